//! The work protocol: request, claim, heartbeat, progress, complete, fail,
//! cancel and recovery, each one write transaction.
//!
//! Every command loads the processing state it decides on inside the write
//! transaction, asks the domain (`opledger_domain::work`), appends what the
//! domain returned and folds it inline, so the state a command decided on is
//! the state it changed. Reports from workers are fenced: the claim token
//! (and revision, when given) must still hold the task, else Conflict and
//! nothing is written. Heartbeats and progress counters change only the
//! lease table (liveness); phase changes, final counts and every status
//! change are events.

use crate::commands::{commit_appends, CommandContext, Stamp};
use crate::error::EngineError;
use crate::Engine;
use opledger_domain::events::{Event, OperationCreated, OperationProgressed, OperationTarget};
use opledger_domain::projections::Cell;
use opledger_domain::projections::{
    media_key, region_key, state_key, state_table, MediaRow, ProcessingStateRow, RegionRow, Row, WorkingSet,
    MEDIA_TABLE, REGIONS_TABLE,
};
use opledger_domain::revision::compute_revision;
use opledger_domain::tasks::{task_kind, TargetType, TaskKindSpec, CLAIMABLE_STATUSES};
use opledger_domain::work::{self, Completion, Fence};
use opledger_domain::{MediaId, NewEvent, OperationId, OperationStatus, RegionId, StreamId, Timestamp};
use opledger_store::{ClaimQuery, ExpectedVersion, ExpiredClaim, Lease, RowTarget, Store, StreamAppend, WriteTx};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;

/// The longest lease a claim may take. A worker that needs longer
/// heartbeats; a lease of years would hide a dead worker for years.
pub use crate::commands::MAX_LEASE_MS;

/// The most tasks one claim call may take.
pub const MAX_CLAIM_BATCH: usize = 1_000;

/// Claims recovery examines per transaction.
const RECOVERY_BATCH: usize = 500;

/// What a task runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskTarget {
    Media(MediaId),
    Region(RegionId),
}

impl TaskTarget {
    pub fn target_type(self) -> TargetType {
        match self {
            TaskTarget::Media(_) => TargetType::Media,
            TaskTarget::Region(_) => TargetType::Region,
        }
    }

    fn id(self) -> uuid::Uuid {
        match self {
            TaskTarget::Media(id) => id.0,
            TaskTarget::Region(id) => id.0,
        }
    }
}

/// A request for a task kind on a target at the revision its inputs determine.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRequest {
    pub target: TaskTarget,
    pub kind: String,
    /// The caller's inputs; what the target provides is filled in.
    pub inputs: Value,
    /// Higher runs first.
    pub priority: i32,
}

/// What a request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestOutcome {
    pub operation_id: OperationId,
    pub requested_revision: String,
    /// False when that revision was already the requested one (waiting,
    /// running or completed): nothing was appended.
    pub created: bool,
}

/// A batch claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// Task kinds to take; empty takes any.
    pub kinds: Vec<String>,
    pub worker: String,
    pub lease_ms: i64,
    /// How many tasks to take at most (1 ..= [`MAX_CLAIM_BATCH`]).
    pub limit: usize,
}

/// One claimed task, everything a worker needs to run it and report back.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskClaim {
    pub claim_token: String,
    pub operation_id: OperationId,
    /// The media item: the target, or the item a target region is on.
    pub media_id: Option<MediaId>,
    pub region_id: Option<RegionId>,
    pub task_kind: String,
    pub revision: String,
    pub inputs: Value,
    pub lease_expires_at: Timestamp,
    /// 1 for the first claim of this revision.
    pub attempt: i64,
}

impl TaskClaim {
    /// The fence this claim's reports carry.
    pub fn fence(&self) -> Fence {
        Fence {
            claim_token: self.claim_token.clone(),
            revision: Some(self.revision.clone()),
        }
    }
}

/// A heartbeat's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    pub lease_expires_at: Timestamp,
    /// Stop, clean up temporary outputs, then acknowledge the cancel.
    pub cancel_requested: bool,
}

/// Progress of a running task: real units done, the total when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub phase: String,
    pub processed: i64,
    pub total: Option<i64>,
}

/// Where a task stands after a worker's report or a cancel.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOutcome {
    pub operation_id: OperationId,
    pub status: OperationStatus,
    pub requested_revision: String,
    pub completed_revision: Option<String>,
    pub available_at: Timestamp,
    pub attempt_count: i64,
    pub failure_count: i64,
    pub cancel_requested: bool,
    pub last_error: Option<String>,
}

impl TaskOutcome {
    fn of(row: &ProcessingStateRow) -> Self {
        TaskOutcome {
            operation_id: row.operation_id,
            status: row.status,
            requested_revision: row.requested_revision.clone(),
            completed_revision: row.completed_revision.clone(),
            available_at: row.available_at,
            attempt_count: row.attempt_count,
            failure_count: row.failure_count,
            cancel_requested: row.cancel_requested,
            last_error: row.last_error.clone(),
        }
    }
}

/// A processing state with its claim's liveness joined in.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView {
    pub state: ProcessingStateRow,
    /// Present while a claim is held.
    pub lease: Option<Lease>,
}

impl TaskView {
    /// The lease as extended by heartbeats (the claim's own otherwise).
    pub fn lease_expires_at(&self) -> Option<Timestamp> {
        match (&self.lease, self.state.lease_expires_at) {
            (Some(lease), Some(granted)) => Some(lease.lease_expires_at.max(granted)),
            (None, granted) => granted,
            (Some(lease), None) => Some(lease.lease_expires_at),
        }
    }

    pub fn heartbeat_at(&self) -> Option<Timestamp> {
        self.lease.as_ref().map(|lease| lease.heartbeat_at)
    }
}

/// How a worker ended one claim, for [`Engine::report_outcomes`].
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// Finished: an output, or no result.
    Complete(Completion),
    /// Failed: retried with backoff while attempts remain unless `terminal`.
    Fail { error: String, terminal: bool },
}

/// One worker's report of one claim, with the context its events carry.
#[derive(Debug, Clone)]
pub struct OutcomeReport {
    pub context: CommandContext,
    pub fence: Fence,
    pub outcome: ClaimOutcome,
}

