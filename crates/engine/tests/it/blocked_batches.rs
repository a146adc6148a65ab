//! Batches over kinds with `needs`, on a real database of each backend: an
//! item blocked by a need whose work ended without a result (a metadata
//! task that failed for good on a corrupt file) settles in its batch as
//! `blocked` and counts in its progress, so the batch ends instead of
//! reading "running" forever; it is in the review queue only when its kind
//! is required; it takes its work's outcome once a person clears the need;
//! a cancel counts what it did to the batch's items.

use crate::support::{self, context};
use opledger_domain::batches::{BatchProgress, BatchStatus, ItemOutcome};
use opledger_domain::review::ReviewAction;
use opledger_domain::{MediaId, OperationId, OperationStatus};
use opledger_engine::{BatchCancelCounts, BatchRequest, BatchView, ClaimRequest, Completion, Engine, TaskClaim};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::collections::BTreeMap;

/// Metadata, an optional summary and a required caption that need it.
const PIPELINE: &str = r#"
[[kind]]
name = "metadata"
target = "media"
version = "1"

[[kind]]
name = "summary"
target = "media"
version = "1"
required = false
needs = ["metadata"]

[[kind]]
name = "caption"
target = "media"
version = "1"
required = true
needs = ["metadata"]
"#;

async fn engine<B: Backend>(backend: &B) -> Engine<B::Store> {
    let engine = support::engine(backend).await;
    support::declare(&engine, PIPELINE).await;
    engine
}

async fn items<S: Store>(engine: &Engine<S>, count: usize) -> Vec<MediaId> {
    let mut items = Vec::new();
    for n in 0..count {
        let path = format!("/photos/{n}.jpg");
        let digest = format!("sha256:{n:064x}");
        items.push(
            engine
                .register_media(&context(), &path, "image", Some(digest), Some(10))
                .await
                .unwrap(),
        );
    }
    items
}

async fn batch<S: Store>(engine: &Engine<S>, kind: &str, media: &[MediaId]) -> BatchView {
    engine
        .create_batch(
            &context(),
            BatchRequest {
                name: format!("{kind} run"),
                media: media.to_vec(),
                kinds: vec![kind.into()],
                inputs: BTreeMap::new(),
                priority: 0,
            },
        )
        .await
        .unwrap()
}

