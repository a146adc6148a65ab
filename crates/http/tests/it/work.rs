//! The work protocol over HTTP, route by route, on both backends: request,
//! claim (batch, kinds, long-poll), heartbeat, progress, complete, fail,
//! release, ack-cancel, cancel, and the batched request and report calls.
//! Fencing is checked as the CLI's is: a stale token or revision is 409
//! and the log's head does not move.

use crate::support;

use opledger_domain::MediaId;
use opledger_engine::{CommandContext, Engine};
use opledger_store::Store;
use opledger_testkit::Backend;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use support::{assert_error, start, As, Service};

/// Declares the former built-in kinds (`metadata`, `thumbnail`, …) and
/// registers `count` image items.
async fn media<S: Store>(service: &Service<S>, count: usize) -> Vec<MediaId> {
    let engine: &Engine<S> = service.app.engine();
    let context = CommandContext::actor("test");
    engine
        .declare(&context, opledger_domain::kinds::legacy::declarations())
        .await
        .unwrap();
    let mut items = Vec::new();
    for item in 0..count {
        let media_id = engine
            .register_media(
                &context,
                &format!("/test/{item:04}.jpg"),
                "image",
                Some(format!("sha256:{item:064x}")),
                Some(1_000),
            )
            .await
            .unwrap();
        items.push(media_id);
    }
    items
}

async fn request<S: Store>(service: &Service<S>, media_id: MediaId, kind: &str) -> Value {
    let answer = service
        .post(
            "/api/v1/tasks",
            As::Worker,
            json!({"media_id": media_id.to_string(), "kind": kind, "inputs": {}}),
        )
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body
}

async fn claim<S: Store>(service: &Service<S>, who: As, body: Value) -> Vec<Value> {
    let answer = service.post("/api/v1/claims", who, body).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body["claims"].as_array().cloned().expect("a claims list")
}

async fn head<S: Store>(service: &Service<S>) -> i64 {
    service.app.engine().store().head().await.unwrap()
}

fn on(token: &Value, action: &str) -> String {
    format!("/api/v1/claims/{}/{action}", token.as_str().expect("a token"))
}

async fn a_task_is_requested_claimed_heartbeated_progressed_and_completed<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let items = media(&service, 1).await;
    let requested = request(&service, items[0], "metadata").await;
    assert_eq!(requested["created"], true);
    assert_eq!(requested["status"], "queued");
    assert!(requested["requested_revision"].is_string());
    let again = request(&service, items[0], "metadata").await;
    assert_eq!(again["created"], false, "the same revision is requested once");
    assert_eq!(again["operation_id"], requested["operation_id"]);

    let claims = claim(
        &service,
        As::Worker,
        json!({"worker": "w1", "kinds": ["metadata"], "lease_ms": 30000, "limit": 4}),
    )
    .await;
    assert_eq!(claims.len(), 1);
    let held = &claims[0];
    assert_eq!(held["operation_id"], requested["operation_id"]);
    assert_eq!(held["media_id"], items[0].to_string());
    assert_eq!(held["path"], "/test/0000.jpg");
    assert_eq!(held["task_kind"], "metadata");
    assert_eq!(held["revision"], requested["requested_revision"]);
    assert_eq!(held["attempt"], 1);
    assert!(held["lease_expires_at"].is_string() && held["inputs"].is_object());

    let beat = service
        .post(
            &on(&held["claim_token"], "heartbeat"),
            As::Worker,
            json!({"lease_ms": 60000}),
        )
        .await;
    assert_eq!(beat.status, 200, "{beat:?}");
    assert_eq!(beat.body["cancel_requested"], false);
    assert!(beat.body["lease_expires_at"].as_str().unwrap() > held["lease_expires_at"].as_str().unwrap());
    let empty_beat = service
        .call(
            reqwest::Method::POST,
            &on(&held["claim_token"], "heartbeat"),
            As::Worker,
            None,
        )
        .await;
    assert_eq!(empty_beat.status, 200, "a heartbeat needs no body: {empty_beat:?}");

    let progress = service
        .post(
            &on(&held["claim_token"], "progress"),
            As::Worker,
            json!({"phase": "reading", "processed": 1, "total": 2, "revision": held["revision"], "worker": "w1"}),
        )
        .await;
    assert_eq!(progress.status, 200, "{progress:?}");
    assert_eq!(progress.body, json!({"ok": true}));

    let done = service
        .post(
            &on(&held["claim_token"], "complete"),
            As::Worker,
            json!({"output": {"width": 10}, "revision": held["revision"], "worker": "w1"}),
        )
        .await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(done.body["status"], "succeeded");
    assert_eq!(done.body["completed_revision"], held["revision"]);
    let timeline = service
        .app
        .engine()
        .timeline(opledger_domain::OperationId(
            uuid::Uuid::parse_str(held["operation_id"].as_str().unwrap()).unwrap(),
        ))
        .await
        .unwrap();
    let completion = timeline.last().unwrap();
    assert_eq!(
        completion.actor, "worker (worker w1)",
        "the token's name is the actor, with the worker named in the body beside it"
    );
    service.shutdown().await;
}

