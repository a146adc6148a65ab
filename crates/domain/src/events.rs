//! The typed events of the log and their wire form.
//!
//! In the log an event is two columns: `event_type` (the tag) and `payload`
//! (the variant's fields as JSON), plus `schema_version`. [`Event`] is also
//! serde-internally-tagged (`{"type": "media_registered", ...}`) for fixtures
//! and exports. Decoding dispatches on the tag and deserializes the one
//! payload struct directly, which is much cheaper than serde's buffered
//! internally-tagged path; replay decodes every event, so that matters.
//!
//! Old schema versions stay readable: [`upcast`] lifts a payload written at an
//! older version to the current one before it is decoded.

use crate::error::DecodeError;
use crate::ids::{BatchId, MediaId, OperationId, RegionId};
use crate::kinds::{BlockedOn, KindChange, KindDeclaration, TaskFacts};
use crate::status::{IngestionStage, OperationStatus};
use crate::time::Timestamp;
use crate::transitions::Cause;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What an operation works on. File ingestions start with only a path; media
/// tasks name a media item; region tasks name a region.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OperationTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_id: Option<MediaId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_id: Option<RegionId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// A pixel rectangle inside a media item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundingBox {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MediaRegistered {
    pub media_id: MediaId,
    pub path: String,
    pub media_kind: String,
    #[serde(default)]
    pub content_digest: Option<String>,
    #[serde(default)]
    pub byte_size: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MediaUpdated {
    pub media_id: MediaId,
    pub path: String,
    #[serde(default)]
    pub content_digest: Option<String>,
    #[serde(default)]
    pub byte_size: Option<i64>,
    /// The item's new media kind, when its new content is of another kind
    /// (a photo replaced by a video under the same name); `None`: the kind
    /// is unchanged. Optional and additive: events written before it
    /// existed read as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_kind: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MediaRemoved {
    pub media_id: MediaId,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegionAdded {
    pub region_id: RegionId,
    pub media_id: MediaId,
    pub bbox: BoundingBox,
    pub region_revision: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegionRemoved {
    pub region_id: RegionId,
    pub media_id: MediaId,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationCreated {
    pub operation_id: OperationId,
    /// The task kind, e.g. `ingestion.file`, `metadata`, `thumbnail`.
    pub kind: String,
    pub target: OperationTarget,
    #[serde(default)]
    pub revision: Option<String>,
    #[serde(default)]
    pub inputs: Value,
    /// The initial status: one of [`crate::transitions::INITIAL_STATUSES`].
    pub status: OperationStatus,
    /// Higher runs first. Added in schema version 2 (version 1 had none,
    /// which the upcaster reads as 0).
    pub priority: i32,
    /// The version of the task kind the revision was computed with (its
    /// implementation / model version), so capability states know what
    /// produced a result. Optional and additive: events written before it
    /// existed read as `None` (unknown version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_version: Option<String>,
    /// For a task operation, what its declared kind said when it was
    /// requested (target, capability, required); `None` for operations
    /// that are not tasks (file ingestions). Added in schema version 3;
    /// the upcaster fills it for the kinds builds of then compiled in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskFacts>,
}

/// A task kind was declared, or its declaration changed (a new version, or
/// policy). On the `task_kinds` stream; the declaration is normalized.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskKindDeclared {
    /// Boxed: declarations are rare and large, and every event is as big
    /// as its largest variant.
    pub declaration: Box<KindDeclaration>,
    /// `declared`, `new_version` or `policy`.
    pub change: KindChange,
    /// The version recorded before, for a change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_version: Option<String>,
    /// Why: `kinds apply`, or `upgrade` for the former built-in kinds.
    pub reason: String,
}

/// An event that carries only the operation and a human-readable reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationReason {
    pub operation_id: OperationId,
    #[serde(default)]
    pub reason: String,
}

/// An operation was blocked: by a person or a caller (`blocked_on` absent),
/// or because a capability its kind needs has not succeeded on its item.
/// Recorded again, from `blocked`, when that need's standing changes (the
/// work it waits for ended without a result, or another need is now the
/// one it waits for).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationBlocked {
    pub operation_id: OperationId,
    #[serde(default)]
    pub reason: String,
    /// The unmet need. Optional and additive: blocks recorded before needs
    /// existed read as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_on: Option<BlockedOn>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationClaimed {
    pub operation_id: OperationId,
    pub claim_token: String,
    pub worker: String,
    #[serde(default)]
    pub revision: Option<String>,
    pub lease_expires_at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationStarted {
    pub operation_id: OperationId,
    pub claim_token: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationProgressed {
    pub operation_id: OperationId,
    pub phase: String,
    /// Real units done, never invented.
    pub processed: i64,
    /// `None` when the total is not known yet (indeterminate progress).
    #[serde(default)]
    pub total: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationStageChanged {
    pub operation_id: OperationId,
    pub stage: IngestionStage,
    /// The file as this stage found it, when that differs from what the
    /// ingestion recorded before (a file still being written when it was
    /// found, read once it settled): the ingestion's inputs from here on,
    /// which the next ingest compares the file with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationSucceeded {
    pub operation_id: OperationId,
    #[serde(default)]
    pub claim_token: Option<String>,
    #[serde(default)]
    pub output: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationFailed {
    pub operation_id: OperationId,
    #[serde(default)]
    pub claim_token: Option<String>,
    pub error: String,
    /// Retryable failures go to `failed_retryable`, others to `failed_terminal`.
    pub retryable: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationRetryScheduled {
    pub operation_id: OperationId,
    /// Decided by the command (backoff plus recorded jitter), never re-derived.
    pub available_at: Timestamp,
    pub backoff_ms: i64,
    pub jitter_ms: i64,
}

/// The worker holding a claim gave it back unused: the task goes back to
/// the queue at once, and the attempt the claim took is not counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationReleased {
    pub operation_id: OperationId,
    pub claim_token: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationInterrupted {
    pub operation_id: OperationId,
    #[serde(default)]
    pub claim_token: Option<String>,
    pub reason: String,
}

/// A task operation was asked for a different revision (new inputs, a new
/// task version). `requeue` is decided by the command from the status it
/// saw: a settled or waiting task goes back to the queue at once; one that
/// is queued keeps its place; one a worker holds keeps running, and its
/// result is then recorded against the revision it claimed
/// ([`OperationSuperseded`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationRevisionRequested {
    pub operation_id: OperationId,
    pub revision: String,
    /// The complete inputs of the new revision (what the claim hands out).
    pub inputs: Value,
    pub requeue: bool,
    /// The task kind's version the new revision was computed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_version: Option<String>,
    /// Why the revision changed when nobody asked for it: `version_changed`
    /// for a waiting task re-targeted to its kind's new version
    /// ([`crate::versions`]). `None` for a caller's request. Optional and
    /// additive: requests recorded before it existed read as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The current version of a task's kind changed (a new model or
/// implementation was deployed) since the task was requested. Decided by the
/// engine when it finds the version it runs differs, and recorded, so replay
/// never compares versions itself. The operation's status does not change;
/// a result produced by the previous version makes its capability `stale`
/// until the work is requested at the current version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskVersionChanged {
    pub operation_id: OperationId,
    #[serde(default)]
    pub previous_version: Option<String>,
    pub current_version: String,
    /// The version that produced the result on hand, if any.
    #[serde(default)]
    pub produced_version: Option<String>,
}

/// One item of a batch: an operation the batch runs or follows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchItemSpec {
    pub operation_id: OperationId,
    /// What the item is about, for people: a path, or `media/kind`.
    pub label: String,
}

/// A named run over a fixed set of items. Stream `batch-<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchCreated {
    pub batch_id: BatchId,
    pub name: String,
    /// `tasks` for a batch of task requests, `ingestion` for a folder ingest.
    pub batch_kind: String,
    /// The task kinds the batch requested (empty for ingestion batches).
    #[serde(default)]
    pub task_kinds: Vec<String>,
}

/// Items join a batch only in the command that creates it (in chunks, so
/// no single event is huge): the set is fixed at creation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchItemsAdded {
    pub batch_id: BatchId,
    pub items: Vec<BatchItemSpec>,
}

/// An item's operation reached a settled status; `outcome` is its batch
/// outcome (`succeeded`, `failed`, `skipped`, `cancelled`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchItemSettled {
    pub batch_id: BatchId,
    pub operation_id: OperationId,
    pub outcome: String,
    /// The operation status that settled it.
    pub status: OperationStatus,
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchCancelRequested {
    pub batch_id: BatchId,
    pub reason: String,
}

/// A resume: these items (failed or cancelled before) run again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchResumed {
    pub batch_id: BatchId,
    pub operation_ids: Vec<OperationId>,
    pub reason: String,
}

