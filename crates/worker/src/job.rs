//! What a running task sees: its claim, throttled progress, the
//! cancellation signal, and fenced file outputs.

use crate::files;
use crate::link::{is_claim_lost, is_transient, JobLink};
use opledger_domain::{MediaId, OperationId, RegionId};
use opledger_engine::{CommandContext, EngineError, Fence, LeaseMs, Progress, TaskClaim};
use serde_json::Value;
use std::ffi::OsString;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often, at most, a job sends progress counters within one phase.
/// A phase change is sent at once; the last counters are sent before the
/// outcome is reported, so the final count is always on the timeline.
pub const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// Why a job was told to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// Someone asked for the task to be cancelled. Stop; the runtime
    /// removes the job's temporary outputs and then records `cancelled`.
    CancelRequested,
    /// The claim no longer holds the task (recovery interrupted it after
    /// its lease expired; another worker may be running it now). Stop;
    /// nothing this job does will be recorded or renamed into place.
    ClaimLost(String),
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::CancelRequested => f.write_str("cancellation was requested"),
            StopReason::ClaimLost(reason) => write!(f, "the claim was lost ({reason})"),
        }
    }
}

/// What a job helper can fail with.
#[derive(Debug, Error)]
pub enum JobError {
    /// Cancellation was requested: stop and return.
    #[error("cancellation was requested: stop and return")]
    Cancelled,
    /// The claim no longer holds the task: the report or rename was refused.
    #[error("the claim was lost: {0}")]
    ClaimLost(String),
    /// The task asked for something that cannot be done (a bug in it).
    #[error("{0}")]
    Invalid(String),
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The engine refused or storage failed.
    #[error(transparent)]
    Engine(EngineError),
}

impl JobError {
    /// The stop signal this error carries, if it is one.
    pub fn stop_reason(&self) -> Option<StopReason> {
        match self {
            JobError::Cancelled => Some(StopReason::CancelRequested),
            JobError::ClaimLost(reason) => Some(StopReason::ClaimLost(reason.clone())),
            _ => None,
        }
    }

    pub fn is_claim_lost(&self) -> bool {
        matches!(self, JobError::ClaimLost(_))
    }
}

impl From<StopReason> for JobError {
    fn from(reason: StopReason) -> Self {
        match reason {
            StopReason::CancelRequested => JobError::Cancelled,
            StopReason::ClaimLost(reason) => JobError::ClaimLost(reason),
        }
    }
}

/// The stop signal: set once (a lost claim may replace a cancel request,
/// never the other way round), watched by the job and the runtime.
pub(crate) type StopSender = Arc<watch::Sender<Option<StopReason>>>;

/// Whether a job was told to stop, readable from any thread
/// ([`Job::stop_signal`]).
#[derive(Debug, Clone)]
pub struct StopSignal {
    stop: watch::Receiver<Option<StopReason>>,
}

impl StopSignal {
    /// `Err` once the job was told to stop, like [`Job::checkpoint`].
    pub fn checkpoint(&self) -> Result<(), JobError> {
        match self.stop.borrow().clone() {
            Some(reason) => Err(reason.into()),
            None => Ok(()),
        }
    }
}

pub(crate) fn trip(stop: &watch::Sender<Option<StopReason>>, reason: StopReason) {
    stop.send_if_modified(move |current| {
        let replace = matches!(
            (current.as_ref(), &reason),
            (None, _) | (Some(StopReason::CancelRequested), StopReason::ClaimLost(_))
        );
        if replace {
            *current = Some(reason);
        }
        replace
    });
}

/// Progress as sent and as held back by the throttle.
struct ProgressState {
    interval: Duration,
    sent_at: Option<Instant>,
    /// The phase the engine last accepted.
    phase: Option<String>,
    /// The latest counters not sent yet.
    unsent: Option<Progress>,
    /// After a failed send, nothing is sent before this.
    retry_at: Option<Instant>,
    reports: u64,
}

