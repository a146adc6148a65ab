//! The pool: claims work for its free slots, runs each claim as a job with
//! its own heartbeat, reports the outcome, and runs recovery at start and
//! periodically.

use crate::job::{trip, Job, StopReason, PROGRESS_INTERVAL};
use crate::link::{is_claim_lost, is_transient, JobLink};
use crate::report::{record_end, report_failure, reporter, EndKind, Ran, Reporter, DEFAULT_REPORT_LINGER};
use crate::task::{DynTask, Task};
use futures::FutureExt;
use opledger_engine::{
    ClaimRequest, CommandContext, Engine, EngineError, Fence, LeaseMs, RecoveryReport, TaskClaim, MAX_CLAIM_BATCH,
};
use opledger_store::Store;
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

/// Why a pool could not be built or had to stop.
#[derive(Debug, Error)]
pub enum PoolError {
    /// The builder's settings cannot work.
    #[error("invalid worker pool: {0}")]
    Config(String),
    /// The engine refused (not transiently): recovery at start, or a claim.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What a pool did in one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolReport {
    /// Tasks claimed.
    pub claimed: u64,
    /// Task runs started (a claim whose kind had no task is not one).
    pub executed: u64,
    /// Completions recorded (with an output or no result).
    pub completed: u64,
    /// Failures recorded, retryable and terminal, panics included.
    pub failed: u64,
    /// Of `failed`: reported as terminal.
    pub failed_terminal: u64,
    /// Of `failed`: the task panicked.
    pub panicked: u64,
    /// Cancels acknowledged after the job's temporary outputs were removed.
    pub cancelled: u64,
    /// Claims found lost (recovery took the task): nothing was reported.
    pub lost: u64,
    /// Outcomes that could not be recorded (storage trouble); recovery
    /// requeues those tasks once their lease expires.
    pub unreported: u64,
    /// Progress reports sent (after throttling).
    pub progress_reports: u64,
    /// What the pool's recovery passes did, summed.
    pub recovery: RecoveryReport,
}

impl PoolReport {
    fn add_recovery(&mut self, pass: &RecoveryReport) {
        let total = &mut self.recovery;
        total.interrupted += pass.interrupted;
        total.requeued += pass.requeued;
        total.cancelled += pass.cancelled;
        total.failed += pass.failed;
        total.skipped += pass.skipped;
    }

    fn add_job(&mut self, end: &JobEnd, progress_reports: u64) {
        self.executed += u64::from(end.executed);
        self.progress_reports += progress_reports;
        match end.kind {
            EndKind::Completed => self.completed += 1,
            EndKind::Failed { terminal, panicked } => {
                self.failed += 1;
                self.failed_terminal += u64::from(terminal);
                self.panicked += u64::from(panicked);
            }
            EndKind::Cancelled => self.cancelled += 1,
            EndKind::Lost => self.lost += 1,
            EndKind::Unreported => self.unreported += 1,
        }
    }
}

/// The pool's settings, shared by its jobs.
struct Settings {
    name: String,
    workers: usize,
    lease: LeaseMs,
    batch: usize,
    idle_poll: Duration,
    heartbeat_interval: Duration,
    recovery_interval: Duration,
    stop_grace: Duration,
    progress_interval: Duration,
    report_linger: Duration,
    give_up_after: Option<Duration>,
}

/// The longest a pool waits between claims that failed on storage
/// trouble: the wait doubles from the idle poll up to this.
const MAX_CLAIM_BACKOFF: Duration = Duration::from_secs(5);

/// How long a pool waits before claiming again after `failures` failed
/// claims in a row: the idle poll, doubled per failure, at most
/// [`MAX_CLAIM_BACKOFF`] (never below the idle poll).
fn claim_backoff(idle_poll: Duration, failures: u32) -> Duration {
    let doubled = idle_poll.saturating_mul(1_u32 << failures.saturating_sub(1).min(16));
    doubled.min(MAX_CLAIM_BACKOFF.max(idle_poll))
}

/// Builds a [`WorkerPool`]; see [`WorkerPool::builder`] for the defaults.
pub struct WorkerPoolBuilder<S: Store> {
    engine: Engine<S>,
    name: String,
    tasks: Vec<Arc<dyn DynTask>>,
    workers: usize,
    lease: Duration,
    batch: Option<usize>,
    idle_poll: Duration,
    heartbeat_interval: Option<Duration>,
    recovery_interval: Duration,
    stop_grace: Duration,
    progress_interval: Duration,
    report_linger: Duration,
    give_up_after: Option<Duration>,
}

