//! Taking work and holding it: a claim takes up to a batch of available
//! tasks, each with a fresh token and a lease; while it runs, the worker
//! heartbeats (liveness: the lease row only), reports progress (a new phase
//! is an event), and may ask, without writing, whether its claim still
//! stands.

use super::{load_claimed, stale_claim, state_append};
use crate::error::EngineError;
use crate::idempotency::RequestId;
use crate::load::{all_kinds, load_kinds, undeclared};
use crate::tx::{command_time, spawnable, CommandContext, Decided};
use crate::Engine;
use opledger_domain::events::{Event, OperationClaimed};
use opledger_domain::projections::{state_locations, ProcessingStateRow, Row, WorkingSet, MEDIA_TABLE, REGIONS_TABLE};
use opledger_domain::tasks::CLAIMABLE_STATUSES;
use opledger_domain::versions::check_stated_versions;
use opledger_domain::work::{self, Fence};
use opledger_domain::{LeaseMs, MediaId, OperationId, RegionId, Timestamp};
use opledger_store::{BoxFuture, ClaimQuery, Lease, Store, StoreError, WriteTx};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Whom a heartbeat's request id is recorded for: a heartbeat is fenced by
/// its claim token, not its caller, so the token (in the fingerprint)
/// names it.
const HEARTBEAT_ACTOR: &str = "heartbeat";

/// The most tasks one claim call may take.
pub const MAX_CLAIM_BATCH: usize = 1_000;

/// A batch claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// Task kinds to take; empty takes any.
    pub kinds: Vec<String>,
    pub worker: String,
    pub lease_ms: i64,
    /// How many tasks to take at most (1 ..= [`MAX_CLAIM_BATCH`]).
    pub limit: usize,
    /// The authenticated principal taking the claims, where callers are
    /// told apart (the HTTP service): kept with each lease, so that a
    /// report can be refused to anyone else. `None` on the CLI.
    pub principal: Option<String>,
    /// The versions of each kind the worker's code implements: it is
    /// offered only tasks requested at one of them. A kind without an
    /// entry is offered at any version (the unsafe legacy mode: old code
    /// may then run work requested for a newer version).
    pub versions: BTreeMap<String, BTreeSet<String>>,
}

/// One claimed task, everything a worker needs to run it and report back.
/// (Serialized only as the answer recorded under a claim's request id.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskClaim {
    pub claim_token: String,
    pub operation_id: OperationId,
    /// The media item: the target, or the item a target region is on.
    pub media_id: Option<MediaId>,
    pub region_id: Option<RegionId>,
    pub task_kind: String,
    /// The version of the kind the revision was requested at: the version
    /// the worker must run (`None` for a task recorded before versions).
    #[serde(default)]
    pub kind_version: Option<String>,
    pub revision: String,
    pub inputs: Value,
    pub lease_expires_at: Timestamp,
    /// 1 for the first claim of this revision.
    pub attempt: i64,
    /// Where the media item's file is, what kind of media it is, and its
    /// content digest when registered: what a worker in any language needs
    /// to open the file.
    pub path: Option<String>,
    pub media_kind: Option<String>,
    pub content_digest: Option<String>,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

