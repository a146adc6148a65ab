//! The export routes' refusals, on both backends, with a real artifact
//! directory and no supervisor: registering is 503 in the error shape (as
//! `export create` exits 5), a service without an artifact directory is
//! 503, anonymous callers are refused even where anonymous reading is
//! allowed, text that is no token is 400, and a signed token is honoured
//! only for its principal and that principal's policy revision (another's
//! is 403; one of a job that does not exist is 410). The routes with a
//! running supervisor are tested with real processes in the binary's
//! `tests/it/export_http.rs`.

use crate::support;

use opledger_domain::OperationId;
use opledger_store::Store;
use opledger_supervise::token::Secret;
use opledger_supervise::ArtifactDir;
use opledger_testkit::Backend;
use reqwest::Method;
use serde_json::json;
use support::{assert_error, start, start_with, As};

async fn without_a_supervisor_an_export_is_refused_with_503_and_nothing_is_recorded<B: Backend>(backend: &B) {
    let root = tempfile::tempdir().unwrap();
    let dir = ArtifactDir::open(root.path().join("artifacts")).unwrap();
    let service = start_with(backend, |config| config.artifact_dir = Some(dir)).await;
    let before = service.app.engine().store().head().await.unwrap();
    let answer = service
        .post(
            "/api/v1/exports",
            As::Reader,
            json!({"what": "operations", "format": "csv"}),
        )
        .await;
    assert_error(&answer, 503, "unavailable");
    assert!(
        answer.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no supervisor is running"),
        "{answer:?}"
    );
    // Bad input is refused before the supervisor is looked for.
    let no_batch = service
        .post(
            "/api/v1/exports",
            As::Reader,
            json!({"what": "batch_items", "format": "csv"}),
        )
        .await;
    assert_error(&no_batch, 422, "invalid");
    let bad_format = service
        .post(
            "/api/v1/exports",
            As::Reader,
            json!({"what": "operations", "format": "xlsx"}),
        )
        .await;
    assert_error(&bad_format, 400, "malformed");
    assert_eq!(
        service.app.engine().store().head().await.unwrap(),
        before,
        "nothing recorded"
    );
    service.shutdown().await;
}

async fn a_service_without_an_artifact_directory_answers_its_export_routes_with_503<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let answer = service
        .post(
            "/api/v1/exports",
            As::Admin,
            json!({"what": "operations", "format": "json"}),
        )
        .await;
    assert_error(&answer, 503, "unavailable");
    assert!(answer.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--artifact-dir"));
    service.shutdown().await;
}

async fn anonymous_callers_cannot_export_even_where_anonymous_reading_is_allowed<B: Backend>(backend: &B) {
    let root = tempfile::tempdir().unwrap();
    let dir = ArtifactDir::open(root.path().join("artifacts")).unwrap();
    let service = start_with(backend, |config| {
        config.artifact_dir = Some(dir);
        config.allow_anonymous_read = true;
    })
    .await;
    assert_eq!(service.get("/api/v1/operations", As::Anonymous).await.status, 200);
    let answer = service
        .post(
            "/api/v1/exports",
            As::Anonymous,
            json!({"what": "operations", "format": "csv"}),
        )
        .await;
    assert_error(&answer, 401, "unauthenticated");
    service.shutdown().await;
}

async fn a_job_token_is_honoured_only_for_its_principal_and_policy_revision<B: Backend>(backend: &B) {
    let root = tempfile::tempdir().unwrap();
    let dir = ArtifactDir::open(root.path().join("artifacts")).unwrap();
    let service = start_with(backend, |config| config.artifact_dir = Some(dir.clone())).await;
    let secret = Secret::load(&dir).unwrap();
    let job: OperationId = "01890000-0000-7000-8000-0000000000aa".parse().unwrap();
    let entry = |who: As| {
        service
            .app
            .config()
            .tokens
            .find(service.token(who).unwrap())
            .unwrap()
            .clone()
    };
    let reader = entry(As::Reader);
    let readers = secret.sign(job, &reader.name, &reader.policy_revision());
    let admin = entry(As::Admin);
    let admins = secret.sign(job, &admin.name, &admin.policy_revision());
    let under_an_older_policy = secret.sign(job, &reader.name, "an-older-revision");
    let forged = format!("exp1.{job}.{}", "00".repeat(32));
    for (method, suffix) in [
        (Method::GET, ""),
        (Method::DELETE, ""),
        (Method::POST, "/downloads"),
        (Method::GET, "/file?attempt=1"),
    ] {
        let call = |token: String, who: As| {
            let method = method.clone();
            let path = format!("/api/v1/exports/{token}{suffix}");
            let service = &service;
            async move { service.call(method, &path, who, None).await }
        };
        let what = format!("{method} …{suffix}");
        // Its own token, of a job that is not there: gone.
        assert_error(&call(readers.clone(), As::Reader).await, 410, "gone");
        // Another principal's token, whatever the caller's role.
        assert_error(&call(admins.clone(), As::Reader).await, 403, "forbidden");
        assert_error(&call(readers.clone(), As::Admin).await, 403, "forbidden");
        assert_error(&call(under_an_older_policy.clone(), As::Reader).await, 403, "forbidden");
        assert_error(&call(forged.clone(), As::Reader).await, 403, "forbidden");
        assert_error(&call("opl-claim-none".to_string(), As::Reader).await, 400, "malformed");
        assert_error(&call(readers.clone(), As::Anonymous).await, 401, "unauthenticated");
        eprintln!("checked {what}");
    }
    service.shutdown().await;
}

opledger_testkit::backend_tests!(
    without_a_supervisor_an_export_is_refused_with_503_and_nothing_is_recorded,
    a_service_without_an_artifact_directory_answers_its_export_routes_with_503,
    anonymous_callers_cannot_export_even_where_anonymous_reading_is_allowed,
    a_job_token_is_honoured_only_for_its_principal_and_policy_revision,
);