impl<S: Store> WorkerPoolBuilder<S> {
    /// Registers the implementation of one task kind.
    pub fn task<T: Task>(mut self, task: T) -> Self {
        self.tasks.push(Arc::new(task));
        self
    }

    /// Concurrent jobs (default 4).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// The lease each claim takes and each heartbeat extends to (default 60 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The most tasks one claim call takes (default: the number of workers).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = Some(batch);
        self
    }

    /// How long to wait before claiming again after finding no work (default 1 s).
    pub fn idle_poll(mut self, idle_poll: Duration) -> Self {
        self.idle_poll = idle_poll;
        self
    }

    /// How often a running job heartbeats (default: a third of the lease).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = Some(interval);
        self
    }

    /// How often recovery runs after the pass at start (default 30 s).
    pub fn recovery_interval(mut self, interval: Duration) -> Self {
        self.recovery_interval = interval;
        self
    }

    /// How long a task may keep running after it was told to stop before
    /// its future is dropped (default 10 s).
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// The progress throttle (default [`PROGRESS_INTERVAL`], 250 ms).
    pub fn progress_interval(mut self, interval: Duration) -> Self {
        self.progress_interval = interval;
        self
    }

    /// How long a finished job's outcome may wait for other running jobs'
    /// outcomes to be written with it in one command (default 20 ms). The
    /// wait ends early once every running job has reported, so a lone job
    /// is written at once; a busy pool writes its outcomes in batches,
    /// paying one command's fixed cost and one commit per batch.
    pub fn report_linger(mut self, linger: Duration) -> Self {
        self.report_linger = linger;
        self
    }

    /// Stops the pool with the storage error when its claims have failed
    /// on storage trouble (a full disk, an unreachable server) for this long
    /// in a row, instead of trying again until shut down (the default). The
    /// claims back off meanwhile, from the idle poll doubling up to 5 s.
    pub fn give_up_after(mut self, limit: Duration) -> Self {
        self.give_up_after = Some(limit);
        self
    }

    /// Checks the settings and builds the pool.
    pub fn build(self) -> Result<WorkerPool<S>, PoolError> {
        let invalid = |message: String| Err(PoolError::Config(message));
        if self.name.trim().is_empty() {
            return invalid("a pool needs a worker name".into());
        }
        if self.workers == 0 {
            return invalid("a pool needs at least one worker".into());
        }
        let batch = self.batch.unwrap_or(self.workers.min(MAX_CLAIM_BATCH));
        if batch == 0 || batch > MAX_CLAIM_BATCH {
            return invalid(format!("a claim batch takes 1 to {MAX_CLAIM_BATCH} tasks, not {batch}"));
        }
        let lease = match LeaseMs::from_duration(self.lease) {
            Ok(lease) => lease,
            Err(opledger_domain::DomainError::InvalidInput(message)) => return invalid(message),
            Err(other) => return invalid(other.to_string()),
        };
        let heartbeat_interval = self.heartbeat_interval.unwrap_or(self.lease / 3);
        for (what, interval) in [
            ("heartbeat interval", heartbeat_interval),
            ("idle poll", self.idle_poll),
            ("recovery interval", self.recovery_interval),
        ] {
            if interval.is_zero() {
                return invalid(format!("the {what} must be longer than zero"));
            }
        }
        if heartbeat_interval >= self.lease {
            tracing::warn!(
                ?heartbeat_interval,
                lease = ?self.lease,
                "the heartbeat interval is not shorter than the lease: claims will expire while their tasks run"
            );
        }
        if self.tasks.is_empty() {
            return invalid("a pool needs at least one task".into());
        }
        let mut tasks: BTreeMap<&'static str, Arc<dyn DynTask>> = BTreeMap::new();
        for task in self.tasks {
            let kind = task.kind();
            if let Err(error) = opledger_domain::kinds::check_name("task kind", kind) {
                return invalid(error.to_string());
            }
            if tasks.insert(kind, task).is_some() {
                return invalid(format!("task kind {kind} is registered twice"));
            }
        }
        let settings = Settings {
            name: self.name,
            workers: self.workers,
            lease,
            batch,
            idle_poll: self.idle_poll,
            heartbeat_interval,
            recovery_interval: self.recovery_interval,
            stop_grace: self.stop_grace,
            progress_interval: self.progress_interval,
            report_linger: self.report_linger,
            give_up_after: self.give_up_after,
        };
        Ok(WorkerPool {
            shared: Arc::new(Shared {
                link: Arc::new(self.engine.clone()),
                engine: self.engine,
                tasks,
                settings,
            }),
        })
    }
}

