//! The work protocol on real databases and real connections, every
//! test on each backend (SQLite and PostgreSQL, `opledger_testkit`):
//! independence of task kinds, revisions requested while a worker runs,
//! fencing of stale workers, the recovery race, many workers on separate
//! connections, backoff and its replay, quarantine, cancellation, refusals,
//! and removal of a media item. Each body is written once, generic over the
//! backend; `backend_tests!` at the end makes `NAME::sqlite` and
//! `NAME::postgres` of it.

use futures::{StreamExt, TryStreamExt};
use opledger_domain::events::{BoundingBox, Event};
use opledger_domain::kinds::legacy;
use opledger_domain::projections::{ProcessingStateRow, Row};
use opledger_domain::{DomainError, EventEnvelope, MediaId, OperationId, OperationStatus, RegionId, Timestamp};
use opledger_engine::{
    ClaimRequest, CommandContext, Completion, Engine, EngineError, Fence, FixedClock, FixedJitter, Progress,
    RecoveryHook, RequestOutcome, SequentialIds, TaskClaim, TaskRequest, TaskTarget, TaskView, MAX_CLAIM_BATCH,
    MAX_LEASE_MS,
};
use opledger_store::{ExpiredClaim, ScratchTarget, Store};
use opledger_testkit::{backend_tests, Backend};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use uuid::Uuid;

const T0: i64 = 1_700_000_000_000_000;

/// One engine on one fresh database, with a hand-moved clock, sequential
/// ids and a pinned jitter draw.
struct Lab<S: Store> {
    engine: Engine<S>,
    clock: Arc<FixedClock>,
    context: CommandContext,
}

async fn lab<B: Backend>(backend: &B) -> Lab<B::Store> {
    let store = backend.open().await;
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(T0)));
    let engine = Engine::with_clock(store, clock.clone(), Arc::new(SequentialIds::default()))
        .with_jitter(Arc::new(FixedJitter(500)));
    engine.startup().await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    Lab {
        engine,
        clock,
        context: CommandContext::actor("test"),
    }
}

/// Inputs a kind accepts (the target fills in the digest, box and region revision).
fn inputs_for(kind: &str) -> Value {
    match kind {
        "metadata" => json!({}),
        "thumbnail" => json!({"max_side": 256, "format": "png"}),
        "perceptual_hash" => json!({"algorithm": "dhash"}),
        "auto_tagging" => json!({"model": "tagger", "model_revision": "7"}),
        "full_embedding" | "crop_embedding" => {
            json!({"model": "clip", "model_revision": "2", "embedding_version": "1"})
        }
        other => panic!("no inputs for {other}"),
    }
}

/// Other inputs of the same kind: a new revision.
fn newer_inputs_for(kind: &str) -> Value {
    match kind {
        "metadata" => json!({"extractor": "v2"}),
        "thumbnail" => json!({"max_side": 512, "format": "webp"}),
        "perceptual_hash" => json!({"algorithm": "phash"}),
        other => panic!("no newer inputs for {other}"),
    }
}

fn claim_request(kinds: &[&str], worker: &str, lease_ms: i64, limit: usize) -> ClaimRequest {
    ClaimRequest {
        kinds: kinds.iter().map(|kind| kind.to_string()).collect(),
        worker: worker.to_string(),
        lease_ms,
        limit,
        principal: None,
        versions: Default::default(),
    }
}

impl<S: Store> Lab<S> {
    fn now(&self) -> Timestamp {
        opledger_engine::Clock::now(self.clock.as_ref())
    }

    async fn media(&self, path: &str) -> MediaId {
        self.engine
            .register_media(&self.context, path, "image", Some(format!("sha256:{path}")), Some(10))
            .await
            .unwrap()
    }

    async fn request(&self, target: TaskTarget, kind: &str, inputs: Value, priority: i32) -> RequestOutcome {
        self.engine
            .request_task(
                &self.context,
                TaskRequest {
                    target,
                    kind: kind.to_string(),
                    inputs,
                    priority,
                },
            )
            .await
            .unwrap()
    }

    async fn claim(&self, kinds: &[&str], worker: &str, lease_ms: i64, limit: usize) -> Vec<TaskClaim> {
        self.engine
            .claim_tasks(&self.context, claim_request(kinds, worker, lease_ms, limit))
            .await
            .unwrap()
    }

    async fn claim_one(&self, kind: &str, worker: &str, lease_ms: i64) -> TaskClaim {
        let mut claims = self.claim(&[kind], worker, lease_ms, 1).await;
        assert_eq!(claims.len(), 1, "one {kind} task should be claimable");
        claims.remove(0)
    }

    async fn view(&self, operation_id: OperationId) -> TaskView {
        self.engine.task_by_operation(operation_id).await.unwrap().unwrap()
    }

    async fn state(&self, operation_id: OperationId) -> ProcessingStateRow {
        self.view(operation_id).await.state
    }

    async fn timeline(&self, operation_id: OperationId) -> Vec<EventEnvelope> {
        self.engine.timeline(operation_id).await.unwrap()
    }

    async fn event_types(&self, operation_id: OperationId) -> Vec<&'static str> {
        self.timeline(operation_id)
            .await
            .iter()
            .map(EventEnvelope::event_type)
            .collect()
    }

    async fn head(&self) -> i64 {
        self.engine.store().head().await.unwrap()
    }

    async fn verify(&self) {
        let report = self.engine.verify().await.unwrap();
        assert!(report.is_identical(), "{}", report.render());
    }
}

#[track_caller]
fn assert_conflict<T: std::fmt::Debug>(result: Result<T, EngineError>, what: &str) {
    match result {
        Err(EngineError::Domain(DomainError::Conflict(_))) => {}
        other => panic!("{what}: expected a Conflict, got {other:?}"),
    }
}

#[track_caller]
fn assert_invalid<T: std::fmt::Debug>(result: Result<T, EngineError>, what: &str) {
    match result {
        Err(EngineError::Domain(DomainError::InvalidInput(_))) => {}
        other => panic!("{what}: expected InvalidInput, got {other:?}"),
    }
}

#[track_caller]
fn assert_not_found<T: std::fmt::Debug>(result: Result<T, EngineError>, what: &str) {
    match result {
        Err(EngineError::Domain(DomainError::NotFound { .. })) => {}
        other => panic!("{what}: expected NotFound, got {other:?}"),
    }
}

/// Runs a command whose future the compiler cannot prove `Send` for every
/// lifetime ("implementation of `Send` is not general enough" on
/// `&Engine<S>`), from a future that must be `Send` (a recovery
/// hook): the future is built and driven on a blocking thread.
async fn off_task<T, F, Fut>(make: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || handle.block_on(make()))
        .await
        .unwrap()
}

/// A small seeded generator (splitmix64): the same seed, the same scenario.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

// ---------------------------------------------------------------------------

