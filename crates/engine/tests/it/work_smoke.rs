//! The work protocol end to end on one real database of each backend
//! (SQLite and PostgreSQL, `opledger_testkit`): the paths every worker takes
//! (request, claim, heartbeat, progress, complete, fail, supersede, recover),
//! checked against the projected state and replay.

use opledger_domain::kinds::legacy;
use opledger_domain::OperationStatus;
use opledger_domain::Timestamp;
use opledger_engine::{
    ClaimOutcome, ClaimRequest, CommandContext, Completion, Engine, Fence, FixedClock, FixedJitter, OutcomeReport,
    Progress, SequentialIds, TaskRequest, TaskTarget,
};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::sync::Arc;

async fn a_task_goes_from_request_to_completion_and_replay_agrees<B: Backend>(backend: &B) {
    let store = backend.open().await;
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(1_700_000_000_000_000)));
    let engine = Engine::with_clock(store, clock.clone(), Arc::new(SequentialIds::default()))
        .with_jitter(Arc::new(FixedJitter(500)));
    engine.startup().await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
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
                principal: None,
                versions: Default::default(),
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
                principal: None,
                versions: Default::default(),
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
                principal: None,
                versions: Default::default(),
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
                principal: None,
                versions: Default::default(),
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
    assert_eq!(
        engine
            .store()
            .count_by(&opledger_domain::projections::MEDIA_STATES_TABLE, "status")
            .await
            .unwrap(),
        vec![(Some("succeeded".to_string()), 1)]
    );
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

