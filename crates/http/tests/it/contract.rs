//! The service's contract as a document and its limits: the served
//! `/openapi.json` is the committed `docs/openapi.json` (regenerate with
//! `OPLEDGER_UPDATE_OPENAPI=1 cargo test -p opledger-http --test
//! contract`), a body over the limit is 413 before it is parsed, and JSON
//! nested 10,000 deep is a 400 that leaves the service up.

use crate::support;

use opledger_testkit::Backend;
use reqwest::header;
use std::path::PathBuf;
use support::{assert_error, start, start_with, As};

fn committed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

async fn the_served_openapi_document_is_the_committed_one<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let served = service.get("/openapi.json", As::Anonymous).await;
    assert_eq!(served.status, 200);
    assert_eq!(served.body["openapi"], "3.1.0");
    let text = serde_json::to_string_pretty(&served.body).unwrap() + "\n";
    assert_eq!(
        serde_json::to_value(opledger_http::openapi()).unwrap(),
        served.body,
        "the service serves opledger_http::openapi()"
    );
    if std::env::var_os("OPLEDGER_UPDATE_OPENAPI").is_some() {
        std::fs::write(committed(), &text).unwrap();
    }
    let on_disk = std::fs::read_to_string(committed()).unwrap_or_default();
    assert!(
        on_disk == text,
        "docs/openapi.json differs from the served document; regenerate it with \
         OPLEDGER_UPDATE_OPENAPI=1 cargo test -p opledger-http --test contract"
    );
    service.shutdown().await;
}

async fn a_body_over_the_limit_is_413_before_it_is_parsed<B: Backend>(backend: &B) {
    let service = start_with(backend, |config| config.body_limit = 1024).await;
    // Not JSON at all: parsed, it would be a 400.
    let body = vec![b'x'; 4096];
    let answer = service
        .http
        .post(service.url("/api/v1/media"))
        .bearer_auth(service.token(As::Admin).unwrap())
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, body.len())
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 413);
    let error: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(error["error"]["code"], "too_large");
    let fits = service
        .post("/api/v1/media", As::Admin, serde_json::json!({"path": "/fits.jpg"}))
        .await;
    assert_eq!(fits.status, 201, "{fits:?}");
    service.shutdown().await;
}

async fn json_nested_ten_thousand_deep_is_refused_with_400_and_the_service_stays_up<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let body = "[".repeat(10_000) + &"]".repeat(10_000);
    for path in [
        "/api/v1/media",
        "/api/v1/batches",
        "/api/v1/review/resolve",
        "/api/v1/kinds",
    ] {
        let answer = service
            .http
            .post(service.url(path))
            .bearer_auth(service.token(As::Admin).unwrap())
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 400, "{path}");
        let error: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(error["error"]["code"], "malformed");
        assert!(
            error["error"]["message"].as_str().unwrap().len() < 400,
            "no echo of the body"
        );
    }
    let object = r#"{"a":"#.repeat(10_000) + "1" + &"}".repeat(10_000);
    let answer = service
        .http
        .post(service.url("/api/v1/media"))
        .bearer_auth(service.token(As::Admin).unwrap())
        .body(object)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    assert_eq!(service.get("/healthz", As::Anonymous).await.status, 200);
    assert_eq!(service.get("/api/v1/status", As::Reader).await.status, 200);
    assert_error(&service.get("/api/v1/media/nope", As::Reader).await, 400, "malformed");
    service.shutdown().await;
}

opledger_testkit::backend_tests!(
    the_served_openapi_document_is_the_committed_one,
    a_body_over_the_limit_is_413_before_it_is_parsed,
    json_nested_ten_thousand_deep_is_refused_with_400_and_the_service_stays_up,
);