/// A review-queue entry resolved by a recorded action, on the operation's
/// stream so its timeline shows who decided what and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReviewResolved {
    pub operation_id: OperationId,
    pub entry_id: i64,
    /// `retry`, `dismiss` or `acknowledge`.
    pub action: String,
    pub reason: String,
    /// For a retry at a given revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// A worker finished a claim whose revision is no longer the requested one:
/// its outcome is recorded against the revision it claimed, and the task
/// goes back to the queue for the requested revision instead of to done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationSuperseded {
    pub operation_id: OperationId,
    pub claim_token: String,
    pub claimed_revision: String,
    pub requested_revision: String,
    /// What the worker reported: `succeeded`, `no_result` or `failed`.
    pub outcome: String,
    #[serde(default)]
    pub output: Value,
    #[serde(default)]
    pub error: Option<String>,
}

macro_rules! event_catalogue {
    ($( $variant:ident ( $payload:ty ) = $tag:literal, v $version:literal ; )+) => {
        /// Every event the log can hold. The tag is the `event_type` column.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "type", rename_all = "snake_case")]
        pub enum Event {
            $( $variant($payload), )+
        }

        impl Event {
            /// Every event type with its current schema version.
            pub const CATALOGUE: &'static [(&'static str, u32)] = &[$(($tag, $version)),+];

            /// The `event_type` column.
            pub fn event_type(&self) -> &'static str {
                match self { $( Event::$variant(_) => $tag, )+ }
            }

            /// The schema version this build writes for this event type.
            pub fn schema_version(&self) -> u32 {
                match self { $( Event::$variant(_) => $version, )+ }
            }

            /// The `payload` column: the variant's fields as JSON, without the tag.
            pub fn payload_json(&self) -> String {
                let encoded = match self { $( Event::$variant(payload) => serde_json::to_string(payload), )+ };
                encoded.expect("event payloads are plain data and always serialize")
            }

            /// Decodes a payload written at the current schema version.
            fn decode_current(event_type: &str, payload: &str) -> Result<Event, DecodeError> {
                match event_type {
                    $( $tag => serde_json::from_str::<$payload>(payload)
                        .map(Event::$variant)
                        .map_err(|error| DecodeError::Malformed {
                            event_type: event_type.to_string(),
                            reason: error.to_string(),
                        }), )+
                    other => Err(DecodeError::UnknownType { event_type: other.to_string() }),
                }
            }
        }

        /// The current schema version of an event type, if the type is known.
        pub fn current_version(event_type: &str) -> Option<u32> {
            match event_type { $( $tag => Some($version), )+ _ => None }
        }
    };
}

