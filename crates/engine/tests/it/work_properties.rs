//! Property tests of the work protocol on a real SQLite database.
//!
//! A case is a random sequence of work-protocol commands over a small
//! universe (three media items with one region, four task kinds, two input
//! variants each): requests (first ones, repeats, new revisions, refused
//! ones), batch claims, heartbeats, progress, completions (with an output or
//! no result), failures (retryable or terminal), cancels and their
//! acknowledgements, each report made with a held, an ended or a bogus claim
//! token. The clock moves between commands; now and then recovery runs or the
//! process restarts (reopen, startup, maintenance), sometimes under a new
//! metadata version. Batches are created over the items, cancelled and
//! resumed; open review entries are retried, dismissed or acknowledged.
//!
//! Properties:
//! 1. A refused command appends nothing (the log head is unchanged), and
//!    every refusal is a domain error, never a store error.
//! 2. Fencing: a report made with a token that does not hold its task is a
//!    Conflict; a report with a held token is accepted (an acknowledgement
//!    only when a cancel was requested).
//! 3. A held claim has its lease row; an ended claim has none.
//! 4. Every batch's counts equal its items' outcomes and its activity is the
//!    shared predicate's; no item is unsettled while its operation is
//!    settled; every open review entry is for a routed status.
//! 5. At the end, `verify()` finds the inline projections identical to a
//!    replay of the log from empty, twice, and the live tables equal the pure
//!    in-memory reference fold of the whole log.
//!
//! Failure persistence is off: nothing is written into the source tree.

use futures::TryStreamExt;
use opledger_domain::batches::{is_active, settled_outcome, BatchProgress};
use opledger_domain::kinds::legacy;
use opledger_domain::projections::{all_specs, fold_in_memory, Row};
use opledger_domain::review::{route, ReviewAction};
use opledger_domain::BatchId;
use opledger_domain::{DomainError, MediaId, OperationId, RegionId, Timestamp};
use opledger_engine::{
    BatchRequest, ClaimRequest, CommandContext, Completion, Engine, EngineError, Fence, FixedClock, FixedJitter,
    Progress, SequentialIds, TaskClaim, TaskRequest, TaskTarget,
};
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestError, TestRunner};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which claim token a report carries.
#[derive(Debug, Clone, Copy)]
enum Token {
    /// The k-th (modulo) claim still held; bogus while none is.
    Held(usize),
    /// The k-th (modulo) claim that ended; bogus while none has.
    Ended(usize),
    /// A token nobody was given.
    Bogus,
}

#[derive(Debug, Clone)]
enum Command {
    /// Target 0..=2 is a media item, 3 the region; kind 0..=3 (media kinds
    /// on the region and the region kind on media are refused).
    Request {
        target: usize,
        kind: usize,
        variant: bool,
    },
    /// Inputs that no kind accepts.
    RequestMalformed,
    Claim {
        any_kind: bool,
        kind: usize,
        limit: usize,
        lease_ms: i64,
    },
    Heartbeat(Token),
    Progress(Token, bool, i64),
    Complete(Token, bool),
    Fail(Token, bool),
    Cancel(usize),
    AcknowledgeCancel(Token),
    Recover,
    Advance(i64),
    Restart,
    /// A batch over the media items in the mask (bit i: item i) and a kind.
    BatchCreate(u8, usize),
    BatchCancel(usize),
    BatchResume(usize),
    /// Resolve the k-th open review entry: 0 retry, 1 dismiss, 2 acknowledge.
    ReviewResolve(usize, u8),
    /// Restart under a new metadata version (a deployment of a new model).
    NewMetadataVersion,
}

const KINDS: [&str; 4] = ["metadata", "thumbnail", "auto_tagging", "crop_embedding"];

fn inputs(kind: &str, variant: bool) -> Value {
    match kind {
        "metadata" if variant => json!({"extractor": "exif-2"}),
        "metadata" => json!({}),
        "thumbnail" => json!({"max_side": if variant { 512 } else { 256 }, "format": "png"}),
        "auto_tagging" => json!({"model": "tagger", "model_revision": if variant { "r2" } else { "r1" }}),
        _ => json!({"model": "clip", "model_revision": "r1", "embedding_version": if variant { "2" } else { "1" }}),
    }
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        6 => (0usize..4).prop_map(Token::Held),
        2 => (0usize..4).prop_map(Token::Ended),
        1 => Just(Token::Bogus),
    ]
}

