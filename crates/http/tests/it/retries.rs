//! The `Idempotency-Key` header on the writing routes, on both backends:
//! a request retried with its key answers the first attempt's result and
//! the log's head does not move; the same key for another command is 409;
//! a bad key is 400; the many-item routes refuse a key (422); a long-poll
//! claim under a key that found nothing takes work that arrives later.

use crate::support;

use opledger_engine::{CommandContext, Engine};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::{json, Value};
use support::{start, As, Service};

async fn head<S: Store>(service: &Service<S>) -> i64 {
    service.app.engine().store().head().await.unwrap()
}

/// Declares the former built-in kinds and registers one image item.
async fn one_item<S: Store>(service: &Service<S>) -> String {
    let engine: &Engine<S> = service.app.engine();
    let context = CommandContext::actor("test");
    engine
        .declare(&context, opledger_domain::kinds::legacy::declarations())
        .await
        .unwrap();
    engine
        .register_media(
            &context,
            "/test/a.jpg",
            "image",
            Some(format!("sha256:{:064x}", 1)),
            Some(1_000),
        )
        .await
        .unwrap()
        .to_string()
}

/// POSTs twice with `key`: both 200 with the same body, the second moving
/// nothing. Answers the body.
async fn twice<S: Store>(service: &Service<S>, path: &str, body: Value, key: &str) -> Value {
    let first = service.post_keyed(path, As::Worker, body.clone(), key).await;
    assert_eq!(first.status, 200, "{first:?}");
    let at = head(service).await;
    let second = service.post_keyed(path, As::Worker, body, key).await;
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.body, first.body, "the retry answered differently");
    assert_eq!(head(service).await, at, "the retry appended events");
    first.body
}

async fn a_request_retried_with_its_key_answers_its_first_result<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let media = one_item(&service).await;
    let requested = twice(
        &service,
        "/api/v1/tasks",
        json!({"media_id": media, "kind": "metadata", "inputs": {}}),
        "request-1",
    )
    .await;
    assert_eq!(
        requested["created"], true,
        "the retry answers the first attempt's `created`"
    );

    let claimed = twice(
        &service,
        "/api/v1/claims",
        json!({"worker": "w1", "kinds": ["metadata"], "lease_ms": 60_000}),
        "claim-1",
    )
    .await;
    let token = claimed["claims"][0]["claim_token"]
        .as_str()
        .expect("a claim")
        .to_string();
    let done = twice(
        &service,
        &format!("/api/v1/claims/{token}/complete"),
        json!({"output": {"width": 1}}),
        "complete-1",
    )
    .await;
    assert_eq!(done["status"], "succeeded");

    // The key of the completion, for a request: 409, nothing written.
    let at = head(&service).await;
    let reused = service
        .post_keyed(
            "/api/v1/tasks",
            As::Worker,
            json!({"media_id": media, "kind": "thumbnail"}),
            "complete-1",
        )
        .await;
    assert_eq!(reused.status, 409, "{reused:?}");
    assert_eq!(head(&service).await, at);

    // A key that is not 1 to 200 visible ASCII characters: 400.
    let bad = service
        .post_keyed(
            "/api/v1/tasks",
            As::Worker,
            json!({"media_id": media, "kind": "thumbnail"}),
            "a b",
        )
        .await;
    assert_eq!(bad.status, 400, "{bad:?}");
    // The many-item routes take no key: 422.
    let many = service
        .post_keyed("/api/v1/task-requests", As::Worker, json!({"requests": []}), "many-1")
        .await;
    assert_eq!(many.status, 422, "{many:?}");
    assert_eq!(head(&service).await, at);
}

async fn a_claim_under_a_key_that_found_nothing_takes_work_that_arrives_later<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let media = one_item(&service).await;
    let body = json!({"worker": "w1", "kinds": ["metadata"], "lease_ms": 60_000});
    let empty = service
        .post_keyed("/api/v1/claims", As::Worker, body.clone(), "poll-1")
        .await;
    assert_eq!(empty.body["claims"], json!([]), "{empty:?}");
    let requested = service
        .post(
            "/api/v1/tasks",
            As::Worker,
            json!({"media_id": media, "kind": "metadata"}),
        )
        .await;
    assert_eq!(requested.status, 200, "{requested:?}");
    let claimed = twice(&service, "/api/v1/claims", body, "poll-1").await;
    assert_eq!(claimed["claims"][0]["operation_id"], requested.body["operation_id"]);
}

backend_tests!(
    a_request_retried_with_its_key_answers_its_first_result,
    a_claim_under_a_key_that_found_nothing_takes_work_that_arrives_later,
);