async fn a_stale_token_or_revision_is_409_and_appends_nothing<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let items = media(&service, 1).await;
    request(&service, items[0], "metadata").await;
    let claims = claim(&service, As::Worker, json!({"worker": "w1"})).await;
    let held = &claims[0];

    let before = head(&service).await;
    let wrong_revision = service
        .post(
            &on(&held["claim_token"], "complete"),
            As::Worker,
            json!({"output": {}, "revision": "not-the-claimed-revision"}),
        )
        .await;
    assert_error(&wrong_revision, 409, "conflict");
    assert_eq!(head(&service).await, before, "a fenced-out report appends nothing");

    let done = service
        .post(&on(&held["claim_token"], "complete"), As::Worker, json!({"output": {}}))
        .await;
    assert_eq!(done.status, 200, "{done:?}");
    let after = head(&service).await;
    for action in ["complete", "fail", "release", "ack-cancel", "heartbeat", "progress"] {
        let body = match action {
            "fail" => json!({"error": "late"}),
            "progress" => json!({"phase": "late", "processed": 1}),
            _ => json!({}),
        };
        let stale = service.post(&on(&held["claim_token"], action), As::Worker, body).await;
        assert_error(&stale, 409, "conflict");
    }
    let unknown = service
        .post(
            &on(&json!(uuid::Uuid::new_v4().to_string()), "complete"),
            As::Worker,
            json!({}),
        )
        .await;
    assert_error(&unknown, 409, "conflict");
    assert_eq!(head(&service).await, after, "stale reports append nothing");
    let not_a_token = service
        .post("/api/v1/claims/not%20a%20token/complete", As::Worker, json!({}))
        .await;
    assert_error(&not_a_token, 400, "malformed");
    service.shutdown().await;
}

async fn a_failure_is_retried_later_and_a_terminal_one_is_final<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let items = media(&service, 2).await;
    request(&service, items[0], "metadata").await;
    request(&service, items[1], "metadata").await;
    let claims = claim(&service, As::Worker, json!({"worker": "w1", "limit": 2})).await;
    assert_eq!(claims.len(), 2);
    let retried = service
        .post(
            &on(&claims[0]["claim_token"], "fail"),
            As::Worker,
            json!({"error": "disk busy"}),
        )
        .await;
    assert_eq!(retried.status, 200, "{retried:?}");
    assert_eq!(retried.body["failure_count"], 1);
    assert_eq!(retried.body["last_error"], "disk busy");
    assert!(
        retried.body["status"] != "failed_terminal",
        "a first failure retries: {retried:?}"
    );
    let terminal = service
        .post(
            &on(&claims[1]["claim_token"], "fail"),
            As::Worker,
            json!({"error": "corrupt file", "terminal": true}),
        )
        .await;
    assert_eq!(terminal.status, 200, "{terminal:?}");
    assert_eq!(terminal.body["status"], "failed_terminal");
    let malformed = service
        .post(
            &on(&claims[1]["claim_token"], "fail"),
            As::Worker,
            json!({"terminal": true}),
        )
        .await;
    assert_error(&malformed, 400, "malformed");
    service.shutdown().await;
}