struct Shared<S: Store> {
    engine: Engine<S>,
    /// The same engine, as jobs see it.
    link: Arc<dyn JobLink>,
    tasks: BTreeMap<&'static str, Arc<dyn DynTask>>,
    settings: Settings,
}

/// A pool of in-process workers over one engine.
///
/// N workers run at most N jobs at once. Whenever slots are free the pool
/// claims up to `min(free slots, batch)` tasks of its registered kinds in
/// one call, and runs each claim as a tokio task with its own heartbeat
/// loop. Claims are recorded with the pool's name as the worker; each job's
/// reports with the actor `name/slot-N` and the claim token as correlation
/// id, so a timeline shows which slot did what in which attempt.
pub struct WorkerPool<S: Store> {
    shared: Arc<Shared<S>>,
}

impl<S: Store> Clone for WorkerPool<S> {
    fn clone(&self) -> Self {
        WorkerPool {
            shared: self.shared.clone(),
        }
    }
}

/// How one job ended.
struct JobEnd {
    executed: bool,
    kind: EndKind,
}

enum Mode {
    UntilIdle,
    UntilShutdown,
}

impl Mode {
    /// Failed claims in a row a run sits out before it gives up: a service
    /// keeps trying; a run until idle reports the trouble soon.
    fn claim_retries(&self) -> u32 {
        match self {
            Mode::UntilShutdown => u32::MAX,
            Mode::UntilIdle => 5,
        }
    }
}

/// Whether a failed claim is worth trying again: storage trouble, or a
/// conflict (a row the claim query offered and the domain refused; one such
/// row fails the whole claim call). Invalid settings are not.
fn retry_claim(error: &EngineError) -> bool {
    is_transient(error) || is_claim_lost(error)
}

impl<S: Store> WorkerPool<S> {
    /// A builder with the defaults: 4 workers, 60 s leases, claim batches
    /// of one per worker, 1 s idle poll, heartbeats every third of the
    /// lease, recovery every 30 s, 10 s stop grace, progress at most every
    /// 250 ms. `name` is the worker name claims are recorded with.
    pub fn builder(engine: Engine<S>, name: impl Into<String>) -> WorkerPoolBuilder<S> {
        WorkerPoolBuilder {
            engine,
            name: name.into(),
            tasks: Vec::new(),
            workers: 4,
            lease: Duration::from_secs(60),
            batch: None,
            idle_poll: Duration::from_secs(1),
            heartbeat_interval: None,
            recovery_interval: Duration::from_secs(30),
            stop_grace: Duration::from_secs(10),
            progress_interval: PROGRESS_INTERVAL,
            report_linger: DEFAULT_REPORT_LINGER,
            give_up_after: None,
        }
    }

    /// The registered task kinds.
    pub fn kinds(&self) -> Vec<&'static str> {
        self.shared.tasks.keys().copied().collect()
    }

    /// Runs until `shutdown` resolves, then stops claiming and waits for
    /// the running jobs to finish and report (a long job keeps its lease
    /// alive meanwhile; a job that must not be waited for is recovered from
    /// its expired lease by the next pool).
    pub fn run_until<F>(&self, shutdown: F) -> impl Future<Output = Result<PoolReport, PoolError>> + Send
    where
        F: Future<Output = ()> + Send,
    {
        run(self.shared.clone(), Mode::UntilShutdown, shutdown)
    }

    /// Runs until a claim finds no work and no job is running. Work that is
    /// not due yet (a retry scheduled for later) is not waited for.
    pub fn run_until_idle(&self) -> impl Future<Output = Result<PoolReport, PoolError>> + Send {
        run(self.shared.clone(), Mode::UntilIdle, std::future::pending())
    }
}