fn command() -> BoxedStrategy<Command> {
    prop_oneof![
        8 => (0usize..4, 0usize..4, any::<bool>())
            .prop_map(|(target, kind, variant)| Command::Request { target, kind, variant }),
        1 => Just(Command::RequestMalformed),
        6 => (any::<bool>(), 0usize..4, 1usize..4, prop_oneof![Just(1_000i64), Just(60_000)])
            .prop_map(|(any_kind, kind, limit, lease_ms)| Command::Claim { any_kind, kind, limit, lease_ms }),
        2 => token().prop_map(Command::Heartbeat),
        2 => (token(), any::<bool>(), 0i64..5).prop_map(|(token, phase, processed)| Command::Progress(token, phase, processed)),
        5 => (token(), prop::bool::weighted(0.2)).prop_map(|(token, nothing)| Command::Complete(token, nothing)),
        4 => (token(), prop::bool::weighted(0.3)).prop_map(|(token, terminal)| Command::Fail(token, terminal)),
        2 => (0usize..6).prop_map(Command::Cancel),
        2 => token().prop_map(Command::AcknowledgeCancel),
        2 => Just(Command::Recover),
        4 => prop_oneof![Just(500i64), Just(2_000), Just(70_000), Just(700_000)].prop_map(Command::Advance),
        1 => Just(Command::Restart),
        2 => (1u8..8, 0usize..3).prop_map(|(mask, kind)| Command::BatchCreate(mask, kind)),
        1 => (0usize..4).prop_map(Command::BatchCancel),
        2 => (0usize..4).prop_map(Command::BatchResume),
        2 => (0usize..4, 0u8..3).prop_map(|(pick, action)| Command::ReviewResolve(pick, action)),
        1 => Just(Command::NewMetadataVersion),
    ]
    .boxed()
}

fn fail(message: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(message.into())
}

struct World {
    path: PathBuf,
    clock: Arc<FixedClock>,
    ids: Arc<SequentialIds>,
    engine: Engine<SqliteStore>,
    context: CommandContext,
    media: Vec<MediaId>,
    region: RegionId,
    /// Task operations in the order they were created.
    operations: Vec<OperationId>,
    held: Vec<TaskClaim>,
    ended: Vec<TaskClaim>,
    tally: BTreeMap<&'static str, usize>,
    batches: Vec<BatchId>,
    metadata_version: u32,
}

async fn open_engine(
    path: &Path,
    clock: &Arc<FixedClock>,
    ids: &Arc<SequentialIds>,
    metadata_version: u32,
) -> Engine<SqliteStore> {
    let store = SqliteStore::open(SqliteConfig::at(path)).await.expect("open the store");
    let engine = Engine::with_clock(store, clock.clone(), ids.clone()).with_jitter(Arc::new(FixedJitter(400)));
    engine.startup().await.expect("startup");
    // The deployment runs this version of metadata.
    let kinds = legacy::declarations()
        .into_iter()
        .map(|mut kind| {
            if kind.name == "metadata" {
                kind.version = metadata_version.to_string();
            }
            kind
        })
        .collect();
    engine
        .declare(&CommandContext::actor("deploy"), kinds)
        .await
        .expect("declare the kinds");
    engine
        .maintain(&CommandContext::actor("system"))
        .await
        .expect("maintenance");
    engine
}

impl World {
    async fn new(path: PathBuf) -> World {
        let clock = Arc::new(FixedClock::at(Timestamp::from_micros(1_790_000_000_000_000)));
        let ids = Arc::new(SequentialIds::default());
        let engine = open_engine(&path, &clock, &ids, 1).await;
        let context = CommandContext::actor("property");
        let mut media = Vec::new();
        for index in 0..3 {
            media.push(
                engine
                    .register_media(
                        &context,
                        &format!("/p/{index}.png"),
                        "image",
                        Some(format!("sha256:{index:064x}")),
                        Some(10),
                    )
                    .await
                    .expect("register"),
            );
        }
        let region = engine
            .add_region(
                &context,
                media[0],
                opledger_domain::events::BoundingBox {
                    x: 1,
                    y: 2,
                    width: 30,
                    height: 40,
                },
                1,
            )
            .await
            .expect("add a region");
        World {
            path,
            clock,
            ids,
            engine,
            context,
            media,
            region,
            operations: Vec::new(),
            held: Vec::new(),
            ended: Vec::new(),
            tally: BTreeMap::new(),
            batches: Vec::new(),
            metadata_version: 1,
        }
    }