/// What a recovery pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Claims found with an expired lease and interrupted.
    pub interrupted: u64,
    pub requeued: u64,
    /// Interrupted tasks whose cancel request recovery finished.
    pub cancelled: u64,
    /// Quarantined (interrupted too often) or not re-run by policy.
    pub failed: u64,
    /// Candidates that a worker completed, failed or extended between
    /// recovery's read and its write: left alone.
    pub skipped: u64,
}

/// Called between recovery's read of expired claims and its write; tests
/// use it to land a completion in the gap.
pub type RecoveryHook = Box<dyn Fn(Vec<ExpiredClaim>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A worker report's decision, made against the state it finds.
type Decision = Box<dyn FnOnce(&ProcessingStateRow) -> Result<Vec<Event>, opledger_domain::DomainError> + Send>;

fn stale_claim(fence: &Fence) -> EngineError {
    EngineError::Domain(opledger_domain::DomainError::Conflict(format!(
        "claim {} does not hold any task (it finished, was interrupted by recovery, or never existed)",
        fence.claim_token
    )))
}

/// Loads the processing states of many task operations (both tables) into
/// `rows`, absent ones as known-absent.
async fn load_states<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    operation_ids: &[OperationId],
) -> Result<(), EngineError> {
    for target_type in [TargetType::Media, TargetType::Region] {
        let keys: Vec<String> = operation_ids
            .iter()
            .map(|operation_id| state_key(target_type, *operation_id))
            .filter(|key| !rows.is_known(key))
            .map(|key| key.key.to_string())
            .collect();
        if keys.is_empty() {
            continue;
        }
        let loaded = tx.load_rows(state_table(target_type), &keys).await?;
        for key in keys {
            rows.insert_loaded(
                opledger_domain::projections::RowKey::new(state_table(target_type), key),
                None,
            );
        }
        for row in loaded {
            rows.insert_loaded(row.key(), Some(row));
        }
    }
    Ok(())
}

/// Loads the processing state of a task operation (either table) into
/// `rows`; None when it has none.
async fn load_state<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    operation_id: OperationId,
) -> Result<Option<ProcessingStateRow>, EngineError> {
    let mut found = None;
    for target_type in [TargetType::Media, TargetType::Region] {
        let key = state_key(target_type, operation_id);
        if rows.is_known(&key) {
            if let Some(Row::ProcessingState(row)) = rows.get(&key) {
                found = Some(row.clone());
            }
            continue;
        }
        let loaded = tx.load_rows(state_table(target_type), &[key.key.to_string()]).await?;
        match loaded.into_iter().next() {
            Some(Row::ProcessingState(row)) => {
                rows.insert_loaded(key, Some(Row::ProcessingState(row.clone())));
                found = Some(row);
            }
            _ => rows.insert_loaded(key, None),
        }
    }
    Ok(found)
}

/// The task a claim token holds, through its lease row; Conflict when the
/// claim no longer exists (finished, interrupted, or never was).
async fn load_claimed<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    fence: &Fence,
) -> Result<(ProcessingStateRow, Lease), EngineError> {
    let stale = || stale_claim(fence);
    let lease = tx.lease(&fence.claim_token).await?.ok_or_else(stale)?;
    let state = load_state(tx, rows, lease.operation_id).await?.ok_or_else(stale)?;
    work::check_fence(&state, fence)?;
    Ok((state, lease))
}

