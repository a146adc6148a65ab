//! Deciding file ingestions (`ingestion.file` operations): their creation,
//! claim and stages, the registration of what they found, how they end,
//! and files confirmed gone. Each decision is a [`Chain`] of
//! [`decide_operation`] steps applied in sequence to a copy of the
//! operation's row, so a command that moves a file through several stages
//! records every stage as its own event and checks each against the
//! transition table. The engine loads the rows, calls these, and appends
//! the chains' events.

use crate::decide::{decide_operation, OperationCommand};
use crate::error::DomainError;
use crate::events::{Event, MediaRegistered, MediaUpdated, OperationCreated, OperationTarget};
use crate::ids::{MediaId, OperationId};
use crate::projections::{MediaRow, OperationRow, INGESTION_FILE};
use crate::status::{IngestionStage, OperationStatus};
use crate::time::Timestamp;
use crate::transitions::{self, Cause};
use serde_json::{json, Value};

/// What an ingest saw of a file when it found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileObservation {
    pub path: String,
    pub byte_size: i64,
    /// Modification time, nanoseconds since the epoch.
    pub modified_ns: i64,
}

impl FileObservation {
    /// The inputs an ingestion operation records: what a later run compares
    /// to tell an unchanged file from a changed one.
    pub fn inputs(&self) -> Value {
        json!({"path": self.path, "byte_size": self.byte_size, "modified_ns": self.modified_ns})
    }
}

/// A chain of decisions about one operation: the row as the chain leaves
/// it, and the events so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    pub row: OperationRow,
    pub events: Vec<Event>,
    /// The operation's stream is created by these events.
    pub new_stream: bool,
}

impl Chain {
    pub fn new(row: OperationRow) -> Self {
        Chain {
            row,
            events: Vec::new(),
            new_stream: false,
        }
    }

    /// A new file ingestion's chain: its creation, from the row that
    /// creation produces.
    pub fn created(operation_id: OperationId, file: &FileObservation, now: Timestamp) -> Self {
        let created = Event::OperationCreated(OperationCreated {
            operation_id,
            kind: INGESTION_FILE.to_string(),
            target: OperationTarget {
                media_id: None,
                region_id: None,
                path: Some(file.path.clone()),
            },
            revision: None,
            inputs: file.inputs(),
            status: OperationStatus::Queued,
            priority: 0,
            task_version: None,
            task: None,
        });
        Chain {
            row: new_ingestion_row(operation_id, file, now),
            events: vec![created],
            new_stream: true,
        }
    }

    /// Decides `command` on the row as the previous decisions left it.
    pub fn then(&mut self, command: OperationCommand) -> Result<(), DomainError> {
        let event = decide_operation(&self.row, command)?;
        if let Some(cause) = event.cause() {
            self.row.status = transitions::transition(self.row.status, cause)?;
        }
        match &event {
            Event::OperationClaimed(claimed) => self.row.claim_token = Some(claimed.claim_token.clone()),
            Event::OperationStageChanged(changed) => self.row.stage = Some(changed.stage),
            _ if !self.row.status.is_claimed() => self.row.claim_token = None,
            _ => {}
        }
        self.events.push(event);
        Ok(())
    }

    /// Moves to each of `stages` that is later than the current stage.
    pub fn stages(&mut self, stages: &[IngestionStage]) -> Result<(), DomainError> {
        for stage in stages {
            if self.row.stage.is_none_or(|current| stage.rank() > current.rank()) {
                self.then(OperationCommand::ChangeStage { stage: *stage })?;
            }
        }
        Ok(())
    }

    /// Moves to `stage` (later than the current one), recording `inputs`
    /// as what the ingestion works on from now on.
    pub fn stage_with_inputs(&mut self, stage: IngestionStage, inputs: Value) -> Result<(), DomainError> {
        self.then(OperationCommand::ChangeStage { stage })?;
        if let Some(Event::OperationStageChanged(changed)) = self.events.last_mut() {
            self.row.inputs = inputs.to_string();
            changed.inputs = Some(inputs);
        }
        Ok(())
    }

