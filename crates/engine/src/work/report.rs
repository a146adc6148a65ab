//! How a claim ends: a worker's completion, failure, acknowledged cancel
//! or release, one path for all of them. Every report becomes a [`Report`] (its fence,
//! its stamp, the outcome, the jitter a failure may use) and
//! [`Engine::end_claims`] records a batch of them in one transaction; the
//! single and batched commands only build reports. Whether the claim still
//! holds the task, and what its outcome records, is the domain's decision
//! (`opledger_domain::work::decide_report`).

use super::{load_states, stale_claim, state_append, state_in, TaskOutcome};
use crate::error::EngineError;
use crate::idempotency::asked_outcome;
use crate::load::load_kinds;
use crate::tx::{spawnable, CommandContext, Decided, Stamp};
use crate::Engine;
use opledger_domain::events::{Event, OperationProgressed};
use opledger_domain::projections::WorkingSet;
use opledger_domain::tasks::RetryPolicy;
use opledger_domain::work::{self, ClaimOutcome, Completion, Fence};
use opledger_domain::{DomainError, OperationId};
use opledger_store::{BoxFuture, Store, TimeSource, WriteTx};
use serde_json::json;

/// One worker's report of one claim, with the context its events carry.
#[derive(Debug, Clone)]
pub struct OutcomeReport {
    pub context: CommandContext,
    pub fence: Fence,
    pub outcome: ClaimOutcome,
}

/// A report ready to be decided: everything fixed before the transaction.
struct Report {
    fence: Fence,
    stamp: Stamp,
    outcome: ClaimOutcome,
    /// Drawn for a failure only (its retry's jitter), recorded if used.
    jitter_draw: u32,
}

impl<S: Store> Engine<S> {
    /// Records a worker's completion (fenced). The final progress counters,
    /// if not yet on the timeline, are recorded first.
    pub fn complete_task<'a>(
        &'a self,
        context: &'a CommandContext,
        fence: &'a Fence,
        completion: Completion,
    ) -> BoxFuture<'a, Result<TaskOutcome, EngineError>> {
        spawnable(self.end_claim(context, fence, ClaimOutcome::Complete(completion), "task.complete"))
    }

    /// Records many completions in one transaction (a worker that finished
    /// a batch of claims). Each is fenced and answered on its own; a stale
    /// one is its own Conflict and does not stop the others. They share one
    /// stamp: one command.
    pub fn complete_tasks<'a>(
        &'a self,
        context: &'a CommandContext,
        completions: Vec<(Fence, Completion)>,
    ) -> BoxFuture<'a, Result<Vec<Result<TaskOutcome, EngineError>>, EngineError>> {
        spawnable(async move {
            context.refuse_request_id("completing many tasks in one call")?;
            let stamp = self.stamp(context);
            let reports = completions
                .into_iter()
                .map(|(fence, completion)| self.report(fence, stamp.clone(), ClaimOutcome::Complete(completion)))
                .collect();
            self.end_claims(reports).await
        })
    }

    /// Records a worker's failure (fenced): retried with backoff and
    /// recorded jitter while attempts remain, else final.
    pub fn fail_task<'a>(
        &'a self,
        context: &'a CommandContext,
        fence: &'a Fence,
        error: &'a str,
        terminal: bool,
    ) -> BoxFuture<'a, Result<TaskOutcome, EngineError>> {
        let outcome = ClaimOutcome::Fail {
            error: error.to_string(),
            terminal,
        };
        spawnable(self.end_claim(context, fence, outcome, "task.fail"))
    }

    /// The worker stopped after a cancel request and removed its temporary
    /// outputs: the task is `cancelled` now.
    pub fn acknowledge_cancel<'a>(
        &'a self,
        context: &'a CommandContext,
        fence: &'a Fence,
    ) -> BoxFuture<'a, Result<TaskOutcome, EngineError>> {
        spawnable(self.end_claim(context, fence, ClaimOutcome::AcknowledgeCancel, "task.ack_cancel"))
    }

    /// Gives a claim back unused (fenced like a completion): the task is
    /// queued again at once, its attempt not counted and no failure
    /// recorded; a cancel requested meanwhile is finished instead. A caller
    /// that took a claim it cannot hand on (its answer could not be
    /// delivered) gives it back this way instead of leaving it leased until
    /// recovery. An empty `reason` records
    /// [`opledger_domain::work::RELEASE_REASON`].
    pub fn release_task<'a>(
        &'a self,
        context: &'a CommandContext,
        fence: &'a Fence,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<TaskOutcome, EngineError>> {
        let outcome = ClaimOutcome::Release {
            reason: reason.to_string(),
        };
        spawnable(self.end_claim(context, fence, outcome, "task.release"))
    }

    /// Records many workers' outcomes — completions, failures and
    /// acknowledged cancels, each with its own actor and correlation — in
    /// one transaction. Each is fenced, decided and answered exactly as the
    /// single commands above would; a stale one is its own Conflict and
    /// does not stop the others. A worker pool sends the outcomes that
    /// queued while its previous report was being written, so a busy pool
    /// pays one command's fixed cost per batch instead of per task.
    pub fn report_outcomes<'a>(
        &'a self,
        reports: Vec<OutcomeReport>,
    ) -> BoxFuture<'a, Result<Vec<Result<TaskOutcome, EngineError>>, EngineError>> {
        spawnable(async move {
            for report in &reports {
                report
                    .context
                    .refuse_request_id("reporting many outcomes in one call")?;
            }
            let reports = reports
                .into_iter()
                .map(|report| self.report(report.fence, self.stamp(&report.context), report.outcome))
                .collect();
            self.end_claims(reports).await
        })
    }

    /// A report with its stamp, and the jitter a failure draws now.
    fn report(&self, fence: Fence, stamp: Stamp, outcome: ClaimOutcome) -> Report {
        let jitter_draw = match outcome {
            ClaimOutcome::Fail { .. } => self.jitter.draw(),
            ClaimOutcome::Complete(_) | ClaimOutcome::AcknowledgeCancel | ClaimOutcome::Release { .. } => 0,
        };
        Report {
            fence,
            stamp,
            outcome,
            jitter_draw,
        }
    }

    /// Ends one claim: [`end_claims_in`] of one report, as command
    /// `command` (recorded under the context's request id, if any). A
    /// refused report refuses the command.
    async fn end_claim(
        &self,
        context: &CommandContext,
        fence: &Fence,
        outcome: ClaimOutcome,
        command: &'static str,
    ) -> Result<TaskOutcome, EngineError> {
        let once = context.once(
            command,
            json!({"claim_token": fence.claim_token, "revision": fence.revision, "outcome": asked_outcome(&outcome)}),
        );
        let report = self.report(fence.clone(), self.stamp(context), outcome);
        let source = self.time_source();
        self.command_once(once, move |tx, rows| {
            Box::pin(async move {
                let decided = end_claims_in(tx, rows, vec![report], source).await?;
                Ok(decided.map(|mut outcomes| outcomes.pop().expect("one report gets one answer")))
            })
        })
        .await
    }

    /// Ends many claims in one transaction: [`end_claims_in`].
    async fn end_claims(&self, reports: Vec<Report>) -> Result<Vec<Result<TaskOutcome, EngineError>>, EngineError> {
        let source = self.time_source();
        self.command(move |tx, rows| Box::pin(end_claims_in(tx, rows, reports, source)))
            .await
    }
}