    fn fence(&self, token: Token) -> (Fence, bool) {
        let bogus = (Fence::token("bogus-token"), false);
        match token {
            Token::Held(k) if !self.held.is_empty() => (self.held[k % self.held.len()].fence(), true),
            Token::Ended(k) if !self.ended.is_empty() => (self.ended[k % self.ended.len()].fence(), false),
            _ => bogus,
        }
    }

    async fn head(&self) -> i64 {
        self.engine.store().head().await.expect("head")
    }

    /// Moves claims that no longer hold their task from `held` to `ended`,
    /// and checks every claim's lease row.
    async fn reconcile(&mut self) -> Result<(), TestCaseError> {
        let mut still = Vec::new();
        for claim in std::mem::take(&mut self.held) {
            let view = self
                .engine
                .task_by_operation(claim.operation_id)
                .await
                .map_err(|error| fail(format!("reading a task: {error}")))?
                .ok_or_else(|| fail("a claimed task vanished"))?;
            if view.state.claim_token.as_deref() == Some(claim.claim_token.as_str()) {
                let lease = view.lease.ok_or_else(|| fail("a held claim has no lease row"))?;
                prop_assert_eq!(lease.operation_id, claim.operation_id);
                prop_assert_eq!(view.state.claimed_revision.as_deref(), Some(claim.revision.as_str()));
                still.push(claim);
            } else {
                self.ended.push(claim);
            }
        }
        self.held = still;
        for claim in &self.ended {
            let lease = self
                .engine
                .store()
                .lease(&claim.claim_token)
                .await
                .map_err(|error| fail(error.to_string()))?;
            prop_assert!(lease.is_none(), "an ended claim kept its lease row");
        }
        Ok(())
    }

    fn count(&mut self, label: &'static str) {
        *self.tally.entry(label).or_default() += 1;
    }

    /// Checks a report's answer: a held token is accepted (`accepted_when`),
    /// any other token is a Conflict.
    fn judge<T>(
        &mut self,
        what: &'static str,
        holds: bool,
        result: &Result<T, EngineError>,
    ) -> Result<(), TestCaseError> {
        match (holds, result) {
            (true, Ok(_)) => self.count("report accepted"),
            (false, Err(EngineError::Domain(DomainError::Conflict(_)))) => self.count("stale report refused"),
            (true, Err(error)) => return Err(fail(format!("{what} with a held token refused: {error}"))),
            (false, Ok(_)) => return Err(fail(format!("{what} with a token that holds nothing was accepted"))),
            (false, Err(error)) => return Err(fail(format!("{what} with a stale token: {error}, not a conflict"))),
        }
        Ok(())
    }