async fn run<S, F>(shared: Arc<Shared<S>>, mode: Mode, shutdown: F) -> Result<PoolReport, PoolError>
where
    S: Store,
    F: Future<Output = ()> + Send,
{
    let settings = &shared.settings;
    let context = CommandContext::actor(settings.name.clone());
    let mut report = PoolReport::default();

    // The pool serves declared kinds only: an undeclared one is refused
    // before anything is claimed, naming what is declared.
    for kind in shared.tasks.keys() {
        shared.engine.task_kind(kind).await?;
    }

    // Recovery first: intermediate states a previous process left go
    // back to the queue before this pool claims anything.
    let pass = shared.engine.recover(&context).await?;
    if pass.interrupted > 0 {
        tracing::info!(?pass, "recovered interrupted work at start");
    }
    report.add_recovery(&pass);
    // Then maintenance: results of task versions no longer current are
    // recorded stale, and batches catch up with items that settled meanwhile.
    let maintenance = shared.engine.maintain(&context).await?;
    if maintenance != opledger_engine::MaintenanceReport::default() {
        tracing::info!(?maintenance, "maintenance at start");
    }

    let (reports, queued_reports) = mpsc::unbounded_channel();
    let running = Arc::new(AtomicUsize::new(0));
    let reporter_task = tokio::spawn(
        reporter(
            shared.engine.clone(),
            queued_reports,
            running.clone(),
            settings.report_linger,
        )
        .in_current_span(),
    );
    let reporter = Reporter { queue: reports };
    let mut jobs: JoinSet<(JobEnd, u64)> = JoinSet::new();
    let mut slots: HashMap<tokio::task::Id, usize> = HashMap::new();
    let mut free: BTreeSet<usize> = (0..settings.workers).collect();
    let mut recovery = tokio::time::interval_at(
        tokio::time::Instant::now() + settings.recovery_interval,
        settings.recovery_interval,
    );
    recovery.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let shutdown = shutdown.fuse();
    tokio::pin!(shutdown);
    let mut stopping = false;
    let mut fatal: Option<EngineError> = None;
    let mut claim_failures: u32 = 0;
    // While claims fail: since when, and when to try again.
    let mut failing_since: Option<tokio::time::Instant> = None;
    let mut next_claim = tokio::time::Instant::now();

    loop {
        while let Some(joined) = jobs.try_join_next_with_id() {
            end_job(&running, joined, &mut slots, &mut free, &mut report);
        }
        // Claim for the free slots; go on claiming while claims come
        // back full (there may be more work than one batch).
        let mut found_nothing = false;
        if !stopping && !free.is_empty() && tokio::time::Instant::now() >= next_claim {
            let limit = free.len().min(settings.batch);
            match claim(&shared, &context, limit).await {
                Ok(claims) => {
                    claim_failures = 0;
                    failing_since = None;
                    let got = claims.len();
                    report.claimed += got as u64;
                    for claim in claims {
                        let slot = free.pop_first().expect("a claim never takes more than the free slots");
                        let id = spawn_job(&shared, &reporter, &mut jobs, slot, claim);
                        slots.insert(id, slot);
                        running.store(slots.len(), Ordering::SeqCst);
                    }
                    if got == limit && !free.is_empty() {
                        continue;
                    }
                    found_nothing = got == 0;
                }
                Err(error) if retry_claim(&error) && claim_failures < mode.claim_retries() => {
                    claim_failures += 1;
                    let failing = failing_since.get_or_insert_with(tokio::time::Instant::now).elapsed();
                    if settings.give_up_after.is_some_and(|limit| failing >= limit) {
                        tracing::error!(%error, ?failing, "claims kept failing; the pool gives up");
                        fatal = Some(gave_up_error(error, failing, claim_failures));
                        stopping = true;
                    } else {
                        let wait = claim_backoff(settings.idle_poll, claim_failures);
                        next_claim = tokio::time::Instant::now() + wait;
                        tracing::warn!(%error, claim_failures, ?wait, "claim failed; trying again after a wait");
                    }
                }
                Err(error) => {
                    tracing::error!(%error, "claim refused; the pool stops claiming");
                    fatal = Some(error);
                    stopping = true;
                }
            }
        }
        if jobs.is_empty() && (stopping || (matches!(mode, Mode::UntilIdle) && found_nothing)) {
            break;
        }
        let poll = !stopping && !free.is_empty();
        tokio::select! {
            biased;
            () = &mut shutdown, if !stopping => {
                tracing::info!(running = jobs.len(), "shutdown: no more claims; waiting for running jobs");
                stopping = true;
            }
            Some(joined) = jobs.join_next_with_id(), if !jobs.is_empty() => {
                end_job(&running, joined, &mut slots, &mut free, &mut report);
            }
            _ = recovery.tick(), if !stopping => {
                match shared.engine.recover(&context).await {
                    Ok(pass) => {
                        if pass.interrupted > 0 {
                            tracing::info!(?pass, "recovered interrupted work");
                        }
                        report.add_recovery(&pass);
                    }
                    Err(error) => tracing::warn!(%error, "recovery pass failed; trying again at the next one"),
                }
            }
            // After a failed claim, the backoff; else the idle poll.
            () = tokio::time::sleep_until(if claim_failures > 0 {
                next_claim
            } else {
                tokio::time::Instant::now() + settings.idle_poll
            }), if poll => {}
        }
    }
    // Every job has reported; the reporter ends once its queue closes.
    drop(reporter);
    if let Err(error) = reporter_task.await {
        tracing::error!(%error, "the outcome reporter ended abnormally");
    }
    match fatal {
        Some(error) => Err(PoolError::Engine(error)),
        None => Ok(report),
    }
}

