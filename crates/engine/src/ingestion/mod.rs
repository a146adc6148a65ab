//! File ingestion commands (`ingestion.file` operations): start many
//! ingestions at once, move them through their stages, register what they
//! found and request its tasks, finish them, and record files that are gone.
//!
//! Each command is one transaction over many files, because an ingest of a
//! folder moves thousands of files through the same steps and the writer's
//! fixed cost per transaction would otherwise dominate; every stage change
//! is still its own event on the file's timeline. The decisions are the
//! domain's (`decide_operation` and the transition table), applied in
//! sequence to a copy of each operation's row. The reads an ingest plans
//! with (by path, by id) are in [`lookups`].

mod lookups;

use crate::error::EngineError;
use crate::tx::{commit_appends, CommandContext, Decided, Stamp};
use crate::work::{request_in_tx, TaskRequest, TaskTarget};
use crate::Engine;
use opledger_domain::decide::{decide_operation, OperationCommand};
use opledger_domain::events::{Event, MediaRegistered, MediaUpdated, OperationCreated, OperationTarget};
use opledger_domain::projections::{
    media_key, operation_key, Cell, MediaRow, OperationRow, Row, WorkingSet, INGESTION_FILE, MEDIA_TABLE,
    OPERATIONS_TABLE,
};
use opledger_domain::transitions;
use opledger_domain::{Cause, IngestionStage, LeaseMs, MediaId, OperationId, OperationStatus, StreamId, Timestamp};
use opledger_store::{ExpectedVersion, RowTarget, Store, StreamAppend, WriteTx};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

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

/// An ingestion this process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestionClaim {
    pub operation_id: OperationId,
    pub path: String,
    pub claim_token: String,
    /// The stage it is at (a resumed ingestion continues from there).
    pub stage: IngestionStage,
}

/// One file found to be what an ingestion registers.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    pub claim: IngestionClaim,
    /// `sha256:<hex>`.
    pub content_digest: String,
    pub byte_size: i64,
    /// What the file is by its content (`image`, `video`, `audio`,
    /// `other`): the kinds that do not apply to it end `not_applicable`.
    pub media_kind: String,
    /// Kinds that cannot run on this file here, by name, with why (a tool
    /// not installed, a decoder not built): requested `blocked` with that
    /// reason instead of queued, so they wait for a person to add what is
    /// missing rather than fail.
    pub blocked: BTreeMap<String, String>,
    /// What parsing found (format, dimensions), for the timeline.
    pub parsed: Value,
    /// The file as it was read (size and modification time once it
    /// settled). When it differs from the ingestion's inputs (the file was
    /// still being written when it was found), the `parsing` stage records
    /// it as the ingestion's inputs, so the next ingest finds the file
    /// unchanged.
    pub observed: Option<FileObservation>,
}

/// What registering a file did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub operation_id: OperationId,
    pub media_id: MediaId,
    /// The media item is new (not updated).
    pub new_media: bool,
    /// Task operations whose revision was requested now (new work).
    pub tasks_requested: usize,
    /// Of those, task operations created now (the item's first request of
    /// the kind).
    pub tasks_created: usize,
    /// The item's task operations, one per requested kind.
    pub task_operations: Vec<OperationId>,
}

/// A step in a chain of decisions about one operation: the row as the
/// chain leaves it, and the events so far.
struct Chain {
    row: OperationRow,
    events: Vec<Event>,
}

impl Chain {
    fn new(row: OperationRow) -> Self {
        Chain {
            row,
            events: Vec::new(),
        }
    }

