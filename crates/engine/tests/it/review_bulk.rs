//! Resolving review entries in bulk on a real database of each backend:
//! each matching entry is resolved as its own recorded action (one
//! `review_resolved` each, actor and reason kept), filters by kind, reason
//! code and batch take exactly their entries, a limit takes the oldest, a
//! dry run appends nothing, and an entry that can no longer be resolved
//! (superseded meanwhile, a retry its work refuses) is skipped with its
//! reason while the others resolve. Every scenario ends with replay
//! identical.

use crate::support;
use opledger_domain::review::{EntryState, ReasonCode, ReviewAction};
use opledger_domain::{BatchId, DomainError, Event, MediaId, OperationId, OperationStatus};
use opledger_engine::{
    BatchRequest, ClaimRequest, CommandContext, Engine, EngineError, ReviewFilter, TaskRequest, TaskTarget,
};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::collections::BTreeMap;

/// Required kinds: metadata (for images only), and caption and tags, which
/// need it; thumbnail stands alone.
const PIPELINE: &str = r#"
[[kind]]
name = "metadata"
target = "media"
version = "1"
applies_to = ["image"]

[[kind]]
name = "caption"
target = "media"
version = "1"
needs = ["metadata"]

[[kind]]
name = "tags"
target = "media"
version = "1"
needs = ["metadata"]

[[kind]]
name = "thumbnail"
target = "media"
version = "1"
"#;

async fn engine<B: Backend>(backend: &B) -> Engine<B::Store> {
    let engine = support::engine(backend).await;
    support::declare(&engine, PIPELINE).await;
    engine
}

fn context(actor: &str) -> CommandContext {
    CommandContext::actor(actor)
}

async fn item<S: Store>(engine: &Engine<S>, path: &str, media_kind: &str) -> MediaId {
    engine
        .register_media(
            &context("cli"),
            path,
            media_kind,
            Some(format!("sha256:{:064x}", path.len())),
            Some(10),
        )
        .await
        .unwrap()
}

async fn ask<S: Store>(engine: &Engine<S>, media: MediaId, kind: &str) -> OperationId {
    engine
        .request_task(
            &context("cli"),
            TaskRequest {
                target: TaskTarget::Media(media),
                kind: kind.into(),
                inputs: json!({}),
                priority: 0,
            },
        )
        .await
        .unwrap()
        .operation_id
}

/// Claims every claimable task of `kind` and fails each for good.
async fn fail_all<S: Store>(engine: &Engine<S>, kind: &str) {
    let claims = engine
        .claim_tasks(
            &context("py-1"),
            ClaimRequest {
                kinds: vec![kind.into()],
                worker: "py-1".into(),
                lease_ms: 30_000,
                limit: 100,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap();
    for claim in claims {
        engine
            .fail_task(&context("py-1"), &claim.fence(), "decoder crashed", true)
            .await
            .unwrap();
    }
}

/// Open entries by operation, with their reason code.
async fn open_entries<S: Store>(engine: &Engine<S>) -> BTreeMap<OperationId, String> {
    engine
        .review_entries()
        .await
        .unwrap()
        .into_iter()
        .map(|entry| (entry.operation_id, entry.reason_code))
        .collect()
}

/// The `review_resolved` events of an operation: (actor, action, reason).
async fn resolutions<S: Store>(engine: &Engine<S>, operation: OperationId) -> Vec<(String, String, String)> {
    engine
        .timeline(operation)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|envelope| match envelope.event {
            Event::ReviewResolved(resolved) => Some((envelope.actor, resolved.action, resolved.reason)),
            _ => None,
        })
        .collect()
}

async fn assert_replays<S: Store>(engine: &Engine<S>) {
    let report = engine.verify().await.unwrap();
    assert!(report.is_identical(), "{}", report.render());
}

fn by_kind(kind: &str) -> ReviewFilter {
    ReviewFilter {
        kind: Some(kind.into()),
        ..ReviewFilter::default()
    }
}

async fn a_bulk_retry_resolves_each_matching_entry_as_its_own_recorded_action<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let mut thumbnails = Vec::new();
    for n in 0..3 {
        let media = item(&engine, &format!("/p/{n}.jpg"), "image").await;
        thumbnails.push(ask(&engine, media, "thumbnail").await);
    }
    let other = item(&engine, "/p/other.jpg", "image").await;
    let metadata = ask(&engine, other, "metadata").await;
    fail_all(&engine, "thumbnail").await;
    fail_all(&engine, "metadata").await;
    assert_eq!(open_entries(&engine).await.len(), 4);

    let report = engine
        .resolve_reviews(
            &context("alice"),
            &by_kind("thumbnail"),
            ReviewAction::Retry,
            "decoder fixed in 2.1",
            false,
            None,
        )
        .await
        .unwrap();
    assert_eq!((report.matched, report.resolved), (3, 3));
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    assert!(!report.dry_run);
    for operation in &thumbnails {
        assert_eq!(
            resolutions(&engine, *operation).await,
            [(
                "alice".to_string(),
                "retry".to_string(),
                "decoder fixed in 2.1".to_string()
            )]
        );
        assert_eq!(
            engine.operation(*operation).await.unwrap().status,
            OperationStatus::Queued
        );
    }
    // The other kind's entry is untouched.
    assert_eq!(
        open_entries(&engine).await,
        BTreeMap::from([(metadata, "failed_terminal".to_string())])
    );
    assert!(resolutions(&engine, metadata).await.is_empty());
    assert_replays(&engine).await;
}