async fn a_released_claim_is_claimable_again_at_once_without_counting_an_attempt<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let items = media(&service, 1).await;
    request(&service, items[0], "thumbnail").await;
    let first = claim(&service, As::Worker, json!({"worker": "w1"})).await;
    let released = service
        .post(
            &on(&first[0]["claim_token"], "release"),
            As::Worker,
            json!({"reason": "shutting down"}),
        )
        .await;
    assert_eq!(released.status, 200, "{released:?}");
    assert_eq!(released.body["status"], "queued");
    let second = claim(&service, As::Worker, json!({"worker": "w2"})).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0]["operation_id"], first[0]["operation_id"]);
    assert_eq!(second[0]["attempt"], 1, "a release is not an attempt");
    let no_result = service
        .post(
            &on(&second[0]["claim_token"], "complete"),
            As::Worker,
            json!({"no_result": "blank image"}),
        )
        .await;
    assert_eq!(no_result.status, 200, "{no_result:?}");
    let both = service
        .post(
            &on(&second[0]["claim_token"], "complete"),
            As::Worker,
            json!({"output": {}, "no_result": "both"}),
        )
        .await;
    assert_eq!(both.status.as_u16() / 100, 4, "{both:?}");
    service.shutdown().await;
}

async fn a_cancel_reaches_the_worker_at_its_heartbeat_and_its_ack_ends_the_task<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let items = media(&service, 2).await;
    let running = request(&service, items[0], "metadata").await;
    let claims = claim(&service, As::Worker, json!({"worker": "w1"})).await;
    let path = format!(
        "/api/v1/operations/{}/cancel",
        running["operation_id"].as_str().unwrap()
    );

    assert_error(&service.post(&path, As::Worker, json!({})).await, 403, "forbidden");
    assert_error(
        &service.post(&path, As::Anonymous, json!({})).await,
        401,
        "unauthenticated",
    );
    let cancelled = service.post(&path, As::Admin, json!({"reason": "not needed"})).await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    assert_eq!(cancelled.body["cancel_requested"], true);

    let beat = service
        .post(&on(&claims[0]["claim_token"], "heartbeat"), As::Worker, json!({}))
        .await;
    assert_eq!(beat.body["cancel_requested"], true, "{beat:?}");
    let acked = service
        .post(&on(&claims[0]["claim_token"], "ack-cancel"), As::Worker, json!({}))
        .await;
    assert_eq!(acked.status, 200, "{acked:?}");
    assert_eq!(acked.body["status"], "cancelled");

    let waiting = request(&service, items[1], "metadata").await;
    let at_once = service
        .call(
            reqwest::Method::POST,
            &format!(
                "/api/v1/operations/{}/cancel",
                waiting["operation_id"].as_str().unwrap()
            ),
            As::Admin,
            None,
        )
        .await;
    assert_eq!(at_once.body["status"], "cancelled", "{at_once:?}");
    let unknown = service
        .post(
            &format!("/api/v1/operations/{}/cancel", uuid::Uuid::new_v4()),
            As::Admin,
            json!({}),
        )
        .await;
    assert_error(&unknown, 404, "not_found");
    let malformed = service
        .post("/api/v1/operations/zzz/cancel", As::Admin, json!({}))
        .await;
    assert_error(&malformed, 400, "malformed");
    service.shutdown().await;
}

