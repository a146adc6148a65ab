//! `list_operations`: operations newest first, filtered by status, kind,
//! batch, media item, creation time and worker.
//!
//! Which index a page walks follows the filters: a media item's operations
//! (`media_id, created_at, id`), one kind's (`kind, created_at, id`), a
//! batch's items (`batch_id, position`, last item first), or every
//! operation (`created_at, id`). Statuses, several kinds and the worker are
//! checked on the rows the walk passes; none of them has an index, since a
//! status changes with every step of the work protocol and each change
//! would rewrite an entry (docs/queries.md, "The query layer").

use super::{cut, page_of, window, Listing, Page, PageRequest, JOINED_WALK_PER_PAGE, WALK_PER_PAGE};
use crate::error::EngineError;
use crate::Engine;
use opledger_domain::projections::{
    operation_key, Cell, OperationRow, Row, BATCHES_TABLE, BATCH_ITEMS_TABLE, OPERATIONS_TABLE,
};
use opledger_domain::{BatchId, MediaId, OperationId, OperationStatus, RegionId, Timestamp};
use opledger_store::{Direction, PageQuery, Store};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The order of operation listings: newest first.
const ORDER: [&str; 2] = ["created_at", "id"];
/// The order of a batch's items.
const ITEM_ORDER: [&str; 1] = ["position"];

/// Which operations a listing shows. Empty lists and None select all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpsFilter {
    /// Any of these statuses.
    pub statuses: Vec<OperationStatus>,
    /// Any of these kinds (task kinds, or `ingestion.file`).
    pub kinds: Vec<String>,
    /// Items of this batch.
    pub batch: Option<BatchId>,
    /// Operations on this media item.
    pub media: Option<MediaId>,
    /// Created at or after this time.
    pub since: Option<Timestamp>,
    /// Created before this time.
    pub until: Option<Timestamp>,
    /// Held now by this worker (claimed and not yet reported).
    pub worker: Option<String>,
}