async fn a_dry_run_reports_the_matching_entries_and_appends_nothing<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    for n in 0..3 {
        let media = item(&engine, &format!("/p/{n}.jpg"), "image").await;
        ask(&engine, media, "thumbnail").await;
    }
    fail_all(&engine, "thumbnail").await;
    let head = engine.store().head().await.unwrap();
    let report = engine
        .resolve_reviews(
            &context("alice"),
            &ReviewFilter::default(),
            ReviewAction::Dismiss,
            "",
            true,
            Some(2),
        )
        .await
        .unwrap();
    assert!(report.dry_run);
    assert_eq!((report.matched, report.entries.len(), report.resolved), (3, 2, 0));
    assert_eq!(report.remaining(), 1);
    let ids: Vec<i64> = report.entries.iter().map(|entry| entry.entry_id).collect();
    let mut oldest = ids.clone();
    oldest.sort_unstable();
    assert_eq!(ids, oldest, "the oldest entries first");
    assert_eq!(engine.store().head().await.unwrap(), head, "a dry run appends nothing");
    assert_eq!(open_entries(&engine).await.len(), 3);
    assert_replays(&engine).await;
}

/// Retrying one blocked entry reopens the need both wait for, which takes
/// the other entry out of the queue (superseded): when its turn comes it is
/// skipped with that reason, and the run goes on.
async fn an_entry_superseded_meanwhile_is_skipped_with_its_reason_and_the_rest_resolve<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let photo = item(&engine, "/p/photo.jpg", "image").await;
    let caption = ask(&engine, photo, "caption").await;
    let tags = ask(&engine, photo, "tags").await;
    let metadata = ask(&engine, photo, "metadata").await;
    fail_all(&engine, "metadata").await;
    let open = open_entries(&engine).await;
    assert_eq!(open.get(&caption).map(String::as_str), Some("blocked"));
    assert_eq!(open.get(&tags).map(String::as_str), Some("blocked"));
    let filter = ReviewFilter {
        reason_code: Some(ReasonCode::Blocked),
        ..ReviewFilter::default()
    };
    let report = engine
        .resolve_reviews(&context("alice"), &filter, ReviewAction::Retry, "", false, None)
        .await
        .unwrap();
    assert_eq!(
        (report.matched, report.resolved, report.skipped.len()),
        (2, 1, 1),
        "{report:?}"
    );
    assert!(report.skipped[0].reason.contains("superseded"), "{:?}", report.skipped);
    assert_eq!(
        engine.operation(metadata).await.unwrap().status,
        OperationStatus::Queued
    );
    // The resolved one carries the bulk default reason; the skipped one
    // records nothing.
    let mut recorded = Vec::new();
    for operation in [caption, tags] {
        recorded.extend(resolutions(&engine, operation).await);
    }
    assert_eq!(
        recorded,
        [(
            "alice".to_string(),
            "retry".to_string(),
            "retry in bulk from the review queue".to_string()
        )]
    );
    assert_replays(&engine).await;
}