event_catalogue! {
    MediaRegistered(MediaRegistered) = "media_registered", v 1;
    MediaUpdated(MediaUpdated) = "media_updated", v 1;
    MediaRemoved(MediaRemoved) = "media_removed", v 1;
    RegionAdded(RegionAdded) = "region_added", v 1;
    RegionRemoved(RegionRemoved) = "region_removed", v 1;
    OperationCreated(OperationCreated) = "operation_created", v 3;
    OperationQueued(OperationReason) = "operation_queued", v 1;
    OperationBlocked(OperationBlocked) = "operation_blocked", v 1;
    OperationUnblocked(OperationReason) = "operation_unblocked", v 1;
    OperationClaimed(OperationClaimed) = "operation_claimed", v 1;
    OperationStarted(OperationStarted) = "operation_started", v 1;
    OperationProgressed(OperationProgressed) = "operation_progressed", v 1;
    OperationStageChanged(OperationStageChanged) = "operation_stage_changed", v 1;
    OperationSucceeded(OperationSucceeded) = "operation_succeeded", v 1;
    OperationFoundNothing(OperationReason) = "operation_found_nothing", v 1;
    OperationMissingConfirmed(OperationReason) = "operation_missing_confirmed", v 1;
    OperationNotApplicable(OperationReason) = "operation_not_applicable", v 1;
    OperationSkipped(OperationReason) = "operation_skipped", v 1;
    OperationFailed(OperationFailed) = "operation_failed", v 1;
    OperationRetryScheduled(OperationRetryScheduled) = "operation_retry_scheduled", v 1;
    OperationDeadLettered(OperationReason) = "operation_dead_lettered", v 1;
    OperationInterrupted(OperationInterrupted) = "operation_interrupted", v 1;
    OperationRequeued(OperationReason) = "operation_requeued", v 1;
    OperationCancelRequested(OperationReason) = "operation_cancel_requested", v 1;
    OperationCancelled(OperationReason) = "operation_cancelled", v 1;
    OperationReopened(OperationReason) = "operation_reopened", v 1;
    OperationRevisionRequested(OperationRevisionRequested) = "operation_revision_requested", v 1;
    OperationSuperseded(OperationSuperseded) = "operation_superseded", v 1;
    OperationReleased(OperationReleased) = "operation_released", v 1;
    TaskVersionChanged(TaskVersionChanged) = "task_version_changed", v 1;
    BatchCreated(BatchCreated) = "batch_created", v 1;
    BatchItemsAdded(BatchItemsAdded) = "batch_items_added", v 1;
    BatchItemSettled(BatchItemSettled) = "batch_item_settled", v 1;
    BatchCancelRequested(BatchCancelRequested) = "batch_cancel_requested", v 1;
    BatchResumed(BatchResumed) = "batch_resumed", v 1;
    ReviewResolved(ReviewResolved) = "review_resolved", v 1;
    TaskKindDeclared(TaskKindDeclared) = "task_kind_declared", v 1;
}

