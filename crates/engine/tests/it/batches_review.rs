//! Capability states, batches and the review queue, on real
//! databases: a capability through its lifecycle and a task-version change;
//! a batch of 100 items with failures, cancellation and resume, counted
//! exactly at every step; a restart in the middle of a batch; duplicate
//! and repeated inputs; the review queue's routing and resolutions. Every
//! scenario ends with `verify`: replay equals live.
//!
//! The scenarios are generic over the backend; `backend_tests!` runs each
//! on SQLite and on PostgreSQL.

use opledger_domain::batches::{is_active, BatchStatus, ItemOutcome};
use opledger_domain::decide::OperationCommand;
use opledger_domain::events::{BatchItemSettled, BatchItemSpec, BoundingBox, Event, OperationTarget};
use opledger_domain::kinds::legacy;
use opledger_domain::projections::{
    BatchRow, CapabilityRow, CAPABILITY_STATES_TABLE, MEDIA_TABLE, REGIONS_TABLE, REVIEW_TABLE,
};
use opledger_domain::review::{EntryState, ReviewAction};
use opledger_domain::Cause;
use opledger_domain::{
    BatchId, CapabilityStatus, DomainError, MediaId, NewEvent, OperationId, OperationStatus, StreamId, Timestamp,
};
use opledger_engine::{
    BatchRequest, ClaimRequest, CommandContext, Completion, Engine, EngineError, FixedClock, FixedJitter, NewOperation,
    SequentialIds, TaskClaim, TaskRequest, TaskTarget,
};
use opledger_store::{ExpectedVersion, Store, StreamAppend};
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

const T0: i64 = 1_700_000_000_000_000;

/// One engine over a backend's database, with a hand-moved clock.
struct Lab<S: Store> {
    engine: Engine<S>,
    clock: Arc<FixedClock>,
    context: CommandContext,
}

async fn lab<B: Backend>(backend: &B, ids_from: u128, task_versions: &[(&str, &str)]) -> Lab<B::Store> {
    let store = backend.open().await;
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(T0)));
    let engine = Engine::with_clock(store, clock.clone(), Arc::new(SequentialIds::starting_at(ids_from)))
        .with_jitter(Arc::new(FixedJitter(0)));
    engine.startup().await.unwrap();
    // The kinds at the versions this deployment runs.
    let kinds = legacy::declarations()
        .into_iter()
        .map(|mut kind| {
            if let Some((_, version)) = task_versions.iter().find(|(name, _)| *name == kind.name) {
                kind.version = version.to_string();
            }
            kind
        })
        .collect();
    engine.declare(&CommandContext::actor("deploy"), kinds).await.unwrap();
    engine.maintain(&CommandContext::actor("system")).await.unwrap();
    Lab {
        engine,
        clock,
        context: CommandContext::actor("test"),
    }
}

impl<S: Store> Lab<S> {
    async fn media(&self, path: &str) -> MediaId {
        self.engine
            .register_media(&self.context, path, "image", Some(format!("sha256:{path}")), Some(10))
            .await
            .unwrap()
    }

    async fn claim(&self, kinds: &[&str], limit: usize) -> Vec<TaskClaim> {
        self.engine
            .claim_tasks(
                &self.context,
                ClaimRequest {
                    kinds: kinds.iter().map(|kind| kind.to_string()).collect(),
                    worker: "worker-1".into(),
                    lease_ms: 60_000,
                    limit,
                    principal: None,
                    versions: Default::default(),
                },
            )
            .await
            .unwrap()
    }

    async fn complete(&self, claim: &TaskClaim) {
        self.engine
            .complete_task(&self.context, &claim.fence(), Completion::Output(json!({"ok": true})))
            .await
            .unwrap();
    }

    async fn fail_terminal(&self, claim: &TaskClaim, error: &str) {
        self.engine
            .fail_task(&self.context, &claim.fence(), error, true)
            .await
            .unwrap();
    }