/// A prepared request: the kind, its current version, the caller's request
/// and the id a new task operation would get.
pub(crate) type PreparedRequest = Result<(&'static TaskKindSpec, String, TaskRequest, OperationId), EngineError>;

/// Decides a batch of task requests inside the caller's transaction: one
/// read per table for the whole batch, then one answer per request and the
/// appends that carry them out (not yet appended: the caller commits them,
/// possibly with more of its own).
pub(crate) async fn request_in_tx<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    prepared: Vec<PreparedRequest>,
    stamp: &Stamp,
) -> Result<(Vec<Result<RequestOutcome, EngineError>>, Vec<StreamAppend>), EngineError> {
    let valid = || prepared.iter().filter_map(|item| item.as_ref().ok());
    // The targets, in two reads: regions first (a region
    // names its item), then every item.
    let region_ids: BTreeSet<RegionId> = valid()
        .filter_map(|(_, _, request, _)| match request.target {
            TaskTarget::Region(region_id) => Some(region_id),
            TaskTarget::Media(_) => None,
        })
        .collect();
    let mut regions: BTreeMap<RegionId, RegionRow> = BTreeMap::new();
    if !region_ids.is_empty() {
        let keys: Vec<String> = region_ids.iter().map(ToString::to_string).collect();
        for row in tx.load_rows(&REGIONS_TABLE, &keys).await? {
            if let Row::Region(region) = row {
                regions.insert(region.region_id, region);
            }
        }
    }
    let media_ids: BTreeSet<MediaId> = valid()
        .filter_map(|(_, _, request, _)| match request.target {
            TaskTarget::Media(media_id) => Some(media_id),
            TaskTarget::Region(region_id) => regions.get(&region_id).map(|region| region.media_id),
        })
        .collect();
    let mut media: BTreeMap<MediaId, MediaRow> = BTreeMap::new();
    if !media_ids.is_empty() {
        let keys: Vec<String> = media_ids.iter().map(ToString::to_string).collect();
        for row in tx.load_rows(&MEDIA_TABLE, &keys).await? {
            if let Row::Media(item) = row {
                media.insert(item.media_id, item);
            }
        }
    }
    // The tasks these targets already have.
    let mut existing: BTreeMap<(uuid::Uuid, String), ProcessingStateRow> = BTreeMap::new();
    let media_targets: Vec<Cell> = media_ids.iter().map(|id| Cell::Uuid(id.0)).collect();
    let region_targets: Vec<Cell> = region_ids.iter().map(|id| Cell::Uuid(id.0)).collect();
    for (target_type, column, targets) in [
        (TargetType::Media, "media_id", media_targets),
        (TargetType::Region, "region_id", region_targets),
    ] {
        if targets.is_empty() {
            continue;
        }
        for row in tx.find_rows_in(state_table(target_type), column, &targets).await? {
            if let Row::ProcessingState(state) = row {
                existing.insert((state.target_id, state.task_kind.clone()), state);
            }
        }
    }
    for item in media.values() {
        rows.insert_loaded(media_key(item.media_id), Some(Row::Media(item.clone())));
    }
    for region in regions.values() {
        rows.insert_loaded(region_key(region.region_id), Some(Row::Region(region.clone())));
    }
    for state in existing.values() {
        rows.insert_loaded(
            state_key(state.target_type, state.operation_id),
            Some(Row::ProcessingState(state.clone())),
        );
    }

    let mut answers = Vec::with_capacity(prepared.len());
    let mut appends = Vec::new();
    // (target, kind) → (operation, revision) decided in this batch.
    let mut decided: BTreeMap<(uuid::Uuid, String), (OperationId, String)> = BTreeMap::new();
    for item in prepared {
        let answer = (|| {
            let (kind, version, request, new_operation_id) = item?;
            let (media_id, region_id, target_values) = target_values_of(request.target, &media, &regions)?;
            let inputs = Value::Object(kind.complete_inputs(&request.inputs, &target_values)?);
            let revision = compute_revision(kind.name, &version, &inputs)
                .map_err(|error| EngineError::invalid(format!("{} inputs: {error}", kind.name)))?;
            let slot = (request.target.id(), kind.name.to_string());
            if let Some((operation_id, earlier)) = decided.get(&slot) {
                if *earlier == revision {
                    return Ok((
                        RequestOutcome {
                            operation_id: *operation_id,
                            requested_revision: revision,
                            created: false,
                        },
                        None,
                    ));
                }
                return Err(EngineError::invalid(format!(
                    "this batch requests {} on {} twice with different inputs",
                    kind.name,
                    request.target.id()
                )));
            }
            let (outcome, append) = match existing.get(&slot) {
                Some(state) => match work::decide_request(state, &revision, inputs, &version) {
                    None => (
                        RequestOutcome {
                            operation_id: state.operation_id,
                            requested_revision: revision.clone(),
                            created: false,
                        },
                        None,
                    ),
                    Some(event) => (
                        RequestOutcome {
                            operation_id: state.operation_id,
                            requested_revision: revision.clone(),
                            created: true,
                        },
                        Some(single_append(state, vec![stamp.event(event)])),
                    ),
                },
                None => {
                    let event = Event::OperationCreated(OperationCreated {
                        operation_id: new_operation_id,
                        kind: kind.name.to_string(),
                        target: OperationTarget {
                            media_id: Some(media_id),
                            region_id,
                            path: None,
                        },
                        revision: Some(revision.clone()),
                        inputs,
                        status: OperationStatus::Queued,
                        priority: request.priority,
                        task_version: Some(version.clone()),
                    });
                    (
                        RequestOutcome {
                            operation_id: new_operation_id,
                            requested_revision: revision.clone(),
                            created: true,
                        },
                        Some(StreamAppend {
                            stream_id: StreamId::operation(new_operation_id),
                            expected: ExpectedVersion::NoStream,
                            events: vec![stamp.event(event)],
                        }),
                    )
                }
            };
            decided.insert(slot, (outcome.operation_id, revision));
            Ok((outcome, append))
        })();
        match answer {
            Ok((outcome, append)) => {
                appends.extend(append);
                answers.push(Ok(outcome));
            }
            Err(error) => answers.push(Err(error)),
        }
    }
    Ok((answers, appends))
}

fn single_append(row: &ProcessingStateRow, events: Vec<NewEvent>) -> StreamAppend {
    StreamAppend {
        stream_id: StreamId::operation(row.operation_id),
        expected: ExpectedVersion::Exactly(row.version),
        events,
    }
}

fn state_after(rows: &WorkingSet, target_type: TargetType, operation_id: OperationId) -> Option<ProcessingStateRow> {
    match rows.get(&state_key(target_type, operation_id)) {
        Some(Row::ProcessingState(row)) => Some(row.clone()),
        _ => None,
    }
}

fn check_lease_ms(lease_ms: i64) -> Result<(), EngineError> {
    if lease_ms <= 0 || lease_ms > MAX_LEASE_MS {
        return Err(EngineError::invalid(format!(
            "a lease must be between 1 ms and {} days, not {lease_ms} ms",
            MAX_LEASE_MS / 86_400_000
        )));
    }
    Ok(())
}

