//! `needs` on a real database of each backend: a task whose kind needs a
//! capability of its item waits, blocked and out of the review queue, until
//! that capability has succeeded, and is then queued in the same
//! transaction without another call; a need whose work ends without a
//! result leaves it blocked with that reason, in the review queue only for
//! a required kind; reopening the need puts it back to waiting.

use crate::support;
use opledger_domain::kinds::DEPENDENCY_SATISFIED;
use opledger_domain::review::ReviewAction;
use opledger_domain::{CapabilityStatus, Event, MediaId, OperationId, OperationStatus, Timestamp};
use opledger_engine::{
    parse_kinds, ClaimRequest, Completion, Engine, FixedClock, SequentialIds, TaskClaim, TaskRequest, TaskTarget,
};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::{json, Value};
use std::sync::Arc;

/// Metadata, and two kinds that need it: a required caption and an
/// optional summary; faces, optional, and a kind that needs faces.
const PIPELINE: &str = r#"
[[kind]]
name = "metadata"
target = "media"
version = "1"
inputs.extractor = { type = "string" }

[[kind]]
name = "caption"
target = "media"
version = "1"
required = true
needs = ["metadata"]
inputs.model = { type = "string", default = "blip" }

[[kind]]
name = "summary"
target = "media"
version = "1"
required = false
needs = ["metadata"]

[[kind]]
name = "faces"
target = "media"
version = "1"
required = false

[[kind]]
name = "face_tags"
target = "media"
version = "1"
required = true
needs = ["faces", "metadata"]
"#;

async fn engine<B: Backend>(backend: &B) -> Engine<B::Store> {
    let engine = support::engine(backend).await;
    support::declare(&engine, PIPELINE).await;
    engine
}

use crate::support::context;

async fn item<S: Store>(engine: &Engine<S>, path: &str) -> MediaId {
    engine
        .register_media(
            &context(),
            path,
            "image",
            Some(format!("sha256:{:064x}", path.len())),
            Some(10),
        )
        .await
        .unwrap()
}

fn request(media: MediaId, kind: &str, inputs: Value) -> TaskRequest {
    TaskRequest {
        target: TaskTarget::Media(media),
        kind: kind.into(),
        inputs,
        priority: 0,
    }
}

async fn ask<S: Store>(engine: &Engine<S>, media: MediaId, kind: &str) -> (OperationId, OperationStatus) {
    let outcome = engine
        .request_task(&context(), request(media, kind, json!({})))
        .await
        .unwrap();
    (outcome.operation_id, outcome.status)
}

