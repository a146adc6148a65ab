//! File ingestion commands (`ingestion.file` operations): start many
//! ingestions at once, move them through their stages, register what they
//! found and request its tasks, finish them, and record files that are gone.
//!
//! Each command is one transaction over many files, because an ingest of a
//! folder moves thousands of files through the same steps and the writer's
//! fixed cost per transaction would otherwise dominate; every stage change
//! is still its own event on the file's timeline. Each command loads the
//! rows, asks the domain (`opledger_domain::ingestion`: chains of
//! `decide_operation` steps on a copy of each operation's row), and
//! appends what it decided. The reads an ingest plans with (by path, by
//! id) are in [`lookups`].

mod lookups;

use crate::error::EngineError;
use crate::tx::{commit_appends, CommandContext, Decided, Stamp};
use crate::work::{request_in_tx, TaskRequest, TaskTarget};
use crate::Engine;
pub use opledger_domain::ingestion::FileObservation;
use opledger_domain::ingestion::{
    decide_begin, decide_finish, decide_media, decide_missing, decide_registration, decide_release, decide_resume,
    Chain, Content, Found,
};
use opledger_domain::projections::{
    media_key, operation_key, Cell, MediaRow, OperationRow, Row, WorkingSet, MEDIA_TABLE, OPERATIONS_TABLE,
};
use opledger_domain::requests::PlannedRequest;
use opledger_domain::{IngestionStage, LeaseMs, MediaId, OperationId, StreamId};
use opledger_store::{ExpectedVersion, Store, StreamAppend, WriteTx};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

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

