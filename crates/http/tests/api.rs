//! The service's behaviour common to every route: readiness, the error
//! shape, limits, roles. Per-route contracts are in the other test files.

mod support;

use opledger_testkit::Backend;
use reqwest::Method;
use serde_json::json;
use support::{assert_error, start, start_with, As};

async fn status_answers_a_reader_what_the_cli_prints<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let answer = service.get("/api/v1/status", As::Reader).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["backend"], backend.name());
    assert!(answer.body["operations_by_status"]["queued"].is_i64());
    service.shutdown().await;
}

async fn a_request_without_a_token_is_401_and_with_an_unknown_one_too<B: Backend>(backend: &B) {
    let service = start(backend).await;
    assert_error(
        &service.get("/api/v1/status", As::Anonymous).await,
        401,
        "unauthenticated",
    );
    let answer = service
        .http
        .get(service.url("/api/v1/status"))
        .bearer_auth("opl_not-a-token")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 401);
    service.shutdown().await;
}

async fn anonymous_reading_is_allowed_only_when_configured<B: Backend>(backend: &B) {
    let service = start_with(backend, |config| config.allow_anonymous_read = true).await;
    assert_eq!(service.get("/api/v1/status", As::Anonymous).await.status, 200);
    service.shutdown().await;
}

async fn an_unknown_route_is_404_in_the_error_shape<B: Backend>(backend: &B) {
    let service = start(backend).await;
    assert_error(&service.get("/api/v1/nothing-here", As::Admin).await, 404, "not_found");
    let health = service.call(Method::GET, "/healthz", As::Anonymous, None).await;
    assert_eq!(health.body, json!({"status": "ok"}));
    assert_eq!(service.get("/readyz", As::Anonymous).await.status, 200);
    service.shutdown().await;
}

opledger_testkit::backend_tests!(
    status_answers_a_reader_what_the_cli_prints,
    a_request_without_a_token_is_401_and_with_an_unknown_one_too,
    anonymous_reading_is_allowed_only_when_configured,
    an_unknown_route_is_404_in_the_error_shape,
);