/// Every claimable task of `kind`, by the item it is on.
async fn claims<S: Store>(engine: &Engine<S>, kind: &str) -> BTreeMap<MediaId, TaskClaim> {
    engine
        .claim_tasks(
            &context(),
            ClaimRequest {
                kinds: vec![kind.into()],
                worker: "w-1".into(),
                lease_ms: 30_000,
                limit: 100,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap()
        .into_iter()
        .map(|claim| (claim.media_id.unwrap(), claim))
        .collect()
}

async fn succeed<S: Store>(engine: &Engine<S>, claim: &TaskClaim) {
    engine
        .complete_task(&context(), &claim.fence(), Completion::Output(json!({})))
        .await
        .unwrap();
}

async fn fail_for_good<S: Store>(engine: &Engine<S>, claim: &TaskClaim) {
    engine
        .fail_task(&context(), &claim.fence(), "corrupt file", true)
        .await
        .unwrap();
}

/// Each item's outcome, in item order.
fn outcomes(view: &BatchView) -> Vec<Option<ItemOutcome>> {
    view.items.iter().map(|item| item.outcome).collect()
}

fn progress(total: i64, succeeded: i64, blocked: i64) -> BatchProgress {
    BatchProgress {
        total,
        settled: succeeded + blocked,
        succeeded,
        blocked,
        ..BatchProgress::default()
    }
}

async fn review<S: Store>(engine: &Engine<S>) -> Vec<(OperationId, String)> {
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

async fn a_batch_of_an_optional_kind_settles_items_whose_need_ended_without_a_result_as_blocked_and_ends<B: Backend>(
    backend: &B,
) {
    let engine = engine(backend).await;
    let media = items(&engine, 4).await;
    let metadata = batch(&engine, "metadata", &media).await;
    let metadata_ops: Vec<OperationId> = metadata.items.iter().map(|item| item.operation_id).collect();
    // Before the summaries are asked for: item 0's metadata succeeds,
    // item 1's fails for good (a corrupt file); 2 and 3 are still queued.
    let claimed = claims(&engine, "metadata").await;
    succeed(&engine, &claimed[&media[0]]).await;
    fail_for_good(&engine, &claimed[&media[1]]).await;
    engine
        .release_task(&context(), &claimed[&media[2]].fence(), "later")
        .await
        .unwrap();
    engine
        .release_task(&context(), &claimed[&media[3]].fence(), "later")
        .await
        .unwrap();

    let summaries = batch(&engine, "summary", &media).await;
    let summary_ops: Vec<OperationId> = summaries.items.iter().map(|item| item.operation_id).collect();
    // Item 1 can never run without a person: settled at once, counted.
    assert_eq!(outcomes(&summaries), [None, Some(ItemOutcome::Blocked), None, None]);
    assert_eq!(summaries.batch.progress, progress(4, 0, 1));
    assert_eq!(
        summaries.items[1].reason.as_deref(),
        Some("needs capability metadata (failed_terminal)")
    );
    assert_eq!(summaries.batch.status, BatchStatus::Running);

    // Item 2's metadata fails for good after the batch began: its summary
    // is blocked again by the failure and settles in the same transaction.
    let claimed = claims(&engine, "metadata").await;
    fail_for_good(&engine, &claimed[&media[2]]).await;
    succeed(&engine, &claimed[&media[3]]).await;
    let view = engine.batch(summaries.batch.batch_id).await.unwrap();
    assert_eq!(
        outcomes(&view),
        [None, Some(ItemOutcome::Blocked), Some(ItemOutcome::Blocked), None]
    );
    for claim in claims(&engine, "summary").await.values() {
        succeed(&engine, claim).await;
    }
    let view = engine.batch(summaries.batch.batch_id).await.unwrap();
    assert_eq!(view.batch.progress, progress(4, 2, 2));
    assert!(!view.active, "every item settled: the batch is not active");
    assert_eq!(view.batch.status, BatchStatus::CompletedWithFailures);
    assert!(engine.batches(true).await.unwrap().is_empty());
    for blocked in [1, 2] {
        assert_eq!(
            engine.operation(summary_ops[blocked]).await.unwrap().status,
            OperationStatus::Blocked
        );
    }
    // The optional summaries need nobody: only the failed metadata is there.
    assert_eq!(
        review(&engine).await,
        [
            (metadata_ops[1], "failed_terminal".to_string()),
            (metadata_ops[2], "failed_terminal".to_string())
        ]
    );
    assert_replays(&engine).await;
}

async fn a_required_kind_blocked_by_a_need_that_ended_without_a_result_is_settled_blocked_and_in_review<B: Backend>(
    backend: &B,
) {
    let engine = engine(backend).await;
    let media = items(&engine, 2).await;
    let metadata = batch(&engine, "metadata", &media).await;
    let captions = batch(&engine, "caption", &media).await;
    let claimed = claims(&engine, "metadata").await;
    succeed(&engine, &claimed[&media[0]]).await;
    fail_for_good(&engine, &claimed[&media[1]]).await;
    for claim in claims(&engine, "caption").await.values() {
        succeed(&engine, claim).await;
    }
    let view = engine.batch(captions.batch.batch_id).await.unwrap();
    assert_eq!(
        outcomes(&view),
        [Some(ItemOutcome::Succeeded), Some(ItemOutcome::Blocked)]
    );
    assert_eq!(view.batch.progress, progress(2, 1, 1));
    assert_eq!(view.batch.status, BatchStatus::CompletedWithFailures);
    assert_eq!(
        review(&engine).await,
        [
            (metadata.items[1].operation_id, "failed_terminal".to_string()),
            (view.items[1].operation_id, "blocked".to_string())
        ]
    );
    assert_replays(&engine).await;
}

async fn an_item_settled_blocked_takes_its_works_outcome_once_a_person_clears_the_need<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let media = items(&engine, 1).await;
    batch(&engine, "metadata", &media).await;
    fail_for_good(&engine, &claims(&engine, "metadata").await[&media[0]]).await;
    let summaries = batch(&engine, "summary", &media).await;
    assert_eq!(outcomes(&summaries), [Some(ItemOutcome::Blocked)]);

    // The failed metadata is retried from the review queue and succeeds:
    // the summary runs, and its success replaces the block.
    let entry = engine.review_entries().await.unwrap()[0].entry_id;
    engine
        .resolve_review(&context(), entry, ReviewAction::Retry, None, "file replaced")
        .await
        .unwrap();
    let view = engine.batch(summaries.batch.batch_id).await.unwrap();
    assert_eq!(
        outcomes(&view),
        [Some(ItemOutcome::Blocked)],
        "settled until the work itself settles"
    );
    succeed(&engine, &claims(&engine, "metadata").await[&media[0]]).await;
    succeed(&engine, &claims(&engine, "summary").await[&media[0]]).await;
    let view = engine.batch(summaries.batch.batch_id).await.unwrap();
    assert_eq!(outcomes(&view), [Some(ItemOutcome::Succeeded)]);
    assert_eq!(view.batch.progress, progress(1, 1, 0));
    assert_eq!(view.batch.status, BatchStatus::Completed);
    assert_eq!(view.items[0].runs, 1);
    let history: Vec<serde_json::Value> = serde_json::from_str(&view.items[0].history).unwrap();
    let told: Vec<&str> = history.iter().map(|entry| entry["outcome"].as_str().unwrap()).collect();
    assert_eq!(told, ["blocked", "succeeded"]);
    assert_replays(&engine).await;
}

async fn cancelling_a_batch_counts_what_it_did_to_its_items<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let media = items(&engine, 6).await;
    batch(&engine, "metadata", &media).await;
    // Item 0's metadata fails for good, 1's and 5's succeed, the others wait.
    let claimed = claims(&engine, "metadata").await;
    fail_for_good(&engine, &claimed[&media[0]]).await;
    for n in [1, 5] {
        succeed(&engine, &claimed[&media[n]]).await;
    }
    for n in [2, 3, 4] {
        engine
            .release_task(&context(), &claimed[&media[n]].fence(), "later")
            .await
            .unwrap();
    }
    // Summaries: 0 settled blocked, 5 succeeds, 1 runs, 2 to 4 wait blocked.
    let summaries = batch(&engine, "summary", &media).await;
    let running = claims(&engine, "summary").await;
    succeed(&engine, &running[&media[5]]).await;

    let (view, counts) = engine
        .cancel_batch_counted(&context(), summaries.batch.batch_id, "not needed")
        .await
        .unwrap();
    // The item settled blocked is cancelled too: it would run if a person
    // cleared its need.
    assert_eq!(
        counts,
        BatchCancelCounts {
            items: 6,
            cancelled: 4,
            asked_to_stop: 1,
            already_settled: 1,
            ..BatchCancelCounts::default()
        }
    );
    assert_eq!(view.batch.status, BatchStatus::Cancelling);
    assert_eq!(view.batch.progress.cancelled, 4);
    assert_eq!(view.batch.progress.blocked, 0);
    let again = engine
        .cancel_batch_counted(&context(), summaries.batch.batch_id, "still not needed")
        .await
        .unwrap()
        .1;
    assert_eq!(
        again,
        BatchCancelCounts {
            items: 6,
            already_stopping: 1,
            already_settled: 5,
            ..BatchCancelCounts::default()
        }
    );
    assert_replays(&engine).await;
}

backend_tests!(
    a_batch_of_an_optional_kind_settles_items_whose_need_ended_without_a_result_as_blocked_and_ends,
    a_required_kind_blocked_by_a_need_that_ended_without_a_result_is_settled_blocked_and_in_review,
    an_item_settled_blocked_takes_its_works_outcome_once_a_person_clears_the_need,
    cancelling_a_batch_counts_what_it_did_to_its_items,
);