    async fn step(&mut self, command: &Command) -> Result<(), TestCaseError> {
        let head = self.head().await;
        let engine = self.engine.clone();
        let context = self.context.clone();
        // The error of a refused command, if any, for the append-nothing check.
        let refused: Option<EngineError> = match command.clone() {
            Command::Request { target, kind, variant } => {
                let kind_name = KINDS[kind];
                let target = if target == 3 {
                    TaskTarget::Region(self.region)
                } else {
                    TaskTarget::Media(self.media[target])
                };
                let fits = matches!(
                    (target, kind_name),
                    (TaskTarget::Region(_), "crop_embedding")
                        | (TaskTarget::Media(_), "metadata" | "thumbnail" | "auto_tagging")
                );
                let result = engine
                    .request_task(
                        &context,
                        TaskRequest {
                            target,
                            kind: kind_name.into(),
                            inputs: inputs(kind_name, variant),
                            priority: kind as i32,
                        },
                    )
                    .await;
                match (&result, fits) {
                    (Ok(outcome), true) => {
                        if !self.operations.contains(&outcome.operation_id) {
                            self.operations.push(outcome.operation_id);
                        }
                        self.count(if outcome.created {
                            "request recorded"
                        } else {
                            "request unchanged"
                        });
                        if !outcome.created {
                            prop_assert_eq!(self.head().await, head, "an unchanged request appended");
                        }
                    }
                    (Err(EngineError::Domain(DomainError::InvalidInput(_))), false) => {
                        self.count("request on the wrong target refused")
                    }
                    (other, fits) => return Err(fail(format!("request (fits: {fits}): {other:?}"))),
                }
                result.err()
            }
            Command::RequestMalformed => {
                let result = engine
                    .request_task(
                        &context,
                        TaskRequest {
                            target: TaskTarget::Media(self.media[1]),
                            kind: "thumbnail".into(),
                            inputs: json!({"max_side": "huge", "format": "png"}),
                            priority: 0,
                        },
                    )
                    .await;
                prop_assert!(matches!(result, Err(EngineError::Domain(DomainError::InvalidInput(_)))));
                self.count("malformed request refused");
                result.err()
            }
            Command::Claim {
                any_kind,
                kind,
                limit,
                lease_ms,
            } => {
                let claims = engine
                    .claim_tasks(
                        &context,
                        ClaimRequest {
                            kinds: if any_kind { vec![] } else { vec![KINDS[kind].into()] },
                            worker: "property-worker".into(),
                            lease_ms,
                            limit,
                            principal: None,
                            versions: Default::default(),
                        },
                    )
                    .await
                    .map_err(|error| fail(format!("claim: {error}")))?;
                prop_assert!(claims.len() <= limit);
                for claim in &claims {
                    prop_assert!(
                        self.held.iter().all(|held| held.operation_id != claim.operation_id),
                        "a task was claimed while another claim held it"
                    );
                    if !any_kind {
                        prop_assert_eq!(claim.task_kind.as_str(), KINDS[kind]);
                    }
                }
                self.count(if claims.is_empty() {
                    "claim found nothing"
                } else {
                    "claim took work"
                });
                self.held.extend(claims);
                None
            }
            Command::Heartbeat(token) => {
                let (fence, holds) = self.fence(token);
                let result = engine.heartbeat(&fence, None).await;
                self.judge("heartbeat", holds, &result)?;
                prop_assert_eq!(self.head().await, head, "a heartbeat appended");
                result.err()
            }
            Command::Progress(token, phase, processed) => {
                let (fence, holds) = self.fence(token);
                let progress = Progress {
                    phase: if phase { "writing" } else { "reading" }.into(),
                    processed,
                    total: Some(4),
                };
                let result = engine.report_progress(&context, &fence, progress).await;
                self.judge("progress", holds, &result)?;
                result.err()
            }
            Command::Complete(token, nothing) => {
                let (fence, holds) = self.fence(token);
                let completion = if nothing {
                    Completion::NoResult {
                        reason: "nothing found".into(),
                    }
                } else {
                    Completion::Output(json!({"done": true}))
                };
                let result = engine.complete_task(&context, &fence, completion).await;
                self.judge("complete", holds, &result)?;
                result.err()
            }
            Command::Fail(token, terminal) => {
                let (fence, holds) = self.fence(token);
                let result = engine.fail_task(&context, &fence, "it broke", terminal).await;
                self.judge("fail", holds, &result)?;
                result.err()
            }
            Command::Cancel(pick) => {
                if self.operations.is_empty() {
                    return Ok(());
                }
                let operation_id = self.operations[pick % self.operations.len()];
                let result = engine.cancel_task(&context, operation_id, "property cancel").await;
                match &result {
                    Ok(_) => self.count("cancel accepted"),
                    Err(EngineError::Domain(DomainError::Conflict(_))) => {
                        self.count("cancel of a settled task refused")
                    }
                    Err(error) => return Err(fail(format!("cancel: {error}"))),
                }
                result.err()
            }
            Command::AcknowledgeCancel(token) => {
                let (fence, holds) = self.fence(token);
                let requested = if holds {
                    engine
                        .task_by_operation(
                            self.held
                                .iter()
                                .find(|claim| claim.claim_token == fence.claim_token)
                                .map(|claim| claim.operation_id)
                                .expect("held"),
                        )
                        .await
                        .map_err(|error| fail(error.to_string()))?
                        .is_some_and(|view| view.state.cancel_requested)
                } else {
                    false
                };
                let result = engine.acknowledge_cancel(&context, &fence).await;
                self.judge("acknowledge", holds && requested, &result)?;
                result.err()
            }
            Command::Recover => {
                let report = engine
                    .recover(&context)
                    .await
                    .map_err(|error| fail(format!("recover: {error}")))?;
                if report.interrupted > 0 {
                    self.count("recovery interrupted claims");
                }
                None
            }
            Command::Advance(ms) => {
                self.clock.advance_millis(ms);
                None
            }
            Command::Restart => {
                self.engine = open_engine(&self.path, &self.clock, &self.ids, self.metadata_version).await;
                self.count("restart");
                None
            }
            Command::NewMetadataVersion => {
                self.metadata_version += 1;
                self.engine = open_engine(&self.path, &self.clock, &self.ids, self.metadata_version).await;
                self.count("new metadata version");
                None
            }
            Command::BatchCreate(mask, kind) => {
                let media: Vec<MediaId> = (0..3)
                    .filter(|index| mask & (1 << index) != 0)
                    .map(|index| self.media[index])
                    .collect();
                let kind = ["metadata", "thumbnail", "auto_tagging"][kind];
                let mut inputs_by_kind = BTreeMap::new();
                inputs_by_kind.insert(kind.to_string(), inputs(kind, false));
                let result = engine
                    .create_batch(
                        &context,
                        BatchRequest {
                            name: format!("batch {}", self.batches.len()),
                            media,
                            kinds: vec![kind.to_string()],
                            inputs: inputs_by_kind,
                            priority: 0,
                        },
                    )
                    .await;
                match result {
                    Ok(view) => {
                        self.batches.push(view.batch.batch_id);
                        for item in &view.items {
                            if !self.operations.contains(&item.operation_id) {
                                self.operations.push(item.operation_id);
                            }
                        }
                        self.count("batch created");
                        None
                    }
                    Err(error) => return Err(fail(format!("batch create: {error}"))),
                }
            }
            Command::BatchCancel(pick) | Command::BatchResume(pick) if self.batches.is_empty() => {
                let _ = pick;
                None
            }
            Command::BatchCancel(pick) => {
                let batch_id = self.batches[pick % self.batches.len()];
                let result = engine.cancel_batch(&context, batch_id, "property cancel").await;
                match &result {
                    Ok(_) => self.count("batch cancelled"),
                    Err(EngineError::Domain(DomainError::Conflict(_))) => {
                        self.count("cancel of a settled batch refused")
                    }
                    Err(error) => return Err(fail(format!("batch cancel: {error}"))),
                }
                result.err()
            }
            Command::BatchResume(pick) => {
                let batch_id = self.batches[pick % self.batches.len()];
                let result = engine.resume_batch(&context, batch_id, "property resume").await;
                match &result {
                    Ok(_) => self.count("batch resumed"),
                    Err(EngineError::Domain(DomainError::Conflict(_))) => {
                        self.count("resume with nothing to resume refused")
                    }
                    Err(error) => return Err(fail(format!("batch resume: {error}"))),
                }
                result.err()
            }
            Command::ReviewResolve(pick, action) => {
                let entries = engine.review_entries().await.map_err(|error| fail(error.to_string()))?;
                if entries.is_empty() {
                    return self.reconcile().await;
                }
                let entry = &entries[pick % entries.len()];
                let action =
                    [ReviewAction::Retry, ReviewAction::Dismiss, ReviewAction::Acknowledge][usize::from(action)];
                let result = engine
                    .resolve_review(&context, entry.entry_id, action, None, "property review")
                    .await;
                match &result {
                    Ok(_) => self.count("review entry resolved"),
                    // Retrying work the table cannot reopen from its status.
                    Err(EngineError::Domain(DomainError::IllegalTransition(_))) => self.count("review retry refused"),
                    Err(error) => return Err(fail(format!("review resolve: {error}"))),
                }
                result.err()
            }
        };
        if let Some(error) = refused {
            prop_assert!(
                matches!(error, EngineError::Domain(_)),
                "a refusal must be a domain error, not {error}"
            );
            prop_assert_eq!(self.head().await, head, "a refused command appended");
        }
        self.check_batches_and_review().await?;
        self.reconcile().await
    }