    /// A new file ingestion's chain: its creation, from the row that
    /// creation produces.
    fn created(operation_id: OperationId, file: &FileObservation, now: Timestamp) -> Self {
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
        }
    }

    /// Decides `command` on the row as the previous decisions left it.
    fn then(&mut self, command: OperationCommand) -> Result<(), EngineError> {
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
    fn stages(&mut self, stages: &[IngestionStage]) -> Result<(), EngineError> {
        for stage in stages {
            if self.row.stage.is_none_or(|current| stage.rank() > current.rank()) {
                self.then(OperationCommand::ChangeStage { stage: *stage })?;
            }
        }
        Ok(())
    }

    /// Moves to `stage` (later than the current one), recording `inputs`
    /// as what the ingestion works on from now on.
    fn stage_with_inputs(&mut self, stage: IngestionStage, inputs: Value) -> Result<(), EngineError> {
        self.then(OperationCommand::ChangeStage { stage })?;
        if let Some(Event::OperationStageChanged(changed)) = self.events.last_mut() {
            self.row.inputs = inputs.to_string();
            changed.inputs = Some(inputs);
        }
        Ok(())
    }

    fn append(self, stamp: &Stamp) -> Option<StreamAppend> {
        (!self.events.is_empty()).then(|| StreamAppend {
            stream_id: StreamId::operation(self.row.operation_id),
            expected: ExpectedVersion::Exactly(self.row.version),
            events: self.events.into_iter().map(|event| stamp.event(event)).collect(),
        })
    }
}

impl<S: Store> Engine<S> {
    /// Starts ingestions, all in one transaction: a new operation for each
    /// of `new` (created, claimed by `worker`, started, at stage
    /// `settling`), and each of `resume` taken over, continuing from its
    /// stage: one a process that died held (its claim interrupted and
    /// requeued, then claimed again; the caller must know the previous
    /// holder is dead, as the ingest lock tells it), one released by an
    /// ingest that stopped (claimed again), or one that failed for good
    /// (reopened, then claimed: an unreadable file that can be read now).
    pub async fn begin_ingestions(
        &self,
        context: &CommandContext,
        worker: &str,
        lease_ms: i64,
        new: Vec<FileObservation>,
        resume: Vec<OperationId>,
    ) -> Result<Vec<IngestionClaim>, EngineError> {
        let lease = LeaseMs::new(lease_ms)?;
        let fresh: Vec<(FileObservation, OperationId, String)> = new
            .into_iter()
            .map(|file| (file, OperationId(self.ids.next()), self.ids.next().to_string()))
            .collect();
        let resumed: Vec<(OperationId, String)> = resume
            .into_iter()
            .map(|operation_id| (operation_id, self.ids.next().to_string()))
            .collect();
        let worker = worker.to_string();
        let stamp = self.stamp(context);
        self.stamped(stamp, move |tx, _, stamp| {
            Box::pin(async move {
                let now = stamp.recorded_at;
                let lease_expires_at = lease.ends_at(now);
                let mut appends = Vec::new();
                let mut claims = Vec::new();
                for (file, operation_id, claim_token) in fresh {
                    let mut chain = Chain::created(operation_id, &file, now);
                    claim_chain(&mut chain, &claim_token, &worker, lease_expires_at)?;
                    let mut append = chain.append(&stamp).expect("a new ingestion has events");
                    append.expected = ExpectedVersion::NoStream;
                    appends.push(append);
                    claims.push(IngestionClaim {
                        operation_id,
                        path: file.path,
                        claim_token,
                        stage: IngestionStage::Settling,
                    });
                }
                let keys: Vec<String> = resumed
                    .iter()
                    .map(|(id, _)| operation_key(*id).key.to_string())
                    .collect();
                let loaded = if keys.is_empty() {
                    Vec::new()
                } else {
                    tx.load_rows(&OPERATIONS_TABLE, &keys).await?
                };
                let loaded: BTreeMap<OperationId, OperationRow> = loaded
                    .into_iter()
                    .filter_map(|row| match row {
                        Row::Operation(operation) => Some((operation.operation_id, operation)),
                        _ => None,
                    })
                    .collect();
                for (operation_id, claim_token) in resumed {
                    let row = loaded
                        .get(&operation_id)
                        .cloned()
                        .ok_or_else(|| EngineError::not_found("operation", operation_id))?;
                    if row.kind != INGESTION_FILE {
                        return Err(EngineError::invalid(format!("{operation_id} is not a file ingestion")));
                    }
                    let path = row.path.clone().unwrap_or_default();
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
                    claim_chain(&mut chain, &claim_token, &worker, lease_expires_at)?;
                    let stage = chain.row.stage.unwrap_or(IngestionStage::Settling);
                    appends.extend(chain.append(&stamp));
                    claims.push(IngestionClaim {
                        operation_id,
                        path,
                        claim_token,
                        stage,
                    });
                }
                Ok(Decided::answer(claims, appends))
            })
        })
        .await
    }