/// A retry the work refuses (its need does not apply to the item, so it
/// cannot run again) is skipped, naming why; a dismiss of the same entries
/// then resolves them.
async fn a_retry_the_work_refuses_is_skipped_and_the_run_goes_on<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let clip = item(&engine, "/p/clip.mp4", "video").await;
    let photo = item(&engine, "/p/photo.jpg", "image").await;
    assert_eq!(
        engine
            .operation(ask(&engine, clip, "metadata").await)
            .await
            .unwrap()
            .status,
        OperationStatus::NotApplicable
    );
    let stuck = ask(&engine, clip, "caption").await;
    let thumbnail = ask(&engine, photo, "thumbnail").await;
    fail_all(&engine, "thumbnail").await;
    let open = open_entries(&engine).await;
    assert_eq!(open.len(), 2, "{open:?}");
    let report = engine
        .resolve_reviews(
            &context("alice"),
            &ReviewFilter::default(),
            ReviewAction::Retry,
            "",
            false,
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        (report.matched, report.resolved, report.skipped.len()),
        (2, 1, 1),
        "{report:?}"
    );
    assert!(
        report.skipped[0].reason.contains("cannot be retried"),
        "{:?}",
        report.skipped
    );
    assert_eq!(resolutions(&engine, thumbnail).await.len(), 1);
    assert!(resolutions(&engine, stuck).await.is_empty());
    let report = engine
        .resolve_reviews(
            &context("alice"),
            &by_kind("caption"),
            ReviewAction::Dismiss,
            "video",
            false,
            None,
        )
        .await
        .unwrap();
    assert_eq!((report.resolved, report.skipped.len()), (1, 0));
    assert_eq!(
        engine.review_entry(report.entries[0].entry_id).await.unwrap().state,
        EntryState::Resolved
    );
    assert_replays(&engine).await;
}

async fn a_batch_filter_takes_only_the_entries_of_the_batchs_operations<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let mut media = Vec::new();
    for n in 0..4 {
        media.push(item(&engine, &format!("/p/{n}.jpg"), "image").await);
    }
    let batch = engine
        .create_batch(
            &context("cli"),
            BatchRequest {
                name: "first two".into(),
                media: media[..2].to_vec(),
                kinds: vec!["thumbnail".into()],
                inputs: BTreeMap::new(),
                priority: 0,
            },
        )
        .await
        .unwrap();
    for other in &media[2..] {
        ask(&engine, *other, "thumbnail").await;
    }
    fail_all(&engine, "thumbnail").await;
    assert_eq!(open_entries(&engine).await.len(), 4);
    let filter = ReviewFilter {
        batch: Some(batch.batch.batch_id),
        ..ReviewFilter::default()
    };
    let report = engine
        .resolve_reviews(
            &context("alice"),
            &filter,
            ReviewAction::Acknowledge,
            "known bad",
            false,
            None,
        )
        .await
        .unwrap();
    assert_eq!((report.matched, report.resolved), (2, 2));
    let in_batch: Vec<OperationId> = batch.items.iter().map(|item| item.operation_id).collect();
    for entry in &report.entries {
        assert!(in_batch.contains(&entry.operation_id));
    }
    assert_eq!(open_entries(&engine).await.len(), 2);

    let unknown = ReviewFilter {
        batch: Some(BatchId(uuid::Uuid::from_u128(404))),
        ..ReviewFilter::default()
    };
    let error = engine
        .resolve_reviews(&context("alice"), &unknown, ReviewAction::Dismiss, "", false, None)
        .await
        .unwrap_err();
    assert!(
        matches!(error, EngineError::Domain(DomainError::NotFound { .. })),
        "{error:?}"
    );
    assert_replays(&engine).await;
}

backend_tests!(
    a_bulk_retry_resolves_each_matching_entry_as_its_own_recorded_action,
    a_dry_run_reports_the_matching_entries_and_appends_nothing,
    an_entry_superseded_meanwhile_is_skipped_with_its_reason_and_the_rest_resolve,
    a_retry_the_work_refuses_is_skipped_and_the_run_goes_on,
    a_batch_filter_takes_only_the_entries_of_the_batchs_operations
);