async fn claim<S: Store>(engine: &Engine<S>, kind: &str) -> Vec<TaskClaim> {
    engine
        .claim_tasks(
            &context(),
            ClaimRequest {
                kinds: vec![kind.into()],
                worker: "w-1".into(),
                lease_ms: 30_000,
                limit: 10,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap()
}

async fn complete<S: Store>(engine: &Engine<S>, kind: &str) {
    let claims = claim(engine, kind).await;
    assert_eq!(claims.len(), 1, "one {kind} task to run");
    engine
        .complete_task(&context(), &claims[0].fence(), Completion::Output(json!({})))
        .await
        .unwrap();
}

async fn fail_for_good<S: Store>(engine: &Engine<S>, kind: &str) {
    let claims = claim(engine, kind).await;
    assert_eq!(claims.len(), 1, "one {kind} task to run");
    engine
        .fail_task(&context(), &claims[0].fence(), "decoder crashed", true)
        .await
        .unwrap();
}

async fn status_of<S: Store>(engine: &Engine<S>, operation: OperationId) -> (OperationStatus, Option<String>) {
    let row = engine.operation(operation).await.unwrap();
    (row.status, row.status_reason)
}

async fn capability<S: Store>(engine: &Engine<S>, media: MediaId, name: &str) -> CapabilityStatus {
    engine
        .capabilities(media)
        .await
        .unwrap()
        .into_iter()
        .find(|row| row.capability == name)
        .unwrap_or_else(|| panic!("no {name} capability"))
        .status
}

/// The operations with an open review entry, with its reason code.
async fn in_review<S: Store>(engine: &Engine<S>) -> Vec<(OperationId, String)> {
    engine
        .review_entries()
        .await
        .unwrap()
        .into_iter()
        .map(|entry| (entry.operation_id, entry.reason_code))
        .collect()
}

async fn assert_replays<S: Store>(engine: &Engine<S>) {
    let report = engine.verify().await.unwrap();
    assert!(report.is_identical(), "{}", report.render());
}

async fn a_task_waits_blocked_until_its_need_succeeds_then_is_queued_without_another_call<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let photo = item(&engine, "/photo.jpg").await;
    let (caption, status) = ask(&engine, photo, "caption").await;
    assert_eq!(status, OperationStatus::Blocked);
    assert_eq!(
        status_of(&engine, caption).await,
        (
            OperationStatus::Blocked,
            Some("needs capability metadata (not requested)".into())
        )
    );
    assert_eq!(capability(&engine, photo, "caption").await, CapabilityStatus::Blocked);
    assert!(
        claim(&engine, "caption").await.is_empty(),
        "a blocked task is never claimable"
    );
    assert!(
        in_review(&engine).await.is_empty(),
        "waiting for work in progress needs nobody"
    );

    let (_, status) = ask(&engine, photo, "metadata").await;
    assert_eq!(status, OperationStatus::Queued);
    complete(&engine, "metadata").await;
    // Nothing else was called: the completion queued the caption.
    assert_eq!(
        status_of(&engine, caption).await,
        (OperationStatus::Queued, Some(DEPENDENCY_SATISFIED.into()))
    );
    let timeline = engine.timeline(caption).await.unwrap();
    let last: Vec<(&str, &str, &str)> = timeline[timeline.len() - 2..]
        .iter()
        .map(|envelope| {
            let reason = match &envelope.event {
                Event::OperationUnblocked(reason) | Event::OperationQueued(reason) => reason.reason.as_str(),
                other => panic!("unexpected {other:?}"),
            };
            (envelope.event.event_type(), reason, envelope.actor.as_str())
        })
        .collect();
    assert_eq!(
        last,
        [
            ("operation_unblocked", DEPENDENCY_SATISFIED, "system"),
            ("operation_queued", DEPENDENCY_SATISFIED, "system"),
        ]
    );
    assert!(
        timeline[timeline.len() - 1]
            .causation_id
            .as_deref()
            .is_some_and(|cause| cause.starts_with("seq:")),
        "caused by the event that satisfied it"
    );
    complete(&engine, "caption").await;
    assert_eq!(capability(&engine, photo, "caption").await, CapabilityStatus::Succeeded);
    assert_replays(&engine).await;
}

async fn a_need_that_fails_for_good_keeps_the_task_blocked_with_that_reason_in_review_only_when_required<B: Backend>(
    backend: &B,
) {
    let engine = engine(backend).await;
    let photo = item(&engine, "/photo.jpg").await;
    let (metadata, _) = ask(&engine, photo, "metadata").await;
    let (caption, _) = ask(&engine, photo, "caption").await;
    let (summary, _) = ask(&engine, photo, "summary").await;
    assert_eq!(
        status_of(&engine, caption).await.1.as_deref(),
        Some("needs capability metadata (queued)")
    );
    fail_for_good(&engine, "metadata").await;
    let stuck = Some("needs capability metadata (failed_terminal)".to_string());
    assert_eq!(
        status_of(&engine, caption).await,
        (OperationStatus::Blocked, stuck.clone())
    );
    assert_eq!(status_of(&engine, summary).await, (OperationStatus::Blocked, stuck));
    // The required caption needs a person; the optional summary does not.
    let review = in_review(&engine).await;
    assert_eq!(
        review,
        [(metadata, "failed_terminal".into()), (caption, "blocked".into())]
    );

    // Retrying the blocked caption retries what it waits for: the
    // metadata is reopened, its dependents wait for it again, out of the
    // queue, and its success releases both.
    let entry = engine.review_entries().await.unwrap()[1].entry_id;
    engine
        .resolve_review(&context(), entry, ReviewAction::Retry, None, "decoder fixed")
        .await
        .unwrap();
    let (status, reason) = status_of(&engine, metadata).await;
    assert_eq!(status, OperationStatus::Queued);
    assert_eq!(
        reason.as_deref(),
        Some("retry of caption from the review queue: decoder fixed")
    );
    assert_eq!(
        status_of(&engine, caption).await,
        (
            OperationStatus::Blocked,
            Some("needs capability metadata (queued)".into())
        )
    );
    assert!(in_review(&engine).await.is_empty(), "{:?}", in_review(&engine).await);
    complete(&engine, "metadata").await;
    assert_eq!(status_of(&engine, caption).await.0, OperationStatus::Queued);
    assert_eq!(status_of(&engine, summary).await.0, OperationStatus::Queued);
    assert_replays(&engine).await;
}

async fn a_task_with_several_needs_waits_for_the_last_and_names_one_that_ended_without_a_result<B: Backend>(
    backend: &B,
) {
    let engine = engine(backend).await;
    let photo = item(&engine, "/photo.jpg").await;
    let other = item(&engine, "/other.jpg").await;
    // Requested in one batch, needs and all: the needs requested beside it
    // are waited for as queued work.
    let outcomes = engine
        .request_tasks(
            &context(),
            vec![
                request(photo, "metadata", json!({})),
                request(photo, "faces", json!({})),
                request(photo, "face_tags", json!({})),
                request(other, "faces", json!({})),
                request(other, "metadata", json!({})),
                request(other, "face_tags", json!({})),
            ],
        )
        .await
        .unwrap();
    let face_tags = outcomes[2].as_ref().unwrap().operation_id;
    let other_face_tags = outcomes[5].as_ref().unwrap().operation_id;
    assert_eq!(
        status_of(&engine, face_tags).await.1.as_deref(),
        Some("needs capability faces (queued)")
    );
    // One need met: it waits for the other.
    let claims = claim(&engine, "metadata").await;
    assert_eq!(claims.len(), 2);
    for claim in &claims {
        engine
            .complete_task(&context(), &claim.fence(), Completion::Output(json!({})))
            .await
            .unwrap();
    }
    assert_eq!(
        status_of(&engine, face_tags).await,
        (OperationStatus::Blocked, Some("needs capability faces (queued)".into()))
    );
    // Faces finds nothing on the photo, and something on the other item.
    for claim in claim(&engine, "faces").await {
        let completion = if claim.media_id == Some(photo) {
            Completion::NoResult {
                reason: "no faces".into(),
            }
        } else {
            Completion::Output(json!({"faces": 2}))
        };
        engine
            .complete_task(&context(), &claim.fence(), completion)
            .await
            .unwrap();
    }
    assert_eq!(
        status_of(&engine, face_tags).await,
        (
            OperationStatus::Blocked,
            Some("needs capability faces (no_result)".into())
        )
    );
    assert_eq!(status_of(&engine, other_face_tags).await.0, OperationStatus::Queued);
    assert_eq!(
        in_review(&engine).await,
        [(face_tags, "blocked".into())],
        "face_tags is required; faces finding nothing is not a failure of its own"
    );
    assert_replays(&engine).await;
}

async fn work_that_runs_again_waits_for_its_needs_again<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let photo = item(&engine, "/photo.jpg").await;
    ask(&engine, photo, "metadata").await;
    complete(&engine, "metadata").await;
    let (caption, status) = ask(&engine, photo, "caption").await;
    assert_eq!(status, OperationStatus::Queued, "its need had succeeded");
    complete(&engine, "caption").await;
    // Both requested again at new revisions: the metadata runs first.
    engine
        .request_task(&context(), request(photo, "metadata", json!({"extractor": "exiftool"})))
        .await
        .unwrap();
    let again = engine
        .request_task(&context(), request(photo, "caption", json!({"model": "blip-2"})))
        .await
        .unwrap();
    assert_eq!((again.operation_id, again.status), (caption, OperationStatus::Blocked));
    assert!(claim(&engine, "caption").await.is_empty());
    complete(&engine, "metadata").await;
    assert_eq!(status_of(&engine, caption).await.0, OperationStatus::Queued);
    assert_replays(&engine).await;
}