impl<S: Store> Engine<S> {
    /// Claims up to `limit` available tasks (claimable status, due now),
    /// highest priority first, then longest waiting. Each claim gets a fresh
    /// token bound to the requested revision and a lease; an empty answer
    /// means nothing is available.
    pub fn claim_tasks<'a>(
        &'a self,
        context: &'a CommandContext,
        request: ClaimRequest,
    ) -> BoxFuture<'a, Result<Vec<TaskClaim>, EngineError>> {
        spawnable(async move {
            let lease = LeaseMs::new(request.lease_ms)?;
            if request.limit == 0 || request.limit > MAX_CLAIM_BATCH {
                return Err(EngineError::invalid(format!(
                    "a claim takes 1 to {MAX_CLAIM_BATCH} tasks, not {}",
                    request.limit
                )));
            }
            work::check_worker_name(&request.worker)?;
            check_stated_versions(&request.kinds, &request.versions)?;
            let once = context.once(
                "task.claim",
                json!({
                    "kinds": request.kinds,
                    "versions": request.versions,
                    "worker": request.worker,
                    "lease_ms": request.lease_ms,
                    "limit": request.limit,
                }),
            );
            let stamp = self.stamp(context);
            let ids = self.ids.clone();
            self.stamped_once(once, stamp, move |tx, rows, stamp| {
                Box::pin(async move {
                    // The command's time, read under the write lock: what is
                    // due and when the lease ends follow the log's clock,
                    // not this host's.
                    let now = stamp.recorded_at;
                    let lease_expires_at = lease.ends_at(now);
                    // Only the kinds asked for are read: a claim costs the
                    // same however many kinds the catalogue holds.
                    let asked = load_kinds(tx, rows, request.kinds.iter().map(String::as_str)).await?;
                    if let Some(unknown) = request
                        .kinds
                        .iter()
                        .find(|kind| !asked.get(*kind).is_some_and(|row| row.declared))
                    {
                        return Err(undeclared(unknown, &all_kinds(tx).await?));
                    }
                    let query = ClaimQuery {
                        kinds: request.kinds,
                        versions: request.versions,
                        statuses: CLAIMABLE_STATUSES,
                        now,
                        limit: request.limit,
                    };
                    let offered = tx.claimable(&query).await?.into_iter().filter_map(|row| match row {
                        Row::ProcessingState(state) => Some(state),
                        _ => None,
                    });
                    let tokens = std::iter::repeat_with(|| ids.next().to_string());
                    let decided =
                        work::decide_claims(offered.collect(), tokens, &request.worker, now, lease_expires_at)?;
                    let mut appends = Vec::with_capacity(decided.len());
                    let mut claims = Vec::with_capacity(decided.len());
                    for (state, claimed) in decided {
                        tx.put_lease(&taken_lease(&claimed, now, request.principal.clone()))
                            .await?;
                        claims.push(TaskClaim::of(&state, &claimed)?);
                        appends.push(state_append(
                            &state,
                            vec![stamp.event(Event::OperationClaimed(claimed))],
                        ));
                        held_row(rows, state);
                    }
                    locate_claims(tx, &mut claims).await?;
                    Ok(Decided::answer(claims, appends))
                })
            })
            .await
        })
    }

    /// Extends a claim's lease (by `lease_ms`, or by the length of the lease
    /// the claim took) and tells the worker whether cancellation was
    /// requested. Liveness only: nothing is appended to the log.
    pub async fn heartbeat(&self, fence: &Fence, lease_ms: Option<i64>) -> Result<HeartbeatOutcome, EngineError> {
        self.heartbeat_once(None, fence, lease_ms).await
    }

    /// [`Engine::heartbeat`] under a request id: a retry with the same id
    /// answers the first heartbeat's outcome and extends nothing again.
    pub async fn heartbeat_once(
        &self,
        request_id: Option<&RequestId>,
        fence: &Fence,
        lease_ms: Option<i64>,
    ) -> Result<HeartbeatOutcome, EngineError> {
        let lease_ms_asked = lease_ms;
        let lease_ms = lease_ms.map(LeaseMs::new).transpose()?;
        let proposed = self.clock.now();
        let source = self.time_source();
        let fence = fence.clone();
        let once = request_id.and_then(|request_id| {
            let context = CommandContext::actor(HEARTBEAT_ACTOR).with_request_id(request_id.clone());
            context.once(
                "task.heartbeat",
                json!({"claim_token": fence.claim_token, "revision": fence.revision, "lease_ms": lease_ms_asked}),
            )
        });
        // A heartbeat writes the lease row only: liveness, not history.
        self.liveness_command_once(once, move |tx, rows| {
            Box::pin(async move {
                let now = command_time(tx, proposed, source).await?;
                let (state, mut lease) = load_claimed(tx, rows, &fence).await?;
                lease.lease_expires_at = work::decide_heartbeat(&state, &fence, now, lease_ms, lease.lease_expires_at)?;
                lease.heartbeat_at = now;
                tx.put_lease(&lease).await?;
                let outcome = HeartbeatOutcome {
                    lease_expires_at: lease.lease_expires_at,
                    cancel_requested: state.cancel_requested,
                };
                Ok(Decided::answer(outcome, Vec::new()))
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
        let state = self.read_state(lease.operation_id).await?.ok_or_else(stale)?;
        work::check_fence(&state, fence)?;
        Ok(HeartbeatOutcome {
            lease_expires_at: lease.lease_expires_at,
            cancel_requested: state.cancel_requested,
        })
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
    ) -> BoxFuture<'a, Result<(), EngineError>> {
        spawnable(async move {
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
            let once = context.once(
                "task.progress",
                json!({
                    "claim_token": fence.claim_token,
                    "revision": fence.revision,
                    "phase": progress.phase,
                    "processed": progress.processed,
                    "total": progress.total,
                }),
            );
            let stamp = self.stamp(context);
            let fence = fence.clone();
            self.stamped_once(once, stamp, move |tx, rows, stamp| {
                Box::pin(async move {
                    let (state, mut lease) = load_claimed(tx, rows, &fence).await?;
                    let Progress {
                        phase,
                        processed,
                        total,
                    } = progress;
                    let event =
                        work::decide_progress(&state, &fence, lease.phase.as_deref(), &phase, processed, total)?;
                    lease.phase = Some(phase);
                    lease.processed = Some(processed);
                    lease.total = total;
                    lease.progressed_at = Some(stamp.recorded_at);
                    lease.progress_unrecorded = event.is_none();
                    tx.put_lease(&lease).await?;
                    let appends = event
                        .map(|event| state_append(&state, vec![stamp.event(event)]))
                        .into_iter()
                        .collect();
                    Ok(Decided::answer((), appends))
                })
            })
            .await
        })
    }
}

impl TaskClaim {
    /// The answer to a claim the domain decided on `state`, without where
    /// its item is ([`locate_claims`] fills that in).
    fn of(state: &ProcessingStateRow, claimed: &OperationClaimed) -> Result<Self, EngineError> {
        let inputs: Value = serde_json::from_str(&state.inputs).map_err(|error| {
            StoreError::corrupt(format!("inputs of task {} are not JSON: {error}", state.operation_id))
        })?;
        Ok(TaskClaim {
            claim_token: claimed.claim_token.clone(),
            operation_id: state.operation_id,
            media_id: state.media_id(),
            region_id: state.region_id(),
            task_kind: state.task_kind.clone(),
            kind_version: state.task_version.clone(),
            revision: state.requested_revision.clone(),
            inputs,
            lease_expires_at: claimed.lease_expires_at,
            attempt: state.attempt_count + 1,
            path: None,
            media_kind: None,
            content_digest: None,
        })
    }
}

/// The lease row of a claim just taken: liveness starts now.
fn taken_lease(claimed: &OperationClaimed, now: Timestamp, principal: Option<String>) -> Lease {
    Lease {
        claim_token: claimed.claim_token.clone(),
        operation_id: claimed.operation_id,
        worker: claimed.worker.clone(),
        heartbeat_at: now,
        lease_expires_at: claimed.lease_expires_at,
        phase: None,
        processed: None,
        total: None,
        progressed_at: None,
        progress_unrecorded: false,
        principal,
    }
}

/// Puts a claimed task's row in the working set for the fold, which then
/// knows it is in no other table.
fn held_row(rows: &mut WorkingSet, state: ProcessingStateRow) {
    let [(first_table, first), (_, second)] = state_locations(state.operation_id);
    let (own, other) = if first_table.name == state.table().name {
        (first, second)
    } else {
        (second, first)
    };
    rows.insert_loaded(own, Some(Row::ProcessingState(state)));
    rows.insert_loaded(other, None);
}

/// Fills in where each claim's item is: a region task's item is the one
/// the region is on, and every worker needs the item's file, media kind
/// and digest.
async fn locate_claims<T: WriteTx>(tx: &mut T, claims: &mut [TaskClaim]) -> Result<(), EngineError> {
    let region_keys: Vec<String> = claims
        .iter()
        .filter_map(|claim| claim.region_id.map(|region_id| region_id.to_string()))
        .collect();
    if !region_keys.is_empty() {
        for row in tx.load_rows(&REGIONS_TABLE, &region_keys).await? {
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
    let media_keys: Vec<String> = claims
        .iter()
        .filter_map(|claim| claim.media_id.map(|media_id| media_id.to_string()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if !media_keys.is_empty() {
        for row in tx.load_rows(&MEDIA_TABLE, &media_keys).await? {
            if let Row::Media(item) = row {
                for claim in claims.iter_mut().filter(|claim| claim.media_id == Some(item.media_id)) {
                    claim.path = Some(item.path.clone());
                    claim.media_kind = Some(item.media_kind.clone());
                    claim.content_digest = item.content_digest.clone();
                }
            }
        }
    }
    Ok(())
}
