//! How a job's end is recorded: completions and failures go to the pool's
//! reporter, which writes the outcomes that queue while one batch is being
//! written together in the next command; a cancel is acknowledged once the
//! job's temporary outputs are gone; a lost claim records nothing. Reports
//! are tried again on transient storage trouble.

use crate::job::{Job, StopReason};
use crate::link::{is_claim_lost, is_transient};
use crate::task::{Outcome, TaskError};
use opledger_domain::OperationStatus;
use opledger_engine::{ClaimOutcome, CommandContext, Engine, EngineError, Fence, OutcomeReport, TaskOutcome};
use opledger_store::Store;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndKind {
    Completed,
    Failed { terminal: bool, panicked: bool },
    Cancelled,
    Lost,
    Unreported,
}

/// How a task's run ended, before anything was reported.
pub(crate) enum Ran {
    Returned(Result<Outcome, TaskError>),
    Panicked(String),
    /// Told to stop, it did not return within the grace: dropped.
    Abandoned,
}

/// Most outcomes written in one command.
const MAX_REPORT_BATCH: usize = 128;

/// See [`WorkerPoolBuilder::report_linger`].
pub(crate) const DEFAULT_REPORT_LINGER: Duration = Duration::from_millis(20);

/// An outcome waiting for the reporter, and where its answer goes.
pub(crate) struct PendingReport {
    report: OutcomeReport,
    answer: oneshot::Sender<Result<TaskOutcome, EngineError>>,
}

/// How jobs hand their outcomes to the pool's reporter.
#[derive(Clone)]
pub(crate) struct Reporter {
    pub(crate) queue: mpsc::UnboundedSender<PendingReport>,
}

impl Reporter {
    /// Records one claim's outcome; answers once it is durable (or refused).
    async fn report(
        &self,
        context: &CommandContext,
        fence: &Fence,
        outcome: ClaimOutcome,
    ) -> Result<TaskOutcome, EngineError> {
        let (answer, answered) = oneshot::channel();
        let report = OutcomeReport {
            context: context.clone(),
            fence: fence.clone(),
            outcome,
        };
        let gone = || {
            EngineError::Store(opledger_store::StoreError::unavailable(
                "the pool's outcome reporter has stopped",
            ))
        };
        self.queue.send(PendingReport { report, answer }).map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }
}