    async fn capability(&self, media_id: MediaId, name: &str) -> CapabilityRow {
        self.engine
            .capabilities(media_id)
            .await
            .unwrap()
            .into_iter()
            .find(|row| row.capability == name)
            .unwrap_or_else(|| panic!("media {media_id} has no {name} capability"))
    }

    async fn batch_row(&self, batch_id: BatchId) -> BatchRow {
        self.engine.batch(batch_id).await.unwrap().batch
    }

    async fn verify(&self) {
        let report = self.engine.verify().await.unwrap();
        assert!(report.is_identical(), "{}", report.render());
    }
}

/// (total, settled, succeeded, failed, skipped, cancelled, remaining)
fn counts(batch: &BatchRow) -> (i64, i64, i64, i64, i64, i64, i64) {
    let progress = &batch.progress;
    (
        progress.total,
        progress.settled,
        progress.succeeded,
        progress.failed,
        progress.skipped,
        progress.cancelled,
        progress.remaining(),
    )
}

fn batch_request(name: &str, media: Vec<MediaId>, kinds: &[&str]) -> BatchRequest {
    BatchRequest {
        name: name.into(),
        media,
        kinds: kinds.iter().map(|kind| kind.to_string()).collect(),
        inputs: BTreeMap::new(),
        priority: 0,
    }
}

async fn capability_goes_pending_to_succeeded_then_stale_and_back<B: Backend>(backend: &B) {
    let lab = lab(backend, 1, &[]).await;
    let media_id = lab.media("a.png").await;
    assert!(lab.engine.capabilities(media_id).await.unwrap().is_empty());
    let requested = lab
        .engine
        .request_task(
            &lab.context,
            TaskRequest {
                target: TaskTarget::Media(media_id),
                kind: "metadata".into(),
                inputs: json!({}),
                priority: 0,
            },
        )
        .await
        .unwrap();
    let capability = lab.capability(media_id, "metadata").await;
    assert_eq!(capability.status, CapabilityStatus::Queued);
    assert_eq!(capability.requested_version.as_deref(), Some("1"));
    assert!(capability.required);

    let claim = lab.claim(&["metadata"], 1).await.remove(0);
    assert_eq!(
        lab.capability(media_id, "metadata").await.status,
        CapabilityStatus::Running
    );
    lab.complete(&claim).await;
    let capability = lab.capability(media_id, "metadata").await;
    assert_eq!(capability.status, CapabilityStatus::Succeeded);
    assert_eq!(capability.produced_version.as_deref(), Some("1"));
    assert_eq!(
        capability.produced_revision.as_deref(),
        Some(requested.requested_revision.as_str())
    );
    lab.verify().await;

    // A new build declares metadata version 2: startup's maintenance records the
    // result stale, on the operation's timeline.
    drop(lab);
    let lab = lab_with(backend, 1_000, &[("metadata", "2")]).await;
    let capability = lab.capability(media_id, "metadata").await;
    assert_eq!(capability.status, CapabilityStatus::Stale, "{capability:?}");
    assert_eq!(capability.current_version.as_deref(), Some("2"));
    let timeline: Vec<&str> = lab
        .engine
        .timeline(requested.operation_id)
        .await
        .unwrap()
        .iter()
        .map(|event| event.event_type())
        .collect();
    assert_eq!(timeline.last(), Some(&"task_version_changed"));
    // Maintenance again finds nothing: the sweep is idempotent.
    let again = lab.engine.maintain(&CommandContext::actor("system")).await.unwrap();
    assert_eq!(again.stale_marked, 0);

    // Requested again at the new version: a new revision, re-processed.
    let again = lab
        .engine
        .request_task(
            &lab.context,
            TaskRequest {
                target: TaskTarget::Media(media_id),
                kind: "metadata".into(),
                inputs: json!({}),
                priority: 0,
            },
        )
        .await
        .unwrap();
    assert!(again.created);
    assert_ne!(again.requested_revision, requested.requested_revision);
    assert_eq!(
        lab.capability(media_id, "metadata").await.status,
        CapabilityStatus::Queued
    );
    let claim = lab.claim(&["metadata"], 1).await.remove(0);
    lab.complete(&claim).await;
    let capability = lab.capability(media_id, "metadata").await;
    assert_eq!(capability.status, CapabilityStatus::Succeeded);
    assert_eq!(capability.produced_version.as_deref(), Some("2"));
    lab.verify().await;
}