impl Event {
    /// Decodes a stored event, lifting older schema versions first.
    pub fn decode(event_type: &str, schema_version: u32, payload: &str) -> Result<Event, DecodeError> {
        let newest = current_version(event_type).ok_or_else(|| DecodeError::UnknownType {
            event_type: event_type.to_string(),
        })?;
        if schema_version == newest {
            return Event::decode_current(event_type, payload);
        }
        if schema_version == 0 || schema_version > newest {
            return Err(DecodeError::UnknownVersion {
                event_type: event_type.to_string(),
                schema_version,
                newest,
            });
        }
        let value: Value = serde_json::from_str(payload).map_err(|error| DecodeError::Malformed {
            event_type: event_type.to_string(),
            reason: error.to_string(),
        })?;
        let lifted = upcast(event_type, schema_version, value)?;
        Event::decode_current(event_type, &lifted.to_string())
    }

    /// The transition this event makes, if it changes the operation status.
    pub fn cause(&self) -> Option<Cause> {
        Some(match self {
            Event::OperationQueued(_) => Cause::Enqueue,
            Event::OperationBlocked(_) => Cause::Block,
            Event::OperationUnblocked(_) => Cause::Unblock,
            Event::OperationClaimed(_) => Cause::Claim,
            Event::OperationStarted(_) => Cause::Start,
            Event::OperationSucceeded(_) => Cause::Succeed,
            Event::OperationFoundNothing(_) => Cause::FindNothing,
            Event::OperationMissingConfirmed(_) => Cause::ConfirmMissing,
            Event::OperationNotApplicable(_) => Cause::MarkNotApplicable,
            Event::OperationSkipped(_) => Cause::Skip,
            Event::OperationFailed(failed) if failed.retryable => Cause::FailRetryable,
            Event::OperationFailed(_) => Cause::FailTerminal,
            Event::OperationRetryScheduled(_) => Cause::ScheduleRetry,
            Event::OperationDeadLettered(_) => Cause::DeadLetter,
            Event::OperationInterrupted(_) => Cause::Interrupt,
            Event::OperationRequeued(_) => Cause::Requeue,
            Event::OperationCancelled(_) => Cause::Cancel,
            Event::OperationReopened(_) => Cause::Reopen,
            Event::OperationRevisionRequested(requested) if requested.requeue => Cause::Request,
            Event::OperationSuperseded(_) => Cause::Supersede,
            Event::OperationReleased(_) => Cause::Release,
            _ => return None,
        })
    }