    /// Claims and starts the ingestion for `worker`, at stage `settling`
    /// at least.
    pub fn claim(&mut self, claim_token: &str, worker: &str, lease_expires_at: Timestamp) -> Result<(), DomainError> {
        self.then(OperationCommand::Claim {
            claim_token: claim_token.to_string(),
            worker: worker.to_string(),
            lease_expires_at,
        })?;
        self.then(OperationCommand::Start {
            claim_token: claim_token.to_string(),
        })?;
        self.stages(&[IngestionStage::Settling])
    }
}

/// A new file found: created, claimed by `worker`, started, at `settling`.
pub fn decide_begin(
    operation_id: OperationId,
    file: &FileObservation,
    claim_token: &str,
    worker: &str,
    now: Timestamp,
    lease_expires_at: Timestamp,
) -> Result<Chain, DomainError> {
    let mut chain = Chain::created(operation_id, file, now);
    chain.claim(claim_token, worker, lease_expires_at)?;
    Ok(chain)
}

/// An ingestion taken over by a new ingest, continuing from its stage:
/// one a dead process held is interrupted and requeued, one that failed
/// for good is reopened (the file may be readable now), then it is
/// claimed.
pub fn decide_resume(
    row: OperationRow,
    claim_token: &str,
    worker: &str,
    lease_expires_at: Timestamp,
) -> Result<Chain, DomainError> {
    if row.kind != INGESTION_FILE {
        return Err(DomainError::InvalidInput(format!(
            "{} is not a file ingestion",
            row.operation_id
        )));
    }
    let mut chain = Chain::new(row);
    if chain.row.status.is_claimed() {
        chain.then(OperationCommand::Interrupt {
            reason: "the ingest process holding it died".into(),
        })?;
        chain.then(OperationCommand::Transition {
            cause: Cause::Requeue,
            reason: "resumed by the next ingest".into(),
        })?;
    } else if chain.row.status.is_failed_for_good() {
        chain.then(OperationCommand::Transition {
            cause: Cause::Reopen,
            reason: "retried by the next ingest: the file can be read now".into(),
        })?;
    }
    chain.claim(claim_token, worker, lease_expires_at)?;
    Ok(chain)
}

/// What a held ingestion found, for its registration.
#[derive(Debug, Clone, Copy)]
pub struct Found<'a> {
    pub claim_token: &'a str,
    /// The file as it was read, when it was read differently from the
    /// ingestion's inputs (it was still being written when found).
    pub observed: Option<&'a FileObservation>,
    /// What parsing found (format, dimensions), for the timeline.
    pub parsed: &'a Value,
}

/// The stages `parsing` and `registered` of a held ingestion, with what
/// parsing found as its progress; Conflict when this ingest no longer
/// holds it. A file read as it was not found is recorded with the
/// observation as its inputs, so the next ingest finds it unchanged.
pub fn decide_registration(row: OperationRow, found: Found<'_>) -> Result<Chain, DomainError> {
    if row.claim_token.as_deref() != Some(found.claim_token) {
        return Err(DomainError::Conflict(format!(
            "ingestion {} is no longer held by this ingest",
            row.operation_id
        )));
    }
    let mut chain = Chain::new(row);
    let read_as = found.observed.map(FileObservation::inputs);
    let recorded = serde_json::from_str::<Value>(&chain.row.inputs).ok();
    match read_as.filter(|read_as| Some(read_as) != recorded.as_ref()) {
        Some(inputs) => chain.stage_with_inputs(IngestionStage::Parsing, inputs)?,
        None => chain.stages(&[IngestionStage::Parsing])?,
    }
    chain.then(OperationCommand::Progress {
        claim_token: found.claim_token.to_string(),
        phase: format!("parsed: {}", found.parsed),
        processed: 1,
        total: Some(1),
    })?;
    chain.stages(&[IngestionStage::Registered])?;
    Ok(chain)
}

/// A file's content as registration found it.
#[derive(Debug, Clone, Copy)]
pub struct Content<'a> {
    pub path: &'a str,
    pub media_kind: &'a str,
    pub content_digest: &'a str,
    pub byte_size: i64,
}