/// One operation as listings show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OperationItem {
    pub operation_id: OperationId,
    pub kind: String,
    pub status: OperationStatus,
    pub stage: Option<String>,
    pub media_id: Option<MediaId>,
    pub region_id: Option<RegionId>,
    pub path: Option<String>,
    pub worker: Option<String>,
    pub attempt_count: i64,
    pub interruption_count: i64,
    pub status_reason: Option<String>,
    pub last_error: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl OperationItem {
    pub fn of(row: &OperationRow) -> Self {
        OperationItem {
            operation_id: row.operation_id,
            kind: row.kind.clone(),
            status: row.status,
            stage: row.stage.map(|stage| stage.as_str().to_string()),
            media_id: row.media_id,
            region_id: row.region_id,
            path: row.path.clone(),
            worker: row.worker.clone(),
            attempt_count: row.attempt_count,
            interruption_count: row.interruption_count,
            status_reason: row.status_reason.clone(),
            last_error: row.last_error.clone(),
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

impl OpsFilter {
    /// The listing this filter's pages belong to (a cursor of one is no
    /// cursor of the other): a batch's items are walked in item order
    /// unless a media item's operations are walked instead.
    pub fn listing(&self) -> Listing {
        if self.batch.is_some() && self.media.is_none() {
            Listing::BatchOperations
        } else {
            Listing::Operations
        }
    }

    /// Whether an operation passes every filter but the batch.
    fn admits(&self, operation: &OperationRow) -> bool {
        (self.statuses.is_empty() || self.statuses.contains(&operation.status))
            && (self.kinds.is_empty() || self.kinds.contains(&operation.kind))
            && self.media.is_none_or(|media| operation.media_id == Some(media))
            && self.since.is_none_or(|since| operation.created_at >= since)
            && self.until.is_none_or(|until| operation.created_at < until)
            && self
                .worker
                .as_ref()
                .is_none_or(|worker| operation.worker.as_ref() == Some(worker))
    }

    fn check(&self) -> Result<(), EngineError> {
        if let (Some(since), Some(until)) = (self.since, self.until) {
            if since >= until {
                return Err(EngineError::invalid(format!(
                    "since ({since}) must be earlier than until ({until})"
                )));
            }
        }
        if self.kinds.iter().any(|kind| kind.trim().is_empty()) || self.worker.as_deref().is_some_and(str::is_empty) {
            return Err(EngineError::invalid("a kind or worker filter cannot be empty"));
        }
        Ok(())
    }
}

fn texts(values: impl IntoIterator<Item = impl Into<String>>) -> Vec<Cell> {
    values.into_iter().map(|value| Cell::Text(value.into())).collect()
}

impl<S: Store> Engine<S> {
    /// One page of operations, newest first (a batch's: last item first).
    /// The `next` cursor continues the same listing with the same filter.
    pub async fn list_operations(
        &self,
        filter: &OpsFilter,
        page: &PageRequest,
    ) -> Result<Page<OperationItem>, EngineError> {
        filter.check()?;
        let limit = page.checked_limit()?;
        if let Some(media) = filter.media {
            self.media(media).await?;
            return self.operations_by_index(filter, page, limit).await;
        }
        if let Some(batch) = filter.batch {
            return self.batch_operations(batch, filter, page, limit).await;
        }
        self.operations_by_index(filter, page, limit).await
    }

    /// A walk of one of the operations' own indexes: a media item's, one
    /// kind's, or every operation's, with the other filters checked on
    /// the rows it passes (a batch's membership on a window of them).
    async fn operations_by_index(
        &self,
        filter: &OpsFilter,
        page: &PageRequest,
        limit: usize,
    ) -> Result<Page<OperationItem>, EngineError> {
        let mut query = PageQuery::new(&OPERATIONS_TABLE, &ORDER, Direction::Descending, limit);
        query.after = page.position(filter.listing())?;
        query.from = filter.since.map(Cell::Timestamp);
        query.to = filter.until.map(Cell::Timestamp);
        query.walk = WALK_PER_PAGE;
        match (filter.media, filter.kinds.as_slice()) {
            (Some(media), kinds) => {
                query.equal.push(("media_id", Cell::Uuid(media.0)));
                if !kinds.is_empty() {
                    query.any_of.push(("kind", texts(kinds.iter().cloned())));
                }
            }
            (None, [kind]) => query.equal.push(("kind", Cell::Text(kind.clone()))),
            (None, []) => {}
            (None, kinds) => query.any_of.push(("kind", texts(kinds.iter().cloned()))),
        }
        if !filter.statuses.is_empty() {
            query
                .any_of
                .push(("status", texts(filter.statuses.iter().map(|status| status.as_str()))));
        }
        if let Some(worker) = &filter.worker {
            query.any_of.push(("worker", texts([worker.clone()])));
        }
        if !query.filters() {
            query.walk = limit;
        }
        let Some(batch) = filter.batch else {
            let walked = self.store.page_rows(&query).await?;
            return Ok(page_of(Listing::Operations, walked, operation_item));
        };
        // A media item's operations in one batch: the walk's window, then
        // which of its operations are the batch's items.
        self.batch_row(batch).await?;
        let walked = self.store.page_rows(&window(query, JOINED_WALK_PER_PAGE)).await?;
        let ids: Vec<Cell> = walked
            .rows
            .iter()
            .filter_map(|row| match row {
                Row::Operation(operation) => Some(Cell::Uuid(operation.operation_id.0)),
                _ => None,
            })
            .collect();
        let in_batch: BTreeSet<OperationId> = self
            .store
            .find_rows_in(&BATCH_ITEMS_TABLE, "operation_id", &ids)
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::BatchItem(item) if item.batch_id == batch => Some(item.operation_id),
                _ => None,
            })
            .collect();
        let kept = walked
            .rows
            .into_iter()
            .filter(|row| matches!(row, Row::Operation(operation) if in_batch.contains(&operation.operation_id)))
            .collect();
        Ok(page_of(
            Listing::Operations,
            cut(kept, limit, walked.resume, &ORDER),
            operation_item,
        ))
    }

    /// A batch's operations, last item first: a walk of its items, their
    /// operations loaded by key and filtered (on a window of the items when
    /// anything but the batch filters).
    async fn batch_operations(
        &self,
        batch: BatchId,
        filter: &OpsFilter,
        page: &PageRequest,
        limit: usize,
    ) -> Result<Page<OperationItem>, EngineError> {
        self.batch_row(batch).await?;
        let filtered = filter.filters_more_than_batch();
        let walk = if filtered { JOINED_WALK_PER_PAGE } else { limit };
        let mut query = PageQuery::new(&BATCH_ITEMS_TABLE, &ITEM_ORDER, Direction::Descending, walk);
        query.equal.push(("batch_id", Cell::Uuid(batch.0)));
        query.after = page.position(filter.listing())?;
        let walked = self.store.page_rows(&query).await?;
        let keys: Vec<String> = walked
            .rows
            .iter()
            .filter_map(|row| match row {
                Row::BatchItem(item) => Some(operation_key(item.operation_id).key.to_string()),
                _ => None,
            })
            .collect();
        let mut operations: BTreeMap<OperationId, OperationRow> = self
            .store
            .load_rows(&OPERATIONS_TABLE, &keys)
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::Operation(operation) => Some((operation.operation_id, operation)),
                _ => None,
            })
            .collect();
        // Items stay in walk order (their positions make the cursor); each
        // is kept when its operation passes the filter.
        let mut kept = Vec::new();
        let mut items = Vec::new();
        for row in walked.rows {
            let Row::BatchItem(item) = &row else { continue };
            let Some(operation) = operations.remove(&item.operation_id) else {
                continue;
            };
            if filter.admits(&operation) {
                items.push(OperationItem::of(&operation));
                kept.push(row);
            }
        }
        let cut = cut(kept, limit, walked.resume, &ITEM_ORDER);
        items.truncate(cut.rows.len());
        Ok(Page {
            items,
            next: cut
                .resume
                .map(|position| super::cursor::encode(Listing::BatchOperations, &position)),
        })
    }

    /// A batch's row, or not found.
    pub(super) async fn batch_row(
        &self,
        batch: BatchId,
    ) -> Result<opledger_domain::projections::BatchRow, EngineError> {
        match self
            .store
            .load_rows(&BATCHES_TABLE, &[batch.to_string()])
            .await?
            .into_iter()
            .next()
        {
            Some(Row::Batch(row)) => Ok(row),
            _ => Err(EngineError::not_found("batch", batch)),
        }
    }
}

impl OpsFilter {
    /// Whether any filter besides the batch is set.
    fn filters_more_than_batch(&self) -> bool {
        !self.statuses.is_empty()
            || !self.kinds.is_empty()
            || self.media.is_some()
            || self.since.is_some()
            || self.until.is_some()
            || self.worker.is_some()
    }
}

fn operation_item(row: Row) -> Option<OperationItem> {
    match row {
        Row::Operation(operation) => Some(OperationItem::of(&operation)),
        _ => None,
    }
}