async fn a_kind_limited_token_works_only_on_its_kinds<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let items = media(&service, 1).await;
    let forbidden = service
        .post(
            "/api/v1/tasks",
            As::ThumbnailWorker,
            json!({"media_id": items[0].to_string(), "kind": "metadata"}),
        )
        .await;
    assert_error(&forbidden, 403, "forbidden");
    request(&service, items[0], "metadata").await;
    request(&service, items[0], "thumbnail").await;

    let asked_other = service
        .post(
            "/api/v1/claims",
            As::ThumbnailWorker,
            json!({"worker": "t", "kinds": ["metadata"]}),
        )
        .await;
    assert_error(&asked_other, 403, "forbidden");
    let own = claim(&service, As::ThumbnailWorker, json!({"worker": "t", "limit": 10})).await;
    assert_eq!(own.len(), 1, "only the token's kind is claimed: {own:?}");
    assert_eq!(own[0]["task_kind"], "thumbnail");

    let other = claim(&service, As::Worker, json!({"worker": "w"})).await;
    assert_eq!(other[0]["task_kind"], "metadata");
    let before = head(&service).await;
    for action in ["complete", "heartbeat", "release"] {
        let answer = service
            .post(&on(&other[0]["claim_token"], action), As::ThumbnailWorker, json!({}))
            .await;
        assert_error(&answer, 403, "forbidden");
    }
    let batched = service
        .post(
            "/api/v1/reports",
            As::ThumbnailWorker,
            json!({"reports": [{"claim_token": other[0]["claim_token"], "outcome": "complete"}]}),
        )
        .await;
    assert_eq!(batched.body["items"][0]["error"]["code"], "forbidden", "{batched:?}");
    assert_eq!(head(&service).await, before, "refused reports append nothing");

    assert_error(
        &service.post("/api/v1/claims", As::Reader, json!({"worker": "r"})).await,
        403,
        "forbidden",
    );
    assert_error(
        &service
            .post("/api/v1/claims", As::Anonymous, json!({"worker": "r"}))
            .await,
        401,
        "unauthenticated",
    );
    service.shutdown().await;
}

