//! Recovery: claims whose lease expired (their workers died or lost
//! touch) are interrupted, then requeued, cancelled or failed per their
//! kind's policy. Expired claims are read on a read connection and each is
//! checked again inside the write, so a completion that lands in between
//! wins.

use super::{load_state, state_append};
use crate::error::EngineError;
use crate::idempotency::{FORGET_PER_TRANSACTION, REQUEST_RETENTION_MS};
use crate::load::load_kinds;
use crate::tx::{CommandContext, Decided};
use crate::Engine;
use opledger_domain::projections::{ProcessingStateRow, WorkingSet};
use opledger_domain::recovery::{decide_recovery, Recovered, Suspicion};
use opledger_domain::tasks::RetryPolicy;
use opledger_domain::Timestamp;
use opledger_store::{ExpiredClaim, Store, WriteTx};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Claims recovery examines per transaction.
const RECOVERY_BATCH: usize = 500;

/// What a recovery pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Claims found with an expired lease and interrupted.
    pub interrupted: u64,
    pub requeued: u64,
    /// Interrupted tasks whose cancel request recovery finished.
    pub cancelled: u64,
    /// Quarantined (interrupted too often) or not re-run by policy.
    pub failed: u64,
    /// Candidates that a worker completed, failed or extended between
    /// recovery's read and its write: left alone.
    pub skipped: u64,
    /// Claims of a gone worker that, by its flight record, it had not
    /// started: given back like a release (queued at once, no
    /// interruption or attempt counted), not interrupted.
    pub released: u64,
    /// Commands recorded under request ids longer ago than the retention
    /// ([`crate::REQUEST_RETENTION_MS`]), forgotten by this pass.
    pub forgotten_requests: u64,
}

/// What gone workers' flight records say (`opledger_worker::FlightRecord`):
/// for each worker that left one, the claim tokens it was running when it
/// ended. A worker with no entry left no record: each of its claims counts
/// as interrupted.
pub type RunningWhenGone = BTreeMap<String, BTreeSet<String>>;