/// One claimed task as its [`crate::Task`] sees it.
pub struct Job {
    claim: TaskClaim,
    fence: Fence,
    context: CommandContext,
    lease: LeaseMs,
    link: Arc<dyn JobLink>,
    stop_tx: StopSender,
    stop_rx: watch::Receiver<Option<StopReason>>,
    progress: ProgressState,
    temporary: Vec<PathBuf>,
    /// A share of a limited resource (a CPU permit) the task handed over
    /// with [`Job::hold_compute_share`]; given back when outputs are
    /// committed.
    compute_share: Option<Box<dyn Send + Sync>>,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("claim", &self.claim)
            .field("actor", &self.context.actor)
            .field("stop", &*self.stop_rx.borrow())
            .field("temporary", &self.temporary)
            .finish_non_exhaustive()
    }
}

impl Job {
    pub(crate) fn new(
        claim: TaskClaim,
        context: CommandContext,
        lease: LeaseMs,
        link: Arc<dyn JobLink>,
        stop_tx: StopSender,
        progress_interval: Duration,
    ) -> Self {
        let stop_rx = stop_tx.subscribe();
        Job {
            fence: claim.fence(),
            claim,
            context,
            lease,
            link,
            stop_tx,
            stop_rx,
            progress: ProgressState {
                interval: progress_interval,
                sent_at: None,
                phase: None,
                unsent: None,
                retry_at: None,
                reports: 0,
            },
            temporary: Vec::new(),
            compute_share: None,
        }
    }

    /// Hands the job a share of a limited resource the task holds while
    /// it computes — typically a semaphore permit that bounds how many
    /// tasks use the CPU at once. The job gives it back (drops it) when the
    /// task starts committing an output, whose flush, fenced heartbeat and
    /// rename wait on the disk, so another task can compute meanwhile.
    pub fn hold_compute_share(&mut self, share: impl Send + Sync + 'static) {
        self.compute_share = Some(Box::new(share));
    }

    /// Gives back the share handed over with [`Job::hold_compute_share`],
    /// if the job still holds it.
    pub fn release_compute_share(&mut self) {
        self.compute_share = None;
    }

    /// The claim: inputs, revision, target ids, attempt, token, lease.
    pub fn claim(&self) -> &TaskClaim {
        &self.claim
    }

    /// The complete inputs of the claimed revision (what the revision hashes).
    pub fn inputs(&self) -> &Value {
        &self.claim.inputs
    }

    /// The revision this claim runs; outputs belong to it.
    pub fn revision(&self) -> &str {
        &self.claim.revision
    }

    pub fn operation_id(&self) -> OperationId {
        self.claim.operation_id
    }

    pub fn media_id(&self) -> Option<MediaId> {
        self.claim.media_id
    }

    pub fn region_id(&self) -> Option<RegionId> {
        self.claim.region_id
    }

    pub fn kind(&self) -> &str {
        &self.claim.task_kind
    }

    /// 1 for the first claim of this revision.
    pub fn attempt(&self) -> i64 {
        self.claim.attempt
    }

    /// Who the job's reports are recorded as (`pool/slot`).
    pub fn actor(&self) -> &str {
        &self.context.actor
    }

    /// Whether the job was told to stop: cancellation was requested, or the
    /// claim was lost. Cheap; call it at checkpoints.
    pub fn is_cancelled(&self) -> bool {
        self.stop_rx.borrow().is_some()
    }

