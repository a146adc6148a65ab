//! Commands: load state, ask the domain, append and fold in one transaction.
//!
//! Every command takes its time and ids before it enters the store's write
//! transaction, so what it records is fixed by the command, never re-derived.
//! Inside the transaction it reads the projected rows it decides on (its own
//! earlier writes included), appends with the stream version it read as the
//! expectation, and folds the new events into every projection before the
//! transaction commits. A refusal returns before anything is appended.

use crate::error::EngineError;
use crate::load::{all_kinds, load_kinds, load_media, load_operation};
use crate::tx::{append_and_fold, CommandContext, Decided};
use crate::work::cancel_tasks_of_removed_target;
use crate::Engine;
use opledger_domain::decide::{decide_operation, OperationCommand};
use opledger_domain::events::{
    BoundingBox, Event, MediaRegistered, MediaRemoved, MediaUpdated, OperationCreated, OperationTarget, RegionAdded,
    RegionRemoved,
};
use opledger_domain::kinds;
use opledger_domain::projections::{region_key, Row, REGIONS_TABLE};
use opledger_domain::transitions::INITIAL_STATUSES;
use opledger_domain::{
    EventEnvelope, IngestionStage, LeaseMs, MediaId, OperationId, OperationStatus, RegionId, StreamId, Timestamp,
};
use opledger_store::{ExpectedVersion, RowTarget, Store, StreamAppend};
use serde_json::Value;

/// What `create_operation` needs.
#[derive(Debug, Clone, PartialEq)]
pub struct NewOperation {
    pub kind: String,
    pub target: OperationTarget,
    pub revision: Option<String>,
    pub inputs: Value,
    pub status: OperationStatus,
    pub priority: i32,
}

fn single(mut envelopes: Vec<EventEnvelope>) -> EventEnvelope {
    envelopes
        .pop()
        .expect("a command that appended one event gets one envelope back")
}

impl<S: Store> Engine<S> {
    /// Appends events as given and folds them inline. The trusted, low-level
    /// path (fixtures, benchmarks, importers): events are checked only by the
    /// folds, which refuse anything that contradicts the current state.
    pub async fn append(&self, appends: Vec<StreamAppend>) -> Result<Vec<EventEnvelope>, EngineError> {
        self.command(move |tx, rows| {
            Box::pin(async move {
                let envelopes = append_and_fold(tx, rows, appends).await?;
                Ok(Decided::answer(envelopes, Vec::new()))
            })
        })
        .await
    }

    /// Registers a media item and returns its new id.
    pub async fn register_media(
        &self,
        context: &CommandContext,
        path: &str,
        media_kind: &str,
        content_digest: Option<String>,
        byte_size: Option<i64>,
    ) -> Result<MediaId, EngineError> {
        if path.trim().is_empty() {
            return Err(EngineError::invalid("a media item needs a non-empty path"));
        }
        if media_kind.trim().is_empty() {
            return Err(EngineError::invalid("a media item needs a media kind"));
        }
        kinds::check_name("media kind", media_kind)?;
        if byte_size.is_some_and(|size| size < 0) {
            return Err(EngineError::invalid("byte size cannot be negative"));
        }
        let media_id = MediaId(self.ids.next());
        let stamp = self.stamp(context);
        let event = Event::MediaRegistered(MediaRegistered {
            media_id,
            path: path.to_string(),
            media_kind: media_kind.to_string(),
            content_digest,
            byte_size,
        });
        let media_kind = media_kind.to_string();
        // At the time its transaction gives it, like every command: the
        // trusted `append` records the times it is handed.
        self.stamped(stamp, move |tx, _, stamp| {
            Box::pin(async move {
                if !kinds::BUILT_IN_MEDIA_KINDS.contains(&media_kind.as_str()) {
                    let declared = all_kinds(tx).await?;
                    kinds::check_media_kind(&media_kind, declared.iter().filter_map(|row| row.declaration.as_ref()))?;
                }
                let append = StreamAppend {
                    stream_id: StreamId::media(media_id),
                    expected: ExpectedVersion::NoStream,
                    events: vec![stamp.event(event)],
                };
                Ok(Decided::answer(media_id, vec![append]))
            })
        })
        .await
    }