    /// Moves held ingestions to a stage (each only forward), in one
    /// transaction.
    pub async fn ingestion_stage(
        &self,
        context: &CommandContext,
        claims: &[IngestionClaim],
        stage: IngestionStage,
    ) -> Result<(), EngineError> {
        let ids: Vec<OperationId> = claims.iter().map(|claim| claim.operation_id).collect();
        let stamp = self.stamp(context);
        self.stamped(stamp, move |tx, _, stamp| {
            Box::pin(async move {
                let mut appends = Vec::new();
                for row in load_ingestions(tx, &ids).await? {
                    let mut chain = Chain::new(row);
                    chain.stages(&[stage])?;
                    appends.extend(chain.append(&stamp));
                }
                Ok(Decided::answer((), appends))
            })
        })
        .await
    }

    /// Registers what held ingestions found, in one transaction: stages
    /// `parsing` and `registered` on each file's timeline, the media item
    /// registered (or updated with its new digest and size), and `kinds`
    /// requested on it at their default inputs (a revision already
    /// requested or done is not requested again).
    pub async fn register_ingestions(
        &self,
        context: &CommandContext,
        registrations: Vec<Registration>,
        kinds: &[&str],
    ) -> Result<Vec<Registered>, EngineError> {
        let existing = self
            .media_by_paths(registrations.iter().map(|item| item.claim.path.clone()).collect())
            .await?;
        let mut planned = Vec::with_capacity(registrations.len());
        let mut requests = Vec::new();
        let mut unavailable = Vec::new();
        for registration in registrations {
            let (media_id, new_media) = match existing.get(&registration.claim.path) {
                Some(media) => (media.media_id, false),
                None => (MediaId(self.ids.next()), true),
            };
            for kind in kinds {
                requests.push(TaskRequest {
                    target: TaskTarget::Media(media_id),
                    kind: kind.to_string(),
                    // The kind's declared defaults fill every input.
                    inputs: serde_json::Value::Object(serde_json::Map::new()),
                    priority: 0,
                });
                unavailable.push(registration.blocked.get(*kind).cloned());
            }
            planned.push((registration, media_id, new_media));
        }
        let prepared: Vec<_> = self
            .prepare_requests(requests)
            .into_iter()
            .zip(unavailable)
            .map(|(item, reason)| item.map(|(request, operation_id, _)| (request, operation_id, reason)))
            .collect();
        // The id each request's task would get if it is new.
        let new_ids: Vec<Option<OperationId>> = prepared
            .iter()
            .map(|item| item.as_ref().ok().map(|(_, operation_id, _)| *operation_id))
            .collect();
        let per_file = kinds.len();
        let stamp = self.stamp(context);
        self.stamped(stamp, move |tx, rows, stamp| {
            Box::pin(async move {
                refuse_second_media_at_a_path(tx, &planned).await?;
                let ids: Vec<OperationId> = planned.iter().map(|(item, _, _)| item.claim.operation_id).collect();
                let operations: BTreeMap<OperationId, OperationRow> = load_ingestions(tx, &ids)
                    .await?
                    .into_iter()
                    .map(|row| (row.operation_id, row))
                    .collect();
                let media_keys: Vec<String> = planned
                    .iter()
                    .filter(|(_, _, new_media)| !*new_media)
                    .map(|(_, media_id, _)| media_key(*media_id).key.to_string())
                    .collect();
                let media: BTreeMap<MediaId, MediaRow> = if media_keys.is_empty() {
                    BTreeMap::new()
                } else {
                    tx.load_rows(&MEDIA_TABLE, &media_keys)
                        .await?
                        .into_iter()
                        .filter_map(|row| match row {
                            Row::Media(item) => Some((item.media_id, item)),
                            _ => None,
                        })
                        .collect()
                };
                let mut appends = Vec::new();
                for (item, media_id, new_media) in &planned {
                    let row = operations
                        .get(&item.claim.operation_id)
                        .cloned()
                        .ok_or_else(|| EngineError::not_found("operation", item.claim.operation_id))?;
                    if row.claim_token.as_deref() != Some(item.claim.claim_token.as_str()) {
                        return Err(EngineError::Domain(opledger_domain::DomainError::Conflict(format!(
                            "ingestion {} is no longer held by this ingest",
                            item.claim.operation_id
                        ))));
                    }
                    let mut chain = Chain::new(row);
                    let read_as = item.observed.as_ref().map(FileObservation::inputs);
                    let recorded = serde_json::from_str::<Value>(&chain.row.inputs).ok();
                    match read_as.filter(|read_as| Some(read_as) != recorded.as_ref()) {
                        Some(inputs) => chain.stage_with_inputs(IngestionStage::Parsing, inputs)?,
                        None => chain.stages(&[IngestionStage::Parsing])?,
                    }
                    chain.then(OperationCommand::Progress {
                        claim_token: item.claim.claim_token.clone(),
                        phase: format!("parsed: {}", item.parsed),
                        processed: 1,
                        total: Some(1),
                    })?;
                    chain.stages(&[IngestionStage::Registered])?;
                    appends.extend(chain.append(&stamp));
                    let media_event = if *new_media {
                        Some(Event::MediaRegistered(MediaRegistered {
                            media_id: *media_id,
                            path: item.claim.path.clone(),
                            media_kind: item.media_kind.clone(),
                            content_digest: Some(item.content_digest.clone()),
                            byte_size: Some(item.byte_size),
                        }))
                    } else {
                        let known = media
                            .get(media_id)
                            .ok_or_else(|| EngineError::not_found("media", media_id))?;
                        // New content may be of another kind: the kinds that
                        // apply to the item follow what it is now.
                        let kind_changed = known.media_kind != item.media_kind;
                        (known.content_digest.as_deref() != Some(item.content_digest.as_str())
                            || known.byte_size != Some(item.byte_size)
                            || kind_changed)
                            .then(|| {
                                Event::MediaUpdated(MediaUpdated {
                                    media_id: *media_id,
                                    path: item.claim.path.clone(),
                                    content_digest: Some(item.content_digest.clone()),
                                    byte_size: Some(item.byte_size),
                                    media_kind: kind_changed.then(|| item.media_kind.clone()),
                                })
                            })
                    };
                    if let Some(event) = media_event {
                        appends.push(StreamAppend {
                            stream_id: StreamId::media(*media_id),
                            expected: if *new_media {
                                ExpectedVersion::NoStream
                            } else {
                                ExpectedVersion::Any
                            },
                            events: vec![stamp.event(event)],
                        });
                    }
                }
                // The media rows are written: the requests read them, into a
                // working set of their own.
                if !appends.is_empty() {
                    commit_appends(tx, rows, appends).await?;
                }
                *rows = WorkingSet::default();
                let (answers, task_appends) = request_in_tx(tx, rows, prepared, &stamp).await?;
                let mut outcomes = Vec::with_capacity(planned.len());
                let mut answers = answers.into_iter().zip(new_ids);
                for (item, media_id, new_media) in &planned {
                    let mut tasks_requested = 0;
                    let mut tasks_created = 0;
                    let mut task_operations = Vec::with_capacity(per_file);
                    for _ in 0..per_file {
                        let (answer, new_id) = answers.next().expect("one answer per request");
                        let answer = answer?;
                        if answer.created {
                            tasks_requested += 1;
                            if Some(answer.operation_id) == new_id {
                                tasks_created += 1;
                            }
                        }
                        task_operations.push(answer.operation_id);
                    }
                    outcomes.push(Registered {
                        operation_id: item.claim.operation_id,
                        media_id: *media_id,
                        new_media: *new_media,
                        tasks_requested,
                        tasks_created,
                        task_operations,
                    });
                }
                Ok(Decided::answer(outcomes, task_appends))
            })
        })
        .await
    }

