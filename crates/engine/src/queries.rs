//! Read queries behind `status` and `timeline`: they read projections and
//! the log through the store's read pool, never the writer.

use crate::error::EngineError;
use crate::Engine;
use opledger_domain::batches::{is_active, BatchStatus};
use opledger_domain::projections::{
    batch_item_id, media_key, operation_key, BatchItemRow, BatchRow, Cell, MediaRow, OperationRow, Row, BATCHES_TABLE,
    BATCH_ITEMS_TABLE, MEDIA_TABLE, OPERATIONS_TABLE,
};
use opledger_domain::projections::{
    BY_STATE, BY_STATUS, CAPABILITY_COUNTS_TABLE, MEDIA_COUNT, MEDIA_COUNTS_TABLE, OPERATION_COUNTS_TABLE,
    REVIEW_COUNTS_TABLE, STALE_BY_KIND,
};
use opledger_domain::review::EntryState;
use opledger_domain::{BatchId, CapabilityStatus, EventEnvelope, MediaId, OperationId, OperationStatus, StreamId};

/// Active batches the status summary lists (per status), at most.
const ACTIVE_BATCHES_SHOWN: usize = 100;
/// Blocked operations the status summary reads to group them by reason, at
/// most: a reason shared by thousands of files (a tool not installed) is
/// found in the first of them.
const BLOCKED_READ: usize = 1000;
use opledger_store::Store;
use serde::Serialize;

/// Where one projection stands relative to the head of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProjectionLag {
    pub name: String,
    pub version: u32,
    pub position: i64,
    /// Events in the log the projection has not folded yet.
    pub lag: i64,
}

/// The dashboard summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusReport {
    pub backend: &'static str,
    /// The highest seq in the log.
    pub head: i64,
    pub media: i64,
    pub regions: i64,
    pub operations: i64,
    /// Every operation status with its count, zeros included.
    #[serde(serialize_with = "pairs_as_map")]
    pub operations_by_status: Vec<(String, i64)>,
    /// Every capability status with its count, zeros included.
    #[serde(serialize_with = "pairs_as_map")]
    pub capabilities_by_status: Vec<(String, i64)>,
    /// Stale capabilities per task kind (what `reprocess --stale` runs),
    /// kinds with none left out.
    #[serde(serialize_with = "pairs_as_map")]
    pub stale_by_kind: Vec<(String, i64)>,
    /// Batches the activity predicate says are active, newest first.
    pub active_batches: Vec<BatchSummary>,
    /// Open review entries.
    pub review_queue: i64,
    /// Why operations are blocked, one entry per reason (a tool missing
    /// blocks every file's task alike: said once, not per file); left out
    /// when nothing is blocked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_by_reason: Vec<BlockedReason>,
    pub projections: Vec<ProjectionLag>,
    /// The last check of the log's integrity (`replay --verify`), if one
    /// was recorded.
    pub integrity: Option<crate::IntegrityCheck>,
}

/// Blocked operations that share a reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockedReason {
    pub reason: String,
    /// How many of the blocked operations read carry it (at most the
    /// first thousand blocked are read: `counted_all` says whether that
    /// was every one).
    pub count: i64,
    pub counted_all: bool,
    /// Their task kinds, in name order.
    pub kinds: Vec<String>,
}

/// Counts by name serialize as one JSON object (`{"queued": 3, ...}`), in
/// their order: what the CLI's `--json` and the HTTP API both answer.
fn pairs_as_map<S: serde::Serializer>(pairs: &[(String, i64)], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_map(pairs.iter().map(|(name, count)| (name, count)))
}

/// One batch's exact progress, for dashboards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BatchSummary {
    pub batch_id: String,
    pub name: String,
    pub status: String,
    pub total: i64,
    pub settled: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub skipped: i64,
    pub cancelled: i64,
    /// Items that cannot run: a need of their kind ended without a result.
    pub blocked: i64,
    pub remaining: i64,
}

