//! What this installation can run, and the work that waited for it.
//!
//! A task that needs what the installation lacks (ffmpeg for a video's
//! kinds, HEIF decoding for a HEIC photo's) is requested `blocked` with the
//! reason, and its file settles without it. Once the run has what it
//! lacked (ffmpeg installed since, a build with the `heif` feature), the
//! run retries those tasks of its folder's files from the review queue, as
//! a person would (`review resolve --action retry`, one recorded action
//! each, with why), and waits for them like for its files' own tasks: the
//! unchanged file gets the work it could not have before.

use crate::review::open_entries_under;
use crate::{IngestError, StopSignal};
use opledger_domain::review::{ReasonCode, ReviewAction};
use opledger_domain::{OperationId, OperationStatus};
use opledger_engine::{CommandContext, Engine, EngineError};
use opledger_media::{NO_FFMPEG, NO_HEIF_SUPPORT};
use opledger_store::Store;
use std::path::Path;
use std::time::Duration;
use tokio::sync::watch;

/// What this installation can run: a file whose kinds need what it lacks
/// has them requested blocked, with why, instead of failing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tools {
    /// `ffprobe` and `ffmpeg` are installed (video kinds).
    pub ffmpeg: bool,
    /// The build decodes HEIF and AVIF (`opledger_media::HEIF_SUPPORT`).
    pub heif: bool,
}

impl Tools {
    /// The block reasons this installation has the answer to, each with
    /// what a retry records.
    fn answers(self) -> Vec<(&'static str, &'static str)> {
        let mut answers = Vec::new();
        if self.ffmpeg {
            answers.push((NO_FFMPEG, "ffmpeg is installed now"));
        }
        if self.heif {
            answers.push((NO_HEIF_SUPPORT, "this build decodes HEIF"));
        }
        answers
    }
}

/// Retries the open `blocked` review entries of files under `root` whose
/// reason this installation answers; returns their operations. An entry
/// that cannot be retried when its turn comes (resolved meanwhile) is
/// passed over.
pub(crate) async fn retry_what_now_runs<S: Store>(
    engine: &Engine<S>,
    context: &CommandContext,
    root: &Path,
    tools: Tools,
) -> Result<Vec<OperationId>, IngestError> {
    let answers = tools.answers();
    if answers.is_empty() {
        return Ok(Vec::new());
    }
    let mut retried = Vec::new();
    for (entry, path) in open_entries_under(engine, root).await? {
        if entry.reason_code != ReasonCode::Blocked.as_str() {
            continue;
        }
        let Some((_, why)) = answers
            .iter()
            .find(|(reason, _)| entry.detail.as_deref() == Some(*reason))
        else {
            continue;
        };
        match engine
            .resolve_review(context, entry.entry_id, ReviewAction::Retry, None, why)
            .await
        {
            Ok(_) => retried.push(entry.operation_id),
            Err(EngineError::Domain(refused)) => {
                tracing::warn!(entry = entry.entry_id, %path, %refused, "a blocked task could not be retried");
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(retried)
}

/// Waits until none of `operations` is queued or held: each ran, or waits
/// for a retry (its backoff is the next run's business), or stopped for
/// another reason. False when a stop was asked for first, or the workers
/// ended (they gave up on storage trouble).
pub(crate) async fn wait_for<S: Store>(
    engine: &Engine<S>,
    operations: &[OperationId],
    stop: &StopSignal,
    workers_ended: &mut watch::Receiver<bool>,
) -> Result<bool, IngestError> {
    let mut waiting: Vec<OperationId> = operations.to_vec();
    while !waiting.is_empty() {
        if stop.is_requested() || *workers_ended.borrow() {
            return Ok(false);
        }
        let mut still = Vec::new();
        for operation in waiting {
            let status = engine.operation(operation).await?.status;
            if matches!(
                status,
                OperationStatus::Queued | OperationStatus::Leased | OperationStatus::Running
            ) {
                still.push(operation);
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
                () = stop.requested() => {}
                _ = workers_ended.changed() => {}
            }
        }
    }
    Ok(true)
}
