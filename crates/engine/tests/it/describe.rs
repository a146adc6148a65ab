//! `describe`, `follow` and `watch_status` on a real database of each
//! backend: the sentence at each step of a task's life (golden, with a
//! fixed clock and UTC), its place in the claim queue, the budgets of its
//! kind's policy, a history as lines, a follow that yields each new event
//! once, in order, from where it stopped, and a watch that reports again
//! only once the log moved. Every scenario ends with replay identical.

use futures::StreamExt;
use opledger_domain::{DomainError, MediaId, OperationId, Timestamp};
use opledger_engine::{
    parse_kinds, ClaimRequest, CommandContext, Completion, Engine, EngineError, FixedClock, FixedJitter, Progress,
    SequentialIds, TaskClaim, TaskRequest, TaskTarget,
};
use opledger_explain::history::history_lines;
use opledger_explain::QueuePosition;
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const PIPELINE: &str = r#"
[[kind]]
name = "metadata"
target = "media"
version = "1"

[[kind]]
name = "caption"
target = "media"
version = "1"
needs = ["metadata"]
retry = { max_attempts = 5, base_backoff_ms = 2000, jitter = 0.5, max_interruptions = 3 }

[[kind]]
name = "thumbnail"
target = "media"
version = "1"
retry = { max_attempts = 3, base_backoff_ms = 1000, max_interruptions = 2 }
"#;

/// The same pipeline, with a new thumbnail version: its results go stale.
const THUMBNAIL_V2: &str = r#"
[[kind]]
name = "thumbnail"
target = "media"
version = "2"
retry = { max_attempts = 3, base_backoff_ms = 1000, max_interruptions = 2 }
"#;

/// 2023-11-14T22:13:20Z.
const START: i64 = 1_700_000_000_000_000;

struct Ledger<S: Store> {
    engine: Engine<S>,
    clock: Arc<FixedClock>,
}

async fn ledger<B: Backend>(backend: &B) -> Ledger<B::Store> {
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(START)));
    let engine = Engine::with_clock(backend.open().await, clock.clone(), Arc::new(SequentialIds::default()))
        .with_jitter(Arc::new(FixedJitter(500)));
    engine.startup().await.unwrap();
    engine
        .apply_kinds(&context("ops"), &parse_kinds(PIPELINE).unwrap(), false)
        .await
        .unwrap();
    Ledger { engine, clock }
}

fn context(actor: &str) -> CommandContext {
    CommandContext::actor(actor)
}

impl<S: Store> Ledger<S> {
    async fn item(&self, path: &str) -> MediaId {
        self.engine
            .register_media(
                &context("cli"),
                path,
                "image",
                Some(format!("sha256:{:064x}", path.len())),
                Some(10),
            )
            .await
            .unwrap()
    }

    async fn ask(&self, media: MediaId, kind: &str, priority: i32) -> OperationId {
        self.engine
            .request_task(
                &context("cli"),
                TaskRequest {
                    target: TaskTarget::Media(media),
                    kind: kind.into(),
                    inputs: json!({}),
                    priority,
                },
            )
            .await
            .unwrap()
            .operation_id
    }

    async fn claim(&self, kind: &str, worker: &str) -> TaskClaim {
        let mut claims = self
            .engine
            .claim_tasks(
                &context(worker),
                ClaimRequest {
                    kinds: vec![kind.into()],
                    worker: worker.into(),
                    lease_ms: 30_000,
                    limit: 1,
                    principal: None,
                    versions: Default::default(),
                },
            )
            .await
            .unwrap();
        assert_eq!(claims.len(), 1, "a {kind} task to claim");
        claims.remove(0)
    }

    /// The sentence `describe` gives now, read in UTC.
    async fn why(&self, operation: OperationId) -> String {
        let description = self.engine.describe(operation).await.unwrap();
        description.why.sentence(description.described_at, &chrono::Utc)
    }

    fn advance(&self, millis: i64) {
        self.clock.advance_millis(millis);
    }

    async fn assert_replays(&self) {
        let report = self.engine.verify().await.unwrap();
        assert!(report.is_identical(), "{}", report.render());
    }
}