async fn retrying_a_task_whose_need_cannot_run_again_is_refused_naming_the_need<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let file = PIPELINE.replace(
        "name = \"faces\"\ntarget = \"media\"\nversion = \"1\"",
        "name = \"faces\"\ntarget = \"media\"\nversion = \"2\"\napplies_to = [\"video\"]",
    );
    engine
        .apply_kinds(&context(), &parse_kinds(&file).unwrap(), false)
        .await
        .unwrap();
    let photo = item(&engine, "/photo.jpg").await;
    let (_, status) = ask(&engine, photo, "faces").await;
    assert_eq!(status, OperationStatus::NotApplicable);
    let (face_tags, status) = ask(&engine, photo, "face_tags").await;
    assert_eq!(status, OperationStatus::Blocked);
    let entries = engine.review_entries().await.unwrap();
    assert_eq!(entries.len(), 1);
    let head = engine.store().head().await.unwrap();
    let refused = engine
        .resolve_review(&context(), entries[0].entry_id, ReviewAction::Retry, None, "")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("face_tags waits for faces (not_applicable)") && refused.contains("dismiss or acknowledge"),
        "{refused}"
    );
    assert_eq!(engine.store().head().await.unwrap(), head, "nothing appended");
    engine
        .resolve_review(
            &context(),
            entries[0].entry_id,
            ReviewAction::Dismiss,
            None,
            "no faces on photos",
        )
        .await
        .unwrap();
    assert_eq!(status_of(&engine, face_tags).await.0, OperationStatus::Blocked);
    assert_replays(&engine).await;
}

