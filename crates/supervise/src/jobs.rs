//! Export jobs as their callers see them: register one (refused when no
//! supervisor is alive), read where it stands, ask it to stop, find its
//! file; and the sweep of files no job needs any more, which every
//! registration and every supervisor's patrol runs. A job is an operation of kind [`EXPORT_KIND`]: its status, phases,
//! final counts and outcome are events on its timeline; its heartbeat and
//! running counters are liveness in the artifact directory (`live`).

use crate::dir::ArtifactDir;
use crate::export::{ExportSpec, Format, What};
use crate::live::{fresh, live_supervisors, read_job};
use crate::locks::FileLock;
use crate::token::Secret;
use crate::{Limits, SuperviseError, EXPORT_KIND};
use opledger_domain::decide::OperationCommand;
use opledger_domain::events::{Event, OperationTarget};
use opledger_domain::projections::OperationRow;
use opledger_domain::{BatchId, Cause, OperationId, OperationStatus, Timestamp};
use opledger_engine::{CommandContext, Engine, EngineError, NewOperation};
use opledger_store::{Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;

/// What a caller asks to export.
#[derive(Debug, Clone)]
pub struct ExportRequest {
    pub what: What,
    pub format: Format,
    pub batch: Option<BatchId>,
    /// An earlier position than the log's head to export at (None: the
    /// head).
    pub as_of_seq: Option<i64>,
    /// Who asks: the job's token is theirs alone.
    pub principal: String,
    /// The access-policy revision in force.
    pub policy: String,
}

/// A registered job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Registered {
    pub job_token: String,
    pub operation_id: OperationId,
    pub as_of_seq: i64,
}

/// A finished artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    pub size: u64,
    pub sha256: String,
    pub expires_at: Timestamp,
    /// The file's name in the artifact directory's `files/`.
    pub file: String,
}

/// What a succeeded job records as its output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportOutput {
    pub artifact: Artifact,
    pub processed: u64,
    pub total: u64,
    pub regular_rows: u64,
    pub logical_count_unit: String,
}

/// Where a job stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExportStatus {
    pub operation_id: OperationId,
    pub status: OperationStatus,
    pub phase: Option<String>,
    pub processed: Option<u64>,
    /// None while aggregating (not known yet).
    pub total: Option<u64>,
    pub logical_count_unit: &'static str,
    pub regular_rows: Option<u64>,
    /// The supervisor's last heartbeat of the job (while it runs).
    pub heartbeat_at: Option<Timestamp>,
    /// The last progress written.
    pub updated_at: Timestamp,
    pub as_of_seq: i64,
    pub what: What,
    pub format: Format,
    pub cancel_requested: bool,
    /// Why it failed or was cancelled.
    pub reason: Option<String>,
    /// The file, while it is kept.
    pub artifact: Option<Artifact>,
    /// The artifact existed and expired.
    pub expired: bool,
}

fn unavailable(message: impl Into<String>) -> SuperviseError {
    SuperviseError::Engine(EngineError::Store(StoreError::unavailable(message.into())))
}

/// Registers an export, pinned at the log's head (or an earlier position
/// asked for). Refused when no supervisor is alive: nothing would run it.
pub async fn create_export<S: Store>(
    engine: &Engine<S>,
    dir: &ArtifactDir,
    limits: &Limits,
    context: &CommandContext,
    request: ExportRequest,
) -> Result<Registered, SuperviseError> {
    match (request.what, request.batch) {
        (What::BatchItems, None) => return Err(EngineError::invalid("a batch_items export needs a batch").into()),
        (What::Operations | What::CapabilityCounts, Some(_)) => {
            return Err(EngineError::invalid("only a batch_items export takes a batch").into())
        }
        _ => {}
    }
    sweep_files(engine, dir, limits).await;
    if live_supervisors(dir, engine.now(), limits.staleness)?.is_empty() {
        return Err(unavailable(format!(
            "no supervisor is running for the artifact directory {}: start `opledger supervise` first",
            dir.root().display()
        )));
    }
    let head = engine.store().head().await.map_err(EngineError::Store)?;
    let as_of_seq = match request.as_of_seq {
        None => head,
        Some(seq) if (0..=head).contains(&seq) => seq,
        Some(seq) => {
            return Err(EngineError::invalid(format!(
                "as_of_seq {seq} is not a position of the log (0 to its head, {head})"
            ))
            .into())
        }
    };
    let secret = Secret::load(dir)?;
    let spec = ExportSpec {
        what: request.what,
        format: request.format,
        batch: request.batch,
        as_of_seq,
        principal: request.principal.clone(),
        policy: request.policy.clone(),
    };
    let operation_id = engine
        .create_operation(
            context,
            NewOperation {
                kind: EXPORT_KIND.to_string(),
                target: OperationTarget::default(),
                revision: None,
                inputs: serde_json::to_value(&spec).expect("a spec serializes"),
                status: OperationStatus::Queued,
                priority: 0,
            },
        )
        .await?;
    Ok(Registered {
        job_token: secret.sign(operation_id, &request.principal, &request.policy),
        operation_id,
        as_of_seq,
    })
}

