//! What a task implementation provides, and how it says it ended.

use crate::job::{Job, JobError, StopReason};
use futures::future::BoxFuture;
use opledger_engine::{Completion, EngineError};
use serde_json::Value;
use std::future::Future;
use thiserror::Error;

/// One implementation per task kind. The runtime claims work of the kinds
/// its tasks declare and calls [`Task::run`] once per claim.
///
/// `run` may be written as `async fn run(&self, job: &mut Job) -> ...` in
/// the impl; the future must be `Send` (it runs on a multi-threaded
/// runtime). A panic inside it is caught and reported as a retryable
/// failure carrying the panic message.
pub trait Task: Send + Sync + 'static {
    /// The task kind this implementation runs (declared by the domain,
    /// e.g. `metadata`, `thumbnail`).
    fn kind(&self) -> &'static str;

    /// The versions of the kind this implementation runs (as its
    /// declaration names them): the pool is offered only tasks requested
    /// at one of them, so code of an old version never runs work requested
    /// for a new one. Empty (the default) is offered any version: the
    /// unsafe legacy mode, for a task that runs every version alike.
    fn versions(&self) -> Vec<String> {
        Vec::new()
    }

    /// Runs one claimed task. Check [`Job::is_cancelled`] at checkpoints or
    /// select on [`Job::cancelled`], and return [`TaskError::Stopped`] (or
    /// any error) once it trips: the runtime then removes the job's
    /// temporary outputs and records the cancel. A task that keeps running
    /// after the signal is dropped when the pool's stop grace runs out.
    fn run(&self, job: &mut Job) -> impl Future<Output = Result<Outcome, TaskError>> + Send;
}

/// [`Task`] with its future boxed, so tasks of different types fit in one
/// registry.
pub(crate) trait DynTask: Send + Sync + 'static {
    fn kind(&self) -> &'static str;
    fn versions(&self) -> Vec<String>;
    fn run_boxed<'a>(&'a self, job: &'a mut Job) -> BoxFuture<'a, Result<Outcome, TaskError>>;
}

impl<T: Task> DynTask for T {
    fn kind(&self) -> &'static str {
        Task::kind(self)
    }

    fn versions(&self) -> Vec<String> {
        Task::versions(self)
    }

    fn run_boxed<'a>(&'a self, job: &'a mut Job) -> BoxFuture<'a, Result<Outcome, TaskError>> {
        Box::pin(self.run(job))
    }
}

/// What a task produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The output, recorded with the completed revision.
    Output(Value),
    /// It ran and found nothing to produce (an optional output, e.g. no
    /// lyrics exist): `no_result`, which creates no review entry.
    NoResult { reason: String },
}

impl Outcome {
    pub fn output(output: Value) -> Self {
        Outcome::Output(output)
    }

    pub fn no_result(reason: impl Into<String>) -> Self {
        Outcome::NoResult { reason: reason.into() }
    }

    pub(crate) fn into_completion(self) -> Completion {
        match self {
            Outcome::Output(output) => Completion::Output(output),
            Outcome::NoResult { reason } => Completion::NoResult { reason },
        }
    }
}

/// How a task failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TaskError {
    /// Worth another attempt (I/O trouble, a busy service): retried with
    /// backoff while the kind's attempts last.
    #[error("{0}")]
    Retryable(String),
    /// Another attempt would fail the same way (a corrupt file, an
    /// unsupported format): final at once, and goes to review.
    #[error("{0}")]
    Terminal(String),
    /// The task stopped because its job told it to (a cancel request or a
    /// lost claim). Returned without such a signal it counts as a retryable
    /// failure.
    #[error("stopped: {0}")]
    Stopped(StopReason),
}

impl TaskError {
    pub fn retryable(message: impl Into<String>) -> Self {
        TaskError::Retryable(message.into())
    }

    pub fn terminal(message: impl Into<String>) -> Self {
        TaskError::Terminal(message.into())
    }
}

/// A job helper's error as a task error: a stop signal stays a stop; a
/// refused input (a bug in the task) is terminal; I/O and storage trouble is
/// retryable.
impl From<JobError> for TaskError {
    fn from(error: JobError) -> Self {
        match error {
            JobError::Cancelled => TaskError::Stopped(StopReason::CancelRequested),
            JobError::ClaimLost(reason) => TaskError::Stopped(StopReason::ClaimLost(reason)),
            JobError::Invalid(message) => TaskError::Terminal(message),
            JobError::Engine(error @ EngineError::Domain(_)) => TaskError::Terminal(error.to_string()),
            other => TaskError::Retryable(other.to_string()),
        }
    }
}

/// I/O errors are retryable unless the task says otherwise.
impl From<std::io::Error> for TaskError {
    fn from(error: std::io::Error) -> Self {
        TaskError::Retryable(error.to_string())
    }
}
