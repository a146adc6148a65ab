//! Recovery: claims whose lease expired (their workers died or lost
//! touch) are interrupted, then requeued, cancelled or failed per their
//! kind's policy. Expired claims are read on a read connection and each is
//! checked again inside the write, so a completion that lands in between
//! wins.

use super::{load_state, state_append};
use crate::error::EngineError;
use crate::load::load_kinds;
use crate::tx::{CommandContext, Decided};
use crate::Engine;
use opledger_domain::events::Event;
use opledger_domain::lease::lease_end;
use opledger_domain::tasks::RetryPolicy;
use opledger_domain::work;
use opledger_domain::Timestamp;
use opledger_store::{ExpiredClaim, Store, WriteTx};
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;

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
}

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
        let now = self.clock.now();
        self.interrupt_claims(context, now, hook, &Gone::Expired { now }).await
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
        let gone = Gone::Workers {
            workers: workers.iter().cloned().collect(),
            cause: cause.to_string(),
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
            let candidates: Vec<ExpiredClaim> = self
                .store
                .expired_claims(until, RECOVERY_BATCH)
                .await?
                .into_iter()
                .filter(|candidate| !seen.contains(&candidate.claim_token))
                .collect();
            if candidates.is_empty() {
                return Ok(report);
            }
            seen.extend(candidates.iter().map(|candidate| candidate.claim_token.clone()));
            if let Some(hook) = hook {
                hook(candidates.clone()).await;
            }
            let stamp = self.stamp(context);
            let gone = gone.clone();
            let batch = self
                .command(move |tx, rows| {
                    Box::pin(async move {
                        let mut batch = RecoveryReport::default();
                        let mut appends = Vec::new();
                        for candidate in candidates {
                            let state = load_state(tx, rows, candidate.operation_id).await?;
                            let Some(state) = state
                                .filter(|state| state.claim_token.as_deref() == Some(candidate.claim_token.as_str()))
                            else {
                                batch.skipped += 1;
                                continue;
                            };
                            let cause = match &gone {
                                Gone::Expired { now } => {
                                    let lease = tx.lease(&candidate.claim_token).await?;
                                    let extended = lease.map(|lease| lease.lease_expires_at);
                                    let ends = lease_end(state.lease_expires_at, extended).unwrap_or(*now);
                                    if ends >= *now {
                                        batch.skipped += 1;
                                        continue;
                                    }
                                    format!("lease expired at {ends}")
                                }
                                Gone::Workers { workers, cause } => {
                                    // Claims of other workers are not ours to
                                    // judge, and are not counted.
                                    if !state.worker.as_ref().is_some_and(|worker| workers.contains(worker)) {
                                        continue;
                                    }
                                    cause.clone()
                                }
                            };
                            let kinds = load_kinds(tx, rows, [state.task_kind.as_str()]).await?;
                            let policy = kinds
                                .get(&state.task_kind)
                                .and_then(|row| row.declaration.as_ref())
                                .map_or(RetryPolicy::DEFAULT, |declaration| declaration.retry);
                            let events = work::decide_interrupt_because(&state, &policy, &cause)?;
                            batch.interrupted += 1;
                            match events.last() {
                                Some(Event::OperationRequeued(_)) => batch.requeued += 1,
                                Some(Event::OperationCancelled(_)) => batch.cancelled += 1,
                                _ => batch.failed += 1,
                            }
                            tx.delete_lease(&candidate.claim_token).await?;
                            let events = events.into_iter().map(|event| stamp.event(event)).collect();
                            appends.push(state_append(&state, events));
                        }
                        Ok(Decided::answer(batch, appends))
                    })
                })
                .await?;
            report.interrupted += batch.interrupted;
            report.requeued += batch.requeued;
            report.cancelled += batch.cancelled;
            report.failed += batch.failed;
            report.skipped += batch.skipped;
        }
    }
}

/// Which held claims an interrupting pass finds dead.
#[derive(Clone)]
enum Gone {
    /// Those whose lease (extended by heartbeats) ended before `now`.
    Expired { now: Timestamp },
    /// Those held by one of `workers`, whatever their lease.
    Workers { workers: BTreeSet<String>, cause: String },
}