/// The media item's event for a registered file: registered when `known`
/// is `None` (a new item), updated when its digest, size or media kind
/// changed, nothing when it did not.
pub fn decide_media(media_id: MediaId, known: Option<&MediaRow>, content: Content<'_>) -> Option<Event> {
    let Some(known) = known else {
        return Some(Event::MediaRegistered(MediaRegistered {
            media_id,
            path: content.path.to_string(),
            media_kind: content.media_kind.to_string(),
            content_digest: Some(content.content_digest.to_string()),
            byte_size: Some(content.byte_size),
        }));
    };
    // New content may be of another kind: the kinds that apply to the item
    // follow what it is now.
    let kind_changed = known.media_kind != content.media_kind;
    (known.content_digest.as_deref() != Some(content.content_digest)
        || known.byte_size != Some(content.byte_size)
        || kind_changed)
        .then(|| {
            Event::MediaUpdated(MediaUpdated {
                media_id,
                path: content.path.to_string(),
                content_digest: Some(content.content_digest.to_string()),
                byte_size: Some(content.byte_size),
                media_kind: kind_changed.then(|| content.media_kind.to_string()),
            })
        })
}

/// A held ingestion's end: stage `completed` and `succeeded` with the
/// output, or `failed_terminal` with the reason.
pub fn decide_finish(
    row: OperationRow,
    claim_token: &str,
    outcome: Result<Value, String>,
) -> Result<Chain, DomainError> {
    let mut chain = Chain::new(row);
    match outcome {
        Ok(output) => {
            chain.stages(&[IngestionStage::Completed])?;
            chain.then(OperationCommand::Succeed {
                claim_token: claim_token.to_string(),
                output,
            })?;
        }
        Err(error) => chain.then(OperationCommand::Fail {
            claim_token: claim_token.to_string(),
            error,
            retryable: false,
        })?,
    }
    Ok(chain)
}

/// A held ingestion given back unfinished: interrupted for `cause` and
/// queued again, for the next ingest to take over from its stage; `None`
/// when the claim no longer holds it.
pub fn decide_release(row: OperationRow, claim_token: &str, cause: &str) -> Result<Option<Chain>, DomainError> {
    if !row.status.is_claimed() || row.claim_token.as_deref() != Some(claim_token) {
        return Ok(None);
    }
    let mut chain = Chain::new(row);
    chain.then(OperationCommand::Interrupt {
        reason: cause.to_string(),
    })?;
    chain.then(OperationCommand::Transition {
        cause: Cause::Requeue,
        reason: "released unfinished, for the next ingest".into(),
    })?;
    Ok(Some(chain))
}

/// A file gone from disk: a file ingestion confirmed missing.
pub fn decide_missing(operation_id: OperationId, file: &FileObservation, now: Timestamp) -> Result<Chain, DomainError> {
    let mut chain = Chain::created(operation_id, file, now);
    // The path is the operation's own; the reason need not repeat it.
    chain.then(OperationCommand::Transition {
        cause: Cause::ConfirmMissing,
        reason: "gone from disk".into(),
    })?;
    Ok(chain)
}

/// The row a new ingestion operation's creation produces, for deciding its
/// next events in the same command.
fn new_ingestion_row(operation_id: OperationId, file: &FileObservation, now: Timestamp) -> OperationRow {
    OperationRow {
        operation_id,
        kind: INGESTION_FILE.to_string(),
        media_id: None,
        region_id: None,
        path: Some(file.path.clone()),
        revision: None,
        inputs: file.inputs().to_string(),
        status: OperationStatus::Queued,
        stage: Some(IngestionStage::Discovered),
        priority: 0,
        attempt_count: 0,
        interruption_count: 0,
        claim_token: None,
        worker: None,
        lease_expires_at: None,
        available_at: Some(now),
        cancel_requested: false,
        phase: None,
        processed: None,
        total: None,
        last_error: None,
        status_reason: None,
        blocked_on: None,
        created_at: now,
        updated_at: now,
        version: 1,
    }
}

#[cfg(test)]
#[path = "ingestion_tests.rs"]
mod tests;