    /// Records a media item's new path, digest or size.
    pub async fn update_media(
        &self,
        context: &CommandContext,
        media_id: MediaId,
        path: &str,
        content_digest: Option<String>,
        byte_size: Option<i64>,
    ) -> Result<EventEnvelope, EngineError> {
        if path.trim().is_empty() {
            return Err(EngineError::invalid("a media item needs a non-empty path"));
        }
        if byte_size.is_some_and(|size| size < 0) {
            return Err(EngineError::invalid("byte size cannot be negative"));
        }
        let event = Event::MediaUpdated(MediaUpdated {
            media_id,
            path: path.to_string(),
            content_digest,
            byte_size,
            media_kind: None,
        });
        self.media_command(context, media_id, None, event).await
    }

    /// Removes a media item; its regions go with it.
    pub async fn remove_media(
        &self,
        context: &CommandContext,
        media_id: MediaId,
        reason: &str,
    ) -> Result<EventEnvelope, EngineError> {
        let event = Event::MediaRemoved(MediaRemoved {
            media_id,
            reason: reason.to_string(),
        });
        self.media_command(context, media_id, None, event).await
    }

    /// Adds a region to a media item and returns its new id.
    pub async fn add_region(
        &self,
        context: &CommandContext,
        media_id: MediaId,
        bbox: BoundingBox,
        region_revision: i64,
    ) -> Result<RegionId, EngineError> {
        if bbox.width == 0 || bbox.height == 0 {
            return Err(EngineError::invalid("a region needs a non-empty bounding box"));
        }
        let region_id = RegionId(self.ids.next());
        let event = Event::RegionAdded(RegionAdded {
            region_id,
            media_id,
            bbox,
            region_revision,
        });
        self.media_command(context, media_id, None, event).await?;
        Ok(region_id)
    }

    /// Removes one region of a media item.
    pub async fn remove_region(
        &self,
        context: &CommandContext,
        media_id: MediaId,
        region_id: RegionId,
        reason: &str,
    ) -> Result<EventEnvelope, EngineError> {
        let event = Event::RegionRemoved(RegionRemoved {
            region_id,
            media_id,
            reason: reason.to_string(),
        });
        self.media_command(context, media_id, Some(region_id), event).await
    }

    /// Appends one event to a registered media item's stream, at the version
    /// its row shows. `region_id`, when given, must be a region of that item.
    async fn media_command(
        &self,
        context: &CommandContext,
        media_id: MediaId,
        region_id: Option<RegionId>,
        event: Event,
    ) -> Result<EventEnvelope, EngineError> {
        let stamp = self.stamp(context);
        self.stamped(stamp, move |tx, rows, stamp| {
            Box::pin(async move {
                let media = load_media(tx, rows, media_id).await?;
                if let Some(region_id) = region_id {
                    let key = region_key(region_id);
                    let loaded = tx.load_rows(&REGIONS_TABLE, &[key.key.to_string()]).await?;
                    match loaded.into_iter().next() {
                        Some(Row::Region(region)) if region.media_id == media_id => {
                            rows.insert_loaded(key, Some(Row::Region(region)));
                        }
                        _ => return Err(EngineError::not_found("region", region_id)),
                    }
                }
                // Removing a target ends its unfinished tasks first, in the
                // same transaction: their states go with the target (cascade),
                // and an operation left queued or leased would wait forever.
                let removed = match &event {
                    Event::MediaRemoved(removed) => Some((None, format!("media removed: {}", removed.reason))),
                    Event::RegionRemoved(removed) => {
                        Some((Some(removed.region_id), format!("region removed: {}", removed.reason)))
                    }
                    _ => None,
                };
                let mut appends = match removed {
                    Some((region_id, reason)) => {
                        cancel_tasks_of_removed_target(tx, rows, media_id, region_id, &stamp, &reason).await?
                    }
                    None => Vec::new(),
                };
                appends.push(StreamAppend {
                    stream_id: StreamId::media(media_id),
                    expected: ExpectedVersion::Exactly(media.version),
                    events: vec![stamp.event(event)],
                });
                Ok(Decided::then(appends, |_, mut envelopes| {
                    Ok(envelopes.pop().expect("the media event was appended last"))
                }))
            })
        })
        .await
    }