    /// Finishes held ingestions, in one transaction: stage `completed` and
    /// `succeeded` with `output`, or `failed_terminal` with the reason.
    pub async fn finish_ingestions(
        &self,
        context: &CommandContext,
        outcomes: Vec<(IngestionClaim, Result<Value, String>)>,
    ) -> Result<(), EngineError> {
        let stamp = self.stamp(context);
        self.stamped(stamp, move |tx, _, stamp| {
            Box::pin(async move {
                let ids: Vec<OperationId> = outcomes.iter().map(|(claim, _)| claim.operation_id).collect();
                let loaded: BTreeMap<OperationId, OperationRow> = load_ingestions(tx, &ids)
                    .await?
                    .into_iter()
                    .map(|row| (row.operation_id, row))
                    .collect();
                let mut appends = Vec::new();
                for (claim, outcome) in outcomes {
                    let row = loaded
                        .get(&claim.operation_id)
                        .cloned()
                        .ok_or_else(|| EngineError::not_found("operation", claim.operation_id))?;
                    let mut chain = Chain::new(row);
                    match outcome {
                        Ok(output) => {
                            chain.stages(&[IngestionStage::Completed])?;
                            chain.then(OperationCommand::Succeed {
                                claim_token: claim.claim_token.clone(),
                                output,
                            })?;
                        }
                        Err(error) => chain.then(OperationCommand::Fail {
                            claim_token: claim.claim_token.clone(),
                            error,
                            retryable: false,
                        })?,
                    }
                    appends.extend(chain.append(&stamp));
                }
                Ok(Decided::answer((), appends))
            })
        })
        .await
    }

