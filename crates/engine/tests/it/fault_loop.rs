//! Every writing command under single and persistent storage faults, on
//! real databases of each backend (`backend_tests!`): the store is wrapped
//! in `opledger_testkit::faults::FaultyStore`, and each step of a
//! scenario that runs every writing command (register, request, claim,
//! heartbeat, progress, complete, fail, review resolve, recover, batch
//! create / cancel / resume, cancel, and the ingest's registration of
//! discovered files: ingestions begun, staged, registered, finished) is
//! called with every write failing, then with its k-th write transaction
//! failing (k = 1..K, the transaction refused at its start or rolled back
//! at its commit) and with each statement of that transaction failing in
//! turn (the transaction aborted), until a call succeeds. Each faulty call
//! either fails with Unavailable and leaves no visible change (the log
//! head, every projection row, every held claim) or succeeds; no command
//! answers Ok after one of its statements failed; afterwards replay equals live, SQLite's
//! `PRAGMA integrity_check` says `ok`, and no lease is held that no task's
//! claim holds (nor a claim without its lease).

use futures::future::BoxFuture;
use opledger_domain::kinds::legacy;
use opledger_domain::projections::{all_specs, Row, MEDIA_STATES_TABLE, REGION_STATES_TABLE};
use opledger_domain::review::ReviewAction;
use opledger_domain::{IngestionStage, MediaId, OperationStatus, Timestamp};
use opledger_engine::{
    BatchRequest, ClaimRequest, CommandContext, Completion, Engine, EngineError, FileObservation, FixedClock,
    FixedJitter, Progress, Registration, SequentialIds, TaskClaim, TaskRequest, TaskTarget,
};
use opledger_store::{ErrorKind, ExpiredClaim, Store};
use opledger_testkit::faults::{Fault, FaultyStore};
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use sqlx::Connection;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const T0: i64 = 1_700_000_000_000_000;

/// The write transactions of a step each fault is tried at.
const K: u64 = 3;

/// What a caller can see of the ledger.
#[derive(Debug, PartialEq)]
struct Visible {
    head: i64,
    rows: Vec<Vec<Row>>,
    claims: Vec<ExpiredClaim>,
}

struct Lab<S: Store> {
    engine: Engine<FaultyStore<S>>,
    store: FaultyStore<S>,
    clock: Arc<FixedClock>,
    context: CommandContext,
    /// Faulty calls that failed and changed nothing.
    refused: AtomicU64,
    /// Of those, calls with one statement failing.
    statements_refused: AtomicU64,
}

impl<S: Store> Lab<S> {
    async fn visible(&self) -> Visible {
        let mut rows = Vec::new();
        for spec in all_specs() {
            for table in spec.tables {
                rows.push(self.store.scan_table(table).await.unwrap());
            }
        }
        Visible {
            head: self.store.head().await.unwrap(),
            rows,
            claims: self.store.expired_claims(Timestamp::MAX, 10_000).await.unwrap(),
        }
    }

    /// Calls `step` under persistent faults, then with its k-th write
    /// failing (k = 1..=K, each fault kind) until a call succeeds; after
    /// the k-th write's commit fault, with each statement of that write
    /// failing in turn (the statements a call made before its k-th commit
    /// failed are the ones it makes again). Every faulty call must fail
    /// with Unavailable and change nothing, or succeed. Answers the first
    /// success.
    async fn step<'a, T>(&'a self, name: &str, step: impl Fn() -> BoxFuture<'a, Result<T, EngineError>>) -> T {
        let before = self.visible().await;
        self.store.fail_every_write(Some(Fault::Commit));
        let persistent = step().await;
        self.store.clear();
        assert!(
            matches!(&persistent, Err(error) if error.is_store(ErrorKind::Unavailable)),
            "{name} under persistent faults"
        );
        assert_eq!(
            self.visible().await,
            before,
            "{name} under persistent faults changed the ledger"
        );
        self.refused.fetch_add(1, Ordering::SeqCst);
        // Statements of the call already failed one by one.
        let mut covered = 0;
        for k in 1..=K {
            for fault in [Fault::Begin, Fault::Commit] {
                let before = self.visible().await;
                let injected = self.store.injected();
                let statements = self.store.statements();
                self.store.fail_write(k, fault);
                let result = step().await;
                if self.store.injected() == injected {
                    // The step made fewer than k writes: it ran unharmed.
                    self.store.clear();
                    return result.unwrap_or_else(|error| panic!("{name} without a fault: {error}"));
                }
                match result {
                    Err(error) => {
                        assert!(
                            error.is_store(ErrorKind::Unavailable),
                            "{name}, {fault:?} at write {k}: {error}"
                        );
                        assert_eq!(
                            self.visible().await,
                            before,
                            "{name}, {fault:?} at write {k} changed the ledger"
                        );
                        self.refused.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(answer) => {
                        // A fault in a part the command may lose (the
                        // recovery pass's sweep) and still succeed.
                        self.store.clear();
                        return answer;
                    }
                }
                if fault == Fault::Commit {
                    let made = self.store.statements() - statements;
                    for statement in covered + 1..=made {
                        if let Some(answer) = self.statement_fault(name, statement, &step).await {
                            return answer;
                        }
                    }
                    covered = covered.max(made);
                }
            }
        }
        step()
            .await
            .unwrap_or_else(|error| panic!("{name} without a fault: {error}"))
    }

