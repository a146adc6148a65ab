//! Releasing claims whose holders are known gone (`release_claims_of`,
//! `release_claims_where` with what their flight records say they were
//! running) and ingestions a stopping ingest gives back
//! (`release_ingestions`), on each backend: at once, whatever the lease,
//! only the named workers', with the cause on the timeline; only a running
//! claim counts an interruption; a late report of a released claim is
//! refused; replay agrees.

use opledger_domain::kinds::legacy;
use opledger_domain::{Event, OperationStatus, Timestamp};
use opledger_engine::{
    ClaimRequest, CommandContext, Completion, Engine, FileObservation, FixedClock, RunningWhenGone, SequentialIds,
    TaskRequest, TaskTarget,
};
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::collections::BTreeSet;
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
        principal: None,
        versions: Default::default(),
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

/// A process that dies while it runs one task and holds others it had not
/// started (an image that aborts the process, beside the claims queued for
/// its threads): by its flight record only the running claim counts an
/// interruption, so run after run the culprit alone is quarantined; the
/// others are given back without counting and stay queued with a clean
/// budget.
async fn only_the_claim_a_dead_worker_was_running_counts_an_interruption_and_is_quarantined<B: Backend>(backend: &B) {
    let store = backend.open().await;
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(1_700_000_000_000_000)));
    let engine = Engine::with_clock(store, clock, Arc::new(SequentialIds::default()));
    engine.startup().await.unwrap();
    let context = CommandContext::actor("test");
    engine.declare(&context, legacy::declarations()).await.unwrap();
    let mut operations = Vec::new();
    for index in 0..3 {
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
        let requested = engine
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
        operations.push(requested.operation_id);
    }
    let culprit = operations[0];
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds < 50, "the culprit was never quarantined");
        let worker = format!("ingest-run-{rounds}");
        let claims = engine
            .claim_tasks(
                &context,
                ClaimRequest {
                    kinds: vec!["thumbnail".into()],
                    worker: worker.clone(),
                    lease_ms: 3_600_000,
                    limit: 10,
                    principal: None,
                    versions: Default::default(),
                },
            )
            .await
            .unwrap();
        let Some(running) = claims.iter().find(|claim| claim.operation_id == culprit) else {
            break;
        };
        let mut record = RunningWhenGone::new();
        record.insert(worker.clone(), BTreeSet::from([running.claim_token.clone()]));
        let gone = worker.clone();
        let released = engine
            .release_claims_where(&context, move |name| name == gone, "its run died", record)
            .await
            .unwrap();
        assert_eq!(released.interrupted, 1, "{released:?}");
        assert_eq!(released.released as usize, claims.len() - 1, "{released:?}");
    }
    let state = engine.task_by_operation(culprit).await.unwrap().unwrap().state;
    assert_eq!(state.status, OperationStatus::FailedTerminal, "{state:?}");
    let timeline = engine.timeline(culprit).await.unwrap();
    assert!(timeline.iter().any(|event| matches!(&event.event,
        Event::OperationInterrupted(interrupted) if interrupted.reason.starts_with("its run died, while it ran this task"))));
    for waiting in &operations[1..] {
        let state = engine.task_by_operation(*waiting).await.unwrap().unwrap().state;
        assert_eq!(state.interruption_count, 0, "{state:?}");
        assert!(
            state.claim_token.is_some(),
            "claimed again by the last round: {state:?}"
        );
        let timeline = engine.timeline(*waiting).await.unwrap();
        assert!(!timeline
            .iter()
            .any(|event| matches!(event.event, Event::OperationInterrupted(_))));
        assert!(timeline.iter().any(|event| matches!(&event.event,
            Event::OperationReleased(released) if released.reason == "its run died, before it started this task")));
    }
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

backend_tests!(
    only_the_claim_a_dead_worker_was_running_counts_an_interruption_and_is_quarantined,
    claims_of_named_workers_are_released_at_once_and_others_are_left_alone,
    released_ingestions_are_queued_again_and_taken_over_from_their_stage
);