async fn lab_with<B: Backend>(backend: &B, ids_from: u128, versions: &[(&str, &str)]) -> Lab<B::Store> {
    lab(backend, ids_from, versions).await
}

async fn batch_of_100_counts_exactly_through_failures_cancel_and_resume<B: Backend>(backend: &B) {
    let lab = lab(backend, 1, &[]).await;
    let mut media = Vec::new();
    for index in 0..100 {
        media.push(lab.media(&format!("item-{index:03}.png")).await);
    }
    let view = lab
        .engine
        .create_batch(&lab.context, batch_request("hundred", media.clone(), &["metadata"]))
        .await
        .unwrap();
    let batch_id = view.batch.batch_id;
    assert_eq!(counts(&view.batch), (100, 0, 0, 0, 0, 0, 100));
    assert!(view.active);
    assert_eq!(view.batch.status, BatchStatus::Running);

    let mut claims = lab.claim(&["metadata"], 100).await;
    assert_eq!(claims.len(), 100);
    claims.sort_by_key(|claim| claim.media_id);
    let (done, rest) = claims.split_at(80);
    let (failing, running) = rest.split_at(10);
    for (index, claim) in done.iter().enumerate() {
        lab.complete(claim).await;
        if index == 39 {
            assert_eq!(counts(&lab.batch_row(batch_id).await), (100, 40, 40, 0, 0, 0, 60));
        }
    }
    for claim in failing {
        lab.fail_terminal(claim, "not a decodable image").await;
    }
    assert_eq!(counts(&lab.batch_row(batch_id).await), (100, 90, 80, 10, 0, 0, 10));

    // Cancel: the 10 running items are asked to stop; none is settled yet.
    let view = lab
        .engine
        .cancel_batch(&lab.context, batch_id, "operator stop")
        .await
        .unwrap();
    assert_eq!(counts(&view.batch), (100, 90, 80, 10, 0, 0, 10));
    assert_eq!(view.batch.status, BatchStatus::Cancelling);
    assert!(
        view.active,
        "running items keep a cancelled batch active until they stop"
    );
    for (index, claim) in running.iter().enumerate() {
        let heartbeat = lab.engine.heartbeat(&claim.fence(), Some(60_000)).await.unwrap();
        assert!(heartbeat.cancel_requested);
        lab.engine
            .acknowledge_cancel(&lab.context, &claim.fence())
            .await
            .unwrap();
        if index == 4 {
            assert_eq!(counts(&lab.batch_row(batch_id).await), (100, 95, 80, 10, 0, 5, 5));
        }
    }
    let batch = lab.batch_row(batch_id).await;
    assert_eq!(counts(&batch), (100, 100, 80, 10, 0, 10, 0));
    assert_eq!(batch.status, BatchStatus::Cancelled);
    assert!(!is_active(&batch.progress));
    // A settled batch cannot be cancelled again.
    assert!(matches!(
        lab.engine.cancel_batch(&lab.context, batch_id, "").await,
        Err(EngineError::Domain(DomainError::Conflict(_)))
    ));
    lab.verify().await;

    // Resume: only the 20 failed and cancelled items run again.
    let view = lab
        .engine
        .resume_batch(&lab.context, batch_id, "try again")
        .await
        .unwrap();
    assert_eq!(counts(&view.batch), (100, 80, 80, 0, 0, 0, 20));
    assert_eq!(view.batch.status, BatchStatus::Running);
    assert_eq!(view.batch.resumes, 1);
    let again = lab.claim(&["metadata"], 100).await;
    assert_eq!(again.len(), 20, "succeeded items do not run again");
    let rerun: std::collections::BTreeSet<OperationId> = again.iter().map(|claim| claim.operation_id).collect();
    let expected: std::collections::BTreeSet<OperationId> = rest.iter().map(|claim| claim.operation_id).collect();
    assert_eq!(rerun, expected);
    for claim in &again {
        lab.complete(claim).await;
    }
    let view = lab.engine.batch(batch_id).await.unwrap();
    assert_eq!(counts(&view.batch), (100, 100, 100, 0, 0, 0, 0));
    assert_eq!(view.batch.status, BatchStatus::Completed);
    // Each item's history is kept: a failed item failed, resumed, succeeded.
    let failed_item = view
        .items
        .iter()
        .find(|item| item.operation_id == failing[0].operation_id)
        .unwrap();
    assert_eq!(failed_item.runs, 2);
    let history: Vec<serde_json::Value> = serde_json::from_str(&failed_item.history).unwrap();
    let steps: Vec<String> = history
        .iter()
        .map(|entry| {
            entry["outcome"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| "resumed".to_string())
        })
        .collect();
    assert_eq!(steps, ["failed", "resumed", "succeeded"]);
    assert_eq!(view.items.iter().filter(|item| item.runs == 1).count(), 80);
    // No second resume: nothing failed or cancelled is left.
    assert!(lab.engine.resume_batch(&lab.context, batch_id, "").await.is_err());
    lab.verify().await;
}

