//! `/metrics`: Prometheus text with gauges from the engine's status and
//! claim queues, work counters from the log, and request latency by
//! matched route.

use crate::support;

use opledger_domain::kinds::legacy;

use opledger_engine::{ClaimRequest, CommandContext, Completion, TaskRequest, TaskTarget};
use opledger_testkit::Backend;
use serde_json::json;
use support::{start, As};

/// The value of the one sample line that starts with `series` (name and
/// labels as rendered), if any.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

async fn metrics_show_status_counts_queue_age_work_counters_and_request_latency_by_route<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let engine = service.app.engine();
    let context = CommandContext::actor("test");
    engine.declare(&context, legacy::declarations()).await.unwrap();
    let mut media = Vec::new();
    for item in 0..3 {
        let path = format!("/m/{item}.jpg");
        let digest = format!("sha256:{item}");
        media.push(
            engine
                .register_media(&context, &path, "image", Some(digest), Some(1))
                .await
                .unwrap(),
        );
    }
    for item in &media {
        engine
            .request_task(
                &context,
                TaskRequest {
                    target: TaskTarget::Media(*item),
                    kind: "metadata".into(),
                    inputs: json!({}),
                    priority: 0,
                },
            )
            .await
            .unwrap();
    }
    let first = service.get("/metrics", As::Anonymous).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = String::from_utf8(first.bytes.clone()).unwrap();
    assert_eq!(
        sample(&text, "opledger_operations{status=\"queued\"}"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "opledger_claim_queue_depth{kind=\"metadata\"}"),
        Some(3.0),
        "{text}"
    );
    assert!(sample(&text, "opledger_claim_queue_age_seconds{kind=\"metadata\"}").is_some_and(|age| age >= 0.0));
    assert!(text.contains("opledger_projection_lag_events{projection="), "{text}");
    assert!(text.contains("opledger_capabilities{status="), "{text}");
    assert_eq!(sample(&text, "opledger_claims_total"), Some(0.0), "{text}");

    let claims = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec!["metadata".into()],
                worker: "w".into(),
                lease_ms: 30_000,
                limit: 3,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap();
    assert_eq!(claims.len(), 3);
    engine
        .complete_task(&context, &claims[0].fence(), Completion::Output(json!({"width": 1})))
        .await
        .unwrap();
    engine
        .fail_task(&context, &claims[1].fence(), "broken <script>", false)
        .await
        .unwrap();
    assert_eq!(service.get("/api/v1/status", As::Reader).await.status, 200);
    assert_eq!(service.get("/api/v1/status", As::Anonymous).await.status, 401);

    let text = String::from_utf8(service.get("/metrics", As::Anonymous).await.bytes).unwrap();
    assert_eq!(sample(&text, "opledger_claims_total"), Some(3.0), "{text}");
    assert_eq!(sample(&text, "opledger_completions_total"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "opledger_failures_total"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "opledger_retries_total"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "opledger_operations{status=\"succeeded\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "opledger_claim_queue_depth{kind=\"metadata\"}"),
        Some(0.0),
        "{text}"
    );
    // Latency by matched route, method and status: never the raw path.
    assert!(
        text.contains(
            "opledger_http_request_duration_seconds_count{route=\"/api/v1/status\",method=\"GET\",status=\"200\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("route=\"/api/v1/status\",method=\"GET\",status=\"401\""),
        "{text}"
    );
    service.shutdown().await;
}

async fn requests_to_unknown_paths_are_measured_as_one_unmatched_route<B: Backend>(backend: &B) {
    let service = start(backend).await;
    for path in ["/nothing/1", "/nothing/2", "/api/v1/x"] {
        assert_eq!(service.get(path, As::Reader).await.status, 404);
    }
    let text = String::from_utf8(service.get("/metrics", As::Anonymous).await.bytes).unwrap();
    assert!(
        text.contains("route=\"unmatched\",method=\"GET\",status=\"404\"} 3"),
        "{text}"
    );
    assert!(!text.contains("/nothing/"), "{text}");
    service.shutdown().await;
}

/// The count of a histogram's series, 0 when it has none yet.
fn count(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or(0.0)
}

async fn append_and_commit_latency_count_every_write_command_by_kind_and_failures_apart<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let engine = service.app.engine();
    let context = CommandContext::actor("test");
    let before = String::from_utf8(service.get("/metrics", As::Anonymous).await.bytes).unwrap();
    let log_before = count(&before, "opledger_append_duration_seconds_count{kind=\"log\"}");
    let failed_before = count(&before, "opledger_write_failures_total{kind=\"liveness\"}");

    engine.declare(&context, legacy::declarations()).await.unwrap();
    let item = engine
        .register_media(&context, "/m/one.jpg", "image", Some("sha256:1".into()), Some(1))
        .await
        .unwrap();
    engine
        .request_task(
            &context,
            TaskRequest {
                target: TaskTarget::Media(item),
                kind: "metadata".into(),
                inputs: json!({}),
                priority: 0,
            },
        )
        .await
        .unwrap();
    let claims = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec!["metadata".into()],
                worker: "w".into(),
                lease_ms: 30_000,
                limit: 1,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap();
    let fence = claims[0].fence();
    engine.heartbeat(&fence, None).await.unwrap();
    engine.heartbeat(&fence, None).await.unwrap();
    engine
        .complete_task(&context, &fence, Completion::Output(json!({"width": 1})))
        .await
        .unwrap();
    // A heartbeat on the finished claim is refused inside its
    // transaction: nothing is written, and it counts as a failed write,
    // not as a commit.
    engine.heartbeat(&fence, None).await.unwrap_err();

    let text = String::from_utf8(service.get("/metrics", As::Anonymous).await.bytes).unwrap();
    assert!(
        text.contains("# TYPE opledger_append_duration_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE opledger_commit_duration_seconds histogram"),
        "{text}"
    );
    let log = count(&text, "opledger_append_duration_seconds_count{kind=\"log\"}");
    // declare, register, request, claim, complete: five log writes at least
    // (the service's own periodic recovery may add its own).
    assert!(log - log_before >= 5.0, "{log_before} -> {log}\n{text}");
    assert_eq!(
        count(&text, "opledger_append_duration_seconds_count{kind=\"liveness\"}"),
        2.0,
        "{text}"
    );
    assert_eq!(
        count(&text, "opledger_commit_duration_seconds_count{kind=\"liveness\"}"),
        2.0,
        "{text}"
    );
    assert_eq!(
        count(&text, "opledger_write_failures_total{kind=\"liveness\"}") - failed_before,
        1.0,
        "{text}"
    );
    // Every commit's step is part of its whole latency.
    let total = count(&text, "opledger_append_duration_seconds_sum{kind=\"log\"}");
    let commit = count(&text, "opledger_commit_duration_seconds_sum{kind=\"log\"}");
    assert!(total > 0.0 && commit <= total, "commit {commit} of total {total}");
    service.shutdown().await;
}

opledger_testkit::backend_tests!(
    metrics_show_status_counts_queue_age_work_counters_and_request_latency_by_route,
    requests_to_unknown_paths_are_measured_as_one_unmatched_route,
    append_and_commit_latency_count_every_write_command_by_kind_and_failures_apart,
);