async fn a_region_kind_with_needs_is_refused_and_nothing_is_appended<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let head = engine.store().head().await.unwrap();
    let file = "[[kind]]\nname = \"crop_caption\"\ntarget = \"region\"\nversion = \"1\"\nneeds = [\"metadata\"]\n";
    let report = engine
        .apply_kinds(&context(), &parse_kinds(file).unwrap(), false)
        .await
        .unwrap();
    let error = report.refused().next().unwrap().error.clone().unwrap();
    assert!(error.contains("a region kind cannot have needs"), "{error}");
    assert_eq!(engine.store().head().await.unwrap(), head);
}

backend_tests!(
    a_task_waits_blocked_until_its_need_succeeds_then_is_queued_without_another_call,
    a_need_that_fails_for_good_keeps_the_task_blocked_with_that_reason_in_review_only_when_required,
    a_task_with_several_needs_waits_for_the_last_and_names_one_that_ended_without_a_result,
    work_that_runs_again_waits_for_its_needs_again,
    retrying_a_task_whose_need_cannot_run_again_is_refused_naming_the_need,
    a_region_kind_with_needs_is_refused_and_nothing_is_appended,
);

/// One step of a random history of an item's metadata and the kinds that
/// need it.
#[derive(Debug, Clone)]
enum Step {
    /// `kind` requested on item `item` (with `variant` as an input, so a
    /// request may be a new revision).
    Request { item: usize, kind: usize, variant: u8 },
    /// The claimable work of `kind`, each ended as `end` says.
    Run { kind: usize, end: End },
    /// Every open review entry retried.
    RetryReview,
}

#[derive(Debug, Clone, Copy)]
enum End {
    Succeed,
    NothingFound,
    FailForGood,
}

const KINDS: [&str; 4] = ["metadata", "caption", "summary", "faces"];

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let end = prop_oneof![3 => Just(End::Succeed), 1 => Just(End::NothingFound), 1 => Just(End::FailForGood)];
    prop_oneof![
        4 => (0..3usize, 0..4usize, 0..2u8).prop_map(|(item, kind, variant)| Step::Request { item, kind, variant }),
        4 => (0..4usize, end).prop_map(|(kind, end)| Step::Run { kind, end }),
        1 => Just(Step::RetryReview),
    ]
}