/// The append that records a chain's events, stamped; none for an empty
/// chain.
fn chain_append(chain: Chain, stamp: &Stamp) -> Option<StreamAppend> {
    (!chain.events.is_empty()).then(|| StreamAppend {
        stream_id: StreamId::operation(chain.row.operation_id),
        expected: if chain.new_stream {
            ExpectedVersion::NoStream
        } else {
            ExpectedVersion::Exactly(chain.row.version)
        },
        events: chain.events.into_iter().map(|event| stamp.event(event)).collect(),
    })
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
                let ids: Vec<OperationId> = resumed.iter().map(|(id, _)| *id).collect();
                let mut loaded = loaded_by_id(load_ingestions(tx, &ids).await?);
                let mut appends = Vec::new();
                let mut claims = Vec::new();
                for (file, operation_id, claim_token) in fresh {
                    let chain = decide_begin(operation_id, &file, &claim_token, &worker, now, lease_expires_at)?;
                    appends.extend(chain_append(chain, &stamp));
                    let stage = IngestionStage::Settling;
                    claims.push(IngestionClaim {
                        operation_id,
                        path: file.path,
                        claim_token,
                        stage,
                    });
                }
                for (operation_id, claim_token) in resumed {
                    let row = loaded
                        .remove(&operation_id)
                        .ok_or_else(|| EngineError::not_found("operation", operation_id))?;
                    let path = row.path.clone().unwrap_or_default();
                    let chain = decide_resume(row, &claim_token, &worker, lease_expires_at)?;
                    let stage = chain.row.stage.unwrap_or(IngestionStage::Settling);
                    appends.extend(chain_append(chain, &stamp));
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
                    appends.extend(chain_append(chain, &stamp));
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
        let paths = registrations.iter().map(|item| item.claim.path.clone()).collect();
        let existing = self.media_by_paths(paths).await?;
        let planned: Vec<Planned> = registrations
            .into_iter()
            .map(|registration| match existing.get(&registration.claim.path) {
                Some(media) => (registration, media.media_id, false),
                None => (registration, MediaId(self.ids.next()), true),
            })
            .collect();
        let requests = self.plan_kinds(&planned, kinds);
        let per_file = kinds.len();
        let stamp = self.stamp(context);
        self.stamped(stamp, move |tx, rows, stamp| {
            Box::pin(async move {
                refuse_second_media_at_a_path(tx, &planned).await?;
                let appends = decide_registrations(tx, &planned, &stamp).await?;
                // The media rows are written: the requests read them, into a
                // working set of their own.
                if !appends.is_empty() {
                    commit_appends(tx, rows, appends).await?;
                }
                *rows = WorkingSet::default();
                let new_ids: Vec<Option<OperationId>> = requests
                    .iter()
                    .map(|item| item.as_ref().ok().map(|planned| planned.new_operation_id))
                    .collect();
                let (answers, task_appends) = request_in_tx(tx, rows, requests, &stamp).await?;
                let outcomes = registered(&planned, answers.into_iter().zip(new_ids), per_file)?;
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
                let mut loaded = loaded_by_id(load_ingestions(tx, &ids).await?);
                let mut appends = Vec::new();
                for (claim, outcome) in outcomes {
                    let row = loaded
                        .remove(&claim.operation_id)
                        .ok_or_else(|| EngineError::not_found("operation", claim.operation_id))?;
                    appends.extend(chain_append(decide_finish(row, &claim.claim_token, outcome)?, &stamp));
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
                let mut loaded = loaded_by_id(load_ingestions(tx, &ids).await?);
                let mut appends = Vec::new();
                for claim in claims {
                    let Some(row) = loaded.remove(&claim.operation_id) else {
                        continue;
                    };
                    if let Some(chain) = decide_release(row, &claim.claim_token, &cause)? {
                        appends.extend(chain_append(chain, &stamp));
                    }
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
                    appends.extend(chain_append(decide_missing(operation_id, &file, now)?, &stamp));
                    ids.push(operation_id);
                }
                Ok(Decided::answer(ids, appends))
            })
        })
        .await
    }

    /// The requests of `kinds` on each planned item, at their declared
    /// default inputs, each blocked where its registration says the kind
    /// cannot run here.
    fn plan_kinds(
        &self,
        planned: &[Planned],
        kinds: &[&str],
    ) -> Vec<Result<PlannedRequest, opledger_domain::DomainError>> {
        let mut requests = Vec::with_capacity(planned.len() * kinds.len());
        let mut unavailable = Vec::with_capacity(planned.len() * kinds.len());
        for (registration, media_id, _) in planned {
            for kind in kinds {
                requests.push(TaskRequest {
                    target: TaskTarget::Media(*media_id),
                    kind: kind.to_string(),
                    inputs: Value::Object(serde_json::Map::new()),
                    priority: 0,
                });
                unavailable.push(registration.blocked.get(*kind).cloned());
            }
        }
        self.prepare_requests(requests)
            .into_iter()
            .zip(unavailable)
            .map(|(item, reason)| {
                item.map(|planned| PlannedRequest {
                    unavailable: reason,
                    ..planned
                })
            })
            .collect()
    }
}

/// A registration with the media item it registers and whether that item
/// is new.
type Planned = (Registration, MediaId, bool);

/// Each planned registration's stages and media event, decided on the
/// ingestions and known items loaded here.
async fn decide_registrations<T: WriteTx>(
    tx: &mut T,
    planned: &[Planned],
    stamp: &Stamp,
) -> Result<Vec<StreamAppend>, EngineError> {
    let ids: Vec<OperationId> = planned.iter().map(|(item, _, _)| item.claim.operation_id).collect();
    let mut operations = loaded_by_id(load_ingestions(tx, &ids).await?);
    let known: Vec<MediaId> = planned
        .iter()
        .filter(|(_, _, new)| !*new)
        .map(|(_, id, _)| *id)
        .collect();
    let media = load_media(tx, &known).await?;
    let mut appends = Vec::new();
    for (item, media_id, new_media) in planned {
        let row = operations
            .remove(&item.claim.operation_id)
            .ok_or_else(|| EngineError::not_found("operation", item.claim.operation_id))?;
        let found = Found {
            claim_token: &item.claim.claim_token,
            observed: item.observed.as_ref(),
            parsed: &item.parsed,
        };
        appends.extend(chain_append(decide_registration(row, found)?, stamp));
        let known = match new_media {
            true => None,
            false => Some(
                media
                    .get(media_id)
                    .ok_or_else(|| EngineError::not_found("media", media_id))?,
            ),
        };
        let content = Content {
            path: &item.claim.path,
            media_kind: &item.media_kind,
            content_digest: &item.content_digest,
            byte_size: item.byte_size,
        };
        if let Some(event) = decide_media(*media_id, known, content) {
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
    Ok(appends)
}

/// What each planned registration did, from the answers to its `per_file`
/// requests (in plan order) and the id each task would have got if new.
fn registered(
    planned: &[Planned],
    mut answers: impl Iterator<Item = (Result<crate::work::RequestOutcome, EngineError>, Option<OperationId>)>,
    per_file: usize,
) -> Result<Vec<Registered>, EngineError> {
    let mut outcomes = Vec::with_capacity(planned.len());
    for (item, media_id, new_media) in planned {
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
    Ok(outcomes)
}

fn loaded_by_id(rows: Vec<OperationRow>) -> BTreeMap<OperationId, OperationRow> {
    rows.into_iter().map(|row| (row.operation_id, row)).collect()
}

async fn load_media<T: WriteTx>(tx: &mut T, ids: &[MediaId]) -> Result<BTreeMap<MediaId, MediaRow>, EngineError> {
    if ids.is_empty() {
        return Ok(BTreeMap::new());
    }
    let keys: Vec<String> = ids.iter().map(|id| media_key(*id).key.to_string()).collect();
    Ok(tx
        .load_rows(&MEDIA_TABLE, &keys)
        .await?
        .into_iter()
        .filter_map(|row| match row {
            Row::Media(item) => Some((item.media_id, item)),
            _ => None,
        })
        .collect())
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
async fn refuse_second_media_at_a_path<T: WriteTx>(tx: &mut T, planned: &[Planned]) -> Result<(), EngineError> {
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