    /// Calls `step` with its `statement`-th statement failing: it must fail
    /// with Unavailable and change nothing (None), or succeed (its answer).
    async fn statement_fault<'a, T>(
        &'a self,
        name: &str,
        statement: u64,
        step: &impl Fn() -> BoxFuture<'a, Result<T, EngineError>>,
    ) -> Option<T> {
        let before = self.visible().await;
        let injected = self.store.injected();
        self.store.fail_statement(statement);
        let result = step().await;
        let hit = self.store.injected() > injected;
        self.store.clear();
        match result {
            Ok(answer) => Some(answer),
            Err(error) => {
                assert!(
                    hit && error.is_store(ErrorKind::Unavailable),
                    "{name}, statement {statement} failing: {error}"
                );
                assert_eq!(
                    self.visible().await,
                    before,
                    "{name}, statement {statement} failing changed the ledger"
                );
                self.statements_refused.fetch_add(1, Ordering::SeqCst);
                None
            }
        }
    }

    async fn claim(&self, worker: &'static str, lease_ms: i64) -> TaskClaim {
        let request = ClaimRequest {
            kinds: vec!["thumbnail".into()],
            worker: worker.into(),
            lease_ms,
            limit: 1,
            principal: None,
            versions: Default::default(),
        };
        let mut claims = self
            .step("claim", || self.engine.claim_tasks(&self.context, request.clone()))
            .await;
        assert_eq!(claims.len(), 1);
        claims.remove(0)
    }

    async fn media(&self, path: &'static str) -> MediaId {
        self.step("register", || {
            Box::pin(
                self.engine
                    .register_media(&self.context, path, "image", Some(format!("sha256:{path}")), Some(10)),
            )
        })
        .await
    }
}

fn thumbnail(media: MediaId) -> TaskRequest {
    TaskRequest {
        target: TaskTarget::Media(media),
        kind: "thumbnail".into(),
        inputs: json!({"max_side": 256, "format": "png"}),
        priority: 0,
    }
}