async fn two_task_kinds_on_one_media_item_progress_independently<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    let media = lab.media("a.png").await;
    let target = TaskTarget::Media(media);
    let metadata = lab.request(target, "metadata", inputs_for("metadata"), 0).await;
    let thumbnail = lab.request(target, "thumbnail", inputs_for("thumbnail"), 0).await;
    assert_ne!(metadata.operation_id, thumbnail.operation_id);

    // Claim, heartbeat, progress and fail metadata: thumbnail's row stays as it was.
    let thumbnail_before = lab.view(thumbnail.operation_id).await;
    assert_eq!(thumbnail_before.state.status, OperationStatus::Queued);
    let meta_claim = lab.claim_one("metadata", "w1", 30_000).await;
    assert_eq!(meta_claim.operation_id, metadata.operation_id);
    lab.clock.advance_millis(100);
    lab.engine.heartbeat(&meta_claim.fence(), None).await.unwrap();
    lab.engine
        .report_progress(
            &lab.context,
            &meta_claim.fence(),
            Progress {
                phase: "reading".into(),
                processed: 1,
                total: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(lab.view(thumbnail.operation_id).await, thumbnail_before);
    // The heartbeat and the counters are liveness, visible from a read connection.
    let meta_view = lab.view(metadata.operation_id).await;
    let lease = meta_view.lease.clone().expect("a held claim has a lease row");
    assert_eq!((lease.phase.as_deref(), lease.processed), (Some("reading"), Some(1)));
    assert_eq!(lease.heartbeat_at, lab.now());
    assert!(meta_view.lease_expires_at().unwrap() > meta_claim.lease_expires_at);
    let failed = lab
        .engine
        .fail_task(&lab.context, &meta_claim.fence(), "unreadable header", false)
        .await
        .unwrap();
    assert_eq!(failed.status, OperationStatus::RetryWaiting);
    assert_eq!(lab.view(thumbnail.operation_id).await, thumbnail_before);

    // Claim and complete thumbnail: metadata's row stays as it was.
    let metadata_before = lab.view(metadata.operation_id).await;
    assert_eq!(metadata_before.state.status, OperationStatus::RetryWaiting);
    let thumb_claim = lab.claim_one("thumbnail", "w2", 30_000).await;
    assert_eq!(thumb_claim.operation_id, thumbnail.operation_id);
    assert_eq!(lab.view(metadata.operation_id).await, metadata_before);
    let done = lab
        .engine
        .complete_task(
            &lab.context,
            &thumb_claim.fence(),
            Completion::Output(json!({"path": "t.png"})),
        )
        .await
        .unwrap();
    assert_eq!(done.status, OperationStatus::Succeeded);
    assert_eq!(lab.view(metadata.operation_id).await, metadata_before);

    // Metadata retries and succeeds on its own: thumbnail's final row stays.
    let thumbnail_done = lab.view(thumbnail.operation_id).await;
    assert_eq!(thumbnail_done.state.status, OperationStatus::Succeeded);
    lab.clock.set(metadata_before.state.available_at);
    let meta_claim = lab.claim_one("metadata", "w1", 30_000).await;
    assert_eq!(meta_claim.attempt, 2);
    assert_eq!(lab.view(thumbnail.operation_id).await, thumbnail_done);
    let done = lab
        .engine
        .complete_task(
            &lab.context,
            &meta_claim.fence(),
            Completion::Output(json!({"width": 10})),
        )
        .await
        .unwrap();
    assert_eq!(done.status, OperationStatus::Succeeded);
    assert_eq!(lab.view(thumbnail.operation_id).await, thumbnail_done);
    let metadata_done = lab.state(metadata.operation_id).await;
    assert_eq!(metadata_done.failure_count, 1);
    assert_eq!(metadata_done.attempt_count, 2);
    assert_eq!(
        metadata_done.completed_revision.as_deref(),
        Some(metadata.requested_revision.as_str())
    );
    lab.verify().await;
}

async fn a_new_revision_requested_while_the_old_one_runs_is_never_lost<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    let media = lab.media("b.png").await;
    let target = TaskTarget::Media(media);
    let r1 = lab
        .request(target, "thumbnail", json!({"max_side": 256, "format": "png"}), 0)
        .await;
    let operation = r1.operation_id;
    let claim = lab.claim_one("thumbnail", "w1", 30_000).await;
    assert_eq!(claim.revision, r1.requested_revision);
    let row = lab.state(operation).await;
    assert_eq!(row.status, OperationStatus::Leased);
    assert_eq!(row.claimed_revision.as_deref(), Some(r1.requested_revision.as_str()));

    // R2 while R1 runs.
    lab.clock.advance_millis(10);
    let r2 = lab
        .request(target, "thumbnail", json!({"max_side": 512, "format": "png"}), 0)
        .await;
    assert!(r2.created);
    assert_eq!(r2.operation_id, operation);
    assert_ne!(r2.requested_revision, r1.requested_revision);
    let row = lab.state(operation).await;
    assert_eq!(row.status, OperationStatus::Leased);
    assert_eq!(row.requested_revision, r2.requested_revision);
    assert_eq!(row.claimed_revision.as_deref(), Some(r1.requested_revision.as_str()));
    assert_eq!(row.claim_token.as_deref(), Some(claim.claim_token.as_str()));
    assert_eq!(row.completed_revision, None);
    // The same R2 again is a no-op.
    let again = lab
        .request(target, "thumbnail", json!({"max_side": 512, "format": "png"}), 0)
        .await;
    assert!(!again.created);

    // R1 finishes: recorded against R1, and the task waits for R2.
    lab.clock.advance_millis(10);
    let outcome = lab
        .engine
        .complete_task(&lab.context, &claim.fence(), Completion::Output(json!({"side": 256})))
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::Queued);
    let row = lab.state(operation).await;
    assert_eq!(row.status, OperationStatus::Queued);
    assert_eq!(row.completed_revision.as_deref(), Some(r1.requested_revision.as_str()));
    assert_eq!(row.requested_revision, r2.requested_revision);
    assert_eq!(row.output.as_deref(), Some(r#"{"side":256}"#));
    assert_eq!(row.claim_token, None);
    assert_eq!(row.claimed_revision, None);
    assert!(row.available_at <= lab.now(), "claimable now");
    let types = lab.event_types(operation).await;
    assert!(types.contains(&"operation_superseded"), "{types:?}");
    assert!(
        !types.contains(&"operation_succeeded"),
        "R1 must not succeed the task: {types:?}"
    );

    // R2 runs and completes.
    let claim = lab.claim_one("thumbnail", "w2", 30_000).await;
    assert_eq!(claim.revision, r2.requested_revision);
    assert_eq!(claim.inputs["max_side"], 512);
    assert_eq!(claim.attempt, 1);
    let row = lab.state(operation).await;
    assert_eq!(row.status, OperationStatus::Leased);
    assert_eq!(row.completed_revision.as_deref(), Some(r1.requested_revision.as_str()));
    let outcome = lab
        .engine
        .complete_task(&lab.context, &claim.fence(), Completion::Output(json!({"side": 512})))
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::Succeeded);
    let row = lab.state(operation).await;
    assert_eq!(row.status, OperationStatus::Succeeded);
    assert_eq!(row.completed_revision.as_deref(), Some(r2.requested_revision.as_str()));
    assert_eq!(row.output.as_deref(), Some(r#"{"side":512}"#));
    // A completed revision requested again is a no-op.
    let again = lab
        .request(target, "thumbnail", json!({"max_side": 512, "format": "png"}), 0)
        .await;
    assert!(!again.created);
    assert_eq!(lab.state(operation).await, row);
    let timeline = lab.timeline(operation).await;
    let succeeded: Vec<_> = timeline
        .iter()
        .filter(|event| event.event_type() == "operation_succeeded")
        .collect();
    assert_eq!(succeeded.len(), 1);

    // The worker running R1 dies after R2 was requested: recovery ends its
    // claim and R2 is what runs next.
    let media = lab.media("b-dies.png").await;
    let target = TaskTarget::Media(media);
    let r1 = lab
        .request(target, "thumbnail", json!({"max_side": 256, "format": "png"}), 0)
        .await;
    let dead = lab.claim_one("thumbnail", "dies", 1_000).await;
    let r2 = lab
        .request(target, "thumbnail", json!({"max_side": 128, "format": "png"}), 0)
        .await;
    assert!(r2.created);
    lab.clock.advance_millis(1_001);
    let report = lab.engine.recover(&lab.context).await.unwrap();
    assert_eq!((report.interrupted, report.requeued), (1, 1), "{report:?}");
    let row = lab.state(r1.operation_id).await;
    assert_eq!(row.status, OperationStatus::Queued);
    assert_eq!(row.requested_revision, r2.requested_revision);
    assert_eq!(row.completed_revision, None);
    assert_eq!(row.claim_token, None);
    assert_conflict(
        lab.engine
            .complete_task(&lab.context, &dead.fence(), Completion::Output(json!({})))
            .await,
        "the dead worker's late completion",
    );
    let claim = lab.claim_one("thumbnail", "w3", 30_000).await;
    assert_eq!(claim.revision, r2.requested_revision);
    let outcome = lab
        .engine
        .complete_task(&lab.context, &claim.fence(), Completion::Output(json!({"side": 128})))
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::Succeeded);
    assert_eq!(
        outcome.completed_revision.as_deref(),
        Some(r2.requested_revision.as_str())
    );
    lab.verify().await;
}

async fn a_stale_worker_cannot_heartbeat_progress_complete_or_fail<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    let media = lab.media("c.png").await;
    let operation = lab
        .request(TaskTarget::Media(media), "thumbnail", inputs_for("thumbnail"), 0)
        .await
        .operation_id;
    let a = lab.claim_one("thumbnail", "A", 1_000).await;
    lab.clock.advance_millis(1_500);
    let report = lab.engine.recover(&lab.context).await.unwrap();
    assert_eq!((report.interrupted, report.requeued), (1, 1));
    let b = lab.claim_one("thumbnail", "B", 30_000).await;
    assert_eq!(b.operation_id, operation);
    assert_ne!(a.claim_token, b.claim_token);

    let stale_attempts = |phase: &'static str| {
        let lab = &lab;
        let a = a.clone();
        async move {
            for fence in [a.fence(), Fence::token(a.claim_token.clone())] {
                let before = lab.view(operation).await;
                let head = lab.head().await;
                assert_conflict(lab.engine.heartbeat(&fence, None).await, &format!("{phase}: heartbeat"));
                assert_conflict(
                    lab.engine
                        .report_progress(
                            &lab.context,
                            &fence,
                            Progress {
                                phase: "writing".into(),
                                processed: 1,
                                total: Some(2),
                            },
                        )
                        .await,
                    &format!("{phase}: progress"),
                );
                assert_conflict(
                    lab.engine
                        .complete_task(&lab.context, &fence, Completion::Output(json!({"by": "A"})))
                        .await,
                    &format!("{phase}: complete"),
                );
                assert_conflict(
                    lab.engine.fail_task(&lab.context, &fence, "A failed", false).await,
                    &format!("{phase}: fail"),
                );
                assert_conflict(
                    lab.engine.fail_task(&lab.context, &fence, "A failed", true).await,
                    &format!("{phase}: terminal fail"),
                );
                assert_eq!(
                    lab.view(operation).await,
                    before,
                    "{phase}: the row (and B's lease) is untouched"
                );
                assert_eq!(lab.head().await, head, "{phase}: nothing appended");
            }
        }
    };
    stale_attempts("while B holds the claim").await;
    // A fence must match the claim's revision too: B's token with another revision is refused.
    assert_conflict(
        lab.engine
            .heartbeat(
                &Fence {
                    claim_token: b.claim_token.clone(),
                    revision: Some("not-the-revision".into()),
                },
                None,
            )
            .await,
        "B's token with another revision",
    );
    let done = lab
        .engine
        .complete_task(&lab.context, &b.fence(), Completion::Output(json!({"by": "B"})))
        .await
        .unwrap();
    assert_eq!(done.status, OperationStatus::Succeeded);
    stale_attempts("after B completed").await;

    let succeeded: Vec<_> = lab
        .timeline(operation)
        .await
        .into_iter()
        .filter_map(|event| match event.event {
            Event::OperationSucceeded(succeeded) => Some(succeeded),
            _ => None,
        })
        .collect();
    assert_eq!(succeeded.len(), 1);
    // The timeline is a reader's: it names the claim by its fingerprint.
    assert_eq!(
        succeeded[0].claim_token.as_deref(),
        Some(opledger_domain::claims::fingerprint(&b.claim_token).as_str())
    );
    assert_eq!(succeeded[0].output, json!({"by": "B"}));
    lab.verify().await;
}