/// A task from its request to a stale result, with the sentence `describe`
/// gives at each step; then another through a cancel, and one blocked by a
/// need whose work failed for good. The same golden on both backends.
async fn describe_explains_each_step_of_a_tasks_life<B: Backend>(backend: &B) {
    let ledger = ledger(backend).await;
    let engine = &ledger.engine;
    let beach = ledger.item("/photos/beach.jpg").await;
    let dunes = ledger.item("/photos/dunes.jpg").await;
    let mut steps = Vec::new();
    let mut step = |name: &str, sentence: String| steps.push(format!("{name:<28} {sentence}"));

    let thumbnail = ledger.ask(beach, "thumbnail", 0).await;
    step("requested", ledger.why(thumbnail).await);
    let urgent = ledger.ask(dunes, "thumbnail", 5).await;
    step("behind an urgent one", ledger.why(thumbnail).await);
    ledger.advance(1_000);
    let claim = ledger.claim("thumbnail", "py-1").await;
    assert_eq!(claim.operation_id, urgent);
    step("the urgent one claimed", ledger.why(urgent).await);
    step("next in line again", ledger.why(thumbnail).await);
    engine
        .report_progress(
            &context("py-1"),
            &claim.fence(),
            Progress {
                phase: "resizing".into(),
                processed: 10,
                total: Some(40),
            },
        )
        .await
        .unwrap();
    ledger.advance(18_000);
    step("running", ledger.why(urgent).await);
    engine
        .fail_task(&context("py-1"), &claim.fence(), "decoder crashed", false)
        .await
        .unwrap();
    step("failed once", ledger.why(urgent).await);
    ledger.advance(5_000);
    step("retry due", ledger.why(urgent).await);
    let claim = ledger.claim("thumbnail", "py-2").await;
    assert_eq!(claim.operation_id, urgent);
    engine
        .complete_task(
            &context("py-2"),
            &claim.fence(),
            Completion::Output(json!({"path": "/t/dunes.png"})),
        )
        .await
        .unwrap();
    step("succeeded", ledger.why(urgent).await);
    engine
        .apply_kinds(&context("ops"), &parse_kinds(THUMBNAIL_V2).unwrap(), false)
        .await
        .unwrap();
    step("a new version", ledger.why(urgent).await);

    // Cancelled while a worker holds it.
    let claim = ledger.claim("thumbnail", "py-1").await;
    assert_eq!(claim.operation_id, thumbnail);
    engine
        .cancel_task(&context("alice"), thumbnail, "wrong crop")
        .await
        .unwrap();
    step("cancel requested", ledger.why(thumbnail).await);
    engine
        .acknowledge_cancel(&context("py-1"), &claim.fence())
        .await
        .unwrap();
    step("cancelled", ledger.why(thumbnail).await);

    // Blocked by a need whose work failed for good.
    let caption = ledger.ask(beach, "caption", 0).await;
    step("waiting for its need", ledger.why(caption).await);
    ledger.ask(beach, "metadata", 0).await;
    let claim = ledger.claim("metadata", "py-1").await;
    engine
        .fail_task(&context("py-1"), &claim.fence(), "not an image", true)
        .await
        .unwrap();
    step("its need failed for good", ledger.why(caption).await);
    step("the need itself", ledger.why(claim.operation_id).await);
    insta::assert_snapshot!("sentences", steps.join("\n"));

    let description = engine.describe(urgent).await.unwrap();
    assert_eq!(description.version(), description.timeline.len() as i64);
    let history = history_lines(&description.timeline, None, &chrono::Utc);
    assert!(!history.iter().any(|line| line.contains(&claim.claim_token)));
    insta::assert_snapshot!("history", history.join("\n"));
    ledger.assert_replays().await;
}

/// The budgets come from the kind's declared policy, the counts from the
/// processing state; a queued task's place counts only claimable tasks of
/// its own kind, and says so.
async fn describe_counts_budgets_and_the_claimable_tasks_ahead_of_its_kind_only<B: Backend>(backend: &B) {
    let ledger = ledger(backend).await;
    let mut items = Vec::new();
    for n in 0..5 {
        items.push(ledger.item(&format!("/p/{n}.jpg")).await);
    }
    let low = ledger.ask(items[0], "thumbnail", 0).await;
    let high = ledger.ask(items[1], "thumbnail", 3).await;
    ledger.advance(10);
    let same_later = ledger.ask(items[2], "thumbnail", 0).await;
    let higher = ledger.ask(items[3], "thumbnail", 9).await;
    // Another kind's queue is not this one's.
    ledger.ask(items[4], "metadata", 9).await;
    let position = |ahead, higher_priority| {
        Some(QueuePosition {
            ahead,
            higher_priority,
            at_least: false,
        })
    };
    let place = |operation| {
        let engine = ledger.engine.clone();
        async move { engine.describe(operation).await.unwrap().queue }
    };
    assert_eq!(place(higher).await, position(0, 0));
    assert_eq!(place(high).await, position(1, 1));
    assert_eq!(place(low).await, position(2, 2));
    assert_eq!(place(same_later).await, position(3, 2));
    assert_eq!(
        ledger.why(same_later).await,
        "queued behind 3 claimable thumbnail tasks (2 of higher priority, 1 waiting longer)"
    );

    let claim = ledger.claim("thumbnail", "py-1").await;
    assert_eq!(claim.operation_id, higher);
    ledger
        .engine
        .fail_task(&context("py-1"), &claim.fence(), "timeout", false)
        .await
        .unwrap();
    let description = ledger.engine.describe(higher).await.unwrap();
    let policy = description.policy.expect("a declared kind has a policy");
    assert_eq!((policy.max_attempts, policy.max_interruptions), (3, 2));
    let state = &description.task.as_ref().unwrap().state;
    assert_eq!((state.failure_count, state.attempt_count), (1, 1));
    assert_eq!(description.queue, None, "waiting for its retry: not claimable yet");
    ledger.assert_replays().await;
}