/// The job a token names, when it is `principal`'s under `policy`, with
/// its operation row and spec.
pub async fn job_of<S: Store>(
    engine: &Engine<S>,
    dir: &ArtifactDir,
    token: &str,
    principal: &str,
    policy: &str,
) -> Result<(OperationRow, ExportSpec), SuperviseError> {
    let job = Secret::load(dir)?.verify(token, principal, policy)?;
    let row = engine.operation(job).await?;
    let spec = spec_of(&row)?;
    // The signature binds both already; the spec recorded at registration
    // says so again, so a job made under another principal or policy is
    // never served even with a key that signed for both.
    if spec.principal != principal || spec.policy != policy {
        return Err(SuperviseError::Token(format!(
            "job token {} is not valid here",
            opledger_domain::quoted(token)
        )));
    }
    Ok((row, spec))
}

/// The spec an export operation recorded.
pub fn spec_of(row: &OperationRow) -> Result<ExportSpec, SuperviseError> {
    if row.kind != EXPORT_KIND {
        return Err(EngineError::not_found("export", row.operation_id).into());
    }
    serde_json::from_str(&row.inputs).map_err(|error| {
        EngineError::invalid(format!(
            "export {} records no spec this build reads: {error}",
            row.operation_id
        ))
        .into()
    })
}

/// The output a succeeded export recorded.
pub async fn output_of<S: Store>(engine: &Engine<S>, job: OperationId) -> Result<Option<ExportOutput>, SuperviseError> {
    let events = engine.timeline(job).await?;
    Ok(events.iter().rev().find_map(|envelope| match &envelope.event {
        Event::OperationSucceeded(succeeded) => serde_json::from_value(succeeded.output.clone()).ok(),
        _ => None,
    }))
}

/// Where the job a token names stands.
pub async fn export_status<S: Store>(
    engine: &Engine<S>,
    dir: &ArtifactDir,
    token: &str,
    principal: &str,
    policy: &str,
) -> Result<ExportStatus, SuperviseError> {
    let (row, spec) = job_of(engine, dir, token, principal, policy).await?;
    status_of(engine, dir, &row, &spec).await
}

/// Where a job stands: the log's record, with the supervisor's liveness
/// while it runs.
pub async fn status_of<S: Store>(
    engine: &Engine<S>,
    dir: &ArtifactDir,
    row: &OperationRow,
    spec: &ExportSpec,
) -> Result<ExportStatus, SuperviseError> {
    let counted = |value: Option<i64>| value.and_then(|value| u64::try_from(value).ok());
    let mut status = ExportStatus {
        operation_id: row.operation_id,
        status: row.status,
        phase: row.phase.clone(),
        processed: counted(row.processed),
        total: counted(row.total),
        logical_count_unit: spec.count_unit(),
        regular_rows: None,
        heartbeat_at: None,
        updated_at: row.updated_at,
        as_of_seq: spec.as_of_seq,
        what: spec.what,
        format: spec.format,
        cancel_requested: row.cancel_requested,
        reason: match row.status {
            OperationStatus::FailedTerminal => row.last_error.clone(),
            OperationStatus::Cancelled => row.status_reason.clone(),
            _ => None,
        },
        artifact: None,
        expired: false,
    };
    if row.status.is_claimed() {
        if let Some(live) = read_job(dir, row.operation_id) {
            status.phase = Some(live.phase);
            status.processed = Some(live.processed);
            status.total = live.total;
            status.regular_rows = live.regular_rows;
            status.heartbeat_at = Some(live.heartbeat_at);
            status.updated_at = live.updated_at;
        }
    }
    if row.status == OperationStatus::Succeeded {
        if let Some(output) = output_of(engine, row.operation_id).await? {
            status.regular_rows = Some(output.regular_rows);
            status.processed = Some(output.processed);
            status.total = Some(output.total);
            if output.artifact.expires_at <= engine.now() || !dir.files_dir().join(&output.artifact.file).exists() {
                status.expired = true;
            } else {
                status.artifact = Some(output.artifact);
            }
        }
    }
    Ok(status)
}