impl<S: Store> Engine<S> {
    /// Requests a task kind on a target at the revision its inputs
    /// determine. The first request creates the task's operation; a request
    /// for the revision already requested is a no-op; another revision
    /// replaces the requested one atomically (a worker running the old one
    /// finishes it, and the task is then claimable for the new one).
    pub fn request_task<'a>(
        &'a self,
        context: &'a CommandContext,
        request: TaskRequest,
    ) -> opledger_store::BoxFuture<'a, Result<RequestOutcome, EngineError>> {
        // Boxed here, where the future's lifetimes are the caller's: an
        // unboxed one cannot be proven Send for every lifetime and could
        // not be spawned onto a runtime.
        Box::pin(self.request_task_now(context, request))
    }

    async fn request_task_now(
        &self,
        context: &CommandContext,
        request: TaskRequest,
    ) -> Result<RequestOutcome, EngineError> {
        self.request_tasks(context, vec![request])
            .await?
            .pop()
            .expect("one request gets one answer")
    }

    /// Requests many tasks in one transaction (a scheduler enqueueing a
    /// batch). Each request is checked and answered on its own: a refused
    /// one is its own error and does not stop the others. Two requests for
    /// the same kind on the same target in one batch must agree on the
    /// revision.
    pub fn request_tasks<'a>(
        &'a self,
        context: &'a CommandContext,
        requests: Vec<TaskRequest>,
    ) -> opledger_store::BoxFuture<'a, Result<Vec<Result<RequestOutcome, EngineError>>, EngineError>> {
        // Boxed here, where the future's lifetimes are the caller's: an
        // unboxed one cannot be proven Send for every lifetime and could
        // not be spawned onto a runtime.
        Box::pin(self.request_tasks_now(context, requests))
    }

    /// Checks each request's kind and target type and fixes the kind's
    /// current version and the id a new task would get.
    pub(crate) fn prepare_requests(&self, requests: Vec<TaskRequest>) -> Vec<PreparedRequest> {
        requests
            .into_iter()
            .map(|request| {
                let kind = task_kind(&request.kind)?;
                if kind.target != request.target.target_type() {
                    return Err(EngineError::invalid(format!(
                        "task kind {} runs on {} targets, not on a {}",
                        kind.name,
                        kind.target,
                        request.target.target_type()
                    )));
                }
                if !request.inputs.is_object() {
                    return Err(EngineError::invalid(format!(
                        "{} inputs must be a JSON object, not {}",
                        kind.name, request.inputs
                    )));
                }
                let version = self.task_version(kind.name).to_string();
                Ok((kind, version, request, OperationId(self.ids.next())))
            })
            .collect()
    }

    async fn request_tasks_now(
        &self,
        context: &CommandContext,
        requests: Vec<TaskRequest>,
    ) -> Result<Vec<Result<RequestOutcome, EngineError>>, EngineError> {
        let prepared = self.prepare_requests(requests);
        let stamp = self.stamp(context);
        self.store
            .write(move |tx: &mut S::Tx| {
                Box::pin(async move {
                    let mut rows = WorkingSet::default();
                    let (answers, appends) = request_in_tx(tx, &mut rows, prepared, &stamp).await?;
                    if !appends.is_empty() {
                        commit_appends(tx, &mut rows, appends).await?;
                    }
                    Ok::<_, EngineError>(answers)
                })
            })
            .await
    }

    /// Claims up to `limit` available tasks (claimable status, due now),
    /// highest priority first, then longest waiting. Each claim gets a fresh
    /// token bound to the requested revision and a lease; an empty answer
    /// means nothing is available.
    pub fn claim_tasks<'a>(
        &'a self,
        context: &'a CommandContext,
        request: ClaimRequest,
    ) -> opledger_store::BoxFuture<'a, Result<Vec<TaskClaim>, EngineError>> {
        // Boxed for the same reason as request_task: spawnable.
        Box::pin(self.claim_tasks_now(context, request))
    }

    async fn claim_tasks_now(
        &self,
        context: &CommandContext,
        request: ClaimRequest,
    ) -> Result<Vec<TaskClaim>, EngineError> {
        check_lease_ms(request.lease_ms)?;
        if request.limit == 0 || request.limit > MAX_CLAIM_BATCH {
            return Err(EngineError::invalid(format!(
                "a claim takes 1 to {MAX_CLAIM_BATCH} tasks, not {}",
                request.limit
            )));
        }
        if request.worker.trim().is_empty() {
            return Err(EngineError::invalid("a claim needs a worker name"));
        }
        for kind in &request.kinds {
            task_kind(kind)?;
        }
        let stamp = self.stamp(context);
        let now = stamp.recorded_at;
        let lease_expires_at = now.plus_millis(request.lease_ms);
        let ids = self.ids.clone();
        self.store
            .write(move |tx: &mut S::Tx| {
                Box::pin(async move {
                    let query = ClaimQuery {
                        kinds: request.kinds,
                        statuses: CLAIMABLE_STATUSES,
                        now,
                        limit: request.limit,
                    };
                    let candidates = tx.claimable(&query).await?;
                    let mut rows = WorkingSet::default();
                    let mut appends = Vec::with_capacity(candidates.len());
                    let mut claims = Vec::with_capacity(candidates.len());
                    for candidate in candidates {
                        let Row::ProcessingState(state) = candidate else {
                            continue;
                        };
                        // Defence in depth: a row the store offered but the
                        // domain would refuse is passed over, never allowed to
                        // fail the whole batch.
                        if !work::is_claimable(&state, now) {
                            continue;
                        }
                        let claim_token = ids.next().to_string();
                        let event = work::decide_claim(
                            &state,
                            claim_token.clone(),
                            request.worker.clone(),
                            now,
                            lease_expires_at,
                        )?;
                        let inputs: Value = serde_json::from_str(&state.inputs).map_err(|error| {
                            opledger_store::StoreError::corrupt(format!(
                                "inputs of task {} are not JSON: {error}",
                                state.operation_id
                            ))
                        })?;
                        tx.put_lease(&Lease {
                            claim_token: claim_token.clone(),
                            operation_id: state.operation_id,
                            worker: request.worker.clone(),
                            heartbeat_at: now,
                            lease_expires_at,
                            phase: None,
                            processed: None,
                            total: None,
                            progressed_at: None,
                            progress_unrecorded: false,
                        })
                        .await?;
                        claims.push(TaskClaim {
                            claim_token,
                            operation_id: state.operation_id,
                            media_id: state.media_id(),
                            region_id: state.region_id(),
                            task_kind: state.task_kind.clone(),
                            revision: state.requested_revision.clone(),
                            inputs,
                            lease_expires_at,
                            attempt: state.attempt_count + 1,
                        });
                        appends.push(single_append(&state, vec![stamp.event(event)]));
                        let key = state_key(state.target_type, state.operation_id);
                        let other = state_key(
                            match state.target_type {
                                TargetType::Media => TargetType::Region,
                                TargetType::Region => TargetType::Media,
                            },
                            state.operation_id,
                        );
                        rows.insert_loaded(key, Some(Row::ProcessingState(state)));
                        rows.insert_loaded(other, None);
                    }
                    // A region task's worker needs the item the region is on.
                    let region_keys: Vec<String> = claims
                        .iter()
                        .filter_map(|claim| claim.region_id.map(|region_id| region_id.to_string()))
                        .collect();
                    if !region_keys.is_empty() {
                        let regions = tx.load_rows(&REGIONS_TABLE, &region_keys).await?;
                        for row in regions {
                            if let Row::Region(region) = row {
                                for claim in claims
                                    .iter_mut()
                                    .filter(|claim| claim.region_id == Some(region.region_id))
                                {
                                    claim.media_id = Some(region.media_id);
                                }
                            }
                        }
                    }
                    if !appends.is_empty() {
                        commit_appends(tx, &mut rows, appends).await?;
                    }
                    Ok::<_, EngineError>(claims)
                })
            })
            .await
    }

    /// Extends a claim's lease (by `lease_ms`, or by the length of the lease
    /// the claim took) and tells the worker whether cancellation was
    /// requested. Liveness only: nothing is appended to the log.
    pub async fn heartbeat(&self, fence: &Fence, lease_ms: Option<i64>) -> Result<HeartbeatOutcome, EngineError> {
        if let Some(lease_ms) = lease_ms {
            check_lease_ms(lease_ms)?;
        }
        let now = self.clock.now();
        let fence = fence.clone();
        // A heartbeat writes the lease row only: liveness, not history.
        self.store
            .write_liveness(move |tx: &mut S::Tx| {
                Box::pin(async move {
                    let mut rows = WorkingSet::default();
                    let (state, mut lease) = load_claimed(tx, &mut rows, &fence).await?;
                    let granted = match (state.claimed_at, state.lease_expires_at) {
                        (Some(claimed_at), Some(expires)) => {
                            (expires.as_micros() - claimed_at.as_micros()).max(1_000) / 1_000
                        }
                        _ => 60_000,
                    };
                    let extended = now.plus_millis(lease_ms.unwrap_or(granted));
                    lease.heartbeat_at = now;
                    lease.lease_expires_at = lease.lease_expires_at.max(extended);
                    tx.put_lease(&lease).await?;
                    Ok::<_, EngineError>(HeartbeatOutcome {
                        lease_expires_at: lease.lease_expires_at,
                        cancel_requested: state.cancel_requested,
                    })
                })
            })
            .await
    }

    /// Whether `fence` still holds its task, read from a read connection
    /// without writing anything: the lease as it stands and whether a
    /// cancel was requested. A stale or unknown claim is a Conflict, as a
    /// heartbeat would answer. A worker about to publish an output whose
    /// lease has plenty of time left checks with this instead of a
    /// heartbeat (recovery only takes expired leases).
    pub async fn claim_standing(&self, fence: &Fence) -> Result<HeartbeatOutcome, EngineError> {
        let stale = || stale_claim(fence);
        let lease = self.store.lease(&fence.claim_token).await?.ok_or_else(stale)?;
        for target_type in [TargetType::Media, TargetType::Region] {
            let key = state_key(target_type, lease.operation_id);
            let found = self
                .store
                .load_rows(state_table(target_type), &[key.key.to_string()])
                .await?;
            if let Some(Row::ProcessingState(state)) = found.into_iter().next() {
                work::check_fence(&state, fence)?;
                return Ok(HeartbeatOutcome {
                    lease_expires_at: lease.lease_expires_at,
                    cancel_requested: state.cancel_requested,
                });
            }
        }
        Err(stale())
    }

    /// The engine clock's time now.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Records progress of a claimed task. A new phase is an event on the
    /// timeline; counters within a phase are liveness (the lease row), and
    /// the last counters become an event when the task finishes. Workers
    /// throttle their reports (the runtime sends about every 250 ms).
    pub fn report_progress<'a>(
        &'a self,
        context: &'a CommandContext,
        fence: &'a Fence,
        progress: Progress,
    ) -> opledger_store::BoxFuture<'a, Result<(), EngineError>> {
        // Boxed here, where the future's lifetimes are the caller's: an
        // unboxed one cannot be proven Send for every lifetime and could
        // not be spawned onto a runtime.
        Box::pin(self.report_progress_now(context, fence, progress))
    }

    async fn report_progress_now(
        &self,
        context: &CommandContext,
        fence: &Fence,
        progress: Progress,
    ) -> Result<(), EngineError> {
        if progress.phase.trim().is_empty() {
            return Err(EngineError::invalid("progress needs a phase"));
        }
        if progress.processed < 0 || progress.total.is_some_and(|total| total < 0) {
            return Err(EngineError::invalid("progress counts cannot be negative"));
        }
        if let Some(total) = progress.total {
            if progress.processed > total {
                return Err(EngineError::invalid(format!(
                    "processed ({}) cannot exceed total ({total})",
                    progress.processed
                )));
            }
        }
        let stamp = self.stamp(context);
        let fence = fence.clone();
        self.store
            .write(move |tx: &mut S::Tx| {
                Box::pin(async move {
                    let mut rows = WorkingSet::default();
                    let (state, mut lease) = load_claimed(tx, &mut rows, &fence).await?;
                    let new_phase = lease.phase.as_deref() != Some(progress.phase.as_str());
                    lease.phase = Some(progress.phase.clone());
                    lease.processed = Some(progress.processed);
                    lease.total = progress.total;
                    lease.progressed_at = Some(stamp.recorded_at);
                    lease.progress_unrecorded = !new_phase;
                    tx.put_lease(&lease).await?;
                    if new_phase {
                        let event = Event::OperationProgressed(OperationProgressed {
                            operation_id: state.operation_id,
                            phase: progress.phase,
                            processed: progress.processed,
                            total: progress.total,
                        });
                        commit_appends(tx, &mut rows, vec![single_append(&state, vec![stamp.event(event)])]).await?;
                    }
                    Ok::<_, EngineError>(())
                })
            })
            .await
    }

    /// Records a worker's completion (fenced). The final progress counters,
    /// if not yet on the timeline, are recorded first.
    pub fn complete_task<'a>(
        &'a self,
        context: &'a CommandContext,
        fence: &'a Fence,
        completion: Completion,
    ) -> opledger_store::BoxFuture<'a, Result<TaskOutcome, EngineError>> {
        // Boxed here, where the future's lifetimes are the caller's: an
        // unboxed one cannot be proven Send for every lifetime and could
        // not be spawned onto a runtime.
        Box::pin(self.complete_task_now(context, fence, completion))
    }

    async fn complete_task_now(
        &self,
        context: &CommandContext,
        fence: &Fence,
        completion: Completion,
    ) -> Result<TaskOutcome, EngineError> {
        let stamp = self.stamp(context);
        let fence = fence.clone();
        self.finish(fence.clone(), stamp, move |state| {
            work::decide_complete(state, &fence, completion)
        })
        .await
    }

    /// Records many completions in one transaction (a worker that finished
    /// a batch of claims). Each is fenced and answered on its own; a stale
    /// one is its own Conflict and does not stop the others.
    pub fn complete_tasks<'a>(
        &'a self,
        context: &'a CommandContext,
        completions: Vec<(Fence, Completion)>,
    ) -> opledger_store::BoxFuture<'a, Result<Vec<Result<TaskOutcome, EngineError>>, EngineError>> {
        // Boxed here, where the future's lifetimes are the caller's: an
        // unboxed one cannot be proven Send for every lifetime and could
        // not be spawned onto a runtime.
        Box::pin(self.complete_tasks_now(context, completions))
    }

    async fn complete_tasks_now(
        &self,
        context: &CommandContext,
        completions: Vec<(Fence, Completion)>,
    ) -> Result<Vec<Result<TaskOutcome, EngineError>>, EngineError> {
        let stamp = self.stamp(context);
        let reports = completions
            .into_iter()
            .map(|(fence, completion)| {
                let decision_fence = fence.clone();
                let decide: Decision = Box::new(move |state: &ProcessingStateRow| {
                    work::decide_complete(state, &decision_fence, completion)
                });
                (fence, stamp.clone(), decide)
            })
            .collect();
        self.finish_many(reports).await
    }

    /// Records many workers' outcomes — completions and failures, each
    /// with its own actor and correlation — in one transaction. Each is
    /// fenced, decided and answered exactly as [`Engine::complete_task`] or
    /// [`Engine::fail_task`] would; a stale one is its own Conflict and does
    /// not stop the others. A worker pool sends the outcomes that queued
    /// while its previous report was being written, so a busy pool pays one
    /// command's fixed cost per batch instead of per task.
    pub fn report_outcomes<'a>(
        &'a self,
        reports: Vec<OutcomeReport>,
    ) -> opledger_store::BoxFuture<'a, Result<Vec<Result<TaskOutcome, EngineError>>, EngineError>> {
        Box::pin(self.report_outcomes_now(reports))
    }

    async fn report_outcomes_now(
        &self,
        reports: Vec<OutcomeReport>,
    ) -> Result<Vec<Result<TaskOutcome, EngineError>>, EngineError> {
        let mut decisions = Vec::with_capacity(reports.len());
        for report in reports {
            let stamp = self.stamp(&report.context);
            let now = stamp.recorded_at;
            let fence = report.fence.clone();
            let decide: Decision = match report.outcome {
                ClaimOutcome::Complete(completion) => {
                    Box::new(move |state: &ProcessingStateRow| work::decide_complete(state, &fence, completion))
                }
                ClaimOutcome::Fail { error, terminal } => {
                    let jitter_draw = self.jitter.draw();
                    Box::new(move |state: &ProcessingStateRow| {
                        let policy = task_kind(&state.task_kind)?.policy;
                        work::decide_fail(state, &fence, &error, terminal, &policy, now, jitter_draw)
                    })
                }
            };
            decisions.push((report.fence, stamp, decide));
        }
        self.finish_many(decisions).await
    }

    /// Records a worker's failure (fenced): retried with backoff and
    /// recorded jitter while attempts remain, else final.
    pub fn fail_task<'a>(
        &'a self,
        context: &'a CommandContext,
        fence: &'a Fence,
        error: &'a str,
        terminal: bool,
    ) -> opledger_store::BoxFuture<'a, Result<TaskOutcome, EngineError>> {
        // Boxed here, where the future's lifetimes are the caller's: an
        // unboxed one cannot be proven Send for every lifetime and could
        // not be spawned onto a runtime.
        Box::pin(self.fail_task_now(context, fence, error, terminal))
    }

    async fn fail_task_now(
        &self,
        context: &CommandContext,
        fence: &Fence,
        error: &str,
        terminal: bool,
    ) -> Result<TaskOutcome, EngineError> {
        let stamp = self.stamp(context);
        let now = stamp.recorded_at;
        let jitter_draw = self.jitter.draw();
        let (fence_for_decision, error) = (fence.clone(), error.to_string());
        self.finish(fence.clone(), stamp, move |state| {
            let policy = task_kind(&state.task_kind)?.policy;
            work::decide_fail(state, &fence_for_decision, &error, terminal, &policy, now, jitter_draw)
        })
        .await
    }

    /// The worker stopped after a cancel request and removed its temporary
    /// outputs: the task is `cancelled` now.
    pub fn acknowledge_cancel<'a>(
        &'a self,
        context: &'a CommandContext,
        fence: &'a Fence,
    ) -> opledger_store::BoxFuture<'a, Result<TaskOutcome, EngineError>> {
        // Boxed here, where the future's lifetimes are the caller's: an
        // unboxed one cannot be proven Send for every lifetime and could
        // not be spawned onto a runtime.
        Box::pin(self.acknowledge_cancel_now(context, fence))
    }

    async fn acknowledge_cancel_now(
        &self,
        context: &CommandContext,
        fence: &Fence,
    ) -> Result<TaskOutcome, EngineError> {
        let stamp = self.stamp(context);
        let fence = fence.clone();
        self.finish(fence.clone(), stamp, move |state| {
            work::decide_acknowledge_cancel(state, &fence).map(|event| vec![event])
        })
        .await
    }

    /// Ends a claim with the events `decide` returns, in one transaction:
    /// unrecorded final counters first, then the outcome; the lease row goes.
    async fn finish<D>(
        &self,
        fence: Fence,
        stamp: crate::commands::Stamp,
        decide: D,
    ) -> Result<TaskOutcome, EngineError>
    where
        D: FnOnce(&ProcessingStateRow) -> Result<Vec<Event>, opledger_domain::DomainError> + Send + 'static,
    {
        let mut outcomes = self.finish_many(vec![(fence, stamp, Box::new(decide))]).await?;
        outcomes.pop().expect("one report gets one answer")
    }

    /// Ends many claims in one transaction. Each report succeeds or fails on
    /// its own (a stale token is that report's Conflict); the accepted ones
    /// are appended and folded together.
    async fn finish_many(
        &self,
        reports: Vec<(Fence, crate::commands::Stamp, Decision)>,
    ) -> Result<Vec<Result<TaskOutcome, EngineError>>, EngineError> {
        self.store
            .write(move |tx: &mut S::Tx| {
                Box::pin(async move {
                    let mut rows = WorkingSet::default();
                    let tokens: Vec<String> = reports.iter().map(|(fence, _, _)| fence.claim_token.clone()).collect();
                    let leases = tx.leases(&tokens).await?;
                    let operation_ids: Vec<OperationId> = leases.iter().map(|lease| lease.operation_id).collect();
                    load_states(tx, &mut rows, &operation_ids).await?;
                    let mut answers: Vec<Result<OperationId, EngineError>> = Vec::with_capacity(reports.len());
                    let mut appends = Vec::new();
                    let mut touched: Vec<OperationId> = Vec::new();
                    for (fence, stamp, decide) in reports {
                        let decided = (|| {
                            let stale = || stale_claim(&fence);
                            let lease = leases
                                .iter()
                                .find(|lease| lease.claim_token == fence.claim_token)
                                .ok_or_else(stale)?;
                            let state = [TargetType::Media, TargetType::Region]
                                .into_iter()
                                .find_map(|target_type| state_after(&rows, target_type, lease.operation_id))
                                .ok_or_else(stale)?;
                            if touched.contains(&state.operation_id) {
                                return Err(EngineError::Domain(opledger_domain::DomainError::Conflict(format!(
                                    "claim {} is reported twice in one batch",
                                    fence.claim_token
                                ))));
                            }
                            work::check_fence(&state, &fence)?;
                            let outcome_events = decide(&state)?;
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
                                appends.push(single_append(&state, events));
                                answers.push(Ok(state.operation_id));
                            }
                            Err(error) => answers.push(Err(error)),
                        }
                    }
                    if !appends.is_empty() {
                        commit_appends(tx, &mut rows, appends).await?;
                    }
                    Ok::<_, EngineError>(
                        answers
                            .into_iter()
                            .map(|answer| {
                                let operation_id = answer?;
                                [TargetType::Media, TargetType::Region]
                                    .into_iter()
                                    .find_map(|target_type| state_after(&rows, target_type, operation_id))
                                    .map(|after| TaskOutcome::of(&after))
                                    .ok_or_else(|| EngineError::not_found("task", operation_id))
                            })
                            .collect(),
                    )
                })
            })
            .await
    }

    /// Cancels a task: at once when no worker holds it; otherwise the
    /// request is recorded and the worker sees it at its next heartbeat.
    pub fn cancel_task<'a>(
        &'a self,
        context: &'a CommandContext,
        operation_id: OperationId,
        reason: &'a str,
    ) -> opledger_store::BoxFuture<'a, Result<TaskOutcome, EngineError>> {
        // Boxed here, where the future's lifetimes are the caller's: an
        // unboxed one cannot be proven Send for every lifetime and could
        // not be spawned onto a runtime.
        Box::pin(self.cancel_task_now(context, operation_id, reason))
    }

    async fn cancel_task_now(
        &self,
        context: &CommandContext,
        operation_id: OperationId,
        reason: &str,
    ) -> Result<TaskOutcome, EngineError> {
        let stamp = self.stamp(context);
        let reason = reason.to_string();
        self.store
            .write(move |tx: &mut S::Tx| {
                Box::pin(async move {
                    let mut rows = WorkingSet::default();
                    let state = load_state(tx, &mut rows, operation_id)
                        .await?
                        .ok_or_else(|| EngineError::not_found("task", operation_id))?;
                    let events = work::decide_cancel(&state, &reason)?;
                    if events.is_empty() {
                        return Ok(TaskOutcome::of(&state));
                    }
                    let events = events.into_iter().map(|event| stamp.event(event)).collect();
                    commit_appends(tx, &mut rows, vec![single_append(&state, events)]).await?;
                    let after = state_after(&rows, state.target_type, operation_id)
                        .ok_or_else(|| EngineError::not_found("task", operation_id))?;
                    Ok::<_, EngineError>(TaskOutcome::of(&after))
                })
            })
            .await
    }

    /// One recovery pass: every claim whose lease expired is interrupted,
    /// then requeued, cancelled or failed per its kind's policy. Run at
    /// startup before any worker, then periodically.
    pub async fn recover(&self, context: &CommandContext) -> Result<RecoveryReport, EngineError> {
        self.recover_with(context, None).await
    }

    /// [`Engine::recover`] with a hook run between the read of expired
    /// claims and the write that interrupts them. Each candidate is checked
    /// again inside the write: a claim completed, failed or extended in the
    /// gap is left alone, so recovery never undoes a completion.
    pub async fn recover_with(
        &self,
        context: &CommandContext,
        hook: Option<&RecoveryHook>,
    ) -> Result<RecoveryReport, EngineError> {
        let mut report = RecoveryReport::default();
        let now = self.clock.now();
        let mut seen: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        loop {
            let candidates: Vec<ExpiredClaim> = self
                .store
                .expired_claims(now, RECOVERY_BATCH)
                .await?
                .into_iter()
                .filter(|candidate| !seen.contains(&candidate.claim_token))
                .collect();
            if candidates.is_empty() {
                return Ok(report);
            }
            seen.extend(candidates.iter().map(|candidate| candidate.claim_token.clone()));
            if let Some(hook) = hook {
                hook(candidates.clone()).await;
            }
            let stamp = self.stamp(context);
            let batch = self
                .store
                .write(move |tx: &mut S::Tx| {
                    Box::pin(async move {
                        let mut rows = WorkingSet::default();
                        let mut batch = RecoveryReport::default();
                        let mut appends = Vec::new();
                        for candidate in candidates {
                            let state = load_state(tx, &mut rows, candidate.operation_id).await?;
                            let Some(state) = state
                                .filter(|state| state.claim_token.as_deref() == Some(candidate.claim_token.as_str()))
                            else {
                                batch.skipped += 1;
                                continue;
                            };
                            let lease = tx.lease(&candidate.claim_token).await?;
                            let ends = match (&lease, state.lease_expires_at) {
                                (Some(lease), Some(granted)) => lease.lease_expires_at.max(granted),
                                (None, Some(granted)) => granted,
                                (Some(lease), None) => lease.lease_expires_at,
                                (None, None) => now,
                            };
                            if ends >= now {
                                batch.skipped += 1;
                                continue;
                            }
                            let policy = task_kind(&state.task_kind)?.policy;
                            let events = work::decide_interrupt(&state, &policy, ends)?;
                            batch.interrupted += 1;
                            match events.last() {
                                Some(Event::OperationRequeued(_)) => batch.requeued += 1,
                                Some(Event::OperationCancelled(_)) => batch.cancelled += 1,
                                _ => batch.failed += 1,
                            }
                            tx.delete_lease(&candidate.claim_token).await?;
                            let events = events.into_iter().map(|event| stamp.event(event)).collect();
                            appends.push(single_append(&state, events));
                        }
                        if !appends.is_empty() {
                            commit_appends(tx, &mut rows, appends).await?;
                        }
                        Ok::<_, EngineError>(batch)
                    })
                })
                .await?;
            report.interrupted += batch.interrupted;
            report.requeued += batch.requeued;
            report.cancelled += batch.cancelled;
            report.failed += batch.failed;
            report.skipped += batch.skipped;
        }
    }

    /// The processing state of `kind` on `target`, with its claim's
    /// liveness, from a read connection.
    pub async fn task_state(&self, target: TaskTarget, kind: &str) -> Result<Option<TaskView>, EngineError> {
        let kind = task_kind(kind)?;
        if kind.target != target.target_type() {
            return Err(EngineError::invalid(format!(
                "task kind {} runs on {} targets, not on a {}",
                kind.name,
                kind.target,
                target.target_type()
            )));
        }
        let target_column = match target {
            TaskTarget::Media(_) => "media_id",
            TaskTarget::Region(_) => "region_id",
        };
        let found = self
            .store
            .find_rows(
                state_table(kind.target),
                &[
                    (target_column, Cell::Uuid(target.id())),
                    ("task_kind", Cell::Text(kind.name.to_string())),
                ],
                1,
            )
            .await?;
        let Some(Row::ProcessingState(state)) = found.into_iter().next() else {
            return Ok(None);
        };
        self.view(state).await.map(Some)
    }

    /// The processing state of a task operation, from a read connection.
    pub async fn task_by_operation(&self, operation_id: OperationId) -> Result<Option<TaskView>, EngineError> {
        for target_type in [TargetType::Media, TargetType::Region] {
            let key = state_key(target_type, operation_id);
            let found = self
                .store
                .load_rows(state_table(target_type), &[key.key.to_string()])
                .await?;
            if let Some(Row::ProcessingState(state)) = found.into_iter().next() {
                return self.view(state).await.map(Some);
            }
        }
        Ok(None)
    }

    async fn view(&self, state: ProcessingStateRow) -> Result<TaskView, EngineError> {
        let lease = match &state.claim_token {
            Some(token) => self.store.lease(token).await?,
            None => None,
        };
        Ok(TaskView { state, lease })
    }
}