    /// Gives back held ingestions unfinished, in one transaction: each
    /// still held by its claim is interrupted (`cause` on its timeline) and
    /// queued again, for the next ingest to take over from its stage. What
    /// an ingest that stops early does with the files it has not finished.
    /// Returns how many were released.
    pub async fn release_ingestions(
        &self,
        context: &CommandContext,
        claims: Vec<IngestionClaim>,
        cause: &str,
    ) -> Result<usize, EngineError> {
        let stamp = self.stamp(context);
        let cause = cause.to_string();
        self.stamped(stamp, move |tx, _, stamp| {
            Box::pin(async move {
                let ids: Vec<OperationId> = claims.iter().map(|claim| claim.operation_id).collect();
                let loaded: BTreeMap<OperationId, OperationRow> = load_ingestions(tx, &ids)
                    .await?
                    .into_iter()
                    .map(|row| (row.operation_id, row))
                    .collect();
                let mut appends = Vec::new();
                for claim in claims {
                    let Some(row) = loaded.get(&claim.operation_id).cloned() else {
                        continue;
                    };
                    if !row.status.is_claimed() || row.claim_token.as_deref() != Some(claim.claim_token.as_str()) {
                        continue;
                    }
                    let mut chain = Chain::new(row);
                    chain.then(OperationCommand::Interrupt { reason: cause.clone() })?;
                    chain.then(OperationCommand::Transition {
                        cause: Cause::Requeue,
                        reason: "released unfinished, for the next ingest".into(),
                    })?;
                    appends.extend(chain.append(&stamp));
                }
                let released = appends.len();
                Ok(Decided::answer(released, appends))
            })
        })
        .await
    }