async fn a_long_poll_wakes_within_a_second_of_work_requested_by_another_client<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let items = media(&service, 1).await;
    let (http, url, token) = (
        service.http.clone(),
        service.url("/api/v1/claims"),
        service.token(As::Worker).unwrap().to_string(),
    );
    let waiting = tokio::spawn(async move {
        let answer: Value = http
            .post(url)
            .bearer_auth(token)
            .json(&json!({"worker": "poller", "wait_ms": 20000}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (answer, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "nothing is claimable yet: the claim waits");
    let requested_at = Instant::now();
    let requested = request(&service, items[0], "metadata").await;
    let (answer, answered_at) = waiting.await.unwrap();
    assert_eq!(answer["claims"][0]["operation_id"], requested["operation_id"]);
    let waited = answered_at.duration_since(requested_at);
    assert!(waited < Duration::from_secs(1), "woke {waited:?} after the request");
    service.shutdown().await;
}

async fn a_long_poll_answers_no_claims_when_its_wait_passes<B: Backend>(backend: &B) {
    let service = start(backend).await;
    media(&service, 1).await;
    let asked = Instant::now();
    let claims = claim(&service, As::Worker, json!({"worker": "poller", "wait_ms": 600})).await;
    let waited = asked.elapsed();
    assert!(claims.is_empty());
    assert!(waited >= Duration::from_millis(600), "answered after {waited:?}");
    assert!(waited < Duration::from_secs(3), "answered after {waited:?}");
    service.shutdown().await;
}

async fn a_long_poll_is_answered_with_no_claims_when_the_service_stops<B: Backend>(backend: &B) {
    let service = start(backend).await;
    media(&service, 1).await;
    let (http, url, token) = (
        service.http.clone(),
        service.url("/api/v1/claims"),
        service.token(As::Worker).unwrap().to_string(),
    );
    let waiting = tokio::spawn(async move {
        let response = http
            .post(url)
            .bearer_auth(token)
            .json(&json!({"worker": "poller", "wait_ms": 30000}))
            .send()
            .await
            .unwrap();
        (response.status(), response.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    service.shutdown().await;
    let (status, answer) = waiting.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(answer, json!({"claims": []}));
    assert!(stopping.elapsed() < Duration::from_secs(5), "{:?}", stopping.elapsed());
}

async fn batched_requests_and_reports_answer_each_item_in_order<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let items = media(&service, 3).await;
    let requested = service
        .post(
            "/api/v1/task-requests",
            As::Worker,
            json!({"requests": [
                {"media_id": items[0].to_string(), "kind": "metadata"},
                {"kind": "metadata"},
                {"media_id": items[1].to_string(), "kind": "metadata", "priority": 5},
                {"media_id": items[2].to_string(), "kind": "no-such-kind"},
                {"media_id": items[2].to_string(), "kind": "metadata"},
            ]}),
        )
        .await;
    assert_eq!(requested.status, 200, "{requested:?}");
    let answers = requested.body["items"].as_array().unwrap();
    assert_eq!(answers.len(), 5);
    assert_eq!(answers[0]["created"], true);
    assert_eq!(answers[1]["error"]["code"], "invalid");
    assert_eq!(answers[2]["created"], true);
    assert!(answers[3]["error"]["code"].is_string(), "{:?}", answers[3]);
    assert_eq!(answers[4]["created"], true);

    let claims = claim(&service, As::Worker, json!({"worker": "w", "limit": 3})).await;
    assert_eq!(claims.len(), 3);
    assert_eq!(claims[0]["operation_id"], answers[2]["operation_id"], "priority first");
    // The first claim is completed alone, so it is stale in the batch.
    let done = service
        .post(&on(&claims[0]["claim_token"], "complete"), As::Worker, json!({}))
        .await;
    assert_eq!(done.status, 200);
    let reports = service
        .post(
            "/api/v1/reports",
            As::Worker,
            json!({"reports": [
                {"claim_token": claims[0]["claim_token"], "revision": claims[0]["revision"], "outcome": "complete", "output": {}},
                {"claim_token": claims[1]["claim_token"], "revision": claims[1]["revision"], "outcome": "no_result", "reason": "empty"},
                {"claim_token": claims[2]["claim_token"], "revision": claims[2]["revision"], "outcome": "fail", "error": "boom", "terminal": true},
            ]}),
        )
        .await;
    assert_eq!(reports.status, 200, "{reports:?}");
    let results = reports.body["items"].as_array().unwrap();
    assert_eq!(
        results[0]["error"]["code"], "conflict",
        "the fenced-out item: {results:?}"
    );
    assert_eq!(results[1]["status"], "no_result");
    assert_eq!(results[2]["status"], "failed_terminal");
    let bad = service
        .post(
            "/api/v1/reports",
            As::Worker,
            json!({"reports": [{"claim_token": "x", "outcome": "explode"}]}),
        )
        .await;
    assert_error(&bad, 400, "malformed");
    service.shutdown().await;
}

async fn a_worker_states_its_versions_and_is_offered_only_tasks_requested_at_them<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let items = media(&service, 1).await;
    request(&service, items[0], "metadata").await;
    // The former built-in kinds are at version 1.
    let none = claim(
        &service,
        As::Worker,
        json!({"worker": "w2", "kinds": ["metadata"], "versions": {"metadata": ["2"]}}),
    )
    .await;
    assert!(none.is_empty(), "version-2 code is offered no version-1 task");
    let claims = claim(
        &service,
        As::Worker,
        json!({"worker": "w1", "kinds": ["metadata"], "versions": {"metadata": ["1"]}}),
    )
    .await;
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0]["kind_version"], "1", "the claim says the version to run");

    let before = head(&service).await;
    let refused = service
        .post(
            "/api/v1/claims",
            As::Worker,
            json!({"worker": "w1", "kinds": ["metadata"], "versions": {"thumbnail": ["1"]}}),
        )
        .await;
    assert_error(&refused, 422, "invalid");
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not name"),
        "{refused:?}"
    );
    assert_eq!(head(&service).await, before, "nothing appended");
}

opledger_testkit::backend_tests!(
    a_task_is_requested_claimed_heartbeated_progressed_and_completed,
    a_stale_token_or_revision_is_409_and_appends_nothing,
    a_failure_is_retried_later_and_a_terminal_one_is_final,
    a_released_claim_is_claimable_again_at_once_without_counting_an_attempt,
    a_cancel_reaches_the_worker_at_its_heartbeat_and_its_ack_ends_the_task,
    a_kind_limited_token_works_only_on_its_kinds,
    a_long_poll_wakes_within_a_second_of_work_requested_by_another_client,
    a_long_poll_answers_no_claims_when_its_wait_passes,
    a_long_poll_is_answered_with_no_claims_when_the_service_stops,
    batched_requests_and_reports_answer_each_item_in_order,
    a_worker_states_its_versions_and_is_offered_only_tasks_requested_at_them,
);