/// The error a pool that gave up stops with: the storage error, said
/// first (a full disk reads `disk full: …`), then for how long it lasted.
fn gave_up_error(error: EngineError, failing: Duration, claims: u32) -> EngineError {
    match error {
        EngineError::Store(store) => EngineError::Store(opledger_store::StoreError::new(
            store.kind,
            format!(
                "{} (claims failed {claims} times over {:.0} s; stopped trying)",
                store.message,
                failing.as_secs_f64()
            ),
        )),
        other => other,
    }
}

async fn claim<S: Store>(
    shared: &Shared<S>,
    context: &CommandContext,
    limit: usize,
) -> Result<Vec<TaskClaim>, EngineError> {
    shared
        .engine
        .claim_tasks(
            context,
            ClaimRequest {
                kinds: shared.tasks.keys().map(|kind| kind.to_string()).collect(),
                worker: shared.settings.name.clone(),
                lease_ms: shared.settings.lease.millis(),
                limit,
                principal: None,
                versions: shared
                    .tasks
                    .iter()
                    .map(|(kind, task)| (kind.to_string(), task.versions().into_iter().collect::<BTreeSet<_>>()))
                    .filter(|(_, versions)| !versions.is_empty())
                    .collect(),
            },
        )
        .await
}

fn spawn_job<S: Store>(
    shared: &Arc<Shared<S>>,
    reporter: &Reporter,
    jobs: &mut JoinSet<(JobEnd, u64)>,
    slot: usize,
    claim: TaskClaim,
) -> tokio::task::Id {
    let shared = shared.clone();
    let actor = format!("{}/slot-{slot}", shared.settings.name);
    let span = tracing::info_span!(
        "job",
        operation = %claim.operation_id,
        kind = %claim.task_kind,
        attempt = claim.attempt,
        actor = %actor,
    );
    jobs.spawn(run_job(shared, reporter.clone(), actor, claim).instrument(span))
        .id()
}

fn end_job(
    running: &AtomicUsize,
    joined: Result<(tokio::task::Id, (JobEnd, u64)), tokio::task::JoinError>,
    slots: &mut HashMap<tokio::task::Id, usize>,
    free: &mut BTreeSet<usize>,
    report: &mut PoolReport,
) {
    let id = match joined {
        Ok((id, (end, progress_reports))) => {
            report.add_job(&end, progress_reports);
            id
        }
        Err(error) => {
            // The runtime itself failed around a job (task panics are caught
            // inside it): nothing was reported; recovery takes the claim
            // once its lease expires.
            tracing::error!(%error, "a job ended without reporting");
            report.unreported += 1;
            error.id()
        }
    };
    if let Some(slot) = slots.remove(&id) {
        running.store(slots.len(), Ordering::SeqCst);
        free.insert(slot);
    }
}

