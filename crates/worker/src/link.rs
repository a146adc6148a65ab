//! The engine as a job sees it: the fenced calls a running task's claim
//! makes while it is held (heartbeat, progress, is it still standing),
//! behind an object-safe trait, [`JobLink`], so that [`crate::Job`] and
//! [`crate::Task`] are not generic over the store.

use futures::future::BoxFuture;
use opledger_domain::{DomainError, Timestamp};
use opledger_engine::{CommandContext, Engine, EngineError, Fence, HeartbeatOutcome, LeaseMs, Progress};
use opledger_store::{ErrorKind, Store};

/// A running job's link to the engine, for its one claim.
pub(crate) trait JobLink: Send + Sync + 'static {
    /// A fenced heartbeat that extends the lease to `now + lease`.
    fn heartbeat<'a>(
        &'a self,
        fence: &'a Fence,
        lease: LeaseMs,
    ) -> BoxFuture<'a, Result<HeartbeatOutcome, EngineError>>;

    fn progress<'a>(
        &'a self,
        context: &'a CommandContext,
        fence: &'a Fence,
        progress: Progress,
    ) -> BoxFuture<'a, Result<(), EngineError>>;

    /// Whether the claim still holds its task, read without writing, and
    /// the time as of the answer by the clock leases are decided by
    /// ([`Engine::read_time`]: the server's on PostgreSQL, so a host whose
    /// clock is behind does not see a lease as longer than it is).
    fn claim_standing<'a>(
        &'a self,
        fence: &'a Fence,
    ) -> BoxFuture<'a, Result<(HeartbeatOutcome, Timestamp), EngineError>>;
}

impl<S: Store> JobLink for Engine<S> {
    fn heartbeat<'a>(
        &'a self,
        fence: &'a Fence,
        lease: LeaseMs,
    ) -> BoxFuture<'a, Result<HeartbeatOutcome, EngineError>> {
        Box::pin(Engine::heartbeat(self, fence, Some(lease.millis())))
    }

    fn progress<'a>(
        &'a self,
        context: &'a CommandContext,
        fence: &'a Fence,
        progress: Progress,
    ) -> BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(self.report_progress(context, fence, progress))
    }

    fn claim_standing<'a>(
        &'a self,
        fence: &'a Fence,
    ) -> BoxFuture<'a, Result<(HeartbeatOutcome, Timestamp), EngineError>> {
        Box::pin(async move {
            let standing = Engine::claim_standing(self, fence).await?;
            Ok((standing, self.read_time().await?))
        })
    }
}

/// The fence refused the report: the claim no longer holds the task
/// (recovery interrupted it, it finished, or another claim has it).
pub(crate) fn is_claim_lost(error: &EngineError) -> bool {
    matches!(error, EngineError::Domain(DomainError::Conflict(_)))
}

/// Storage trouble that may pass: worth trying again later.
pub(crate) fn is_transient(error: &EngineError) -> bool {
    error.is_store(ErrorKind::Unavailable) || error.is_store(ErrorKind::Conflict)
}
