//! A scenario that writes every event type this build knows, through the
//! engine's commands alone, with a fixed clock, ids and jitter: what a new
//! golden log is made from (`OPLEDGER_WRITE_GOLDEN_LOG=NAME`). Its events
//! are real commands' events, so a golden log made from it holds what a
//! release writes, not what someone thought it writes.

use opledger_domain::decide::OperationCommand;
use opledger_domain::events::{BoundingBox, OperationTarget};
use opledger_domain::review::ReviewAction;
use opledger_domain::transitions::Cause;
use opledger_domain::{IngestionStage, OperationStatus, Timestamp};
use opledger_engine::{
    parse_kinds, BatchRequest, ClaimRequest, CommandContext, Completion, Engine, FileObservation, FixedClock,
    FixedJitter, NewOperation, Progress, SequentialIds, TaskClaim, TaskRequest, TaskTarget,
};
use opledger_testkit::Harness;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;

const KINDS: &str = r#"
[[kind]]
name = "describe"
target = "media"
version = "1"
capability = "facts"
required = true
applies_to = ["image"]
purpose = "the facts of a picture"
inputs.detail = { type = "integer", min = 1, max = 3, default = 1 }
retry = { max_attempts = 2, base_backoff_ms = 1000, jitter = 0.25, exhausted = "failed_terminal" }

[[kind]]
name = "caption"
target = "media"
version = "1"
capability = "caption"
required = false
applies_to = ["image"]
needs = ["facts"]
purpose = "a sentence about a picture"
inputs.words = { type = "integer", default = 12 }
retry = { max_attempts = 1, exhausted = "dead_lettered" }

[[kind]]
name = "crop"
target = "region"
version = "1"
required = false
purpose = "a crop of a region"
"#;

fn claim(kinds: &[&str], worker: &str) -> ClaimRequest {
    ClaimRequest {
        kinds: kinds.iter().map(|kind| kind.to_string()).collect(),
        worker: worker.into(),
        lease_ms: 30_000,
        limit: 10,
        principal: None,
        versions: Default::default(),
    }
}

fn request(target: TaskTarget, kind: &str, inputs: serde_json::Value) -> TaskRequest {
    TaskRequest {
        target,
        kind: kind.into(),
        inputs,
        priority: 0,
    }
}

async fn one<S: opledger_store::Store>(engine: &Engine<S>, kinds: &[&str], worker: &str) -> TaskClaim {
    let mut claims = engine
        .claim_tasks(&CommandContext::actor(worker), claim(kinds, worker))
        .await
        .unwrap();
    assert_eq!(claims.len(), 1, "{kinds:?}: {claims:?}");
    claims.remove(0)
}