/// Ends many claims in the caller's transaction. Each report succeeds or
/// fails on its own (a stale token is that report's Conflict): unrecorded
/// final progress counters first, then the outcome the domain decides; the
/// lease row goes. The accepted ones are appended and folded together.
async fn end_claims_in<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    reports: Vec<Report>,
    source: TimeSource,
) -> Result<Decided<Vec<Result<TaskOutcome, EngineError>>>, EngineError> {
    let tokens: Vec<String> = reports.iter().map(|report| report.fence.claim_token.clone()).collect();
    let leases = tx.leases(&tokens).await?;
    let operation_ids: Vec<OperationId> = leases.iter().map(|lease| lease.operation_id).collect();
    load_states(tx, rows, &operation_ids).await?;
    // Failures retry as their kind declares; only they need it.
    let failing: Vec<String> = reports
        .iter()
        .filter(|report| matches!(report.outcome, ClaimOutcome::Fail { .. }))
        .filter_map(|report| {
            leases
                .iter()
                .find(|lease| lease.claim_token == report.fence.claim_token)
        })
        .filter_map(|lease| state_in(rows, lease.operation_id))
        .map(|state| state.task_kind)
        .collect();
    let kinds = if failing.is_empty() {
        Default::default()
    } else {
        load_kinds(tx, rows, failing.iter().map(String::as_str)).await?
    };
    let mut answers: Vec<Result<OperationId, EngineError>> = Vec::with_capacity(reports.len());
    let mut appends = Vec::new();
    let mut touched: Vec<OperationId> = Vec::new();
    for report in reports {
        let Report {
            fence,
            stamp,
            outcome,
            jitter_draw,
        } = report;
        // Each report's time as the transaction gives it: a retry's due
        // time follows the log's clock.
        let stamp = stamp.in_transaction(tx, source).await?;
        let decided = (|| {
            let stale = || stale_claim(&fence);
            let lease = leases
                .iter()
                .find(|lease| lease.claim_token == fence.claim_token)
                .ok_or_else(stale)?;
            let state = state_in(rows, lease.operation_id).ok_or_else(stale)?;
            if touched.contains(&state.operation_id) {
                return Err(EngineError::Domain(DomainError::Conflict(format!(
                    "claim {} is reported twice in one batch",
                    fence.claim_token
                ))));
            }
            let policy = kinds
                .get(&state.task_kind)
                .and_then(|row| row.declaration.as_ref())
                .map_or(RetryPolicy::DEFAULT, |declaration| declaration.retry);
            let outcome_events = work::decide_report(&state, &fence, outcome, &policy, stamp.recorded_at, jitter_draw)?;
            let mut events = Vec::with_capacity(outcome_events.len() + 1);
            if lease.progress_unrecorded {
                if let (Some(phase), Some(processed)) = (lease.phase.clone(), lease.processed) {
                    events.push(stamp.event(Event::OperationProgressed(OperationProgressed {
                        operation_id: state.operation_id,
                        phase,
                        processed,
                        total: lease.total,
                    })));
                }
            }
            events.extend(outcome_events.into_iter().map(|event| stamp.event(event)));
            Ok((state, events))
        })();
        match decided {
            Ok((state, events)) => {
                tx.delete_lease(&fence.claim_token).await?;
                touched.push(state.operation_id);
                appends.push(state_append(&state, events));
                answers.push(Ok(state.operation_id));
            }
            Err(error) => answers.push(Err(error)),
        }
    }
    Ok(Decided::then(appends, move |rows, _| {
        Ok(answers
            .into_iter()
            .map(|answer| TaskOutcome::in_rows(rows, answer?))
            .collect())
    }))
}
