//! An item whose content changes media kind while a worker holds one of
//! its tasks, on a real database of each backend: the request at the new
//! revision leaves the held claim to its worker, and however the claim
//! ends — an answer for the old revision, a claim given back, a lease that
//! expired — the task does not go back to the queue for content its kind
//! does not apply to: it ends `not_applicable`, its batch item settles,
//! and replay agrees. The same steps with content of the same kind queue
//! the task for the new revision.

use crate::support;
use opledger_domain::events::{Event, MediaUpdated};
use opledger_domain::{MediaId, NewEvent, OperationStatus, StreamId};
use opledger_engine::{
    BatchRequest, ClaimRequest, Completion, Engine, FixedClock, PageRequest, TaskClaim, TaskRequest, TaskTarget,
};
use opledger_store::{ExpectedVersion, Store, StreamAppend};
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::sync::Arc;

const PIPELINE: &str = r#"
[[kind]]
name = "thumbnail"
target = "media"
version = "1"
capability = "thumbnail"
required = false
applies_to = ["image"]
"#;

/// How the worker's claim ends after the content changed.
#[derive(Debug, Clone, Copy)]
enum End {
    /// It answers for the revision it claimed.
    Completes,
    /// It gives the claim back unused.
    Releases,
    /// It dies; recovery interrupts the expired lease and requeues.
    Expires,
}

use crate::support::context;

fn digest(n: u8) -> String {
    format!("sha256:{}", format!("{n:02x}").repeat(32))
}

fn thumbnail(media: MediaId) -> TaskRequest {
    TaskRequest {
        target: TaskTarget::Media(media),
        kind: "thumbnail".into(),
        inputs: json!({}),
        priority: 0,
    }
}

async fn claim<S: Store>(engine: &Engine<S>) -> Vec<TaskClaim> {
    engine
        .claim_tasks(
            &context(),
            ClaimRequest {
                kinds: vec!["thumbnail".into()],
                worker: "w".into(),
                lease_ms: 30_000,
                limit: 10,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap()
}

async fn engine<B: Backend>(backend: &B) -> (Engine<B::Store>, Arc<FixedClock>) {
    let (engine, clock) = support::engine_with_clock(backend).await;
    support::declare(&engine, PIPELINE).await;
    (engine, clock)
}

/// Runs the steps on a new photo: its thumbnail claimed, its content
/// replaced by content of `new_kind` and the task requested at the new
/// revision, the claim ended as `end` says. Returns the task's status, its
/// reason, and its batch's settled count.
async fn replace_while_held<S: Store>(
    engine: &Engine<S>,
    clock: &FixedClock,
    new_kind: &str,
    end: End,
) -> (OperationStatus, String, i64) {
    let path = format!("/{end:?}.jpg");
    let photo = engine
        .register_media(&context(), &path, "image", Some(digest(1)), Some(10))
        .await
        .unwrap();
    let batch = engine
        .create_batch(
            &context(),
            BatchRequest {
                name: "thumbnails".into(),
                media: vec![photo],
                kinds: vec!["thumbnail".into()],
                inputs: Default::default(),
                priority: 0,
            },
        )
        .await
        .unwrap();
    let held = claim(engine).await;
    assert_eq!(held.len(), 1);

    // The file is replaced under the same name, as an ingest records it.
    engine
        .append(vec![StreamAppend {
            stream_id: StreamId::media(photo),
            expected: ExpectedVersion::Any,
            events: vec![NewEvent {
                event: Event::MediaUpdated(MediaUpdated {
                    media_id: photo,
                    path: path.clone(),
                    content_digest: Some(digest(2)),
                    byte_size: Some(20),
                    media_kind: (new_kind != "image").then(|| new_kind.to_string()),
                }),
                recorded_at: engine.now(),
                actor: "test".into(),
                correlation_id: "replace".into(),
                causation_id: None,
            }],
        }])
        .await
        .unwrap();
    let requested = engine.request_task(&context(), thumbnail(photo)).await.unwrap();
    assert!(requested.created, "a new revision is requested");
    assert_eq!(
        requested.status,
        OperationStatus::Leased,
        "the held claim is left to its worker"
    );

    let fence = held[0].fence();
    match end {
        End::Completes => {
            engine
                .complete_task(&context(), &fence, Completion::Output(json!({"width": 1})))
                .await
                .unwrap();
        }
        End::Releases => {
            engine.release_task(&context(), &fence, "shutting down").await.unwrap();
        }
        End::Expires => {
            clock.advance_millis(31_000);
            let report = engine.recover(&context()).await.unwrap();
            assert_eq!(report.interrupted, 1);
        }
    }
    let state = engine
        .task_by_operation(requested.operation_id)
        .await
        .unwrap()
        .expect("the task")
        .state;
    let row = engine.operation(requested.operation_id).await.unwrap();
    let settled = engine
        .batch_page(batch.batch.batch_id, &PageRequest::default())
        .await
        .unwrap()
        .batch
        .progress
        .settled;
    assert!(
        engine.verify().await.unwrap().is_identical(),
        "replay agrees with the inline projections"
    );
    (state.status, row.status_reason.unwrap_or_default(), settled)
}

async fn a_task_held_when_its_items_content_turns_into_another_kind_ends_not_applicable_however_its_claim_ends<
    B: Backend,
>(
    backend: &B,
) {
    let (engine, clock) = engine(backend).await;
    for end in [End::Completes, End::Releases, End::Expires] {
        let (status, reason, settled) = replace_while_held(&engine, &clock, "audio", end).await;
        assert_eq!(status, OperationStatus::NotApplicable, "{end:?}");
        assert_eq!(reason, r#"thumbnail applies to image, not to "audio""#, "{end:?}");
        assert_eq!(settled, 1, "{end:?}: the batch item settled");
        assert!(claim(&engine).await.is_empty(), "{end:?}: nothing to claim");
    }
}

async fn a_task_held_when_its_items_content_changes_within_its_kind_runs_again_at_the_new_revision<B: Backend>(
    backend: &B,
) {
    let (engine, clock) = engine(backend).await;
    for end in [End::Completes, End::Releases, End::Expires] {
        let (status, _, settled) = replace_while_held(&engine, &clock, "image", end).await;
        assert_eq!(status, OperationStatus::Queued, "{end:?}");
        assert_eq!(settled, 0, "{end:?}");
        let again = claim(&engine).await;
        assert_eq!(again.len(), 1, "{end:?}: claimable at the new revision");
        assert_eq!(
            again[0].inputs["content_digest"],
            json!(digest(2)),
            "{end:?}: on the new content"
        );
        engine
            .complete_task(&context(), &again[0].fence(), Completion::Output(json!({"width": 2})))
            .await
            .unwrap();
    }
}

backend_tests!(
    a_task_held_when_its_items_content_turns_into_another_kind_ends_not_applicable_however_its_claim_ends,
    a_task_held_when_its_items_content_changes_within_its_kind_runs_again_at_the_new_revision,
);