async fn every_writing_command_under_single_and_persistent_faults_fails_cleanly_or_succeeds<B: Backend>(backend: &B) {
    let store = FaultyStore::new(backend.open().await);
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(T0)));
    let engine = Engine::with_clock(store.clone(), clock.clone(), Arc::new(SequentialIds::default()))
        .with_jitter(Arc::new(FixedJitter(0)));
    engine.startup().await.unwrap();
    engine
        .declare(&CommandContext::actor("deploy"), legacy::declarations())
        .await
        .unwrap();
    let lab = Lab {
        engine,
        store,
        clock,
        context: CommandContext::actor("test"),
        refused: AtomicU64::new(0),
        statements_refused: AtomicU64::new(0),
    };
    let engine = &lab.engine;
    let context = &lab.context;

    let a = lab.media("/photos/a.png").await;
    let b = lab.media("/photos/b.png").await;
    let c = lab.media("/photos/c.png").await;
    for media in [a, b] {
        lab.step("request", || engine.request_task(context, thumbnail(media)))
            .await;
    }

    // One task runs to success.
    let first = lab.claim("w1", 60_000).await;
    let fence = first.fence();
    lab.step("heartbeat", || Box::pin(engine.heartbeat(&fence, None))).await;
    let progress = || Progress {
        phase: "writing".into(),
        processed: 1,
        total: Some(1),
    };
    lab.step("progress", || engine.report_progress(context, &fence, progress()))
        .await;
    let output = || Completion::Output(json!({"path": "/thumbs/a.png"}));
    let done = lab
        .step("complete", || engine.complete_task(context, &fence, output()))
        .await;
    assert_eq!(done.status, OperationStatus::Succeeded);

    // One fails terminally, is retried from the review queue, and is
    // interrupted by recovery when its next lease expires.
    let second = lab.claim("w2", 60_000).await;
    let fence = second.fence();
    lab.step("fail", || engine.fail_task(context, &fence, "decoder crashed", true))
        .await;
    let entry = lab.engine.review_entries().await.unwrap().remove(0);
    lab.step("review resolve", || {
        Box::pin(engine.resolve_review(context, entry.entry_id, ReviewAction::Retry, None, ""))
    })
    .await;
    let third = lab.claim("w3", 1_000).await;
    lab.clock.advance_millis(2_000);
    let system = CommandContext::actor("system");
    let recovered = lab.step("recover", || Box::pin(engine.recover(&system))).await;
    assert_eq!(recovered.interrupted, 1);
    let _ = third;

    // A batch is created, cancelled and resumed; then its task cancelled.
    let request = || BatchRequest {
        name: "thumbnails".into(),
        media: vec![c],
        kinds: vec!["thumbnail".into()],
        inputs: BTreeMap::new(),
        priority: 0,
    };
    let batch = lab
        .step("batch create", || Box::pin(engine.create_batch(context, request())))
        .await;
    let batch_id = batch.batch.batch_id;
    lab.step("batch cancel", || {
        Box::pin(engine.cancel_batch(context, batch_id, "wrong run"))
    })
    .await;
    let resumed = lab
        .step("batch resume", || {
            Box::pin(engine.resume_batch(context, batch_id, "right run"))
        })
        .await;
    lab.step("cancel", || {
        engine.cancel_task(context, resumed.items[0].operation_id, "not needed")
    })
    .await;

    // The ingest's registration of the files it discovered: ingestions
    // begun for new files, moved to hashing, registered (a media item
    // each, and its tasks requested), finished.
    let files: Vec<FileObservation> = ["/ingest/d.png", "/ingest/e.png"]
        .into_iter()
        .map(|path| FileObservation {
            path: path.into(),
            byte_size: 10,
            modified_ns: 1,
        })
        .collect();
    let claims = lab
        .step("ingestion begin", || {
            Box::pin(engine.begin_ingestions(context, "ingest-1", 60_000, files.clone(), Vec::new()))
        })
        .await;
    lab.step("ingestion stage", || {
        Box::pin(engine.ingestion_stage(context, &claims, IngestionStage::Hashing))
    })
    .await;
    let registrations: Vec<Registration> = claims
        .iter()
        .enumerate()
        .map(|(index, claim)| Registration {
            claim: claim.clone(),
            content_digest: format!("sha256:{index:064x}"),
            byte_size: 10,
            media_kind: "image".into(),
            blocked: BTreeMap::new(),
            parsed: json!({"format": "png"}),
            observed: None,
        })
        .collect();
    let registered = lab
        .step("ingestion register", || {
            Box::pin(engine.register_ingestions(context, registrations.clone(), &["thumbnail"]))
        })
        .await;
    assert_eq!(registered.len(), 2);
    assert!(registered.iter().all(|item| item.new_media && item.tasks_created == 1));
    lab.step("ingestion finish", || {
        let outcomes = claims.iter().map(|claim| (claim.clone(), Ok(json!({})))).collect();
        Box::pin(engine.finish_ingestions(context, outcomes))
    })
    .await;

    let refused = lab.refused.load(Ordering::SeqCst);
    let statements_refused = lab.statements_refused.load(Ordering::SeqCst);
    assert!(refused >= 50, "only {refused} faulty calls were refused");
    assert!(
        statements_refused >= 50,
        "only {statements_refused} calls with a failing statement were refused"
    );
    assert_eq!(
        lab.store.swallowed(),
        0,
        "a command answered Ok after one of its statements had failed"
    );
    println!(
        "{refused} calls under write faults and {statements_refused} with a failing statement failed and changed nothing"
    );

    // The ledger is whole.
    let report = lab.engine.verify().await.unwrap();
    assert!(report.is_identical(), "{}", report.render());
    if backend.name() == "sqlite" {
        let mut connection = sqlx::SqliteConnection::connect(&backend.url()).await.unwrap();
        let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&mut connection)
            .await
            .unwrap();
        assert_eq!(integrity, "ok");
    }
    // Every lease belongs to a claim a task holds, and every held claim
    // has its lease.
    let leases = lab.store.expired_claims(Timestamp::MAX, 10_000).await.unwrap();
    let mut held = Vec::new();
    for table in [&MEDIA_STATES_TABLE, &REGION_STATES_TABLE] {
        for row in lab.store.scan_table(table).await.unwrap() {
            if let Row::ProcessingState(state) = row {
                if matches!(state.status, OperationStatus::Leased | OperationStatus::Running) {
                    held.push((
                        state.operation_id,
                        state.claim_token.clone().expect("a held claim's token"),
                    ));
                }
            }
        }
    }
    let mut leased: Vec<_> = leases
        .iter()
        .map(|lease| (lease.operation_id, lease.claim_token.clone()))
        .collect();
    leased.sort();
    held.sort();
    assert_eq!(leased, held, "leases and held claims differ");
}

backend_tests!(every_writing_command_under_single_and_persistent_faults_fails_cleanly_or_succeeds);