async fn describing_an_unknown_operation_is_not_found<B: Backend>(backend: &B) {
    let ledger = ledger(backend).await;
    let error = ledger
        .engine
        .describe(OperationId(uuid::Uuid::from_u128(42)))
        .await
        .unwrap_err();
    assert!(
        matches!(error, EngineError::Domain(DomainError::NotFound { .. })),
        "{error:?}"
    );
}

type Follow = futures::stream::BoxStream<'static, Result<opledger_domain::EventEnvelope, EngineError>>;

async fn next(follow: &mut Follow) -> opledger_domain::EventEnvelope {
    tokio::time::timeout(Duration::from_secs(10), follow.next())
        .await
        .expect("a new event within 10 s")
        .expect("the follow goes on")
        .unwrap()
}

/// A follow reads the stream on from the version it was given: what was
/// there before is not repeated, every new event comes once, in order.
async fn a_follow_yields_each_new_event_once_in_order_from_where_it_stopped<B: Backend>(backend: &B) {
    let ledger = ledger(backend).await;
    let beach = ledger.item("/photos/beach.jpg").await;
    let operation = ledger.ask(beach, "thumbnail", 0).await;
    let seen = ledger.engine.timeline(operation).await.unwrap().len() as i64;
    let mut follow = ledger.engine.follow(operation, seen, Duration::from_millis(10));
    // Nothing new yet: the follow waits.
    assert!(tokio::time::timeout(Duration::from_millis(100), follow.next())
        .await
        .is_err());
    let claim = ledger.claim("thumbnail", "py-1").await;
    let claimed = next(&mut follow).await;
    assert_eq!(
        (claimed.stream_version, claimed.event.event_type()),
        (seen + 1, "operation_claimed")
    );
    ledger
        .engine
        .complete_task(&context("py-1"), &claim.fence(), Completion::Output(json!({})))
        .await
        .unwrap();
    let succeeded = next(&mut follow).await;
    assert_eq!(
        (succeeded.stream_version, succeeded.event.event_type()),
        (seen + 2, "operation_succeeded")
    );
    let timeline = ledger.engine.timeline(operation).await.unwrap();
    assert_eq!(timeline.len() as i64, seen + 2, "{timeline:?}");
    assert!(tokio::time::timeout(Duration::from_millis(100), follow.next())
        .await
        .is_err());
    ledger.assert_replays().await;
}

/// A watch reports at once, then again only after the log moved.
async fn a_status_watch_reports_again_only_after_the_log_moved<B: Backend>(backend: &B) {
    let ledger = ledger(backend).await;
    let mut watch = ledger.engine.watch_status(Duration::from_millis(10));
    let first = watch.next().await.unwrap().unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(150), watch.next())
            .await
            .is_err(),
        "a ledger at rest reports nothing new"
    );
    let beach = ledger.item("/photos/beach.jpg").await;
    ledger.ask(beach, "thumbnail", 0).await;
    let second = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("a report once the log moved")
        .unwrap()
        .unwrap();
    assert!(second.head > first.head);
    assert_eq!(second.media, first.media + 1);
    ledger.assert_replays().await;
}

backend_tests!(
    describe_explains_each_step_of_a_tasks_life,
    describe_counts_budgets_and_the_claimable_tasks_ahead_of_its_kind_only,
    describing_an_unknown_operation_is_not_found,
    a_follow_yields_each_new_event_once_in_order_from_where_it_stopped,
    a_status_watch_reports_again_only_after_the_log_moved
);