/// Writes the outcomes jobs send, one command at a time: the outcomes that
/// queued while one batch was being written go together in the next. A
/// pool whose jobs finish faster than the store commits thus pays one
/// command's fixed cost (loads, positions, savepoint, commit) per batch
/// instead of per task; a quiet pool writes each outcome at once.
pub(crate) async fn reporter<S: Store>(
    engine: Engine<S>,
    mut queue: mpsc::UnboundedReceiver<PendingReport>,
    running: Arc<AtomicUsize>,
    linger: Duration,
) {
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + linger;
        while batch.len() < MAX_REPORT_BATCH {
            match queue.try_recv() {
                Ok(pending) => batch.push(pending),
                // Every running job has reported: nothing more will come.
                Err(_) if batch.len() >= running.load(Ordering::SeqCst) => break,
                Err(_) => match tokio::time::timeout_at(deadline, queue.recv()).await {
                    Ok(Some(pending)) => batch.push(pending),
                    Ok(None) | Err(_) => break,
                },
            }
        }
        let reports: Vec<OutcomeReport> = batch.iter().map(|pending| pending.report.clone()).collect();
        match with_retries("report outcomes", || engine.report_outcomes(reports.clone())).await {
            Ok(answers) => {
                for (pending, answer) in batch.into_iter().zip(answers) {
                    let _ = pending.answer.send(answer);
                }
            }
            Err(error) => {
                for pending in batch {
                    let _ = pending.answer.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Records how the job ended. A lost claim records nothing; a cancel is
/// acknowledged only after the temporary outputs are gone; an output is
/// completed even if a cancel request arrived after the task finished.
pub(crate) async fn record_end<S: Store>(
    engine: &Engine<S>,
    reporter: &Reporter,
    context: &CommandContext,
    fence: &Fence,
    job: &mut Job,
    ran: Ran,
) -> EndKind {
    let stop = job.stop_reason();
    if let Some(StopReason::ClaimLost(reason)) = &stop {
        let removed = job.remove_temporary_outputs().await;
        tracing::warn!(%reason, removed, "claim lost: the outcome is not reported");
        return EndKind::Lost;
    }
    let finished_anyway = matches!(ran, Ran::Returned(Ok(_)));
    if stop == Some(StopReason::CancelRequested) && !finished_anyway {
        let removed = job.remove_temporary_outputs().await;
        tracing::info!(removed, "cancelled; temporary outputs removed");
        return match with_retries("acknowledge the cancel", || engine.acknowledge_cancel(context, fence)).await {
            Ok(_) => EndKind::Cancelled,
            Err(error) if is_claim_lost(&error) => {
                tracing::warn!(%error, "cancel not acknowledged: the claim was lost");
                EndKind::Lost
            }
            Err(error) => {
                tracing::error!(%error, "cancel not acknowledged; recovery will finish it");
                EndKind::Unreported
            }
        };
    }
    // Whatever was not committed is garbage now.
    job.remove_temporary_outputs().await;
    job.flush_progress().await;
    if job
        .stop_reason()
        .is_some_and(|reason| matches!(reason, StopReason::ClaimLost(_)))
    {
        return EndKind::Lost;
    }
    let (message, terminal, panicked) = match ran {
        Ran::Returned(Ok(outcome)) => {
            let completion = outcome.into_completion();
            return match reporter
                .report(context, fence, ClaimOutcome::Complete(completion))
                .await
            {
                Ok(outcome) => {
                    tracing::debug!(status = %outcome.status, "completed");
                    EndKind::Completed
                }
                Err(error) if is_claim_lost(&error) => {
                    tracing::warn!(%error, "completion refused: the claim was lost");
                    EndKind::Lost
                }
                Err(error) => {
                    tracing::error!(%error, "completion not recorded; recovery will requeue the task");
                    EndKind::Unreported
                }
            };
        }
        Ran::Returned(Err(TaskError::Retryable(message))) => (message, false, false),
        Ran::Returned(Err(TaskError::Terminal(message))) => (message, true, false),
        Ran::Returned(Err(TaskError::Stopped(reason))) => (
            format!("the task stopped without being asked to ({reason})"),
            false,
            false,
        ),
        Ran::Panicked(message) => (format!("the task panicked: {message}"), false, true),
        Ran::Abandoned => (
            "the task was dropped after it was told to stop".to_string(),
            false,
            false,
        ),
    };
    report_failure(reporter, context, fence, &message, terminal, panicked).await
}

pub(crate) async fn report_failure(
    reporter: &Reporter,
    context: &CommandContext,
    fence: &Fence,
    message: &str,
    terminal: bool,
    panicked: bool,
) -> EndKind {
    let message = opledger_domain::work::failure_message(message);
    let outcome = ClaimOutcome::Fail {
        error: message.to_string(),
        terminal,
    };
    match reporter.report(context, fence, outcome).await {
        Ok(outcome) if outcome.status == OperationStatus::Cancelled => {
            // A cancel was requested after the job's last heartbeat: the
            // engine finished it with the failure instead of a retry.
            tracing::info!(error = message, "failed after a cancel request: cancelled");
            EndKind::Cancelled
        }
        Ok(outcome) => {
            tracing::info!(status = %outcome.status, error = message, "failed");
            EndKind::Failed { terminal, panicked }
        }
        Err(error) if is_claim_lost(&error) => {
            tracing::warn!(%error, "failure refused: the claim was lost");
            EndKind::Lost
        }
        Err(error) => {
            tracing::error!(%error, "failure not recorded; recovery will requeue the task");
            EndKind::Unreported
        }
    }
}

/// Tries a report again on transient storage trouble (three more times,
/// 100 ms, 400 ms, 1.6 s apart).
async fn with_retries<T, F, Fut>(what: &str, mut call: F) -> Result<T, EngineError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, EngineError>>,
{
    let mut delay = Duration::from_millis(100);
    let mut retries = 3;
    loop {
        match call().await {
            Err(error) if retries > 0 && is_transient(&error) => {
                tracing::warn!(%error, ?delay, "could not {what}; trying again");
                tokio::time::sleep(delay).await;
                delay *= 4;
                retries -= 1;
            }
            other => return other,
        }
    }
}