/// One claim, from start to report.
async fn run_job<S: Store>(
    shared: Arc<Shared<S>>,
    reporter: Reporter,
    actor: String,
    claim: TaskClaim,
) -> (JobEnd, u64) {
    let settings = &shared.settings;
    let fence = claim.fence();
    let context = CommandContext::actor(actor).with_correlation(claim.claim_token.clone());
    let Some(task) = shared.tasks.get(claim.task_kind.as_str()).cloned() else {
        // Claims are filtered by the registered kinds; this is a bug.
        let error = format!("no task for kind {} in pool {}", claim.task_kind, settings.name);
        let kind = report_failure(&reporter, &context, &fence, &error, false, false).await;
        return (JobEnd { executed: false, kind }, 0);
    };

    let (stop_tx, _) = watch::channel(None);
    let stop_tx = Arc::new(stop_tx);
    let (done_tx, done_rx) = oneshot::channel();
    let heartbeat = tokio::spawn(
        heartbeat_loop(
            shared.link.clone(),
            fence.clone(),
            settings.lease,
            settings.heartbeat_interval,
            stop_tx.clone(),
            done_rx,
        )
        .in_current_span(),
    );
    let mut job = Job::new(
        claim,
        context.clone(),
        settings.lease,
        shared.link.clone(),
        stop_tx,
        settings.progress_interval,
    );
    tracing::debug!("running");
    // The claim goes with the closures the task queues on compute threads,
    // so a flight record names it while one of them runs.
    let ran = crate::flight::CLAIM
        .scope(
            fence.claim_token.clone(),
            run_task(task.as_ref(), &mut job, settings.stop_grace),
        )
        .await;
    let _ = done_tx.send(());
    if let Err(error) = heartbeat.await {
        tracing::warn!(%error, "the heartbeat loop ended abnormally");
    }
    let kind = record_end(&shared.engine, &reporter, &context, &fence, &mut job, ran).await;
    (JobEnd { executed: true, kind }, job.progress_reports())
}

/// Runs the task, catching a panic; a task told to stop that does not
/// return within `grace` is dropped.
async fn run_task(task: &dyn DynTask, job: &mut Job, grace: Duration) -> Ran {
    let stopped = job.cancelled();
    let run = AssertUnwindSafe(task.run_boxed(job)).catch_unwind();
    tokio::select! {
        result = run => match result {
            Ok(result) => Ran::Returned(result),
            Err(payload) => Ran::Panicked(panic_message(payload.as_ref())),
        },
        reason = async move {
            let reason = stopped.await;
            tokio::time::sleep(grace).await;
            reason
        } => {
            tracing::warn!(%reason, ?grace, "the task did not stop within its grace; dropped");
            Ran::Abandoned
        }
    }
}

/// The text a panic carried, for the failure it becomes.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Extends the lease every `interval` until the job is done; trips the
/// job's stop signal when the answer asks for cancellation or the fence
/// refuses the heartbeat (the claim was lost: stop, report nothing). Keeps
/// beating after a cancel request, so the lease holds while the job cleans
/// up.
async fn heartbeat_loop(
    link: Arc<dyn JobLink>,
    fence: Fence,
    lease: LeaseMs,
    interval: Duration,
    stop: Arc<watch::Sender<Option<StopReason>>>,
    mut done: oneshot::Receiver<()>,
) {
    let mut delay = interval;
    loop {
        tokio::select! {
            biased;
            _ = &mut done => return,
            () = tokio::time::sleep(delay) => {}
        }
        match link.heartbeat(&fence, lease).await {
            Ok(beat) => {
                delay = interval;
                if beat.cancel_requested {
                    if stop.borrow().is_none() {
                        tracing::info!("cancellation requested");
                    }
                    trip(&stop, StopReason::CancelRequested);
                }
            }
            Err(error) if is_claim_lost(&error) => {
                tracing::warn!(%error, "heartbeat refused: the claim was lost; stopping the task");
                trip(&stop, StopReason::ClaimLost(error.to_string()));
                return;
            }
            Err(error) => {
                // The lease still runs; try again sooner.
                delay = (interval / 4).max(Duration::from_millis(50));
                tracing::warn!(%error, ?delay, "heartbeat failed; trying again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_that_fail_back_off_doubling_from_the_idle_poll_up_to_a_cap() {
        let poll = Duration::from_millis(50);
        let waits: Vec<u128> = (1..=10).map(|n| claim_backoff(poll, n).as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000, 5_000]);
        assert_eq!(claim_backoff(poll, u32::MAX), MAX_CLAIM_BACKOFF);
        // An idle poll longer than the cap is never shortened.
        assert_eq!(claim_backoff(Duration::from_secs(9), 3), Duration::from_secs(9));
    }

    #[test]
    fn panic_messages_are_read_from_str_and_string_payloads() {
        let text: Box<dyn Any + Send> = Box::new("boom");
        assert_eq!(panic_message(text.as_ref()), "boom");
        let owned: Box<dyn Any + Send> = Box::new(String::from("bang 7"));
        assert_eq!(panic_message(owned.as_ref()), "bang 7");
        let other: Box<dyn Any + Send> = Box::new(7_u8);
        assert_eq!(panic_message(other.as_ref()), "a panic without a message");
    }
}