    /// Records files that are gone from disk: for each path, a file
    /// ingestion confirmed missing (`missing_confirmed`, which the review
    /// queue routes as `source_missing`). One transaction.
    pub async fn confirm_missing_files(
        &self,
        context: &CommandContext,
        files: Vec<FileObservation>,
    ) -> Result<Vec<OperationId>, EngineError> {
        let planned: Vec<(FileObservation, OperationId)> = files
            .into_iter()
            .map(|file| (file, OperationId(self.ids.next())))
            .collect();
        let stamp = self.stamp(context);
        self.stamped(stamp, move |_, _, stamp| {
            Box::pin(async move {
                let now = stamp.recorded_at;
                let mut appends = Vec::new();
                let mut ids = Vec::new();
                for (file, operation_id) in planned {
                    let mut chain = Chain::created(operation_id, &file, now);
                    // The path is the operation's own; the reason need
                    // not repeat it.
                    chain.then(OperationCommand::Transition {
                        cause: Cause::ConfirmMissing,
                        reason: "gone from disk".into(),
                    })?;
                    let mut append = chain.append(&stamp).expect("events");
                    append.expected = ExpectedVersion::NoStream;
                    appends.push(append);
                    ids.push(operation_id);
                }
                Ok(Decided::answer(ids, appends))
            })
        })
        .await
    }
}

fn claim_chain(
    chain: &mut Chain,
    claim_token: &str,
    worker: &str,
    lease_expires_at: Timestamp,
) -> Result<(), EngineError> {
    chain.then(OperationCommand::Claim {
        claim_token: claim_token.to_string(),
        worker: worker.to_string(),
        lease_expires_at,
    })?;
    chain.then(OperationCommand::Start {
        claim_token: claim_token.to_string(),
    })?;
    chain.stages(&[IngestionStage::Settling])
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

async fn load_ingestions<T: WriteTx>(tx: &mut T, ids: &[OperationId]) -> Result<Vec<OperationRow>, EngineError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<String> = ids.iter().map(|id| operation_key(*id).key.to_string()).collect();
    Ok(tx
        .load_rows(&OPERATIONS_TABLE, &keys)
        .await?
        .into_iter()
        .filter_map(|row| match row {
            Row::Operation(operation) => Some(operation),
            _ => None,
        })
        .collect())
}

/// The media registry holds one item per path for what the ingest
/// registers: a new item is refused, inside the write that would register
/// it, when an item at its path exists (registered since the read that
/// planned it, by another writer) or when two of the registrations name
/// one path. *Why here:* the plan's read is outside the transaction, and
/// only a check under the write lock sees every writer's items.
async fn refuse_second_media_at_a_path<T: WriteTx>(
    tx: &mut T,
    planned: &[(Registration, MediaId, bool)],
) -> Result<(), EngineError> {
    let mut paths = BTreeSet::new();
    for (item, _, new_media) in planned {
        if *new_media && !paths.insert(item.claim.path.clone()) {
            return Err(second_media_at(&item.claim.path, None));
        }
    }
    if paths.is_empty() {
        return Ok(());
    }
    let values: Vec<Cell> = paths.into_iter().map(Cell::Text).collect();
    let found = tx.find_rows_in(&MEDIA_TABLE, "path", &values).await?;
    match found.into_iter().find_map(|row| match row {
        Row::Media(item) => Some(item),
        _ => None,
    }) {
        Some(item) => Err(second_media_at(&item.path, Some(item.media_id))),
        None => Ok(()),
    }
}

fn second_media_at(path: &str, existing: Option<MediaId>) -> EngineError {
    let held = existing.map_or_else(
        || "twice in one registration".to_string(),
        |id| format!("already as {id}"),
    );
    EngineError::Domain(opledger_domain::DomainError::Conflict(format!(
        "a media item for {} is registered {held}: the media registry holds one item per ingested path",
        opledger_domain::quoted(path)
    )))
}