    /// Why the job was told to stop, if it was.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop_rx.borrow().clone()
    }

    /// `Err` once the job was told to stop: `job.checkpoint()?` in a loop.
    pub fn checkpoint(&self) -> Result<(), JobError> {
        match self.stop_reason() {
            Some(reason) => Err(reason.into()),
            None => Ok(()),
        }
    }

    /// Resolves when the job is told to stop. It borrows nothing from the
    /// job, so a task can select on it while it works on the job.
    pub fn cancelled(&self) -> impl Future<Output = StopReason> + Send + 'static {
        let mut stop = self.stop_rx.clone();
        async move {
            let reason = stop
                .wait_for(Option::is_some)
                .await
                .ok()
                .and_then(|reason| reason.clone());
            match reason {
                Some(reason) => reason,
                // The runtime dropped the signal: the job is over and
                // nothing will trip it any more.
                None => std::future::pending().await,
            }
        }
    }

    /// A handle that blocking work (on another thread, where the job
    /// cannot go) checks to learn that the job was told to stop, for
    /// example just before it writes a temporary output the runtime may
    /// already have cleaned up.
    pub fn stop_signal(&self) -> StopSignal {
        StopSignal {
            stop: self.stop_rx.clone(),
        }
    }

    /// Reports progress: real units done in this phase, and the total when
    /// known (`None`: indeterminate). Throttled: a new phase is sent at
    /// once (it is an event on the timeline); counters within a phase at
    /// most every [`PROGRESS_INTERVAL`]; whatever is held back is sent
    /// before the outcome, so the final count is recorded. Storage trouble
    /// is logged and retried later, never returned: progress is not worth
    /// failing a job over. A lost claim is returned (stop).
    pub async fn progress(&mut self, phase: &str, processed: i64, total: Option<i64>) -> Result<(), JobError> {
        if phase.trim().is_empty() {
            return Err(JobError::Invalid("progress needs a phase".into()));
        }
        if processed < 0 || total.is_some_and(|total| total < 0) {
            return Err(JobError::Invalid("progress counts cannot be negative".into()));
        }
        if let Some(total) = total {
            if processed > total {
                return Err(JobError::Invalid(format!(
                    "processed ({processed}) cannot exceed total ({total})"
                )));
            }
        }
        if let Some(StopReason::ClaimLost(reason)) = self.stop_reason() {
            return Err(JobError::ClaimLost(reason));
        }
        let progress = Progress {
            phase: phase.to_string(),
            processed,
            total,
        };
        let now = Instant::now();
        let state = &self.progress;
        let backing_off = state.retry_at.is_some_and(|at| now < at);
        let new_phase = state.phase.as_deref() != Some(phase);
        let due = state.sent_at.is_none_or(|at| now.duration_since(at) >= state.interval);
        if backing_off || !(new_phase || due) {
            self.progress.unsent = Some(progress);
            return Ok(());
        }
        self.send_progress(progress).await
    }

    async fn send_progress(&mut self, progress: Progress) -> Result<(), JobError> {
        let sent = self.link.progress(&self.context, &self.fence, progress.clone()).await;
        let now = Instant::now();
        match sent {
            Ok(()) => {
                let state = &mut self.progress;
                state.phase = Some(progress.phase);
                state.sent_at = Some(now);
                state.unsent = None;
                state.retry_at = None;
                state.reports += 1;
                Ok(())
            }
            Err(error) if is_claim_lost(&error) => {
                let reason = error.to_string();
                trip(&self.stop_tx, StopReason::ClaimLost(reason.clone()));
                Err(JobError::ClaimLost(reason))
            }
            Err(error) if is_transient(&error) => {
                tracing::warn!(%error, "progress not recorded; will send it again later");
                self.progress.unsent = Some(progress);
                self.progress.retry_at = Some(now + self.progress.interval);
                Ok(())
            }
            Err(error) => Err(JobError::Engine(error)),
        }
    }

    /// Sends counters the throttle held back (before the outcome is
    /// reported, so the engine records the final count).
    pub(crate) async fn flush_progress(&mut self) {
        if let Some(progress) = self.progress.unsent.take() {
            if let Err(error) = self.send_progress(progress).await {
                tracing::warn!(%error, "final progress not recorded");
            }
        }
    }

    pub(crate) fn progress_reports(&self) -> u64 {
        self.progress.reports
    }

    /// The temporary path to write an output to before it is committed to
    /// `final_path`: beside it (same filesystem, so the rename is atomic),
    /// hidden, and specific to this revision and claim:
    /// `.{file}.{revision[..16]}.{claim_token}.tmp`. Two claims never write
    /// the same temporary file. The job remembers it and removes it if the
    /// task fails, is cancelled or loses its claim without committing it.
    pub fn output_path_for(&mut self, final_path: &Path) -> Result<PathBuf, JobError> {
        let Some(file_name) = final_path.file_name() else {
            return Err(JobError::Invalid(format!(
                "output path {} does not name a file",
                final_path.display()
            )));
        };
        let revision: String = self
            .claim
            .revision
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(16)
            .collect();
        let mut name = OsString::from(".");
        name.push(file_name);
        name.push(format!(".{revision}.{}.tmp", self.claim.claim_token));
        let temporary = final_path.with_file_name(name);
        if !self.temporary.contains(&temporary) {
            self.temporary.push(temporary.clone());
        }
        Ok(temporary)
    }

    /// The temporary outputs this job made and has not committed.
    pub fn temporary_outputs(&self) -> &[PathBuf] {
        &self.temporary
    }

    /// Commits a finished temporary output: flushes it to disk, checks that
    /// the claim still holds the task (a read while more than half the
    /// lease is left, else a fenced heartbeat, which also extends the lease
    /// by the pool's lease length, so recovery cannot take the task in the
    /// moment before the rename), then atomically
    /// renames it to `final_path`. If the claim was lost or cancellation was
    /// requested, the temporary file is removed, nothing is renamed, and
    /// the error says why: an old claim never overwrites a newer output.
    pub async fn commit_output(&mut self, temporary: &Path, final_path: &Path) -> Result<(), JobError> {
        if temporary == final_path {
            return Err(JobError::Invalid(format!(
                "an output is written to a temporary path first, not to its final path {}",
                final_path.display()
            )));
        }
        // From here on the job waits on the disk, not the CPU.
        self.release_compute_share();
        if let Some(reason) = self.stop_reason() {
            self.discard(temporary).await;
            return Err(reason.into());
        }
        let path = temporary.to_path_buf();
        files::blocking(move || files::sync_file(&path))
            .await
            .map_err(|source| JobError::Io {
                action: "flushing",
                path: temporary.to_path_buf(),
                source,
            })?;
        // A read says whether the claim still holds the task; while more
        // than half its lease is left, recovery (which takes expired leases
        // only) cannot take it before the rename, and no write is needed.
        // Near expiry, or when the read fails, a fenced heartbeat both
        // checks and extends the lease.
        let half_lease_us = self.lease.millis().saturating_mul(500);
        let standing = match self.link.claim_standing(&self.fence).await {
            Ok((beat, now))
                if beat.cancel_requested
                    || beat.lease_expires_at.as_micros().saturating_sub(now.as_micros()) > half_lease_us =>
            {
                Ok(beat)
            }
            Err(error) if is_claim_lost(&error) => Err(error),
            _ => self.link.heartbeat(&self.fence, self.lease).await,
        };
        match standing {
            Ok(beat) if beat.cancel_requested => {
                trip(&self.stop_tx, StopReason::CancelRequested);
                self.discard(temporary).await;
                return Err(JobError::Cancelled);
            }
            Ok(_) => {}
            Err(error) if is_claim_lost(&error) => {
                let reason = error.to_string();
                trip(&self.stop_tx, StopReason::ClaimLost(reason.clone()));
                self.discard(temporary).await;
                tracing::warn!(
                    temporary = %temporary.display(),
                    final_path = %final_path.display(),
                    "claim lost: output discarded instead of renamed into place"
                );
                return Err(JobError::ClaimLost(reason));
            }
            // The claim may still hold: keep the file; the task may try
            // again or fail (and the runtime removes it then).
            Err(error) => return Err(JobError::Engine(error)),
        }
        let (from, to) = (temporary.to_path_buf(), final_path.to_path_buf());
        files::blocking(move || files::rename_into_place(&from, &to))
            .await
            .map_err(|source| JobError::Io {
                action: "renaming into place",
                path: temporary.to_path_buf(),
                source,
            })?;
        self.temporary.retain(|path| path != temporary);
        Ok(())
    }

    async fn discard(&mut self, temporary: &Path) {
        let paths = vec![temporary.to_path_buf()];
        let _ = files::blocking(move || Ok(files::remove_all(&paths))).await;
        self.temporary.retain(|path| path != temporary);
    }

    /// Removes every temporary output not committed; returns how many
    /// files were there.
    pub(crate) async fn remove_temporary_outputs(&mut self) -> usize {
        let paths = std::mem::take(&mut self.temporary);
        if paths.is_empty() {
            return 0;
        }
        files::blocking(move || Ok(files::remove_all(&paths)))
            .await
            .unwrap_or(0)
    }
}