fn inputs(kind: &str, variant: u8) -> Value {
    match kind {
        "metadata" => json!({"extractor": format!("x{variant}")}),
        "caption" => json!({"model": format!("m{variant}")}),
        _ => json!({}),
    }
}

async fn run_history(steps: Vec<Step>) {
    let folder = tempfile::tempdir().unwrap();
    let store = opledger_store_sqlite::SqliteStore::open(opledger_store_sqlite::SqliteConfig::at(
        folder.path().join("ledger.db"),
    ))
    .await
    .unwrap();
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(1_700_000_000_000_000)));
    let engine = Engine::with_clock(store, clock.clone(), Arc::new(SequentialIds::default()));
    engine.startup().await.unwrap();
    engine
        .apply_kinds(&context(), &parse_kinds(PIPELINE).unwrap(), false)
        .await
        .unwrap();
    let mut items = Vec::new();
    for n in 0..3 {
        items.push(item(&engine, &format!("/photo-{n}.jpg")).await);
    }
    let mut operations = std::collections::BTreeSet::new();
    for step in steps {
        clock.advance_millis(1_000);
        match step {
            Step::Request { item, kind, variant } => {
                let outcome = engine
                    .request_task(
                        &context(),
                        request(items[item], KINDS[kind], inputs(KINDS[kind], variant)),
                    )
                    .await
                    .unwrap();
                operations.insert(outcome.operation_id);
            }
            Step::Run { kind, end } => {
                for claim in claim(&engine, KINDS[kind]).await {
                    match end {
                        End::Succeed => engine
                            .complete_task(&context(), &claim.fence(), Completion::Output(json!({})))
                            .await
                            .unwrap(),
                        End::NothingFound => engine
                            .complete_task(
                                &context(),
                                &claim.fence(),
                                Completion::NoResult {
                                    reason: "nothing".into(),
                                },
                            )
                            .await
                            .unwrap(),
                        End::FailForGood => engine
                            .fail_task(&context(), &claim.fence(), "broken", true)
                            .await
                            .unwrap(),
                    };
                }
            }
            Step::RetryReview => {
                // Read again after each retry: retrying a need takes its
                // dependents' entries out of the queue.
                while let Some(entry) = engine.review_entries().await.unwrap().into_iter().next() {
                    engine
                        .resolve_review(&context(), entry.entry_id, ReviewAction::Retry, None, "again")
                        .await
                        .unwrap();
                }
            }
        }
        // After every step: nothing waits for a need that has succeeded,
        // and nothing waiting for work in progress is in the review queue.
        let review: Vec<OperationId> = in_review(&engine).await.into_iter().map(|(id, _)| id).collect();
        for operation_id in &operations {
            let operation = engine.operation(*operation_id).await.unwrap();
            let Some(need) = &operation.blocked_on else { continue };
            let media = operation.media_id.unwrap();
            let standing = engine
                .capabilities(media)
                .await
                .unwrap()
                .into_iter()
                .find(|row| row.capability == need.capability)
                .map(|row| row.status);
            assert_ne!(
                standing,
                Some(CapabilityStatus::Succeeded),
                "{} waits for {need} though it succeeded",
                operation.kind
            );
            if need.is_waiting() {
                assert!(
                    !review.contains(operation_id),
                    "{} waiting for {need} is in review",
                    operation.kind
                );
            }
        }
    }
    assert_replays(&engine).await;
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 16, ..proptest::test_runner::Config::default() })]

    /// Random requests, outcomes and review retries over kinds that need
    /// each other: no task waits for a need that succeeded, no task waiting
    /// for work in progress is in the review queue, and the inline
    /// projections equal a full replay.
    #[test]
    fn needs_are_released_exactly_and_replay_to_the_inline_projections(
        steps in proptest::collection::vec(step(), 1..30)
    ) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(run_history(steps));
    }
}