/// Called between recovery's read of expired claims and its write; tests
/// use it to land a completion in the gap.
pub type RecoveryHook = Box<dyn Fn(Vec<ExpiredClaim>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

impl<S: Store> Engine<S> {
    /// One recovery pass: every claim whose lease expired is interrupted,
    /// then requeued, cancelled or failed per its kind's policy. Run at
    /// startup before any worker, then periodically.
    pub async fn recover(&self, context: &CommandContext) -> Result<RecoveryReport, EngineError> {
        self.recover_with(context, None).await
    }

    /// [`Engine::recover`] with a hook run between the read of expired
    /// claims and the write that interrupts them. Each candidate is checked
    /// again inside the write: a claim completed, failed or extended in the
    /// gap is left alone, so recovery never undoes a completion.
    pub async fn recover_with(
        &self,
        context: &CommandContext,
        hook: Option<&RecoveryHook>,
    ) -> Result<RecoveryReport, EngineError> {
        // Candidates are read by the shared clock where the store has one,
        // and each is checked again at the write's own time.
        let now = self.read_time().await?;
        let mut report = self.interrupt_claims(context, now, hook, &Gone::Expired).await?;
        // The claims' outcomes are committed: a sweep that fails does not
        // make the pass a failure (its caller would think nothing was
        // done); the next pass sweeps what this one left.
        match self.forget_old_requests().await {
            Ok(forgotten) => report.forgotten_requests = forgotten,
            Err(error) => tracing::warn!(%error, "could not forget old request ids; the next recovery retries"),
        }
        Ok(report)
    }

    /// Forgets the commands recorded under request ids more than
    /// [`crate::REQUEST_RETENTION_MS`] before now, a bounded number per
    /// transaction (run by each recovery pass); answers how many. A retry
    /// of a forgotten command runs as a new one.
    pub async fn forget_old_requests(&self) -> Result<u64, EngineError> {
        let before = self.read_time().await?.plus_millis(-REQUEST_RETENTION_MS);
        let mut forgotten = 0;
        loop {
            let done = self
                .store
                .write(move |tx: &mut S::Tx| {
                    Box::pin(async move {
                        tx.forget_commands(before, FORGET_PER_TRANSACTION)
                            .await
                            .map_err(EngineError::from)
                    })
                })
                .await?;
            forgotten += done;
            if done < FORGET_PER_TRANSACTION as u64 {
                return Ok(forgotten);
            }
        }
    }

    /// Interrupts at once every claim held by one of `workers`, whatever
    /// its lease, then requeues, cancels or fails each per its kind's
    /// policy, as recovery does; `cause` says why, on each timeline. The
    /// caller must know those workers run no more: a process stopping its
    /// own workers, or one that holds a lock its previous holder held (the
    /// ingest lock), whose claims are then dead without waiting for their
    /// leases to expire. A claim completed in the meantime is left alone.
    pub async fn release_claims_of(
        &self,
        context: &CommandContext,
        workers: &[String],
        cause: &str,
    ) -> Result<RecoveryReport, EngineError> {
        if workers.is_empty() {
            return Ok(RecoveryReport::default());
        }
        let workers: BTreeSet<String> = workers.iter().cloned().collect();
        self.release_claims_where(
            context,
            move |worker| workers.contains(worker),
            cause,
            RunningWhenGone::new(),
        )
        .await
    }

    /// [`Engine::release_claims_of`] for every worker whose name `gone`
    /// accepts: a caller that knows a family of workers dead by their names
    /// (the ingest, holding its ledger's lock, knows every other ingest
    /// run's workers are). Where `running` holds a worker's flight record,
    /// only the claims it was running are interrupted (counted against
    /// their interruption budget, the cause saying it ended while it ran
    /// them: one of them may be what ended it); the others, which were
    /// only waiting, are given back as a release is, without counting.
    pub async fn release_claims_where(
        &self,
        context: &CommandContext,
        gone: impl Fn(&str) -> bool + Send + Sync + 'static,
        cause: &str,
        running: RunningWhenGone,
    ) -> Result<RecoveryReport, EngineError> {
        let gone = Gone::Workers {
            gone: Arc::new(gone),
            cause: cause.to_string(),
            running: Arc::new(running),
        };
        // Every held claim's lease ends before the end of time: the held
        // claims are read through the same index as expired ones.
        self.interrupt_claims(context, Timestamp::MAX, None, &gone).await
    }

    /// Interrupts the held claims, read as ending before `until`, that
    /// `gone` finds dead.
    async fn interrupt_claims(
        &self,
        context: &CommandContext,
        until: Timestamp,
        hook: Option<&RecoveryHook>,
        gone: &Gone,
    ) -> Result<RecoveryReport, EngineError> {
        let mut report = RecoveryReport::default();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        loop {
            // Claims seen and left held (another worker's, or one that
            // moved on) are read again ahead of the rest: read past them.
            let fetched = self.store.expired_claims(until, seen.len() + RECOVERY_BATCH).await?;
            let fresh: Vec<ExpiredClaim> = fetched
                .into_iter()
                .filter(|candidate| !seen.contains(&candidate.claim_token))
                .collect();
            if fresh.is_empty() {
                return Ok(report);
            }
            seen.extend(fresh.iter().map(|candidate| candidate.claim_token.clone()));
            // Claims of workers not named are not ours to judge, and are
            // not counted.
            let candidates: Vec<ExpiredClaim> = fresh
                .into_iter()
                .filter(|candidate| match gone {
                    Gone::Expired => true,
                    Gone::Workers { gone, .. } => gone(&candidate.worker),
                })
                .collect();
            if candidates.is_empty() {
                continue;
            }
            if let Some(hook) = hook {
                hook(candidates.clone()).await;
            }
            let batch = self.recover_claims(context, candidates, gone.clone()).await?;
            report.interrupted += batch.interrupted;
            report.requeued += batch.requeued;
            report.cancelled += batch.cancelled;
            report.failed += batch.failed;
            report.skipped += batch.skipped;
            report.released += batch.released;
        }
    }

    /// One transaction over a page of suspected claims: each one's state
    /// (and lease) loaded, the domain's decision, its events appended and
    /// its lease row dropped.
    async fn recover_claims(
        &self,
        context: &CommandContext,
        candidates: Vec<ExpiredClaim>,
        gone: Gone,
    ) -> Result<RecoveryReport, EngineError> {
        let stamp = self.stamp(context);
        self.stamped(stamp, move |tx, rows, stamp| {
            Box::pin(async move {
                // The write's time, read under the write lock: a lease is
                // expired by the log's clock, never by the clock of the host
                // running recovery.
                let now = stamp.recorded_at;
                let mut batch = RecoveryReport::default();
                let mut appends = Vec::new();
                for candidate in candidates {
                    let token = candidate.claim_token.as_str();
                    let state = load_state(tx, rows, candidate.operation_id).await?;
                    let suspicion = match &gone {
                        Gone::Expired => Suspicion::LeaseEnded {
                            extended_to: tx.lease(token).await?.map(|lease| lease.lease_expires_at),
                        },
                        Gone::Workers { gone, cause, running } => {
                            let worker = state.as_ref().and_then(|state| state.worker.as_deref());
                            Suspicion::WorkerGone {
                                gone: worker.is_some_and(|worker| gone(worker)),
                                cause: cause.clone(),
                                ran: worker
                                    .and_then(|worker| running.get(worker))
                                    .map(|ran| ran.contains(token)),
                            }
                        }
                    };
                    let policy = retry_policy(tx, rows, state.as_ref()).await?;
                    let recovery = decide_recovery(state.as_ref(), token, suspicion, &policy, now)?;
                    batch.count(recovery.recovered);
                    if let (Some(state), false) = (&state, recovery.events.is_empty()) {
                        tx.delete_lease(token).await?;
                        let events = recovery.events.into_iter().map(|event| stamp.event(event)).collect();
                        appends.push(state_append(state, events));
                    }
                }
                Ok(Decided::answer(batch, appends))
            })
        })
        .await
    }
}

impl RecoveryReport {
    fn count(&mut self, recovered: Recovered) {
        match recovered {
            Recovered::Left => {}
            Recovered::Skipped => self.skipped += 1,
            Recovered::Released => self.released += 1,
            Recovered::ReleasedCancelled => self.cancelled += 1,
            Recovered::Requeued => {
                self.interrupted += 1;
                self.requeued += 1;
            }
            Recovered::Cancelled => {
                self.interrupted += 1;
                self.cancelled += 1;
            }
            Recovered::Failed => {
                self.interrupted += 1;
                self.failed += 1;
            }
        }
    }
}

/// The retry policy of a task's kind (the default for a kind without a
/// declaration, or no task).
async fn retry_policy<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    state: Option<&ProcessingStateRow>,
) -> Result<RetryPolicy, EngineError> {
    let Some(state) = state else {
        return Ok(RetryPolicy::DEFAULT);
    };
    let kinds = load_kinds(tx, rows, [state.task_kind.as_str()]).await?;
    Ok(kinds
        .get(&state.task_kind)
        .and_then(|row| row.declaration.as_ref())
        .map_or(RetryPolicy::DEFAULT, |declaration| declaration.retry))
}

/// Whether a worker, by its name, is gone.
type WorkerTest = dyn Fn(&str) -> bool + Send + Sync;

/// Which held claims an interrupting pass finds dead.
#[derive(Clone)]
enum Gone {
    /// Those whose lease (extended by heartbeats) ended before the
    /// write's time.
    Expired,
    /// Those held by a worker `gone` accepts, whatever their lease; what
    /// the gone workers were running, where known.
    Workers {
        gone: Arc<WorkerTest>,
        cause: String,
        running: Arc<RunningWhenGone>,
    },
}