async fn restart_mid_batch_keeps_it_active_and_it_completes<B: Backend>(backend: &B) {
    let lab = lab(backend, 1, &[]).await;
    let mut media = Vec::new();
    for index in 0..10 {
        media.push(lab.media(&format!("r-{index}.png")).await);
    }
    let batch_id = lab
        .engine
        .create_batch(&lab.context, batch_request("restart", media, &["thumbnail"]))
        .await
        .unwrap()
        .batch
        .batch_id;
    let claims = lab.claim(&["thumbnail"], 5).await;
    for claim in &claims[..3] {
        lab.complete(claim).await;
    }
    // Two more settle through the raw path, which records exactly what it
    // is given and so leaves the batch behind its items (as a build that
    // crashed between the two would): reconciliation must catch it up.
    for claim in &claims[3..5] {
        let operation = lab.engine.operation(claim.operation_id).await.unwrap();
        lab.engine
            .append(vec![StreamAppend {
                stream_id: StreamId::operation(claim.operation_id),
                expected: ExpectedVersion::Exactly(operation.version),
                events: vec![NewEvent {
                    event: Event::OperationSucceeded(opledger_domain::events::OperationSucceeded {
                        operation_id: claim.operation_id,
                        claim_token: Some(claim.claim_token.clone()),
                        output: json!({"ok": true}),
                    }),
                    recorded_at: Timestamp::from_micros(T0),
                    actor: "worker-1".into(),
                    correlation_id: "raw".into(),
                    causation_id: None,
                }],
            }])
            .await
            .unwrap();
    }
    let before = lab.batch_row(batch_id).await;
    assert_eq!(counts(&before), (10, 3, 3, 0, 0, 0, 7));
    drop(lab);

    // A new process, long after every lease expired.
    let lab = lab_with(backend, 1_000, &[]).await;
    lab.clock.set(Timestamp::from_micros(T0 + 3_600_000_000));
    let batch = lab.batch_row(batch_id).await;
    assert_eq!(
        counts(&batch),
        (10, 5, 5, 0, 0, 0, 5),
        "reconciliation recorded the two outcomes"
    );
    assert!(is_active(&batch.progress));
    assert_eq!(batch.status, BatchStatus::Running);
    // An expired lease is not an outcome: recovery requeues, the batch stays active.
    let recovered = lab.engine.recover(&lab.context).await.unwrap();
    assert_eq!(recovered.requeued, 0, "{recovered:?}");
    let view = lab.engine.batch(batch_id).await.unwrap();
    assert!(view.active);
    let status = lab.engine.status().await.unwrap();
    assert_eq!(status.active_batches.len(), 1);
    assert_eq!(status.active_batches[0].remaining, 5);
    for claim in lab.claim(&["thumbnail"], 10).await {
        lab.complete(&claim).await;
    }
    let batch = lab.batch_row(batch_id).await;
    assert_eq!(counts(&batch), (10, 10, 10, 0, 0, 0, 0));
    assert_eq!(batch.status, BatchStatus::Completed);
    assert!(lab.engine.status().await.unwrap().active_batches.is_empty());
    lab.verify().await;
}