impl BatchSummary {
    pub fn of(batch: &BatchRow) -> Self {
        let progress = &batch.progress;
        BatchSummary {
            batch_id: batch.batch_id.to_string(),
            name: batch.name.clone(),
            status: batch.status.as_str().to_string(),
            total: progress.total,
            settled: progress.settled,
            succeeded: progress.succeeded,
            failed: progress.failed,
            skipped: progress.skipped,
            cancelled: progress.cancelled,
            blocked: progress.blocked,
            remaining: progress.remaining(),
        }
    }
}

/// Every value of a vocabulary with its count from a `count_by`, zeros included.
fn with_zeros(names: impl Iterator<Item = &'static str>, counted: &[(Option<String>, i64)]) -> Vec<(String, i64)> {
    names
        .map(|name| {
            let count = counted
                .iter()
                .find(|(value, _)| value.as_deref() == Some(name))
                .map_or(0, |(_, count)| *count);
            (name.to_string(), count)
        })
        .collect()
}

impl<S: Store> Engine<S> {
    pub async fn status(&self) -> Result<StatusReport, EngineError> {
        let head = self.store.head().await?;
        // Running counts the folds keep: a row read, whatever the log's size.
        let counted: Vec<(Option<String>, i64)> = self
            .counts(&OPERATION_COUNTS_TABLE, BY_STATUS)
            .await?
            .into_iter()
            .map(|(status, count)| (Some(status), count))
            .collect();
        let operations_by_status = with_zeros(OperationStatus::ALL.iter().map(|status| status.as_str()), &counted);
        let capabilities: Vec<(Option<String>, i64)> = self
            .counts(&CAPABILITY_COUNTS_TABLE, BY_STATUS)
            .await?
            .into_iter()
            .map(|(status, count)| (Some(status), count))
            .collect();
        let capabilities_by_status = with_zeros(
            CapabilityStatus::ALL.iter().map(|status| status.as_str()),
            &capabilities,
        );
        let stale_by_kind: Vec<(String, i64)> = self
            .counts(&CAPABILITY_COUNTS_TABLE, STALE_BY_KIND)
            .await?
            .into_iter()
            .filter(|(_, count)| *count > 0)
            .collect();
        let review_queue = self
            .counts(&REVIEW_COUNTS_TABLE, BY_STATE)
            .await?
            .get(EntryState::Open.as_str())
            .copied()
            .unwrap_or(0);
        // Active batches by the shared predicate; the stored status names
        // the candidates (it is derived from the same predicate by the fold).
        let mut active_batches = Vec::new();
        for status in [BatchStatus::Running, BatchStatus::Cancelling] {
            for row in self
                .store
                .find_rows(
                    &BATCHES_TABLE,
                    &[("status", Cell::Text(status.as_str().to_string()))],
                    ACTIVE_BATCHES_SHOWN,
                )
                .await?
            {
                if let Row::Batch(batch) = row {
                    if is_active(&batch.progress) {
                        active_batches.push(batch);
                    }
                }
            }
        }
        active_batches.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.batch_id.cmp(&a.batch_id)));
        let active_batches = active_batches.iter().map(BatchSummary::of).collect();
        let projections = self
            .store
            .projection_states()
            .await?
            .into_iter()
            .map(|state| ProjectionLag {
                lag: (head - state.position).max(0),
                name: state.name,
                version: state.version,
                position: state.position,
            })
            .collect();
        let blocked = operations_by_status
            .iter()
            .find(|(status, _)| status == OperationStatus::Blocked.as_str())
            .map_or(0, |(_, count)| *count);
        let blocked_by_reason = if blocked > 0 {
            self.blocked_by_reason(blocked).await?
        } else {
            Vec::new()
        };
        let registered = self.counts(&MEDIA_COUNTS_TABLE, MEDIA_COUNT).await?;
        Ok(StatusReport {
            backend: self.store.backend(),
            head,
            media: registered.get("media").copied().unwrap_or(0),
            regions: registered.get("regions").copied().unwrap_or(0),
            operations: counted.iter().map(|(_, count)| count).sum(),
            operations_by_status,
            capabilities_by_status,
            stale_by_kind,
            active_batches,
            review_queue,
            blocked_by_reason,
            projections,
            integrity: self.last_verification().await?,
        })
    }

    /// The blocked operations (up to [`BLOCKED_READ`] of `blocked`) grouped
    /// by their reason, most common first.
    async fn blocked_by_reason(&self, blocked: i64) -> Result<Vec<BlockedReason>, EngineError> {
        let rows = self
            .store
            .find_rows(
                &OPERATIONS_TABLE,
                &[("status", Cell::Text(OperationStatus::Blocked.as_str().to_string()))],
                BLOCKED_READ,
            )
            .await?;
        let counted_all = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= blocked;
        let mut by_reason: std::collections::BTreeMap<String, (i64, std::collections::BTreeSet<String>)> =
            std::collections::BTreeMap::new();
        for row in rows {
            if let Row::Operation(operation) = row {
                let reason = operation.status_reason.unwrap_or_default();
                let entry = by_reason.entry(reason).or_default();
                entry.0 += 1;
                entry.1.insert(operation.kind);
            }
        }
        let mut reasons: Vec<BlockedReason> = by_reason
            .into_iter()
            .map(|(reason, (count, kinds))| BlockedReason {
                reason,
                count,
                counted_all,
                kinds: kinds.into_iter().collect(),
            })
            .collect();
        reasons.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
        Ok(reasons)
    }

    /// The operation's events in order, with actor, time and cause, as
    /// readers see them (claim tokens as fingerprints).
    pub async fn timeline(&self, operation_id: OperationId) -> Result<Vec<EventEnvelope>, EngineError> {
        let events = self.store.read_stream(&StreamId::operation(operation_id)).await?;
        if events.is_empty() {
            return Err(EngineError::not_found("operation", operation_id));
        }
        Ok(events.into_iter().map(EventEnvelope::for_readers).collect())
    }

    /// A running-counts row of a projection (empty when nothing was counted).
    async fn counts(
        &self,
        table: &'static opledger_domain::projections::TableSpec,
        name: &str,
    ) -> Result<std::collections::BTreeMap<String, i64>, EngineError> {
        Ok(
            match self
                .store
                .load_rows(table, &[name.to_string()])
                .await?
                .into_iter()
                .next()
            {
                Some(Row::Counts(row)) => row.counts,
                _ => std::collections::BTreeMap::new(),
            },
        )
    }

    /// The registry row of one media item.
    pub async fn media(&self, media_id: MediaId) -> Result<MediaRow, EngineError> {
        match self
            .store
            .load_rows(&MEDIA_TABLE, &[media_key(media_id).key.to_string()])
            .await?
            .into_iter()
            .next()
        {
            Some(Row::Media(row)) => Ok(row),
            _ => Err(EngineError::not_found("media", media_id)),
        }
    }

    /// The projected row of one operation.
    pub async fn operation(&self, operation_id: OperationId) -> Result<OperationRow, EngineError> {
        let key = operation_key(operation_id);
        match self
            .store
            .load_rows(&OPERATIONS_TABLE, &[key.key.to_string()])
            .await?
            .into_iter()
            .next()
        {
            Some(Row::Operation(row)) => Ok(row),
            _ => Err(EngineError::not_found("operation", operation_id)),
        }
    }

    /// The operation's item in the batch, or None when the operation is
    /// not one of the batch's items (or either does not exist).
    pub async fn batch_item(
        &self,
        batch_id: BatchId,
        operation_id: OperationId,
    ) -> Result<Option<BatchItemRow>, EngineError> {
        let rows = self
            .store
            .load_rows(&BATCH_ITEMS_TABLE, &[batch_item_id(batch_id, operation_id)])
            .await?;
        Ok(rows.into_iter().find_map(|row| match row {
            Row::BatchItem(item) => Some(item),
            _ => None,
        }))
    }

    /// The seq of the batch's first event (its creation), or None while the
    /// batch does not exist.
    pub async fn batch_created_at_seq(&self, batch_id: BatchId) -> Result<Option<i64>, EngineError> {
        let first = self.store.read_stream_after(&StreamId::batch(batch_id), 0, 1).await?;
        Ok(first.first().map(|envelope| envelope.seq))
    }
}
