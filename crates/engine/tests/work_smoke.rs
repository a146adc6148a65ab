//! The work protocol end to end on one real SQLite file: the paths every
//! worker takes (request, claim, heartbeat, progress, complete, fail,
//! supersede, recover), checked against the projected state and replay.

use opledger_domain::OperationStatus;
use opledger_domain::Timestamp;
use opledger_engine::{
    ClaimRequest, CommandContext, Completion, Engine, FixedClock, FixedJitter, Progress, SequentialIds, TaskRequest,
    TaskTarget,
};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use serde_json::json;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_goes_from_request_to_completion_and_replay_agrees() {
    let folder = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteConfig::at(folder.path().join("smoke.db")))
        .await
        .unwrap();
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(1_700_000_000_000_000)));
    let engine = Engine::with_clock(store, clock.clone(), Arc::new(SequentialIds::default()))
        .with_jitter(Arc::new(FixedJitter(500)));
    engine.startup().await.unwrap();
    let context = CommandContext::actor("test");
    let media = engine
        .register_media(&context, "/photos/a.png", "image", Some("sha256:aa".into()), Some(10))
        .await
        .unwrap();
    let request = TaskRequest {
        target: TaskTarget::Media(media),
        kind: "thumbnail".into(),
        inputs: json!({"max_side": 256, "format": "png"}),
        priority: 0,
    };
    let first = engine.request_task(&context, request.clone()).await.unwrap();
    assert!(first.created);
    let again = engine.request_task(&context, request.clone()).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.requested_revision, first.requested_revision);

    let claims = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec!["thumbnail".into()],
                worker: "w1".into(),
                lease_ms: 30_000,
                limit: 10,
            },
        )
        .await
        .unwrap();
    assert_eq!(claims.len(), 1);
    let claim = &claims[0];
    assert_eq!(claim.inputs["content_digest"], "sha256:aa");
    let beat = engine.heartbeat(&claim.fence(), None).await.unwrap();
    assert!(!beat.cancel_requested);
    engine
        .report_progress(
            &context,
            &claim.fence(),
            Progress {
                phase: "writing".into(),
                processed: 1,
                total: Some(2),
            },
        )
        .await
        .unwrap();
    engine
        .report_progress(
            &context,
            &claim.fence(),
            Progress {
                phase: "writing".into(),
                processed: 2,
                total: Some(2),
            },
        )
        .await
        .unwrap();
    // A new revision while the worker runs: its completion is recorded
    // against the old revision and the task is queued again.
    let newer = engine
        .request_task(
            &context,
            TaskRequest {
                inputs: json!({"max_side": 512, "format": "png"}),
                ..request.clone()
            },
        )
        .await
        .unwrap();
    assert!(newer.created);
    assert_ne!(newer.requested_revision, first.requested_revision);
    let outcome = engine
        .complete_task(&context, &claim.fence(), Completion::Output(json!({"path": "a.png"})))
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::Queued);
    assert_eq!(
        outcome.completed_revision.as_deref(),
        Some(first.requested_revision.as_str())
    );
    assert_eq!(outcome.requested_revision, newer.requested_revision);

    let claim = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec![],
                worker: "w2".into(),
                lease_ms: 30_000,
                limit: 10,
            },
        )
        .await
        .unwrap()
        .remove(0);
    assert_eq!(claim.revision, newer.requested_revision);
    let failed = engine
        .fail_task(&context, &claim.fence(), "disk full", false)
        .await
        .unwrap();
    assert_eq!(failed.status, OperationStatus::RetryWaiting);
    assert!(failed.available_at > Timestamp::from_micros(1_700_000_000_000_000));
    clock.advance_millis(10_000);
    let claim = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec![],
                worker: "w3".into(),
                lease_ms: 1_000,
                limit: 10,
            },
        )
        .await
        .unwrap()
        .remove(0);
    clock.advance_millis(5_000);
    let report = engine.recover(&context).await.unwrap();
    assert_eq!(report.interrupted, 1);
    assert_eq!(report.requeued, 1);
    assert!(engine
        .complete_task(&context, &claim.fence(), Completion::Output(json!({})))
        .await
        .is_err());
    let claim = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec![],
                worker: "w4".into(),
                lease_ms: 30_000,
                limit: 10,
            },
        )
        .await
        .unwrap()
        .remove(0);
    let done = engine
        .complete_task(&context, &claim.fence(), Completion::Output(json!({"path": "b.png"})))
        .await
        .unwrap();
    assert_eq!(done.status, OperationStatus::Succeeded);
    let view = engine
        .task_state(TaskTarget::Media(media), "thumbnail")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        view.state.completed_revision.as_deref(),
        Some(newer.requested_revision.as_str())
    );
    assert_eq!(view.state.attempt_count, 3);
    assert_eq!(view.state.failure_count, 1);
    assert_eq!(view.state.interruption_count, 1);
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}