async fn batched_requests_and_completions_answer_each_item_on_its_own<B: Backend>(backend: &B) {
    let store = backend.open().await;
    let engine = Engine::with_clock(
        store,
        Arc::new(FixedClock::at(Timestamp::from_micros(1_700_000_000_000_000))),
        Arc::new(SequentialIds::default()),
    );
    engine.startup().await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    let context = CommandContext::actor("test");
    let mut media = Vec::new();
    for index in 0..3 {
        media.push(
            engine
                .register_media(
                    &context,
                    &format!("/m/{index}.png"),
                    "image",
                    Some(format!("sha256:{index}")),
                    None,
                )
                .await
                .unwrap(),
        );
    }
    let request = |media_id, kind: &str, inputs: serde_json::Value| TaskRequest {
        target: TaskTarget::Media(media_id),
        kind: kind.into(),
        inputs,
        priority: 0,
    };
    let head = engine.store().head().await.unwrap();
    let answers = engine
        .request_tasks(
            &context,
            vec![
                request(media[0], "metadata", json!({})),
                request(media[1], "metadata", json!({})),
                // The same revision twice in one batch: the second is a no-op.
                request(media[1], "metadata", json!({})),
                // The same kind with other inputs in one batch: refused alone.
                request(media[1], "metadata", json!({"extractor": "x"})),
                // Refused alone: unknown kind, unknown media, wrong input type.
                request(media[2], "transcode", json!({})),
                request(
                    opledger_domain::MediaId(uuid::Uuid::from_u128(999)),
                    "metadata",
                    json!({}),
                ),
                request(media[2], "thumbnail", json!({"max_side": "big", "format": "png"})),
                request(media[2], "thumbnail", json!({"max_side": 256, "format": "png"})),
            ],
        )
        .await
        .unwrap();
    let created: Vec<Option<bool>> = answers
        .iter()
        .map(|answer| answer.as_ref().ok().map(|outcome| outcome.created))
        .collect();
    assert_eq!(
        created,
        vec![Some(true), Some(true), Some(false), None, None, None, None, Some(true)]
    );
    assert_eq!(
        engine.store().head().await.unwrap(),
        head + 3,
        "only the three accepted requests appended"
    );

    let claims = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec![],
                worker: "w".into(),
                lease_ms: 30_000,
                limit: 10,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap();
    assert_eq!(claims.len(), 3);
    let mut completions: Vec<(Fence, Completion)> = claims
        .iter()
        .map(|claim| (claim.fence(), Completion::Output(json!({"ok": true}))))
        .collect();
    // A token nobody holds, and one claim reported twice.
    completions.insert(1, (Fence::token("no-such-claim"), Completion::Output(json!({}))));
    completions.push((claims[0].fence(), Completion::Output(json!({}))));
    let outcomes = engine.complete_tasks(&context, completions).await.unwrap();
    let statuses: Vec<Option<OperationStatus>> = outcomes
        .iter()
        .map(|outcome| outcome.as_ref().ok().map(|outcome| outcome.status))
        .collect();
    assert_eq!(
        statuses,
        vec![
            Some(OperationStatus::Succeeded),
            None,
            Some(OperationStatus::Succeeded),
            Some(OperationStatus::Succeeded),
            None
        ]
    );
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

/// Worker fleets spawn each command onto the runtime; every work-protocol
/// command's future must be `Send` for that (a regression here is a compile
/// error in this test).
async fn work_protocol_commands_run_on_spawned_tasks<B: Backend>(backend: &B) {
    let store = backend.open().await;
    let (engine, _) = Engine::open(store).await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    let context = CommandContext::actor("spawned");
    let media = engine
        .register_media(&context, "/s/1.png", "image", Some("sha256:1".into()), None)
        .await
        .unwrap();
    let (e, c) = (engine.clone(), context.clone());
    let requested = tokio::spawn(async move {
        e.request_task(
            &c,
            TaskRequest {
                target: TaskTarget::Media(media),
                kind: "metadata".into(),
                inputs: json!({}),
                priority: 0,
            },
        )
        .await
        .map(|outcome| outcome.created)
    })
    .await
    .unwrap();
    assert_eq!(requested, Ok(true));
    let (e, c) = (engine.clone(), context.clone());
    let claim = tokio::spawn(async move {
        e.claim_tasks(
            &c,
            ClaimRequest {
                kinds: vec![],
                worker: "spawned".into(),
                lease_ms: 10_000,
                limit: 1,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
    })
    .await
    .unwrap()
    .unwrap()
    .remove(0);
    let (e, c, f) = (engine.clone(), context.clone(), claim.fence());
    tokio::spawn(async move { e.heartbeat(&f, None).await.map(|_| ()) })
        .await
        .unwrap()
        .unwrap();
    let (e, f) = (engine.clone(), claim.fence());
    let c2 = c.clone();
    tokio::spawn(async move {
        e.report_progress(
            &c2,
            &f,
            Progress {
                phase: "p".into(),
                processed: 1,
                total: None,
            },
        )
        .await
    })
    .await
    .unwrap()
    .unwrap();
    let (e, f) = (engine.clone(), claim.fence());
    let outcome = tokio::spawn(async move { e.complete_task(&c, &f, Completion::Output(json!({}))).await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::Succeeded);
    let (e, c) = (engine.clone(), context.clone());
    let cancelled = tokio::spawn(async move { e.cancel_task(&c, claim.operation_id, "late").await })
        .await
        .unwrap();
    assert!(cancelled.is_err(), "a succeeded task cannot be cancelled");
    let (e, c) = (engine.clone(), context.clone());
    tokio::spawn(async move { e.recover(&c).await }).await.unwrap().unwrap();
}

async fn removing_a_media_item_cancels_its_unfinished_tasks_and_ends_their_claims<B: Backend>(backend: &B) {
    let store = backend.open().await;
    let (engine, _) = Engine::open(store).await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    let context = CommandContext::actor("test");
    let media = engine
        .register_media(&context, "/r/1.png", "image", Some("sha256:1".into()), None)
        .await
        .unwrap();
    let region = engine
        .add_region(
            &context,
            media,
            opledger_domain::events::BoundingBox {
                x: 0,
                y: 0,
                width: 5,
                height: 5,
            },
            1,
        )
        .await
        .unwrap();
    let mut operations = Vec::new();
    for (target, kind, inputs) in [
        (TaskTarget::Media(media), "metadata", json!({})),
        (
            TaskTarget::Media(media),
            "thumbnail",
            json!({"max_side": 64, "format": "png"}),
        ),
        (
            TaskTarget::Region(region),
            "crop_embedding",
            json!({"model": "m", "model_revision": "1", "embedding_version": "1"}),
        ),
    ] {
        let outcome = engine
            .request_task(
                &context,
                TaskRequest {
                    target,
                    kind: kind.into(),
                    inputs,
                    priority: 0,
                },
            )
            .await
            .unwrap();
        operations.push(outcome.operation_id);
    }
    let claim = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec!["metadata".into()],
                worker: "w".into(),
                lease_ms: 60_000,
                limit: 1,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap()
        .remove(0);
    engine.remove_media(&context, media, "deleted on disk").await.unwrap();
    for operation_id in &operations {
        let row = engine.operation(*operation_id).await.unwrap();
        assert_eq!(row.status, OperationStatus::Cancelled, "{operation_id}");
        assert!(row.status_reason.unwrap().contains("media removed"));
        assert!(
            engine.task_by_operation(*operation_id).await.unwrap().is_none(),
            "state cascaded"
        );
    }
    // The claim ended with its target: the worker hears so at its heartbeat.
    assert!(engine.store().lease(&claim.claim_token).await.unwrap().is_none());
    assert!(engine.heartbeat(&claim.fence(), None).await.is_err());
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

/// Workers' outcomes reported together (`report_outcomes`, what a pool's
/// reporter sends) are each fenced and decided on their own, carry their own
/// actor and correlation on the timeline, and leave the state replay
/// reproduces. `claim_standing` answers like a heartbeat without writing.
async fn outcomes_reported_together_are_each_fenced_and_keep_their_own_actor<B: Backend>(backend: &B) {
    let store = backend.open().await;
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(1_700_000_000_000_000)));
    let engine = Engine::with_clock(store, clock.clone(), Arc::new(SequentialIds::default()))
        .with_jitter(Arc::new(FixedJitter(500)));
    engine.startup().await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    let context = CommandContext::actor("test");
    for index in 0..4 {
        let media = engine
            .register_media(
                &context,
                &format!("/o/{index}.png"),
                "image",
                Some(format!("sha256:{index}")),
                None,
            )
            .await
            .unwrap();
        engine
            .request_task(
                &context,
                TaskRequest {
                    target: TaskTarget::Media(media),
                    kind: "metadata".into(),
                    inputs: json!({}),
                    priority: 0,
                },
            )
            .await
            .unwrap();
    }
    let claims = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec!["metadata".into()],
                worker: "pool".into(),
                lease_ms: 30_000,
                limit: 4,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap();
    assert_eq!(claims.len(), 4);

    // Standing: read, no write; a cancel request shows; a finished claim is a conflict.
    let head = engine.store().head().await.unwrap();
    let standing = engine.claim_standing(&claims[0].fence()).await.unwrap();
    assert!(!standing.cancel_requested);
    assert_eq!(standing.lease_expires_at, claims[0].lease_expires_at);
    engine
        .cancel_task(&context, claims[3].operation_id, "no longer needed")
        .await
        .unwrap();
    assert!(
        engine
            .claim_standing(&claims[3].fence())
            .await
            .unwrap()
            .cancel_requested
    );
    assert!(engine.claim_standing(&Fence::token("no-such-claim")).await.is_err());
    assert_eq!(
        engine.store().head().await.unwrap(),
        head + 1,
        "only the cancel request appended"
    );

    let slot = |index: usize| {
        CommandContext::actor(format!("pool/slot-{index}")).with_correlation(claims[index].claim_token.clone())
    };
    let report = |index: usize, outcome: ClaimOutcome| OutcomeReport {
        context: slot(index),
        fence: claims[index].fence(),
        outcome,
    };
    let answers = engine
        .report_outcomes(vec![
            report(0, ClaimOutcome::Complete(Completion::Output(json!({"width": 4})))),
            report(
                1,
                ClaimOutcome::Fail {
                    error: "decoder busy".into(),
                    terminal: false,
                },
            ),
            OutcomeReport {
                context: CommandContext::actor("stranger"),
                fence: Fence::token("no-such-claim"),
                outcome: ClaimOutcome::Complete(Completion::Output(json!({}))),
            },
            report(
                2,
                ClaimOutcome::Fail {
                    error: "not an image".into(),
                    terminal: true,
                },
            ),
            report(
                3,
                ClaimOutcome::Fail {
                    error: "stopped".into(),
                    terminal: false,
                },
            ),
        ])
        .await
        .unwrap();
    let statuses: Vec<Option<OperationStatus>> = answers
        .iter()
        .map(|answer| answer.as_ref().ok().map(|outcome| outcome.status))
        .collect();
    assert_eq!(
        statuses,
        vec![
            Some(OperationStatus::Succeeded),
            Some(OperationStatus::RetryWaiting),
            None,
            Some(OperationStatus::FailedTerminal),
            Some(OperationStatus::Cancelled),
        ]
    );
    for (index, claim) in claims.iter().enumerate() {
        let timeline = engine.timeline(claim.operation_id).await.unwrap();
        let last = timeline.last().unwrap();
        assert_eq!(last.actor, format!("pool/slot-{index}"), "{:?}", last.event_type());
        assert_eq!(last.correlation_id, claim.claim_token);
    }
    let failed = engine.task_by_operation(claims[1].operation_id).await.unwrap().unwrap();
    assert_eq!(failed.state.last_error.as_deref(), Some("decoder busy"));
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

backend_tests!(
    a_task_goes_from_request_to_completion_and_replay_agrees,
    batched_requests_and_completions_answer_each_item_on_its_own,
    work_protocol_commands_run_on_spawned_tasks,
    removing_a_media_item_cancels_its_unfinished_tasks_and_ends_their_claims,
    outcomes_reported_together_are_each_fenced_and_keep_their_own_actor,
);