/// A request's item, its region (for region kinds), and the inputs they
/// provide.
type TargetValues = (MediaId, Option<RegionId>, Map<String, Value>);

/// What a request's target contributes to its inputs: the media item's
/// digest; for a region also its box and revision. NotFound for a target
/// the batch's reads did not find.
fn target_values_of(
    target: TaskTarget,
    media: &BTreeMap<MediaId, MediaRow>,
    regions: &BTreeMap<RegionId, RegionRow>,
) -> Result<TargetValues, EngineError> {
    let mut values = Map::new();
    let (media_id, region_id) = match target {
        TaskTarget::Media(media_id) => (media_id, None),
        TaskTarget::Region(region_id) => {
            let region = regions
                .get(&region_id)
                .ok_or_else(|| EngineError::not_found("region", region_id))?;
            values.insert(
                "bbox".to_string(),
                serde_json::json!({"x": region.x, "y": region.y, "width": region.width, "height": region.height}),
            );
            values.insert("region_revision".to_string(), Value::from(region.region_revision));
            (region.media_id, Some(region_id))
        }
    };
    let item = media
        .get(&media_id)
        .ok_or_else(|| EngineError::not_found("media", media_id))?;
    if let Some(digest) = &item.content_digest {
        values.insert("content_digest".to_string(), Value::String(digest.clone()));
    }
    Ok((media_id, region_id, values))
}