/// What a worker does in the gap between recovery's read and its write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gap {
    Complete,
    Fail,
    Heartbeat,
    /// A new phase: an event on the stream, but no lease extension.
    Progress,
    /// A new revision is requested: the claim runs a superseded revision.
    Rerequest,
    /// A cancel is requested: recovery finishes it.
    Cancel,
    Nothing,
}

/// A gap action's claim token and what the command answered (the status
/// it left, for completions and failures).
type Landed = (String, Result<Option<OperationStatus>, EngineError>);

impl Gap {
    fn name(self) -> &'static str {
        match self {
            Gap::Complete => "Complete",
            Gap::Fail => "Fail",
            Gap::Heartbeat => "Heartbeat",
            Gap::Progress => "Progress",
            Gap::Rerequest => "Rerequest",
            Gap::Cancel => "Cancel",
            Gap::Nothing => "Nothing",
        }
    }
}

const GAP_KINDS: [&str; 3] = ["metadata", "thumbnail", "perceptual_hash"];

async fn recovery_never_undoes_a_completion_that_lands_between_its_read_and_its_write<B: Backend>(backend: &B) {
    const SEEDS: u64 = 500;
    let lab = lab(backend).await;
    let started = Instant::now();
    let mut seen_actions: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in 0..SEEDS {
        let mut rng = SplitMix64(seed.wrapping_mul(0xA076_1D64_78BD_642F) ^ 0x5EED);
        // Newest scenario first: earlier seeds' requeued tasks never get in the way.
        let priority = i32::try_from(seed).unwrap() + 1;
        let media = lab.media(&format!("seed-{seed}.png")).await;
        let target = TaskTarget::Media(media);
        let count = 1 + rng.below(3) as usize;
        let first = rng.below(3) as usize;
        let kinds: Vec<&str> = (0..count).map(|index| GAP_KINDS[(first + index) % 3]).collect();
        let mut operations = BTreeSet::new();
        for kind in &kinds {
            operations.insert(lab.request(target, kind, inputs_for(kind), priority).await.operation_id);
        }
        // Sometimes a healthy claim with a long lease that recovery must not touch.
        let healthy = if rng.below(4) == 0 {
            lab.request(target, "full_embedding", inputs_for("full_embedding"), priority)
                .await;
            Some(lab.claim_one("full_embedding", "healthy", 3_600_000).await)
        } else {
            None
        };
        let lease_ms = 500 + rng.below(1_000) as i64;
        let claims = lab.claim(&kinds, "doomed", lease_ms, count).await;
        let claimed: BTreeSet<_> = claims.iter().map(|claim| claim.operation_id).collect();
        assert_eq!(
            claimed, operations,
            "seed {seed}: the claim takes exactly this scenario's tasks"
        );
        lab.clock.advance_millis(lease_ms + 1 + rng.below(2_000) as i64);
        let healthy_before = match &healthy {
            Some(claim) => Some(lab.view(claim.operation_id).await),
            None => None,
        };

        let mut plan: BTreeMap<String, (Gap, TaskClaim)> = BTreeMap::new();
        for claim in &claims {
            let gap = match rng.below(7) {
                0 => Gap::Complete,
                1 => Gap::Fail,
                2 => Gap::Heartbeat,
                3 => Gap::Progress,
                4 => Gap::Rerequest,
                5 => Gap::Cancel,
                _ => Gap::Nothing,
            };
            plan.insert(claim.claim_token.clone(), (gap, claim.clone()));
        }
        let plan = Arc::new(plan);
        let landed: Arc<Mutex<Vec<Landed>>> = Arc::new(Mutex::new(Vec::new()));
        let offered: Arc<Mutex<Vec<ExpiredClaim>>> = Arc::new(Mutex::new(Vec::new()));
        let hook: RecoveryHook = {
            let (engine, plan, landed, offered) = (lab.engine.clone(), plan.clone(), landed.clone(), offered.clone());
            let context = CommandContext::actor("gap-worker");
            Box::new(move |candidates: Vec<ExpiredClaim>| {
                let (engine, plan, landed, offered, context) = (
                    engine.clone(),
                    plan.clone(),
                    landed.clone(),
                    offered.clone(),
                    context.clone(),
                );
                Box::pin(async move {
                    for candidate in candidates {
                        offered.lock().unwrap().push(candidate.clone());
                        let Some((gap, claim)) = plan.get(&candidate.claim_token) else {
                            continue;
                        };
                        let fence = claim.fence();
                        let result = match gap {
                            Gap::Complete => engine
                                .complete_task(&context, &fence, Completion::Output(json!({"gap": true})))
                                .await
                                .map(|outcome| Some(outcome.status)),
                            Gap::Fail => engine
                                .fail_task(&context, &fence, "gap failure", false)
                                .await
                                .map(|outcome| Some(outcome.status)),
                            Gap::Heartbeat => engine.heartbeat(&fence, None).await.map(|_| None),
                            Gap::Progress => engine
                                .report_progress(
                                    &context,
                                    &fence,
                                    Progress {
                                        phase: "late".into(),
                                        processed: 1,
                                        total: None,
                                    },
                                )
                                .await
                                .map(|_| None),
                            // These commands' futures are not provably `Send` for
                            // every lifetime (see `off_task`); run them beside.
                            Gap::Rerequest => {
                                let request = TaskRequest {
                                    target: TaskTarget::Media(claim.media_id.unwrap()),
                                    kind: claim.task_kind.clone(),
                                    inputs: newer_inputs_for(&claim.task_kind),
                                    priority: 0,
                                };
                                let (engine, context) = (engine.clone(), context.clone());
                                off_task(move || async move { engine.request_task(&context, request).await })
                                    .await
                                    .map(|outcome| {
                                        assert!(outcome.created);
                                        None
                                    })
                            }
                            Gap::Cancel => {
                                let (engine, context, operation) =
                                    (engine.clone(), context.clone(), claim.operation_id);
                                off_task(move || async move {
                                    engine.cancel_task(&context, operation, "cancelled in the gap").await
                                })
                                .await
                                .map(|outcome| {
                                    assert!(outcome.cancel_requested);
                                    None
                                })
                            }
                            Gap::Nothing => Ok(None),
                        };
                        landed.lock().unwrap().push((candidate.claim_token.clone(), result));
                    }
                }) as Pin<Box<dyn Future<Output = ()> + Send>>
            })
        };
        let report = lab.engine.recover_with(&lab.context, Some(&hook)).await.unwrap();

        let offered_tokens: BTreeSet<String> = offered
            .lock()
            .unwrap()
            .iter()
            .map(|candidate| candidate.claim_token.clone())
            .collect();
        let planned_tokens: BTreeSet<String> = plan.keys().cloned().collect();
        assert_eq!(
            offered_tokens, planned_tokens,
            "seed {seed}: exactly the expired claims are candidates (not the healthy one)"
        );
        for (token, result) in landed.lock().unwrap().iter() {
            let (gap, _) = &plan[token];
            let expected = match gap {
                Gap::Complete => Some(OperationStatus::Succeeded),
                Gap::Fail => Some(OperationStatus::RetryWaiting),
                _ => None,
            };
            assert_eq!(
                result.as_ref().ok(),
                Some(&expected),
                "seed {seed}: {gap:?} in the gap: {result:?}"
            );
        }
        let count_of = |wanted: &[Gap]| plan.values().filter(|(gap, _)| wanted.contains(gap)).count() as u64;
        let requeued = count_of(&[Gap::Nothing, Gap::Progress, Gap::Rerequest]);
        let cancelled = count_of(&[Gap::Cancel]);
        let kept = count_of(&[Gap::Complete, Gap::Fail, Gap::Heartbeat]);
        assert_eq!(
            (
                report.interrupted,
                report.requeued,
                report.skipped,
                report.cancelled,
                report.failed
            ),
            (requeued + cancelled, requeued, kept, cancelled, 0),
            "seed {seed}: {report:?} for {:?}",
            plan.values().map(|(gap, _)| *gap).collect::<Vec<_>>()
        );

        for (gap, claim) in plan.values() {
            *seen_actions.entry(gap.name()).or_default() += 1;
            let row = lab.state(claim.operation_id).await;
            let types = lab.event_types(claim.operation_id).await;
            let tail: Vec<&str> = types.iter().rev().take(2).rev().copied().collect();
            let after = |event: &str| -> Vec<&str> {
                let at = types.iter().rposition(|seen| *seen == event).unwrap();
                types[at + 1..].to_vec()
            };
            match gap {
                Gap::Complete => {
                    assert_eq!(row.status, OperationStatus::Succeeded, "seed {seed}: {types:?}");
                    assert_eq!(row.completed_revision.as_deref(), Some(claim.revision.as_str()));
                    assert_eq!(row.interruption_count, 0);
                    assert!(after("operation_succeeded").is_empty(), "seed {seed}: {types:?}");
                }
                Gap::Fail => {
                    assert_eq!(row.status, OperationStatus::RetryWaiting, "seed {seed}: {types:?}");
                    assert_eq!(row.failure_count, 1);
                    assert_eq!(row.interruption_count, 0);
                    assert_eq!(after("operation_failed"), ["operation_retry_scheduled"], "seed {seed}");
                }
                Gap::Heartbeat => {
                    assert_eq!(row.status, OperationStatus::Leased, "seed {seed}: {types:?}");
                    assert_eq!(row.claim_token.as_deref(), Some(claim.claim_token.as_str()));
                    assert_eq!(types.last(), Some(&"operation_claimed"), "seed {seed}");
                    let view = lab.view(claim.operation_id).await;
                    assert!(view.lease_expires_at().unwrap() > lab.now(), "seed {seed}: extended");
                }
                Gap::Progress | Gap::Nothing => {
                    assert_eq!(row.status, OperationStatus::Queued, "seed {seed}: {types:?}");
                    assert_eq!(row.claim_token, None);
                    assert_eq!(row.interruption_count, 1);
                    assert_eq!(row.failure_count, 0);
                    assert_eq!(tail, ["operation_interrupted", "operation_requeued"], "seed {seed}");
                    if *gap == Gap::Progress {
                        assert_eq!(after("operation_progressed")[..1], ["operation_interrupted"]);
                    }
                    assert_eq!(row.requested_revision, claim.revision);
                }
                Gap::Rerequest => {
                    assert_eq!(row.status, OperationStatus::Queued, "seed {seed}: {types:?}");
                    assert_eq!(row.claim_token, None);
                    assert_ne!(
                        row.requested_revision, claim.revision,
                        "seed {seed}: the new revision waits"
                    );
                    assert_eq!(row.completed_revision, None);
                    assert_eq!(
                        row.interruption_count, 0,
                        "seed {seed}: not counted against the new revision"
                    );
                    assert_eq!(
                        after("operation_revision_requested"),
                        ["operation_interrupted", "operation_requeued"],
                        "seed {seed}"
                    );
                }
                Gap::Cancel => {
                    assert_eq!(row.status, OperationStatus::Cancelled, "seed {seed}: {types:?}");
                    assert_eq!(row.claim_token, None);
                    assert!(!row.cancel_requested);
                    assert_eq!(
                        after("operation_cancel_requested"),
                        ["operation_interrupted", "operation_cancelled"],
                        "seed {seed}"
                    );
                }
            }
        }
        if let (Some(claim), Some(before)) = (&healthy, &healthy_before) {
            assert_eq!(
                &lab.view(claim.operation_id).await,
                before,
                "seed {seed}: healthy claim untouched"
            );
        }
        // Claims that survived recovery still hold: their workers finish them.
        let survivors = plan
            .values()
            .filter(|(gap, _)| *gap == Gap::Heartbeat)
            .map(|(_, claim)| claim)
            .chain(healthy.iter());
        for claim in survivors {
            let outcome = lab
                .engine
                .complete_task(&lab.context, &claim.fence(), Completion::Output(json!({"after": true})))
                .await
                .unwrap();
            assert_eq!(outcome.status, OperationStatus::Succeeded, "seed {seed}");
        }
        // Claims recovery ended no longer hold.
        if let Some((_, claim)) = plan.values().find(|(gap, _)| *gap == Gap::Nothing) {
            assert_conflict(
                lab.engine
                    .complete_task(&lab.context, &claim.fence(), Completion::Output(json!({})))
                    .await,
                &format!("seed {seed}: completion of an interrupted claim"),
            );
        }
        lab.clock.advance_millis(1);
    }
    for gap in [
        "Complete",
        "Fail",
        "Heartbeat",
        "Progress",
        "Rerequest",
        "Cancel",
        "Nothing",
    ] {
        assert!(
            seen_actions.get(gap).copied().unwrap_or(0) > 20,
            "{gap} too rare: {seen_actions:?}"
        );
    }
    eprintln!("{SEEDS} seeds in {:?}: {seen_actions:?}", started.elapsed());
    lab.verify().await;
}

