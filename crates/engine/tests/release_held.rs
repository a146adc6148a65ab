//! Releasing claims whose holders are known gone (`release_claims_of`) and
//! ingestions a stopping ingest gives back (`release_ingestions`), on each
//! backend: at once, whatever the lease, only the named workers', with the
//! cause on the timeline; a late report of a released claim is refused;
//! replay agrees.

use opledger_domain::kinds::legacy;
use opledger_domain::{Event, OperationStatus, Timestamp};
use opledger_engine::{
    ClaimRequest, CommandContext, Completion, Engine, FileObservation, FixedClock, SequentialIds, TaskRequest,
    TaskTarget,
};
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::sync::Arc;

async fn claims_of_named_workers_are_released_at_once_and_others_are_left_alone<B: Backend>(backend: &B) {
    let store = backend.open().await;
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(1_700_000_000_000_000)));
    let engine = Engine::with_clock(store, clock, Arc::new(SequentialIds::default()));
    engine.startup().await.unwrap();
    let context = CommandContext::actor("test");
    engine.declare(&context, legacy::declarations()).await.unwrap();
    for index in 0..4 {
        let media = engine
            .register_media(
                &context,
                &format!("/photos/{index}.png"),
                "image",
                Some(format!("sha256:{index}")),
                Some(10),
            )
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
    }
    let claim = |worker: &str| ClaimRequest {
        kinds: vec!["thumbnail".into()],
        worker: worker.into(),
        lease_ms: 3_600_000,
        limit: 2,
    };
    let dead = engine.claim_tasks(&context, claim("ingest-dead")).await.unwrap();
    let alive = engine.claim_tasks(&context, claim("ingest-alive")).await.unwrap();
    assert_eq!((dead.len(), alive.len()), (2, 2));

    let released = engine
        .release_claims_of(&context, &["ingest-dead".to_string()], "its run is gone")
        .await
        .unwrap();
    assert_eq!(released.interrupted, 2, "{released:?}");
    assert_eq!(released.requeued, 2, "{released:?}");
    for claim in &dead {
        let state = engine.task_by_operation(claim.operation_id).await.unwrap().unwrap();
        assert_eq!(state.state.status, OperationStatus::Queued);
        let timeline = engine.timeline(claim.operation_id).await.unwrap();
        assert!(timeline.iter().any(|event| matches!(&event.event,
            Event::OperationInterrupted(interrupted) if interrupted.reason.starts_with("its run is gone (worker ingest-dead"))));
        let late = engine
            .complete_task(&context, &claim.fence(), Completion::Output(json!({})))
            .await;
        assert!(late.is_err(), "a released claim's report is refused");
    }
    for claim in &alive {
        let state = engine.task_by_operation(claim.operation_id).await.unwrap().unwrap();
        assert_eq!(state.state.claim_token.as_deref(), Some(claim.claim_token.as_str()));
    }
    // Nobody named, nothing done; a second pass finds nothing more.
    assert_eq!(
        engine.release_claims_of(&context, &[], "x").await.unwrap().interrupted,
        0
    );
    let again = engine
        .release_claims_of(&context, &["ingest-dead".to_string()], "its run is gone")
        .await
        .unwrap();
    assert_eq!(again.interrupted, 0);
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

async fn released_ingestions_are_queued_again_and_taken_over_from_their_stage<B: Backend>(backend: &B) {
    let store = backend.open().await;
    let engine = Engine::open(store).await.unwrap().0;
    let context = CommandContext::actor("ingest-one");
    let files: Vec<FileObservation> = (0..3)
        .map(|index| FileObservation {
            path: format!("/photos/{index}.png"),
            byte_size: 10,
            modified_ns: 1,
        })
        .collect();
    let held = engine
        .begin_ingestions(&context, "ingest-one", 86_400_000, files, Vec::new())
        .await
        .unwrap();
    let released = engine
        .release_ingestions(&context, held[..2].to_vec(), "the ingest was stopped (SIGINT)")
        .await
        .unwrap();
    assert_eq!(released, 2);
    // Released twice, or by a stale claim: nothing more.
    assert_eq!(
        engine
            .release_ingestions(&context, held[..2].to_vec(), "again")
            .await
            .unwrap(),
        0
    );
    let paths: Vec<String> = held.iter().map(|claim| claim.path.clone()).collect();
    let rows = engine.ingestions_by_path(&paths).await.unwrap();
    assert_eq!(rows[&paths[0]].status, OperationStatus::Queued);
    assert_eq!(rows[&paths[0]].claim_token, None);
    assert!(rows[&paths[2]].status.is_claimed());
    let taken = engine
        .begin_ingestions(
            &CommandContext::actor("ingest-two"),
            "ingest-two",
            86_400_000,
            Vec::new(),
            vec![held[0].operation_id],
        )
        .await
        .unwrap();
    assert_eq!(taken[0].stage, held[0].stage);
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

backend_tests!(
    claims_of_named_workers_are_released_at_once_and_others_are_left_alone,
    released_ingestions_are_queued_again_and_taken_over_from_their_stage
);