/// Runs the scenario on a fresh database of `harness`; answers its engine.
pub async fn run<H: Harness>(harness: &H) -> Engine<H::Store> {
    let clock = Arc::new(FixedClock::at(Timestamp::parse("2026-12-03T09:00:00.000000Z").unwrap()));
    let engine = Engine::with_clock(harness.open().await, clock.clone(), Arc::new(SequentialIds::default()))
        .with_jitter(Arc::new(FixedJitter(500)));
    engine.startup().await.unwrap();
    let admin = CommandContext::actor("admin");
    let worker = CommandContext::actor("w1");
    let tick = || clock.advance_millis(1_000);

    // Declarations: task_kind_declared.
    engine
        .apply_kinds(&admin, &parse_kinds(KINDS).unwrap(), false)
        .await
        .unwrap();
    tick();
    // The registry: media_registered, media_updated, region_added.
    let photo = engine
        .register_media(
            &admin,
            "/photos/harbour.jpg",
            "image",
            Some(format!("sha256:{}", "a".repeat(64))),
            Some(1_000),
        )
        .await
        .unwrap();
    engine
        .update_media(
            &admin,
            photo,
            "/photos/harbour.jpg",
            Some(format!("sha256:{}", "b".repeat(64))),
            Some(1_200),
        )
        .await
        .unwrap();
    let song = engine
        .register_media(
            &admin,
            "/music/song.mp3",
            "audio",
            Some(format!("sha256:{}", "c".repeat(64))),
            Some(9_000),
        )
        .await
        .unwrap();
    let region = engine
        .add_region(
            &admin,
            photo,
            BoundingBox {
                x: 1,
                y: 2,
                width: 30,
                height: 40,
            },
            1,
        )
        .await
        .unwrap();
    tick();

    // Requests: operation_created; operation_blocked (a need not met);
    // operation_not_applicable (a kind for images on a song).
    engine
        .request_task(&admin, request(TaskTarget::Media(photo), "describe", json!({})))
        .await
        .unwrap();
    engine
        .request_task(&admin, request(TaskTarget::Media(photo), "caption", json!({})))
        .await
        .unwrap();
    engine
        .request_task(&admin, request(TaskTarget::Media(song), "describe", json!({})))
        .await
        .unwrap();
    tick();

    // A claim, a phase, a new revision meanwhile: operation_claimed,
    // operation_progressed, operation_revision_requested,
    // operation_superseded.
    let first = one(&engine, &["describe"], "w1").await;
    engine
        .report_progress(
            &worker,
            &first.fence(),
            Progress {
                phase: "looking".into(),
                processed: 1,
                total: Some(2),
            },
        )
        .await
        .unwrap();
    engine
        .request_task(
            &admin,
            request(TaskTarget::Media(photo), "describe", json!({"detail": 2})),
        )
        .await
        .unwrap();
    engine
        .complete_task(&worker, &first.fence(), Completion::Output(json!({"facts": 1})))
        .await
        .unwrap();
    tick();
    // Given back unused: operation_released.
    let given_back = one(&engine, &["describe"], "w1").await;
    engine
        .release_task(&worker, &given_back.fence(), "shutting down")
        .await
        .unwrap();
    tick();
    // A retryable failure: operation_failed, operation_retry_scheduled;
    // then a success (operation_succeeded) that meets the caption's need
    // (operation_unblocked).
    let flaky = one(&engine, &["describe"], "w1").await;
    engine
        .fail_task(&worker, &flaky.fence(), "timed out", false)
        .await
        .unwrap();
    clock.advance_millis(10_000);
    let done = one(&engine, &["describe"], "w1").await;
    engine
        .complete_task(&worker, &done.fence(), Completion::Output(json!({"facts": 2})))
        .await
        .unwrap();
    tick();
    // Nothing to say: operation_found_nothing.
    let caption = one(&engine, &["caption"], "w1").await;
    engine
        .complete_task(
            &worker,
            &caption.fence(),
            Completion::NoResult {
                reason: "no words for it".into(),
            },
        )
        .await
        .unwrap();
    tick();
    // Asked again and failed with no attempts left: operation_dead_lettered.
    engine
        .request_task(
            &admin,
            request(TaskTarget::Media(photo), "caption", json!({"words": 20})),
        )
        .await
        .unwrap();
    let caption = one(&engine, &["caption"], "w1").await;
    engine
        .fail_task(&worker, &caption.fence(), "model gone", false)
        .await
        .unwrap();
    tick();

    // A region's task whose worker vanished: operation_interrupted,
    // operation_requeued; then cancelled while claimed:
    // operation_cancel_requested, operation_cancelled.
    engine
        .request_task(&admin, request(TaskTarget::Region(region), "crop", json!({})))
        .await
        .unwrap();
    let _lost = one(&engine, &["crop"], "w-gone").await;
    clock.advance_millis(60_000);
    engine.recover(&CommandContext::actor("recovery")).await.unwrap();
    let crop = one(&engine, &["crop"], "w1").await;
    engine
        .cancel_task(&admin, crop.operation_id, "not wanted")
        .await
        .unwrap();
    engine.acknowledge_cancel(&worker, &crop.fence()).await.unwrap();
    tick();

    // A terminal failure of required work opens a review entry; a retry
    // (review_resolved, operation_reopened) runs it again.
    let second = engine
        .register_media(
            &admin,
            "/photos/pier.jpg",
            "image",
            Some(format!("sha256:{}", "d".repeat(64))),
            Some(800),
        )
        .await
        .unwrap();
    engine
        .request_task(&admin, request(TaskTarget::Media(second), "describe", json!({})))
        .await
        .unwrap();
    let broken = one(&engine, &["describe"], "w1").await;
    engine
        .fail_task(&worker, &broken.fence(), "not a picture", true)
        .await
        .unwrap();
    let entry = engine.review_entries().await.unwrap();
    let entry = entry
        .iter()
        .find(|entry| entry.operation_id == broken.operation_id)
        .expect("a review entry for the failed work");
    engine
        .resolve_review(&admin, entry.entry_id, ReviewAction::Retry, None, "a better decoder")
        .await
        .unwrap();
    let again = one(&engine, &["describe"], "w1").await;
    engine
        .complete_task(&worker, &again.fence(), Completion::Output(json!({"facts": 3})))
        .await
        .unwrap();
    tick();

    // A batch: batch_created, batch_items_added, batch_item_settled;
    // cancelled (batch_cancel_requested) and resumed (batch_resumed).
    let third = engine
        .register_media(
            &admin,
            "/photos/boats.jpg",
            "image",
            Some(format!("sha256:{}", "e".repeat(64))),
            Some(700),
        )
        .await
        .unwrap();
    let batch = engine
        .create_batch(
            &admin,
            BatchRequest {
                name: "describe everything".into(),
                media: vec![second, third],
                kinds: vec!["describe".into()],
                inputs: BTreeMap::new(),
                priority: 0,
            },
        )
        .await
        .unwrap();
    let batch_id = batch.batch.batch_id;
    engine.cancel_batch(&admin, batch_id, "wrong folder").await.unwrap();
    engine
        .resume_batch(&admin, batch_id, "right folder after all")
        .await
        .unwrap();
    let resumed = one(&engine, &["describe"], "w1").await;
    engine
        .complete_task(&worker, &resumed.fence(), Completion::Output(json!({"facts": 4})))
        .await
        .unwrap();
    tick();

    // A new version of a kind: task_version_changed.
    engine
        .apply_kinds(
            &admin,
            &parse_kinds(&KINDS.replacen("version = \"1\"", "version = \"2\"", 1)).unwrap(),
            false,
        )
        .await
        .unwrap();
    tick();

    // A file ingestion: operation_started, operation_stage_changed; a file
    // gone from disk: operation_missing_confirmed.
    let file = FileObservation {
        path: "/photos/new.jpg".into(),
        byte_size: 10,
        modified_ns: 1_000,
    };
    let ingestions = engine
        .begin_ingestions(
            &CommandContext::actor("ingest"),
            "ingest-1",
            60_000,
            vec![file],
            Vec::new(),
        )
        .await
        .unwrap();
    engine
        .change_stage(
            &CommandContext::actor("ingest"),
            ingestions[0].operation_id,
            IngestionStage::Hashing,
        )
        .await
        .unwrap();
    engine
        .finish_ingestions(
            &CommandContext::actor("ingest"),
            vec![(ingestions[0].clone(), Err("unreadable".into()))],
        )
        .await
        .unwrap();
    engine
        .confirm_missing_files(
            &CommandContext::actor("ingest"),
            vec![FileObservation {
                path: "/photos/old.jpg".into(),
                byte_size: 5,
                modified_ns: 500,
            }],
        )
        .await
        .unwrap();
    tick();

    // Operations that are not tasks: operation_queued, operation_skipped.
    for (cause, reason) in [(Cause::Enqueue, "go"), (Cause::Skip, "nothing to export")] {
        let operation = engine
            .create_operation(
                &admin,
                NewOperation {
                    kind: "export".into(),
                    target: OperationTarget {
                        media_id: None,
                        region_id: None,
                        path: Some("/exports/all.csv".into()),
                    },
                    revision: None,
                    inputs: json!({}),
                    status: OperationStatus::Pending,
                    priority: 0,
                },
            )
            .await
            .unwrap();
        engine
            .operation_command(
                &admin,
                operation,
                OperationCommand::Transition {
                    cause,
                    reason: reason.into(),
                },
            )
            .await
            .unwrap();
    }
    tick();

    // Removals: region_removed, media_removed.
    engine
        .remove_region(&admin, photo, region, "cropped away")
        .await
        .unwrap();
    engine.remove_media(&admin, song, "deleted").await.unwrap();
    engine
}