    /// Creates an operation and returns its id.
    pub async fn create_operation(
        &self,
        context: &CommandContext,
        operation: NewOperation,
    ) -> Result<OperationId, EngineError> {
        if operation.kind.trim().is_empty() {
            return Err(EngineError::invalid("an operation needs a kind"));
        }
        if !INITIAL_STATUSES.contains(&operation.status) {
            return Err(EngineError::invalid(format!(
                "an operation cannot start {}; it starts one of: {}",
                operation.status,
                INITIAL_STATUSES
                    .iter()
                    .map(|status| status.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let operation_id = OperationId(self.ids.next());
        let stamp = self.stamp(context);
        self.stamped(stamp, move |tx, rows, stamp| {
            Box::pin(async move {
                if !load_kinds(tx, rows, [operation.kind.as_str()]).await?.is_empty() {
                    return Err(EngineError::invalid(format!(
                        "{} is a task kind: request it with request_task (`opledger task request`), which computes its revision",
                        operation.kind
                    )));
                }
                if let Some(media_id) = operation.target.media_id {
                    load_media(tx, rows, media_id).await?;
                }
                if let Some(region_id) = operation.target.region_id {
                    let key = region_key(region_id);
                    let loaded = tx.load_rows(&REGIONS_TABLE, &[key.key.to_string()]).await?;
                    if loaded.is_empty() {
                        return Err(EngineError::not_found("region", region_id));
                    }
                }
                let event = Event::OperationCreated(OperationCreated {
                    operation_id,
                    kind: operation.kind,
                    target: operation.target,
                    revision: operation.revision,
                    inputs: operation.inputs,
                    status: operation.status,
                    priority: operation.priority,
                    // Not a task kind (refused above): no task version.
                    task_version: None,
                    task: None,
                });
                let append = StreamAppend {
                    stream_id: StreamId::operation(operation_id),
                    expected: ExpectedVersion::NoStream,
                    events: vec![stamp.event(event)],
                };
                Ok(Decided::answer(operation_id, vec![append]))
            })
        })
        .await
    }

    /// Runs one operation command: the domain decides against the current
    /// row; the event is appended at the row's stream version.
    pub async fn operation_command(
        &self,
        context: &CommandContext,
        operation_id: OperationId,
        command: OperationCommand,
    ) -> Result<EventEnvelope, EngineError> {
        self.operation_command_at(context, operation_id, move |_| command).await
    }

    /// [`Engine::operation_command`] for a command made at the command's
    /// time, as the transaction gives it (a claim's lease end).
    async fn operation_command_at(
        &self,
        context: &CommandContext,
        operation_id: OperationId,
        command: impl FnOnce(Timestamp) -> OperationCommand + Send + 'static,
    ) -> Result<EventEnvelope, EngineError> {
        let stamp = self.stamp(context);
        self.stamped(stamp, move |tx, rows, stamp| {
            Box::pin(async move {
                let row = load_operation(tx, rows, operation_id).await?;
                let event = decide_operation(&row, command(stamp.recorded_at))?;
                let append = StreamAppend {
                    stream_id: StreamId::operation(operation_id),
                    expected: ExpectedVersion::Exactly(row.version),
                    events: vec![stamp.event(event)],
                };
                Ok(Decided::then(vec![append], |_, envelopes| Ok(single(envelopes))))
            })
        })
        .await
    }

    /// Claims a queued operation for `worker` with a lease of `lease_ms`;
    /// returns the new claim token.
    pub async fn claim_operation(
        &self,
        context: &CommandContext,
        operation_id: OperationId,
        worker: &str,
        lease_ms: i64,
    ) -> Result<String, EngineError> {
        let lease = LeaseMs::new(lease_ms)?;
        let claim_token = self.ids.next().to_string();
        let (token, worker) = (claim_token.clone(), worker.to_string());
        self.operation_command_at(context, operation_id, move |now| OperationCommand::Claim {
            claim_token: token,
            worker,
            lease_expires_at: lease.ends_at(now),
        })
        .await?;
        Ok(claim_token)
    }

    /// Moves a file ingestion to a later stage.
    pub async fn change_stage(
        &self,
        context: &CommandContext,
        operation_id: OperationId,
        stage: IngestionStage,
    ) -> Result<EventEnvelope, EngineError> {
        self.operation_command(context, operation_id, OperationCommand::ChangeStage { stage })
            .await
    }
}