    /// Every batch's counts are exactly its items' outcomes, its activity
    /// is the shared predicate's; every open review entry's operation is in
    /// a status the routing policy routes.
    async fn check_batches_and_review(&mut self) -> Result<(), TestCaseError> {
        for batch_id in &self.batches {
            let view = self
                .engine
                .batch(*batch_id)
                .await
                .map_err(|error| fail(error.to_string()))?;
            let mut counted = BatchProgress {
                total: view.items.len() as i64,
                ..BatchProgress::default()
            };
            for item in &view.items {
                if let Some(outcome) = item.outcome {
                    counted.settle(outcome);
                }
                // A settled item's operation is settled with that outcome
                // at settlement time; an unsettled item's operation is not
                // settled (else reconciliation missed it).
                let operation = self
                    .engine
                    .operation(item.operation_id)
                    .await
                    .map_err(|error| fail(error.to_string()))?;
                if item.outcome.is_none() {
                    prop_assert!(
                        settled_outcome(operation.status).is_none(),
                        "item {} unsettled while its operation is {}",
                        item.operation_id,
                        operation.status
                    );
                }
            }
            prop_assert_eq!(view.batch.progress, counted);
            prop_assert_eq!(view.active, is_active(&counted));
        }
        for entry in self
            .engine
            .review_entries()
            .await
            .map_err(|error| fail(error.to_string()))?
        {
            let operation = self
                .engine
                .operation(entry.operation_id)
                .await
                .map_err(|error| fail(error.to_string()))?;
            prop_assert!(
                route(
                    &operation.kind,
                    operation.status,
                    legacy::facts(&operation.kind).is_some_and(|facts| facts.required),
                    operation.blocked_on.as_ref()
                )
                .is_some(),
                "open entry for a {} operation",
                operation.status
            );
        }
        Ok(())
    }

