//! Giving a claim back (`Engine::release_task`) on every backend: the task
//! is queued again at once, claimable by the next worker, its attempt and
//! failure counts untouched by the release, the release on its timeline;
//! fenced like every report (a stale token changes nothing); a cancel
//! requested meanwhile is finished instead; replay agrees.

use crate::support;
use opledger_domain::kinds::legacy;
use opledger_domain::OperationStatus;
use opledger_engine::{ClaimRequest, CommandContext, Engine, EngineError, Fence, TaskClaim, TaskRequest, TaskTarget};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;

const DIGEST: &str = "sha256:00000000000000000000000000000000000000000000000000000000000000aa";

async fn engine<B: Backend>(backend: &B) -> Engine<B::Store> {
    let engine = support::engine(backend).await;
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    engine
}

async fn requested_and_claimed<S: Store>(engine: &Engine<S>, worker: &str) -> TaskClaim {
    let context = CommandContext::actor("test");
    let media = engine
        .register_media(&context, "/photos/r.png", "image", Some(DIGEST.into()), Some(10))
        .await
        .unwrap();
    engine
        .request_task(
            &context,
            TaskRequest {
                target: TaskTarget::Media(media),
                kind: "thumbnail".into(),
                inputs: json!({"max_side": 256, "format": "png"}),
                priority: 0,
            },
        )
        .await
        .unwrap();
    claim(engine, worker).await.expect("a claim")
}

async fn claim<S: Store>(engine: &Engine<S>, worker: &str) -> Option<TaskClaim> {
    engine
        .claim_tasks(
            &CommandContext::actor(worker),
            ClaimRequest {
                kinds: vec!["thumbnail".into()],
                worker: worker.into(),
                lease_ms: 60_000,
                limit: 1,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap()
        .pop()
}

async fn a_released_claim_is_queued_at_once_without_counting_an_attempt<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let first = requested_and_claimed(&engine, "w1").await;
    let released = engine
        .release_task(&CommandContext::actor("w1"), &first.fence(), "")
        .await
        .unwrap();
    assert_eq!(released.status, OperationStatus::Queued);
    assert_eq!(released.attempt_count, 0, "the given-back claim is no attempt");
    assert_eq!(released.failure_count, 0, "a release is no failure");
    assert!(released.available_at <= engine.now(), "claimable at once");

    let timeline = engine.timeline(first.operation_id).await.unwrap();
    let last = timeline.last().unwrap();
    assert_eq!(last.event_type(), "operation_released");
    assert_eq!(last.actor, "w1");
    assert!(last.event.payload_json().contains("released by its worker"));

    let second = claim(&engine, "w2")
        .await
        .expect("the released task is claimable again");
    assert_eq!(second.operation_id, first.operation_id);
    assert_eq!(second.attempt, 1, "the next claim is the first attempt");
    assert_ne!(second.claim_token, first.claim_token);
    assert!(engine.verify().await.unwrap().is_identical());
}

async fn a_stale_release_is_refused_and_changes_nothing<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let first = requested_and_claimed(&engine, "w1").await;
    let context = CommandContext::actor("w1");
    engine
        .release_task(&context, &first.fence(), "cannot run it")
        .await
        .unwrap();
    let head = engine.store().head().await.unwrap();
    // Released once already; and a token that never held anything.
    for fence in [first.fence(), Fence::token("0190f5a2-0000-7000-8000-000000000000")] {
        let refused = engine.release_task(&context, &fence, "again").await.unwrap_err();
        assert!(
            matches!(refused, EngineError::Domain(opledger_domain::DomainError::Conflict(_))),
            "{refused}"
        );
    }
    // A claim whose revision is named wrong is refused too.
    let second = claim(&engine, "w2").await.unwrap();
    let wrong_revision = Fence {
        claim_token: second.claim_token.clone(),
        revision: Some("not-the-revision".into()),
    };
    assert!(engine.release_task(&context, &wrong_revision, "").await.is_err());
    assert_eq!(
        engine.store().head().await.unwrap(),
        head + 1,
        "only the second claim was appended"
    );
    let view = engine.task_by_operation(second.operation_id).await.unwrap().unwrap();
    assert_eq!(view.state.status, OperationStatus::Leased);
    assert!(engine.verify().await.unwrap().is_identical());
}

async fn a_release_while_a_cancel_is_pending_finishes_the_cancel<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let first = requested_and_claimed(&engine, "w1").await;
    let context = CommandContext::actor("test");
    engine
        .cancel_task(&context, first.operation_id, "not needed")
        .await
        .unwrap();
    let released = engine
        .release_task(&CommandContext::actor("w1"), &first.fence(), "stopping")
        .await
        .unwrap();
    assert_eq!(released.status, OperationStatus::Cancelled);
    assert!(!released.cancel_requested);
    assert!(claim(&engine, "w2").await.is_none());
    assert!(engine.verify().await.unwrap().is_identical());
}

backend_tests!(
    a_released_claim_is_queued_at_once_without_counting_an_attempt,
    a_stale_release_is_refused_and_changes_nothing,
    a_release_while_a_cancel_is_pending_finishes_the_cancel,
);
