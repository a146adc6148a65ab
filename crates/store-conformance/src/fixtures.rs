//! Events, rows and one-line writes the checks share.

use opledger_domain::envelope::{NewEvent, StreamId};
use opledger_domain::events::{Event, MediaRegistered, MediaUpdated};
use opledger_domain::ids::{MediaId, OperationId, RegionId};
use opledger_domain::kinds::legacy;
use opledger_domain::projections::{MediaRow, ProcessingStateRow, RegionRow, Row, RowChange, TaskKindRow};
use opledger_domain::status::OperationStatus;
use opledger_domain::tasks::TargetType;
use opledger_domain::time::Timestamp;
use opledger_store::{ExpectedVersion, RowTarget, Store, StoreError, StreamAppend, WriteTx};
use uuid::Uuid;

pub(crate) fn at(micros: i64) -> Timestamp {
    Timestamp::from_micros(1_780_000_000_000_000 + micros)
}

/// A registration event for a media item, for tests that need valid events.
pub fn registered(media_id: MediaId, n: i64) -> NewEvent {
    NewEvent {
        event: Event::MediaRegistered(MediaRegistered {
            media_id,
            path: format!("/library/{n}.png"),
            media_kind: "image".into(),
            content_digest: Some(format!("sha256:{n:064x}")),
            byte_size: Some(n),
        }),
        recorded_at: at(n),
        actor: "conformance".into(),
        correlation_id: "conformance-run".into(),
        causation_id: Some(format!("command-{n}")),
    }
}

pub(crate) fn updated(media_id: MediaId, n: i64) -> NewEvent {
    NewEvent {
        event: Event::MediaUpdated(MediaUpdated {
            media_id,
            path: format!("/library/{n}.png"),
            content_digest: Some(format!("sha256:{n:064x}")),
            byte_size: Some(n),
            media_kind: None,
        }),
        recorded_at: at(n),
        actor: "conformance".into(),
        correlation_id: "conformance-run".into(),
        causation_id: None,
    }
}

pub(crate) fn media(n: u128) -> MediaId {
    MediaId(Uuid::from_u128(n))
}

pub(crate) async fn append<S: Store>(store: &S, appends: Vec<StreamAppend>) -> Result<Vec<i64>, StoreError> {
    store
        .write(move |tx: &mut S::Tx| {
            Box::pin(async move {
                let envelopes = tx.append(appends).await?;
                Ok::<_, StoreError>(envelopes.iter().map(|envelope| envelope.seq).collect())
            })
        })
        .await
}

pub(crate) fn one(stream: &StreamId, expected: ExpectedVersion, events: Vec<NewEvent>) -> Vec<StreamAppend> {
    vec![StreamAppend {
        stream_id: stream.clone(),
        expected,
        events,
    }]
}

pub(crate) fn media_row(media_id: MediaId) -> MediaRow {
    MediaRow {
        media_id,
        path: format!("/library/{media_id}.png"),
        media_kind: "image".into(),
        content_digest: Some("sha256:00".into()),
        byte_size: Some(1),
        registered_at: at(0),
        updated_at: at(0),
        version: 1,
    }
}

pub(crate) fn region_row(region_id: RegionId, media_id: MediaId) -> RegionRow {
    RegionRow {
        region_id,
        media_id,
        x: 0,
        y: 0,
        width: 10,
        height: 10,
        region_revision: 1,
        created_at: at(0),
    }
}

/// An unclaimed processing state of `kind` on a target.
pub(crate) fn state(
    operation: u128,
    target_type: TargetType,
    target: Uuid,
    kind: &str,
    status: OperationStatus,
    priority: i64,
    available_at: i64,
) -> ProcessingStateRow {
    ProcessingStateRow {
        operation_id: OperationId(Uuid::from_u128(operation)),
        target_type,
        target_id: target,
        task_kind: kind.into(),
        status,
        priority,
        requested_revision: format!("rev-{operation}"),
        inputs: "{}".into(),
        task_version: Some("1".into()),
        claimed_revision: None,
        completed_revision: None,
        output: None,
        claim_token: None,
        worker: None,
        claimed_at: None,
        lease_expires_at: None,
        attempt_count: 0,
        failure_count: 0,
        interruption_count: 0,
        available_at: at(available_at),
        cancel_requested: false,
        last_error: None,
        status_reason: None,
        updated_at: at(0),
        version: 1,
    }
}

/// The same state, held by `token` with a lease ending at `lease_ends`.
pub(crate) fn claimed(mut row: ProcessingStateRow, token: &str, lease_ends: i64) -> ProcessingStateRow {
    row.status = OperationStatus::Leased;
    row.claimed_revision = Some(row.requested_revision.clone());
    row.claim_token = Some(token.into());
    row.worker = Some("worker".into());
    row.claimed_at = Some(at(0));
    row.lease_expires_at = Some(at(lease_ends));
    row.attempt_count = 1;
    row
}

/// The rows of the task kinds the fixtures' states use (the former
/// built-ins, declared): the processing-state tables reference them.
pub(crate) fn kind_rows() -> Vec<RowChange> {
    legacy::declarations()
        .into_iter()
        .enumerate()
        .map(|(index, declaration)| {
            upsert(Row::TaskKind(TaskKindRow {
                name: declaration.name.clone(),
                target: declaration.target,
                kind_version: declaration.version.clone(),
                capability: declaration.capability.clone(),
                required: declaration.required,
                declared: true,
                declaration: Some(declaration),
                declared_at: at(0),
                updated_at: at(0),
                version: index as i64 + 1,
            }))
        })
        .collect()
}

/// Stores [`kind_rows`], as a ledger that declared them holds them.
pub(crate) async fn declare_kinds<S: Store>(store: &S) {
    write_rows(store, kind_rows())
        .await
        .expect("the task kind rows are stored");
}

pub(crate) fn upsert(row: Row) -> RowChange {
    RowChange::upsert(row)
}

/// Writes rows in one transaction (no events: the store persists whatever
/// rows it is given; the folds are tested elsewhere).
pub(crate) async fn write_rows<S: Store>(store: &S, rows: Vec<RowChange>) -> Result<(), StoreError> {
    store
        .write(move |tx: &mut S::Tx| Box::pin(async move { tx.write_rows(&rows).await }))
        .await
}

pub(crate) fn operation_ids(rows: &[Row]) -> Vec<u128> {
    rows.iter()
        .map(|row| match row {
            Row::ProcessingState(state) => state.operation_id.0.as_u128(),
            other => panic!("not a processing state: {other:?}"),
        })
        .collect()
}