/// 2,000 tasks (1,000 items, two kinds) in every run; 10,000 with
/// `OPLEDGER_SOAK=1`.
async fn sixteen_workers_on_separate_connections_drain_thousands_of_tasks_exactly_once<B: Backend>(backend: &B) {
    let media_count = opledger_testkit::load_size(1_000, 5_000);
    const KINDS: [&str; 2] = ["metadata", "thumbnail"];
    const WORKERS: usize = 16;
    let setup_store = backend.open().await;
    let (setup, _) = Engine::open(setup_store).await.unwrap();
    setup
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    let context = CommandContext::actor("setup");

    let started = Instant::now();
    let requested: Vec<(MediaId, Vec<RequestOutcome>)> = futures::stream::iter(0..media_count)
        .map(|index| {
            let (setup, context) = (setup.clone(), context.clone());
            async move {
                let path = format!("/drain/{index}.png");
                let media = setup
                    .register_media(&context, &path, "image", Some(format!("sha256:{index}")), Some(1))
                    .await?;
                let mut outcomes = Vec::new();
                for kind in KINDS {
                    outcomes.push(
                        setup
                            .request_task(
                                &context,
                                TaskRequest {
                                    target: TaskTarget::Media(media),
                                    kind: kind.into(),
                                    inputs: inputs_for(kind),
                                    priority: 0,
                                },
                            )
                            .await?,
                    );
                }
                Ok::<_, EngineError>((media, outcomes))
            }
        })
        .buffer_unordered(128)
        .try_collect()
        .await
        .unwrap();
    let mut expected: BTreeMap<OperationId, (MediaId, String, String)> = BTreeMap::new();
    for (media, outcomes) in &requested {
        for (kind, outcome) in KINDS.iter().zip(outcomes) {
            assert!(outcome.created);
            expected.insert(
                outcome.operation_id,
                (*media, kind.to_string(), outcome.requested_revision.clone()),
            );
        }
    }
    assert_eq!(expected.len(), media_count * KINDS.len());
    let setup_took = started.elapsed();

    // Each worker: its own store (own writer connection, own read pool, own
    // writer task), its own engine with the system clock.
    let mut engines = Vec::new();
    for _ in 0..WORKERS {
        engines.push(Engine::new(backend.open().await));
    }
    let started = Instant::now();
    let workers: Vec<_> = engines
        .into_iter()
        .enumerate()
        .map(|(index, engine)| {
            // Polled together from the test task (the engine's futures are
            // not `Send` for every lifetime, which `tokio::spawn` demands);
            // each store's writer runs its transactions on its own task.
            async move {
                let name = format!("worker-{index}");
                let context = CommandContext::actor(name.clone());
                let mut completed = Vec::new();
                let mut conflicts = Vec::new();
                loop {
                    let claims = engine
                        .claim_tasks(&context, claim_request(&[], &name, 600_000, 8))
                        .await
                        .unwrap();
                    if claims.is_empty() {
                        break;
                    }
                    // Report all of them at once: one worker's reports share
                    // its writer's group commit.
                    let outcomes = futures::future::join_all(claims.iter().map(|claim| {
                        let (engine, context, fence) = (engine.clone(), context.clone(), claim.fence());
                        async move {
                            engine
                                .complete_task(&context, &fence, Completion::Output(json!({"by": index})))
                                .await
                        }
                    }))
                    .await;
                    for (claim, outcome) in claims.iter().zip(outcomes) {
                        match outcome {
                            Ok(outcome) => {
                                assert_eq!(outcome.status, OperationStatus::Succeeded);
                                completed.push((claim.operation_id, claim.revision.clone(), claim.claim_token.clone()));
                            }
                            Err(error) => conflicts.push((claim.operation_id, error)),
                        }
                    }
                }
                (completed, conflicts)
            }
        })
        .collect();
    let mut completions = Vec::new();
    for (completed, conflicts) in futures::future::join_all(workers).await {
        assert!(conflicts.is_empty(), "a worker lost a valid claim: {conflicts:?}");
        completions.extend(completed);
    }
    let drain_took = started.elapsed();

    assert_eq!(completions.len(), media_count * KINDS.len());
    let tokens: BTreeSet<&String> = completions.iter().map(|(_, _, token)| token).collect();
    assert_eq!(tokens.len(), completions.len(), "claim tokens are unique");
    let mut per_task: BTreeMap<(MediaId, String, String), usize> = BTreeMap::new();
    for (operation_id, revision, _) in &completions {
        let (media, kind, requested) = &expected[operation_id];
        assert_eq!(revision, requested);
        *per_task.entry((*media, kind.clone(), revision.clone())).or_default() += 1;
    }
    assert_eq!(per_task.len(), media_count * KINDS.len());
    assert!(
        per_task.values().all(|count| *count == 1),
        "every task completed exactly once"
    );

    // From the log: per operation, claims never overlap, and the one
    // success carries the token a worker reported.
    let tokens_by_operation: BTreeMap<OperationId, &String> = completions
        .iter()
        .map(|(operation_id, _, token)| (*operation_id, token))
        .collect();
    let events: Vec<EventEnvelope> = setup.store().read_all(0, 10_000).try_collect().await.unwrap();
    let mut open: BTreeMap<OperationId, String> = BTreeMap::new();
    let mut succeeded: BTreeMap<OperationId, String> = BTreeMap::new();
    let mut claims_seen = 0;
    for envelope in &events {
        match &envelope.event {
            Event::OperationClaimed(claimed) => {
                claims_seen += 1;
                let previous = open.insert(claimed.operation_id, claimed.claim_token.clone());
                assert!(previous.is_none(), "two claims of {} overlap", claimed.operation_id);
            }
            Event::OperationSucceeded(done) => {
                let holder = open.remove(&done.operation_id).expect("a success ends a claim");
                assert_eq!(done.claim_token.as_deref(), Some(holder.as_str()));
                assert!(succeeded.insert(done.operation_id, holder).is_none());
            }
            Event::OperationFailed(_)
            | Event::OperationInterrupted(_)
            | Event::OperationSuperseded(_)
            | Event::OperationCancelled(_)
            | Event::OperationFoundNothing(_) => {
                panic!("unexpected {} in a clean drain", envelope.event_type())
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "claims left open: {}", open.len());
    assert_eq!(claims_seen, media_count * KINDS.len());
    assert_eq!(succeeded.len(), media_count * KINDS.len());
    for (operation_id, token) in &succeeded {
        assert_eq!(&tokens_by_operation[operation_id], &token);
    }
    let status = setup.status().await.unwrap();
    assert_eq!(status.head, events.len() as i64);
    let report = setup.verify().await.unwrap();
    assert!(report.is_identical(), "{}", report.render());
    eprintln!("setup {setup_took:?}, drain {drain_took:?}");
}

/// Fails a fresh `kind` task until its attempts run out, checking every
/// step; returns the operation.
async fn fail_until_exhausted<S: Store>(lab: &Lab<S>, kind: &str) -> OperationId {
    let media = lab.media(&format!("{kind}.png")).await;
    let operation = lab
        .request(TaskTarget::Media(media), kind, inputs_for(kind), 0)
        .await
        .operation_id;
    let mut scheduled = Vec::new();
    for attempt in 1..=5_i64 {
        let claim = lab.claim_one(kind, "w", 30_000).await;
        assert_eq!(claim.attempt, attempt);
        lab.clock.advance_millis(250);
        let now = lab.now();
        let error = format!("{kind} failure {attempt}");
        let outcome = lab
            .engine
            .fail_task(&lab.context, &claim.fence(), &error, false)
            .await
            .unwrap();
        let row = lab.state(operation).await;
        assert_eq!(row.attempt_count, attempt);
        assert_eq!(row.failure_count, attempt);
        assert_eq!(row.interruption_count, 0);
        assert_eq!(row.claim_token, None);
        assert_eq!(outcome.failure_count, attempt);
        assert_eq!(outcome.attempt_count, attempt);
        if attempt < 5 {
            let backoff = 1_000_i64 << (attempt - 1);
            let jitter = backoff * 250 / 1_000 * 500 / 1_000;
            assert_eq!(row.status, OperationStatus::RetryWaiting);
            assert_eq!(row.last_error.as_deref(), Some(error.as_str()));
            assert_eq!(row.available_at, now.plus_millis(backoff + jitter), "attempt {attempt}");
            assert_eq!(outcome.available_at, row.available_at);
            scheduled.push((row.available_at, backoff, jitter));
            // Not before its time.
            lab.clock.set(row.available_at.plus_millis(-1));
            assert!(lab.claim(&[kind], "w", 30_000, 1).await.is_empty());
            lab.clock.set(row.available_at);
        } else {
            let last_error = row.last_error.clone().unwrap();
            match kind {
                "thumbnail" => {
                    assert_eq!(row.status, OperationStatus::FailedTerminal);
                    assert!(last_error.contains("no attempts left"), "{last_error}");
                }
                _ => {
                    assert_eq!(row.status, OperationStatus::DeadLettered);
                    assert_eq!(last_error, error);
                    assert!(row.status_reason.as_deref().unwrap().contains("no attempts left"));
                }
            }
            assert!(lab.claim(&[kind], "w", 30_000, 1).await.is_empty());
        }
    }
    let recorded: Vec<(Timestamp, i64, i64)> = lab
        .timeline(operation)
        .await
        .into_iter()
        .filter_map(|event| match event.event {
            Event::OperationRetryScheduled(retry) => Some((retry.available_at, retry.backoff_ms, retry.jitter_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(recorded, scheduled, "the events carry what the state showed");
    operation
}

async fn failures_back_off_exponentially_until_the_attempts_run_out_and_replay_reproduces_available_at<B: Backend>(
    backend: &B,
) {
    let lab = lab(backend).await;
    let thumbnail = fail_until_exhausted(&lab, "thumbnail").await;
    let tagging = fail_until_exhausted(&lab, "auto_tagging").await;

    // A terminal failure is final at once.
    let media = lab.media("terminal.png").await;
    let terminal = lab
        .request(
            TaskTarget::Media(media),
            "perceptual_hash",
            inputs_for("perceptual_hash"),
            0,
        )
        .await
        .operation_id;
    let claim = lab.claim_one("perceptual_hash", "w", 30_000).await;
    let outcome = lab
        .engine
        .fail_task(&lab.context, &claim.fence(), "not an image", true)
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::FailedTerminal);
    let row = lab.state(terminal).await;
    assert_eq!((row.attempt_count, row.failure_count), (1, 1));
    assert_eq!(row.last_error.as_deref(), Some("not an image"));

    lab.verify().await;
    // And directly: the replayed rows equal the live ones, available_at included.
    let (scratch, replayed, _) = lab.engine.replay_into_scratch().await.unwrap();
    for operation in [thumbnail, tagging, terminal] {
        let live = lab.state(operation).await;
        let again = replayed
            .rows()
            .find_map(|row| match row {
                Row::ProcessingState(state) if state.operation_id == operation => Some(state.clone()),
                _ => None,
            })
            .expect("the replay cache holds every row of this small log");
        assert_eq!(again.available_at, live.available_at);
        assert_eq!(again, live);
    }
    scratch.discard().await.unwrap();
}

async fn an_item_interrupted_too_often_is_quarantined<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    let media = lab.media("poison.png").await;
    let operation = lab
        .request(TaskTarget::Media(media), "thumbnail", inputs_for("thumbnail"), 0)
        .await
        .operation_id;
    for interruption in 1..=4_i64 {
        let claim = lab.claim_one("thumbnail", "doomed", 1_000).await;
        assert_eq!(claim.attempt, interruption);
        lab.clock.advance_millis(1_001);
        let report = lab.engine.recover(&lab.context).await.unwrap();
        assert_eq!(report.interrupted, 1);
        let row = lab.state(operation).await;
        assert_eq!(row.interruption_count, interruption);
        assert_eq!(row.failure_count, 0, "interruptions are not errors");
        assert_eq!(row.last_error, None);
        assert_eq!(row.claim_token, None);
        if interruption <= 3 {
            assert_eq!((report.requeued, report.failed), (1, 0));
            assert_eq!(row.status, OperationStatus::Queued);
        } else {
            assert_eq!((report.requeued, report.failed), (0, 1));
            assert_eq!(row.status, OperationStatus::FailedTerminal);
            let reason = row.status_reason.clone().unwrap();
            assert!(reason.contains("quarantined"), "{reason}");
            assert!(lab.claim(&[], "w", 1_000, 10).await.is_empty());
        }
    }
    lab.verify().await;
}

async fn cancel_of_a_claimed_task_waits_for_the_worker_and_recovery_finishes_a_dead_workers_cancel<B: Backend>(
    backend: &B,
) {
    let lab = lab(backend).await;
    let media = lab.media("cancel.png").await;
    let target = TaskTarget::Media(media);

    // A live worker: the cancel waits for its acknowledgement.
    let live = lab
        .request(target, "metadata", inputs_for("metadata"), 0)
        .await
        .operation_id;
    let claim = lab.claim_one("metadata", "live", 30_000).await;
    let outcome = lab.engine.cancel_task(&lab.context, live, "user asked").await.unwrap();
    assert!(outcome.cancel_requested);
    assert_eq!(outcome.status, OperationStatus::Leased);
    let row = lab.state(live).await;
    assert!(row.cancel_requested);
    assert_eq!(row.status, OperationStatus::Leased);
    assert_eq!(row.claim_token.as_deref(), Some(claim.claim_token.as_str()));
    // Asking again changes nothing.
    let head = lab.head().await;
    lab.engine.cancel_task(&lab.context, live, "again").await.unwrap();
    assert_eq!(lab.head().await, head);
    let beat = lab.engine.heartbeat(&claim.fence(), None).await.unwrap();
    assert!(beat.cancel_requested);
    let outcome = lab
        .engine
        .acknowledge_cancel(&lab.context, &claim.fence())
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::Cancelled);
    assert!(!outcome.cancel_requested);
    let row = lab.state(live).await;
    assert_eq!(row.status, OperationStatus::Cancelled);
    assert_eq!(row.claim_token, None);
    assert_conflict(
        lab.engine.heartbeat(&claim.fence(), None).await,
        "heartbeat after cancel",
    );

    // A dead worker: recovery finishes the cancel.
    let dead = lab
        .request(target, "thumbnail", inputs_for("thumbnail"), 0)
        .await
        .operation_id;
    let claim = lab.claim_one("thumbnail", "dead", 1_000).await;
    let outcome = lab.engine.cancel_task(&lab.context, dead, "user asked").await.unwrap();
    assert!(outcome.cancel_requested);
    assert_eq!(outcome.status, OperationStatus::Leased);
    lab.clock.advance_millis(1_001);
    let report = lab.engine.recover(&lab.context).await.unwrap();
    assert_eq!((report.interrupted, report.cancelled, report.requeued), (1, 1, 0));
    let row = lab.state(dead).await;
    assert_eq!(row.status, OperationStatus::Cancelled);
    assert!(!row.cancel_requested);
    assert_eq!(row.failure_count, 0);
    assert_conflict(
        lab.engine.acknowledge_cancel(&lab.context, &claim.fence()).await,
        "acknowledge by a worker recovery already ended",
    );

    // Queued work is cancelled at once.
    let queued = lab
        .request(target, "perceptual_hash", inputs_for("perceptual_hash"), 0)
        .await
        .operation_id;
    let outcome = lab.engine.cancel_task(&lab.context, queued, "").await.unwrap();
    assert_eq!(outcome.status, OperationStatus::Cancelled);
    assert!(!outcome.cancel_requested);
    assert!(lab.claim(&["perceptual_hash"], "w", 1_000, 1).await.is_empty());

    // Finished work cannot be cancelled.
    let finished = lab
        .request(target, "auto_tagging", inputs_for("auto_tagging"), 0)
        .await
        .operation_id;
    let claim = lab.claim_one("auto_tagging", "w", 30_000).await;
    lab.engine
        .complete_task(&lab.context, &claim.fence(), Completion::Output(json!({"tags": []})))
        .await
        .unwrap();
    let before = lab.state(finished).await;
    let head = lab.head().await;
    assert_conflict(
        lab.engine.cancel_task(&lab.context, finished, "too late").await,
        "cancel of a success",
    );
    assert_eq!(lab.state(finished).await, before);
    assert_eq!(lab.head().await, head);
    // An acknowledgement without a request is refused too.
    let media = lab.media("other.png").await;
    let unasked = lab
        .request(TaskTarget::Media(media), "metadata", inputs_for("metadata"), 0)
        .await
        .operation_id;
    let claim = lab.claim_one("metadata", "w", 30_000).await;
    assert_conflict(
        lab.engine.acknowledge_cancel(&lab.context, &claim.fence()).await,
        "acknowledge without a cancel request",
    );
    lab.engine
        .complete_task(&lab.context, &claim.fence(), Completion::Output(json!({})))
        .await
        .unwrap();
    assert_eq!(lab.state(unasked).await.status, OperationStatus::Succeeded);

    // A worker that reports a retryable failure instead of acknowledging has
    // stopped too: its failure is recorded and the cancel is not lost (the
    // task must not wait to retry with a cancel pending, where no claim can
    // take it and the claim query trips over it).
    let media = lab.media("cancel-then-fail.png").await;
    let failing = lab
        .request(
            TaskTarget::Media(media),
            "full_embedding",
            inputs_for("full_embedding"),
            0,
        )
        .await
        .operation_id;
    let claim = lab.claim_one("full_embedding", "w", 30_000).await;
    lab.engine
        .cancel_task(&lab.context, failing, "user asked")
        .await
        .unwrap();
    let outcome = lab
        .engine
        .fail_task(&lab.context, &claim.fence(), "stopped half way", false)
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::Cancelled, "{outcome:?}");
    let row = lab.state(failing).await;
    assert_eq!(row.status, OperationStatus::Cancelled);
    assert!(!row.cancel_requested);
    assert_eq!(row.failure_count, 1);
    assert_eq!(row.last_error.as_deref(), Some("stopped half way"));

    // The same when the worker finishes a revision superseded meanwhile:
    // its output is recorded against the revision it ran, and the cancel
    // stands (as recovery would decide for a dead worker).
    let media = lab.media("cancel-then-supersede.png").await;
    let target = TaskTarget::Media(media);
    let r1 = lab.request(target, "thumbnail", inputs_for("thumbnail"), 0).await;
    let claim = lab.claim_one("thumbnail", "w", 30_000).await;
    lab.engine
        .cancel_task(&lab.context, r1.operation_id, "user asked")
        .await
        .unwrap();
    let r2 = lab
        .request(target, "thumbnail", json!({"max_side": 64, "format": "png"}), 0)
        .await;
    assert!(r2.created);
    let outcome = lab
        .engine
        .complete_task(&lab.context, &claim.fence(), Completion::Output(json!({"side": 256})))
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::Cancelled, "{outcome:?}");
    let row = lab.state(r1.operation_id).await;
    assert!(!row.cancel_requested);
    assert_eq!(row.completed_revision.as_deref(), Some(r1.requested_revision.as_str()));
    assert_eq!(row.requested_revision, r2.requested_revision);

    // Whatever happened above, the queue keeps answering.
    lab.clock.advance_millis(3_600_000);
    let claims = lab
        .engine
        .claim_tasks(&lab.context, claim_request(&[], "w", 30_000, 10))
        .await
        .expect("no row may make claims fail");
    assert!(claims.is_empty(), "{claims:?}");
    lab.verify().await;
}

async fn bad_requests_are_refused_and_append_nothing<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    let media = lab.media("ok.png").await;
    let bare = lab
        .engine
        .register_media(&lab.context, "/no-digest.png", "image", None, None)
        .await
        .unwrap();
    let region = lab
        .engine
        .add_region(
            &lab.context,
            media,
            BoundingBox {
                x: 0,
                y: 0,
                width: 4,
                height: 4,
            },
            1,
        )
        .await
        .unwrap();
    let head = lab.head().await;
    let request = |target: TaskTarget, kind: &str, inputs: Value| TaskRequest {
        target,
        kind: kind.to_string(),
        inputs,
        priority: 0,
    };
    let engine = &lab.engine;
    let context = &lab.context;
    let unknown_media = TaskTarget::Media(MediaId(Uuid::from_u128(0xDEAD)));
    let unknown_region = TaskTarget::Region(RegionId(Uuid::from_u128(0xBEEF)));
    let target = TaskTarget::Media(media);

    assert_not_found(
        engine
            .request_task(context, request(unknown_media, "metadata", json!({})))
            .await,
        "unknown media",
    );
    assert_invalid(
        engine
            .request_task(context, request(target, "transcode", json!({})))
            .await,
        "unknown task kind",
    );
    assert_invalid(
        engine
            .request_task(context, request(target, "crop_embedding", inputs_for("crop_embedding")))
            .await,
        "crop_embedding on a media target",
    );
    assert_invalid(
        engine
            .request_task(context, request(TaskTarget::Region(region), "metadata", json!({})))
            .await,
        "a media kind on a region target",
    );
    assert_not_found(
        engine
            .request_task(
                context,
                request(unknown_region, "crop_embedding", inputs_for("crop_embedding")),
            )
            .await,
        "crop_embedding on an unknown region",
    );
    for inputs in [json!([1]), json!("max_side"), json!(null), json!(7)] {
        assert_invalid(
            engine
                .request_task(context, request(target, "thumbnail", inputs.clone()))
                .await,
            &format!("inputs {inputs}"),
        );
    }
    assert_invalid(
        engine
            .request_task(context, request(target, "auto_tagging", json!({"model": "clip"})))
            .await,
        "missing required input (without a default)",
    );
    assert_invalid(
        engine
            .request_task(
                context,
                request(target, "thumbnail", json!({"max_side": "big", "format": "png"})),
            )
            .await,
        "input of the wrong type",
    );
    assert_invalid(
        engine
            .request_task(
                context,
                request(target, "thumbnail", json!({"max_side": 2.5, "format": "png"})),
            )
            .await,
        "a fraction for an integer input",
    );
    assert_invalid(
        engine
            .request_task(
                context,
                request(
                    target,
                    "thumbnail",
                    json!({"max_side": 256, "format": "png", "colour": 1}),
                ),
            )
            .await,
        "an unknown input",
    );
    assert_invalid(
        engine
            .request_task(
                context,
                request(TaskTarget::Media(bare), "thumbnail", inputs_for("thumbnail")),
            )
            .await,
        "a target without a digest",
    );
    for lease_ms in [0, -1, MAX_LEASE_MS + 1] {
        assert_invalid(
            engine.claim_tasks(context, claim_request(&[], "w", lease_ms, 1)).await,
            &format!("lease {lease_ms} ms"),
        );
    }
    for limit in [0, MAX_CLAIM_BATCH + 1] {
        assert_invalid(
            engine.claim_tasks(context, claim_request(&[], "w", 1_000, limit)).await,
            &format!("claim limit {limit}"),
        );
    }
    assert_invalid(
        engine
            .claim_tasks(context, claim_request(&["transcode"], "w", 1_000, 1))
            .await,
        "claim of an unknown kind",
    );
    assert_invalid(
        engine.claim_tasks(context, claim_request(&[], " ", 1_000, 1)).await,
        "claim without a worker name",
    );
    assert_not_found(
        engine
            .cancel_task(context, OperationId(Uuid::from_u128(0xF00D)), "no such task")
            .await,
        "cancel of an unknown task",
    );
    assert_eq!(lab.head().await, head, "no refusal appended anything");
    assert!(engine.task_state(target, "thumbnail").await.unwrap().is_none());

    // The boundaries themselves are accepted.
    lab.request(target, "metadata", json!({}), 0).await;
    let claims = engine
        .claim_tasks(context, claim_request(&[], "w", MAX_LEASE_MS, MAX_CLAIM_BATCH))
        .await
        .unwrap();
    assert_eq!(claims.len(), 1);
    for lease_ms in [0, MAX_LEASE_MS + 1] {
        assert_invalid(
            engine.heartbeat(&claims[0].fence(), Some(lease_ms)).await,
            &format!("heartbeat lease {lease_ms} ms"),
        );
    }
    lab.verify().await;
}