/// Asks the job a token names to stop: at once when it waits in the
/// queue; a running job's cancel is recorded now (durable) and becomes
/// `cancelled` once its supervisor has stopped the child and removed its
/// files.
pub async fn cancel_export<S: Store>(
    engine: &Engine<S>,
    dir: &ArtifactDir,
    context: &CommandContext,
    token: &str,
    principal: &str,
    policy: &str,
) -> Result<OperationStatus, SuperviseError> {
    let (row, _) = job_of(engine, dir, token, principal, policy).await?;
    let command = if row.status.is_claimed() {
        OperationCommand::RequestCancel {
            reason: "cancelled".to_string(),
        }
    } else {
        OperationCommand::Transition {
            cause: Cause::Cancel,
            reason: "cancelled".to_string(),
        }
    };
    engine.operation_command(context, row.operation_id, command).await?;
    Ok(engine.operation(row.operation_id).await?.status)
}

/// The file of a succeeded job that has not expired.
pub async fn artifact_path<S: Store>(
    engine: &Engine<S>,
    dir: &ArtifactDir,
    token: &str,
    principal: &str,
    policy: &str,
) -> Result<(PathBuf, Artifact), SuperviseError> {
    let (row, spec) = job_of(engine, dir, token, principal, policy).await?;
    let status = status_of(engine, dir, &row, &spec).await?;
    match status.artifact {
        Some(artifact) => Ok((dir.files_dir().join(&artifact.file), artifact)),
        None if status.expired => Err(SuperviseError::Gone(format!(
            "the artifact of export {} expired",
            row.operation_id
        ))),
        None => Err(EngineError::Domain(opledger_domain::DomainError::Conflict(format!(
            "export {} is {}, not succeeded: it has no file",
            row.operation_id, row.status
        )))
        .into()),
    }
}

/// Whether an artifact being handed out may still be: its job is still
/// succeeded with no cancel asked for, and the artifact has not expired.
/// A service asks before every chunk it sends.
pub async fn still_servable<S: Store>(
    engine: &Engine<S>,
    job: OperationId,
    artifact: &Artifact,
) -> Result<(), SuperviseError> {
    if artifact.expires_at <= engine.now() {
        return Err(SuperviseError::Gone(format!("the artifact of export {job} expired")));
    }
    let row = engine.operation(job).await?;
    if row.status != OperationStatus::Succeeded || row.cancel_requested {
        return Err(SuperviseError::Gone(format!(
            "export {job} is {}{}: its artifact is no longer served",
            row.status,
            if row.cancel_requested {
                " with a cancel asked for"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// The JSON output a success records.
pub(crate) fn output_value(output: &ExportOutput) -> Value {
    serde_json::to_value(output).expect("an output serializes")
}

/// Removes expired artifacts and temporary files whose job's execution
/// lock nobody holds. Run by every supervisor on its patrol and at every
/// registration.
///
/// An artifact expires at the time its job recorded (`expires_at`), never
/// by this sweeper's own expiry limit: supervisors started with different
/// limits share one directory. Only a file no succeeded job records (its
/// job failed after writing it, or it is not a job's) is judged by its
/// age against this sweeper's limit.
pub async fn sweep_files<S: Store>(engine: &Engine<S>, dir: &ArtifactDir, limits: &Limits) {
    let now = engine.now();
    if let Ok(entries) = std::fs::read_dir(dir.files_dir()) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let job = name.split('.').next().and_then(|stem| stem.parse::<OperationId>().ok());
            let recorded = match job {
                Some(job) => match output_of(engine, job).await {
                    Ok(output) => output.filter(|output| output.artifact.file == name),
                    // Its record cannot be read now: the next sweep decides.
                    Err(_) => continue,
                },
                None => None,
            };
            let expired = match recorded {
                Some(output) => output.artifact.expires_at <= now,
                // A file's age is its modification time against the
                // engine's clock: it was renamed into `files/` when its
                // job succeeded.
                None => entry
                    .metadata()
                    .and_then(|metadata| metadata.modified())
                    .ok()
                    .and_then(|modified| modified.duration_since(std::time::UNIX_EPOCH).ok())
                    .and_then(|since| i64::try_from(since.as_micros()).ok())
                    .is_some_and(|written| !fresh(Timestamp::from_micros(written), now, limits.expiry)),
            };
            if expired {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir.tmp_dir()) {
        for entry in entries.flatten() {
            let path = entry.path();
            let job = path
                .file_stem()
                .and_then(|stem| stem.to_str())
                .and_then(|stem| stem.parse::<OperationId>().ok());
            let Some(job) = job else { continue };
            if let Ok(Some(_lock)) = FileLock::try_take(&dir.job_lock(job)) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}
