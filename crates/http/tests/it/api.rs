//! The service's behaviour common to every route: readiness, the error
//! shape, limits, roles. Per-route contracts are in the other test files.

use crate::support;

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

/// A handler that panics is answered 500 in the error shape, the panic is
/// logged, and the service goes on serving.
#[tokio::test]
async fn a_panicking_handler_is_a_500_in_the_error_shape_and_the_service_goes_on() {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;
    let backend = opledger_testkit::sqlite::backend().await;
    let store = opledger_testkit::Harness::open(&backend).await;
    let app = opledger_http::App::new(
        opledger_engine::Engine::new(store),
        opledger_http::ServiceConfig::default(),
    );
    let routes = axum::Router::new()
        .route(
            "/boom",
            axum::routing::get(|| async { panic!("a bug in a handler") as &'static str }),
        )
        .route("/fine", axum::routing::get(|| async { "fine" }));
    let service = opledger_http::with_layers(routes, app);
    let answer = service
        .clone()
        .oneshot(Request::get("/boom").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(answer.status(), 500);
    let body = axum::body::to_bytes(answer.into_body(), 1 << 16).await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "internal", "{body}");
    assert!(
        !body.to_string().contains("a bug in a handler"),
        "the panic's text stays in the log: {body}"
    );
    let next = service
        .oneshot(Request::get("/fine").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(next.status(), 200);
}