async fn removing_a_media_item_removes_its_processing_states_and_replay_agrees<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    let media = lab.media("gone.png").await;
    let keep = lab.media("kept.png").await;
    let region = lab
        .engine
        .add_region(
            &lab.context,
            media,
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
    let metadata = lab
        .request(TaskTarget::Media(media), "metadata", inputs_for("metadata"), 0)
        .await;
    let crop = lab
        .request(
            TaskTarget::Region(region),
            "crop_embedding",
            inputs_for("crop_embedding"),
            0,
        )
        .await;
    let kept = lab
        .request(TaskTarget::Media(keep), "metadata", inputs_for("metadata"), 0)
        .await;
    let crop_row = lab.state(crop.operation_id).await;
    assert_eq!(crop_row.target_id, region.0);
    let inputs: Value = serde_json::from_str(&crop_row.inputs).unwrap();
    assert_eq!(inputs["bbox"], json!({"x": 1, "y": 2, "width": 30, "height": 40}));
    assert_eq!(inputs["region_revision"], 1);
    let claim = lab.claim_one("crop_embedding", "w", 1_000).await;
    assert_eq!(claim.region_id, Some(region));
    lab.verify().await;

    let kept_before = lab.view(kept.operation_id).await;
    lab.engine.remove_media(&lab.context, media, "deleted").await.unwrap();
    assert!(lab
        .engine
        .task_by_operation(metadata.operation_id)
        .await
        .unwrap()
        .is_none());
    assert!(lab.engine.task_by_operation(crop.operation_id).await.unwrap().is_none());
    assert_eq!(lab.view(kept.operation_id).await, kept_before);
    // The worker still holding the region's claim finds it gone.
    assert_conflict(
        lab.engine
            .complete_task(&lab.context, &claim.fence(), Completion::Output(json!({})))
            .await,
        "completion for a removed item",
    );
    lab.clock.advance_millis(2_000);
    let report = lab.engine.recover(&lab.context).await.unwrap();
    assert_eq!(report.interrupted, 0);
    assert_not_found(
        lab.engine
            .request_task(
                &lab.context,
                TaskRequest {
                    target: TaskTarget::Media(media),
                    kind: "metadata".into(),
                    inputs: json!({}),
                    priority: 0,
                },
            )
            .await,
        "request on a removed item",
    );
    lab.verify().await;
}

backend_tests!(
    two_task_kinds_on_one_media_item_progress_independently,
    a_new_revision_requested_while_the_old_one_runs_is_never_lost,
    a_stale_worker_cannot_heartbeat_progress_complete_or_fail,
    recovery_never_undoes_a_completion_that_lands_between_its_read_and_its_write,
    failures_back_off_exponentially_until_the_attempts_run_out_and_replay_reproduces_available_at,
    an_item_interrupted_too_often_is_quarantined,
    cancel_of_a_claimed_task_waits_for_the_worker_and_recovery_finishes_a_dead_workers_cancel,
    bad_requests_are_refused_and_append_nothing,
    removing_a_media_item_removes_its_processing_states_and_replay_agrees,
);
backend_tests!(worker_threads = 4; sixteen_workers_on_separate_connections_drain_thousands_of_tasks_exactly_once);