/// The appends that cancel every unfinished task of a target about to be
/// removed (a media item with its regions, or one region), and the removal
/// of their lease rows: a worker holding one finds its claim lost at its
/// next heartbeat and stops without reporting.
pub(crate) async fn cancel_tasks_of_removed_target<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    media_id: MediaId,
    region_id: Option<RegionId>,
    stamp: &crate::commands::Stamp,
    reason: &str,
) -> Result<Vec<StreamAppend>, EngineError> {
    let mut states = Vec::new();
    let region_ids: Vec<Cell> = match region_id {
        Some(region_id) => vec![Cell::Uuid(region_id.0)],
        None => {
            states.extend(
                tx.find_rows_in(state_table(TargetType::Media), "media_id", &[Cell::Uuid(media_id.0)])
                    .await?,
            );
            tx.find_rows_in(&REGIONS_TABLE, "media_id", &[Cell::Uuid(media_id.0)])
                .await?
                .into_iter()
                .filter_map(|row| match row {
                    Row::Region(region) => Some(Cell::Uuid(region.region_id.0)),
                    _ => None,
                })
                .collect()
        }
    };
    if !region_ids.is_empty() {
        states.extend(
            tx.find_rows_in(state_table(TargetType::Region), "region_id", &region_ids)
                .await?,
        );
    }
    let mut appends = Vec::new();
    for row in states {
        let Row::ProcessingState(state) = row else {
            continue;
        };
        rows.insert_loaded(
            state_key(state.target_type, state.operation_id),
            Some(Row::ProcessingState(state.clone())),
        );
        if state.status.is_terminal() {
            continue;
        }
        if let Some(token) = &state.claim_token {
            tx.delete_lease(token).await?;
        }
        let event = Event::OperationCancelled(opledger_domain::events::OperationReason {
            operation_id: state.operation_id,
            reason: reason.to_string(),
        });
        appends.push(single_append(&state, vec![stamp.event(event)]));
    }
    Ok(appends)
}