async fn expired_lease_keeps_batch_active_until_recovered_work_completes<B: Backend>(backend: &B) {
    let lab = lab(backend, 1, &[]).await;
    let media_id = lab.media("slow.png").await;
    let batch_id = lab
        .engine
        .create_batch(&lab.context, batch_request("slow", vec![media_id], &["metadata"]))
        .await
        .unwrap()
        .batch
        .batch_id;
    let _claim = lab.claim(&["metadata"], 1).await;
    lab.clock.set(Timestamp::from_micros(T0 + 120_000_000));
    let recovered = lab.engine.recover(&lab.context).await.unwrap();
    assert_eq!(recovered.interrupted, 1);
    let view = lab.engine.batch(batch_id).await.unwrap();
    assert!(view.active, "an interrupted item is not settled");
    assert_eq!(counts(&view.batch), (1, 0, 0, 0, 0, 0, 1));
    let claim = lab.claim(&["metadata"], 1).await.remove(0);
    lab.complete(&claim).await;
    assert!(!lab.engine.batch(batch_id).await.unwrap().active);
    lab.verify().await;
}

async fn duplicate_and_repeated_inputs_do_not_inflate_progress<B: Backend>(backend: &B) {
    let lab = lab(backend, 1, &[]).await;
    let first = lab.media("one.png").await;
    let second = lab.media("two.png").await;
    // The same item and kind listed twice are one item each.
    let view = lab
        .engine
        .create_batch(
            &lab.context,
            batch_request("dups", vec![first, second, first], &["metadata", "metadata"]),
        )
        .await
        .unwrap();
    let batch_id = view.batch.batch_id;
    assert_eq!(counts(&view.batch), (2, 0, 0, 0, 0, 0, 2));
    let claims = lab.claim(&["metadata"], 10).await;
    lab.complete(&claims[0]).await;
    assert_eq!(counts(&lab.batch_row(batch_id).await), (2, 1, 1, 0, 0, 0, 1));
    // A repeated report for the settled item adds nothing.
    lab.engine
        .append(vec![StreamAppend {
            stream_id: StreamId::batch(batch_id),
            expected: ExpectedVersion::Any,
            events: vec![NewEvent {
                event: Event::BatchItemSettled(BatchItemSettled {
                    batch_id,
                    operation_id: claims[0].operation_id,
                    outcome: ItemOutcome::Failed.as_str().into(),
                    status: OperationStatus::FailedTerminal,
                    reason: Some("late duplicate report".into()),
                }),
                recorded_at: Timestamp::from_micros(T0),
                actor: "worker-1".into(),
                correlation_id: "raw".into(),
                causation_id: None,
            }],
        }])
        .await
        .unwrap();
    assert_eq!(counts(&lab.batch_row(batch_id).await), (2, 1, 1, 0, 0, 0, 1));

    // A batch over work already done at its revision: skipped, not run again.
    lab.complete(&claims[1]).await;
    let view = lab
        .engine
        .create_batch(&lab.context, batch_request("again", vec![first, second], &["metadata"]))
        .await
        .unwrap();
    assert_eq!(counts(&view.batch), (2, 2, 0, 0, 2, 0, 0));
    assert_eq!(view.batch.status, BatchStatus::Completed);
    assert!(lab.claim(&["metadata"], 10).await.is_empty());

    // Inputs of an ingestion: distinct paths; a duplicate input (the same
    // path twice) is one item, and an input skipped as a duplicate of an
    // asset already identified in the batch counts once, as skipped.
    let mut ingestions = Vec::new();
    for path in ["in/a.png", "in/b.png", "in/copy-of-a.png"] {
        ingestions.push(
            lab.engine
                .create_operation(
                    &lab.context,
                    NewOperation {
                        kind: "ingestion.file".into(),
                        target: OperationTarget {
                            media_id: None,
                            region_id: None,
                            path: Some(path.into()),
                        },
                        revision: None,
                        inputs: json!({}),
                        status: OperationStatus::Queued,
                        priority: 0,
                    },
                )
                .await
                .unwrap(),
        );
    }
    let mut items: Vec<BatchItemSpec> = ingestions
        .iter()
        .map(|operation_id| BatchItemSpec {
            operation_id: *operation_id,
            label: operation_id.to_string(),
        })
        .collect();
    items.push(items[0].clone());
    let ingest_batch = BatchId(uuid::Uuid::from_u128(0xba7c));
    let view = lab
        .engine
        .create_batch_over(&lab.context, ingest_batch, "ingest", "ingestion", items, false)
        .await
        .unwrap();
    assert_eq!(counts(&view.batch), (3, 0, 0, 0, 0, 0, 3));
    lab.engine
        .operation_command(
            &lab.context,
            ingestions[2],
            OperationCommand::Transition {
                cause: Cause::Skip,
                reason: "duplicate of in/a.png".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(counts(&lab.batch_row(ingest_batch).await), (3, 1, 0, 0, 1, 0, 2));
    lab.verify().await;
}

async fn review_queue_routes_resolves_and_closes_on_success<B: Backend>(backend: &B) {
    let lab = lab(backend, 1, &[]).await;
    let media_id = lab.media("broken.png").await;
    for kind in ["metadata", "perceptual_hash"] {
        lab.engine
            .request_task(
                &lab.context,
                TaskRequest {
                    target: TaskTarget::Media(media_id),
                    kind: kind.into(),
                    inputs: if kind == "perceptual_hash" {
                        json!({"algorithm": "dhash64"})
                    } else {
                        json!({})
                    },
                    priority: 0,
                },
            )
            .await
            .unwrap();
    }
    // An optional capability that finds nothing: no entry.
    let hash = lab.claim(&["perceptual_hash"], 1).await.remove(0);
    lab.engine
        .complete_task(
            &lab.context,
            &hash.fence(),
            Completion::NoResult {
                reason: "too small".into(),
            },
        )
        .await
        .unwrap();
    assert!(lab.engine.review_entries().await.unwrap().is_empty());
    assert_eq!(
        lab.capability(media_id, "perceptual_hash").await.status,
        CapabilityStatus::NoResult
    );

    // A terminal failure: one entry, with the reason.
    let metadata = lab.claim(&["metadata"], 1).await.remove(0);
    lab.fail_terminal(&metadata, "not a decodable image: truncated").await;
    let entries = lab.engine.review_entries().await.unwrap();
    assert_eq!(entries.len(), 1);
    let entry = &entries[0];
    assert_eq!(entry.reason_code, "failed_terminal");
    assert_eq!(entry.operation_id, metadata.operation_id);
    assert!(entry.detail.as_deref().unwrap().contains("truncated"));
    assert_eq!(lab.engine.status().await.unwrap().review_queue, 1);

    // Retry re-enters the work protocol; the entry leaves the queue and
    // closes when the work succeeds.
    let retried = lab
        .engine
        .resolve_review(&lab.context, entry.entry_id, ReviewAction::Retry, None, "file replaced")
        .await
        .unwrap();
    assert_eq!(retried.state, EntryState::Retrying);
    assert!(lab.engine.review_entries().await.unwrap().is_empty());
    // Resolving it again is refused: it is no longer open.
    assert!(matches!(
        lab.engine
            .resolve_review(&lab.context, entry.entry_id, ReviewAction::Dismiss, None, "")
            .await,
        Err(EngineError::Domain(DomainError::Conflict(_)))
    ));
    let again = lab.claim(&["metadata"], 1).await.remove(0);
    assert_eq!(again.operation_id, metadata.operation_id);
    lab.fail_terminal(&again, "still broken").await;
    // Failing again opens a new entry.
    let entries = lab.engine.review_entries().await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_ne!(entries[0].entry_id, entry.entry_id);
    let second = entries[0].entry_id;
    lab.engine
        .resolve_review(
            &lab.context,
            second,
            ReviewAction::Retry,
            Some(again.revision.clone()),
            "fixed",
        )
        .await
        .unwrap();
    let third = lab.claim(&["metadata"], 1).await.remove(0);
    lab.complete(&third).await;
    let closed = lab.engine.review_entry(second).await.unwrap();
    assert_eq!(closed.state, EntryState::Resolved);
    assert_eq!(closed.resolution.as_deref(), Some("retry"));
    assert_eq!(
        lab.capability(media_id, "metadata").await.status,
        CapabilityStatus::Succeeded
    );

    // Dismiss and acknowledge close entries and leave the work as it is;
    // an unknown revision is refused and writes nothing.
    let other = lab.media("other.png").await;
    lab.engine
        .request_task(
            &lab.context,
            TaskRequest {
                target: TaskTarget::Media(other),
                kind: "metadata".into(),
                inputs: json!({}),
                priority: 0,
            },
        )
        .await
        .unwrap();
    let claim = lab.claim(&["metadata"], 1).await.remove(0);
    lab.fail_terminal(&claim, "unsupported format").await;
    let entry = lab.engine.review_entries().await.unwrap().remove(0);
    let head = lab.engine.store().head().await.unwrap();
    assert!(matches!(
        lab.engine
            .resolve_review(
                &lab.context,
                entry.entry_id,
                ReviewAction::Retry,
                Some("f".repeat(64)),
                ""
            )
            .await,
        Err(EngineError::Domain(DomainError::InvalidInput(_)))
    ));
    assert!(matches!(
        lab.engine
            .resolve_review(
                &lab.context,
                entry.entry_id,
                ReviewAction::Dismiss,
                Some("x".into()),
                ""
            )
            .await,
        Err(EngineError::Domain(DomainError::InvalidInput(_)))
    ));
    assert_eq!(
        lab.engine.store().head().await.unwrap(),
        head,
        "refusals append nothing"
    );
    let dismissed = lab
        .engine
        .resolve_review(
            &lab.context,
            entry.entry_id,
            ReviewAction::Acknowledge,
            None,
            "known bad file",
        )
        .await
        .unwrap();
    assert_eq!(dismissed.state, EntryState::Resolved);
    assert_eq!(dismissed.resolved_by.as_deref(), Some("test"));
    assert_eq!(
        lab.engine.operation(claim.operation_id).await.unwrap().status,
        OperationStatus::FailedTerminal
    );
    assert!(lab.engine.review_entries().await.unwrap().is_empty());
    lab.verify().await;
}

/// The dashboard's running counts against counts of the tables themselves.
async fn assert_status_counts_match_the_tables<S: Store>(lab: &Lab<S>) {
    let status = lab.engine.status().await.unwrap();
    let store = lab.engine.store();
    let counted = store.count_by(&CAPABILITY_STATES_TABLE, "status").await.unwrap();
    for (name, count) in &status.capabilities_by_status {
        let expected = counted
            .iter()
            .find(|(value, _)| value.as_deref() == Some(name.as_str()))
            .map_or(0, |(_, count)| *count);
        assert_eq!(*count, expected, "capabilities {name}: {status:?}");
    }
    let review = store.count_by(&REVIEW_TABLE, "state").await.unwrap();
    let open = review
        .iter()
        .find(|(state, _)| state.as_deref() == Some(EntryState::Open.as_str()))
        .map_or(0, |(_, count)| *count);
    assert_eq!(status.review_queue, open, "{status:?}");
    assert_eq!(status.regions, store.count_rows(&REGIONS_TABLE).await.unwrap());
    assert_eq!(status.media, store.count_rows(&MEDIA_TABLE).await.unwrap());
}

fn capability_count(status: &opledger_engine::StatusReport, name: &str) -> i64 {
    status
        .capabilities_by_status
        .iter()
        .find(|(status, _)| status == name)
        .map_or(0, |(_, count)| *count)
}

async fn status_counts_stay_true_when_media_with_capabilities_and_regions_is_removed<B: Backend>(backend: &B) {
    let lab = lab(backend, 1, &[]).await;
    let kept = lab.media("kept.png").await;
    let removed = lab.media("removed.png").await;
    for media_id in [kept, removed] {
        for (kind, inputs) in [
            ("metadata", json!({})),
            ("thumbnail", json!({"max_side": 256, "format": "png"})),
        ] {
            lab.engine
                .request_task(
                    &lab.context,
                    TaskRequest {
                        target: TaskTarget::Media(media_id),
                        kind: kind.into(),
                        inputs,
                        priority: 0,
                    },
                )
                .await
                .unwrap();
        }
    }
    let bbox = BoundingBox {
        x: 0,
        y: 0,
        width: 10,
        height: 10,
    };
    lab.engine.add_region(&lab.context, kept, bbox, 1).await.unwrap();
    for _ in 0..2 {
        lab.engine.add_region(&lab.context, removed, bbox, 1).await.unwrap();
    }
    for claim in lab.claim(&["metadata"], 2).await {
        lab.complete(&claim).await;
    }
    for claim in lab.claim(&["thumbnail"], 2).await {
        if claim.media_id == Some(removed) {
            lab.fail_terminal(&claim, "decoding failed").await;
        } else {
            lab.complete(&claim).await;
        }
    }
    let before = lab.engine.status().await.unwrap();
    assert_eq!(capability_count(&before, "succeeded"), 3, "{before:?}");
    assert_eq!(capability_count(&before, "failed_terminal"), 1, "{before:?}");
    assert_eq!((before.media, before.regions, before.review_queue), (2, 3, 1));
    assert_status_counts_match_the_tables(&lab).await;

    // The removed item's capabilities and regions go by cascade; the
    // counts go down with them. Its review entry stays: it is history.
    lab.engine
        .remove_media(&lab.context, removed, "deleted by the user")
        .await
        .unwrap();
    let after = lab.engine.status().await.unwrap();
    assert_eq!(capability_count(&after, "succeeded"), 2, "{after:?}");
    assert_eq!(capability_count(&after, "failed_terminal"), 0, "{after:?}");
    assert_eq!((after.media, after.regions, after.review_queue), (1, 1, 1));
    assert_status_counts_match_the_tables(&lab).await;
    lab.verify().await;
}

backend_tests!(
    status_counts_stay_true_when_media_with_capabilities_and_regions_is_removed,
    capability_goes_pending_to_succeeded_then_stale_and_back,
    batch_of_100_counts_exactly_through_failures_cancel_and_resume,
    restart_mid_batch_keeps_it_active_and_it_completes,
    expired_lease_keeps_batch_active_until_recovered_work_completes,
    duplicate_and_repeated_inputs_do_not_inflate_progress,
    review_queue_routes_resolves_and_closes_on_success,
);