    async fn check_replay(&self) -> Result<(), TestCaseError> {
        let first = self.engine.verify().await.map_err(|error| fail(error.to_string()))?;
        prop_assert!(
            first.is_identical(),
            "inline projections differ from replay:\n{}",
            first.render()
        );
        let second = self.engine.verify().await.map_err(|error| fail(error.to_string()))?;
        prop_assert_eq!(first.render(), second.render(), "two replays disagree");
        let events: Vec<_> = self
            .engine
            .store()
            .read_all(0, 1_000)
            .try_collect()
            .await
            .map_err(|error| fail(error.to_string()))?;
        let reference = fold_in_memory(&events).map_err(|error| fail(error.to_string()))?;
        for spec in all_specs() {
            for table in spec.tables {
                let live = self
                    .engine
                    .store()
                    .scan_table(table)
                    .await
                    .map_err(|error| fail(error.to_string()))?;
                let expected: Vec<Row> = reference
                    .rows()
                    .filter(|row| row.table().name == table.name)
                    .cloned()
                    .collect();
                prop_assert_eq!(live, expected, "{} differs from the reference fold", table.name);
            }
        }
        Ok(())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn config(default_cases: u32) -> ProptestConfig {
    let defaults = ProptestConfig::default();
    ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            defaults.cases
        } else {
            default_cases
        },
        failure_persistence: None,
        max_shrink_iters: 1_000,
        ..defaults
    }
}

#[test]
fn work_protocol_sequences_keep_fencing_and_leases_and_replay_identically() {
    let mut runner = TestRunner::new(config(64));
    let tally: RefCell<BTreeMap<&'static str, usize>> = RefCell::new(BTreeMap::new());
    let result = runner.run(&prop::collection::vec(command(), 1..60), |commands| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("work.db");
        runtime().block_on(async {
            let mut world = World::new(path).await;
            // Every case starts with some work in the queue and a claim on
            // it, so reports with held tokens are common.
            let opening = [
                Command::Request {
                    target: 0,
                    kind: 0,
                    variant: false,
                },
                Command::Request {
                    target: 1,
                    kind: 1,
                    variant: false,
                },
                Command::Request {
                    target: 3,
                    kind: 3,
                    variant: false,
                },
                Command::Claim {
                    any_kind: true,
                    kind: 0,
                    limit: 2,
                    lease_ms: 60_000,
                },
            ];
            for command in &opening {
                world
                    .step(command)
                    .await
                    .map_err(|error| fail(format!("opening ({command:?}): {error}")))?;
            }
            for (index, command) in commands.iter().enumerate() {
                world
                    .step(command)
                    .await
                    .map_err(|error| fail(format!("step {index} ({command:?}): {error}")))?;
            }
            world.check_replay().await?;
            let mut tally = tally.borrow_mut();
            for (label, count) in world.tally {
                *tally.entry(label).or_default() += count;
            }
            Ok(())
        })
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, commands)) => panic!(
            "failed: {reason}\nminimal failing sequence ({} commands):\n{commands:#?}",
            commands.len()
        ),
        Err(TestError::Abort(reason)) => panic!("aborted: {reason}"),
    }
    let tally = tally.into_inner();
    eprintln!("{tally:#?}");
    // The generator must keep reaching the interesting paths.
    for label in [
        "report accepted",
        "stale report refused",
        "claim took work",
        "request recorded",
        "request unchanged",
        "request on the wrong target refused",
        "recovery interrupted claims",
        "cancel accepted",
        "batch created",
        "batch cancelled",
        "batch resumed",
        "review entry resolved",
        "new metadata version",
    ] {
        assert!(tally.contains_key(label), "never reached: {label}; {tally:#?}");
    }
}