    /// The operation this event belongs to, for operation events.
    pub fn operation_id(&self) -> Option<OperationId> {
        Some(match self {
            Event::OperationCreated(event) => event.operation_id,
            Event::OperationQueued(event)
            | Event::OperationUnblocked(event)
            | Event::OperationFoundNothing(event)
            | Event::OperationMissingConfirmed(event)
            | Event::OperationNotApplicable(event)
            | Event::OperationSkipped(event)
            | Event::OperationDeadLettered(event)
            | Event::OperationRequeued(event)
            | Event::OperationCancelRequested(event)
            | Event::OperationCancelled(event)
            | Event::OperationReopened(event) => event.operation_id,
            Event::OperationBlocked(event) => event.operation_id,
            Event::OperationClaimed(event) => event.operation_id,
            Event::OperationStarted(event) => event.operation_id,
            Event::OperationProgressed(event) => event.operation_id,
            Event::OperationStageChanged(event) => event.operation_id,
            Event::OperationSucceeded(event) => event.operation_id,
            Event::OperationFailed(event) => event.operation_id,
            Event::OperationRetryScheduled(event) => event.operation_id,
            Event::OperationInterrupted(event) => event.operation_id,
            Event::OperationRevisionRequested(event) => event.operation_id,
            Event::OperationSuperseded(event) => event.operation_id,
            Event::OperationReleased(event) => event.operation_id,
            Event::TaskVersionChanged(event) => event.operation_id,
            Event::ReviewResolved(event) => event.operation_id,
            Event::BatchCreated(_)
            | Event::BatchItemsAdded(_)
            | Event::BatchItemSettled(_)
            | Event::BatchCancelRequested(_)
            | Event::BatchResumed(_)
            | Event::MediaRegistered(_)
            | Event::MediaUpdated(_)
            | Event::MediaRemoved(_)
            | Event::RegionAdded(_)
            | Event::RegionRemoved(_)
            | Event::TaskKindDeclared(_) => return None,
        })
    }

    /// The block of an operation that waits for `need`, a capability its
    /// kind needs on the item.
    pub fn blocked_on_need(operation_id: OperationId, need: BlockedOn) -> Event {
        Event::OperationBlocked(OperationBlocked {
            operation_id,
            reason: need.reason(),
            blocked_on: Some(need),
        })
    }

    /// Builds the event that makes `cause` happen to an operation, with a
    /// reason, for the causes whose events carry nothing but a reason.
    /// Causes that need more (claim, start, succeed, fail, retry, interrupt)
    /// return `None`: their commands build the event with its data.
    pub fn for_reason(cause: Cause, operation_id: OperationId, reason: String) -> Option<Event> {
        let payload = OperationReason { operation_id, reason };
        Some(match cause {
            Cause::Enqueue => Event::OperationQueued(payload),
            Cause::Block => Event::OperationBlocked(OperationBlocked {
                operation_id,
                reason: payload.reason,
                blocked_on: None,
            }),
            Cause::Unblock => Event::OperationUnblocked(payload),
            Cause::FindNothing => Event::OperationFoundNothing(payload),
            Cause::ConfirmMissing => Event::OperationMissingConfirmed(payload),
            Cause::MarkNotApplicable => Event::OperationNotApplicable(payload),
            Cause::Skip => Event::OperationSkipped(payload),
            Cause::DeadLetter => Event::OperationDeadLettered(payload),
            Cause::Requeue => Event::OperationRequeued(payload),
            Cause::Cancel => Event::OperationCancelled(payload),
            Cause::Reopen => Event::OperationReopened(payload),
            Cause::Claim
            | Cause::Start
            | Cause::Succeed
            | Cause::FailRetryable
            | Cause::FailTerminal
            | Cause::ScheduleRetry
            | Cause::Interrupt
            | Cause::Request
            | Cause::Supersede
            | Cause::Release => return None,
        })
    }
}

fn as_object(event_type: &str, payload: Value) -> Result<serde_json::Map<String, Value>, DecodeError> {
    match payload {
        Value::Object(object) => Ok(object),
        other => Err(DecodeError::Malformed {
            event_type: event_type.to_string(),
            reason: format!("expected an object, found {}", crate::kinds::short(&other.to_string())),
        }),
    }
}

/// Lifts a payload written at `from_version` to the current schema version of
/// its type, one version step at a time. Each step is a pure function of the
/// old payload; steps are never removed, so every version ever written stays
/// readable.
pub fn upcast(event_type: &str, from_version: u32, mut payload: Value) -> Result<Value, DecodeError> {
    let newest = current_version(event_type).ok_or_else(|| DecodeError::UnknownType {
        event_type: event_type.to_string(),
    })?;
    let mut version = from_version;
    while version < newest {
        payload = match (event_type, version) {
            // v1 → v2: operations gained a priority; v1 operations ran at 0.
            ("operation_created", 1) => {
                let mut object = match payload {
                    Value::Object(object) => object,
                    other => {
                        return Err(DecodeError::Malformed {
                            event_type: event_type.to_string(),
                            reason: format!("expected an object, found {other}"),
                        })
                    }
                };
                object.entry("priority").or_insert(Value::from(0));
                Value::Object(object)
            }
            // v2 → v3: task operations carry their kind's facts. Builds that
            // wrote v2 compiled six kinds in; an operation of any other kind
            // was not a task.
            ("operation_created", 2) => {
                let mut object = as_object(event_type, payload)?;
                let facts = object
                    .get("kind")
                    .and_then(Value::as_str)
                    .and_then(crate::kinds::legacy::facts);
                if let Some(facts) = facts {
                    let facts = serde_json::to_value(facts).expect("task facts serialize");
                    object.entry("task").or_insert(facts);
                }
                Value::Object(object)
            }
            _ => {
                return Err(DecodeError::UnknownVersion {
                    event_type: event_type.to_string(),
                    schema_version: from_version,
                    newest,
                })
            }
        };
        version += 1;
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn operation_id() -> OperationId {
        OperationId(Uuid::from_u128(7))
    }

    #[test]
    fn payload_round_trips_through_type_and_payload_columns() {
        let event = Event::OperationClaimed(OperationClaimed {
            operation_id: operation_id(),
            claim_token: "token-1".into(),
            worker: "worker-a".into(),
            revision: Some("rev".into()),
            lease_expires_at: Timestamp::from_micros(5_000_000),
        });
        let decoded = Event::decode(event.event_type(), event.schema_version(), &event.payload_json()).unwrap();
        assert_eq!(decoded, event);
    }

    #[test]
    fn internally_tagged_form_names_the_type() {
        let event = Event::OperationQueued(OperationReason {
            operation_id: operation_id(),
            reason: String::new(),
        });
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["type"], "operation_queued");
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
    }

    #[test]
    fn version_one_operation_created_is_upcast_with_priority_zero() {
        let v1 = r#"{"operation_id":"00000000-0000-0000-0000-000000000007","kind":"metadata","target":{},"status":"queued"}"#;
        let Event::OperationCreated(created) = Event::decode("operation_created", 1, v1).unwrap() else {
            panic!("wrong variant");
        };
        assert_eq!(created.priority, 0);
        assert_eq!(created.kind, "metadata");
    }

    #[test]
    fn unknown_type_and_version_and_malformed_payload_are_errors_not_panics() {
        assert!(matches!(
            Event::decode("nonsense", 1, "{}"),
            Err(DecodeError::UnknownType { .. })
        ));
        assert!(matches!(
            Event::decode("media_registered", 9, "{}"),
            Err(DecodeError::UnknownVersion { .. })
        ));
        assert!(matches!(
            Event::decode("media_registered", 1, "{not json"),
            Err(DecodeError::Malformed { .. })
        ));
        assert!(matches!(
            Event::decode("media_registered", 1, r#"{"media_id": 5}"#),
            Err(DecodeError::Malformed { .. })
        ));
        assert!(matches!(
            Event::decode("operation_created", 1, "[1]"),
            Err(DecodeError::Malformed { .. })
        ));
    }

    #[test]
    fn catalogue_lists_unique_types() {
        let mut types: Vec<&str> = Event::CATALOGUE.iter().map(|(event_type, _)| *event_type).collect();
        types.sort();
        let before = types.len();
        types.dedup();
        assert_eq!(types.len(), before);
    }
}
