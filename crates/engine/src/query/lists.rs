//! Pages of the review queue, of batches, and of one batch's items.

use super::{page_of, Listing, Page, PageRequest};
use crate::error::EngineError;
use crate::Engine;
use opledger_domain::batches::{is_active, BatchStatus};
use opledger_domain::projections::{
    media_key, operation_key, BatchItemRow, BatchRow, Cell, ReviewRow, Row, BATCHES_TABLE, BATCH_ITEMS_TABLE,
    MEDIA_TABLE, OPERATIONS_TABLE, REVIEW_TABLE,
};
use opledger_domain::review::EntryState;
use opledger_domain::{BatchId, MediaId, OperationId};
use opledger_store::{Direction, PageQuery, Store};
use std::collections::BTreeMap;

/// One item of a batch, with the path of what its operation works on.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchItemView {
    pub item: BatchItemRow,
    /// The file an ingestion names, or the media item's path.
    pub path: Option<String>,
}

/// One open review entry, with the path of what its operation works on.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewView {
    pub entry: ReviewRow,
    /// The file an ingestion names, or the media item's path.
    pub path: Option<String>,
}

/// A batch's progress and one page of its items, in item order.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchPage {
    pub batch: BatchRow,
    pub active: bool,
    pub items: Page<BatchItemView>,
}

impl<S: Store> Engine<S> {
    /// One page of the open review entries, oldest first (by entry id,
    /// from the queue's index of open entries).
    pub async fn review_page(&self, page: &PageRequest) -> Result<Page<ReviewView>, EngineError> {
        let mut query = PageQuery::new(
            &REVIEW_TABLE,
            &["entry_id"],
            Direction::Ascending,
            page.checked_limit()?,
        );
        query
            .equal
            .push(("state", Cell::Text(EntryState::Open.as_str().to_string())));
        query.after = page.position(Listing::Review)?;
        let walked = self.store.page_rows(&query).await?;
        let entries = page_of(Listing::Review, walked, |row| match row {
            Row::Review(entry) => Some(entry),
            _ => None,
        });
        let paths = self
            .operation_paths_of(entries.items.iter().map(|entry| entry.operation_id))
            .await?;
        Ok(entries.map(|entry| ReviewView {
            path: paths.get(&entry.operation_id).cloned(),
            entry,
        }))
    }

    /// One page of batches, newest first; with `active_only`, those whose
    /// items are not all settled (the stored status the activity predicate
    /// decides: running or cancelling).
    pub async fn batch_list(&self, active_only: bool, page: &PageRequest) -> Result<Page<BatchRow>, EngineError> {
        let limit = page.checked_limit()?;
        let mut query = PageQuery::new(
            &BATCHES_TABLE,
            &["created_at", "batch_id"],
            Direction::Descending,
            limit,
        );
        query.after = page.position(Listing::Batches)?;
        if active_only {
            query.any_of.push((
                "status",
                [BatchStatus::Running, BatchStatus::Cancelling]
                    .iter()
                    .map(|status| Cell::Text(status.as_str().to_string()))
                    .collect(),
            ));
            query.walk = super::WALK_PER_PAGE;
        }
        let walked = self.store.page_rows(&query).await?;
        Ok(page_of(Listing::Batches, walked, |row| match row {
            Row::Batch(batch) if !active_only || is_active(&batch.progress) => Some(batch),
            _ => None,
        }))
    }

    /// A batch's progress and one page of its items in item order, each
    /// with the path its operation works on.
    pub async fn batch_page(&self, batch_id: BatchId, page: &PageRequest) -> Result<BatchPage, EngineError> {
        let batch = self.batch_row(batch_id).await?;
        let mut query = PageQuery::new(
            &BATCH_ITEMS_TABLE,
            &["position"],
            Direction::Ascending,
            page.checked_limit()?,
        );
        query.equal.push(("batch_id", Cell::Uuid(batch_id.0)));
        query.after = page.position(Listing::BatchItems)?;
        let walked = self.store.page_rows(&query).await?;
        let items = page_of(Listing::BatchItems, walked, |row| match row {
            Row::BatchItem(item) => Some(item),
            _ => None,
        });
        let paths = self
            .operation_paths_of(items.items.iter().map(|item| item.operation_id))
            .await?;
        Ok(BatchPage {
            active: is_active(&batch.progress),
            batch,
            items: items.map(|item| BatchItemView {
                path: paths.get(&item.operation_id).cloned(),
                item,
            }),
        })
    }

    /// The path each operation works on: the file an ingestion names, or
    /// its media item's path. Two key lookups, whatever the count.
    pub(super) async fn operation_paths_of(
        &self,
        operations: impl Iterator<Item = OperationId>,
    ) -> Result<BTreeMap<OperationId, String>, EngineError> {
        let keys: Vec<String> = operations.map(|id| operation_key(id).key.to_string()).collect();
        let mut paths = BTreeMap::new();
        let mut on_media: Vec<(OperationId, MediaId)> = Vec::new();
        for row in self.store.load_rows(&OPERATIONS_TABLE, &keys).await? {
            if let Row::Operation(operation) = row {
                match (operation.path, operation.media_id) {
                    (Some(path), _) => {
                        paths.insert(operation.operation_id, path);
                    }
                    (None, Some(media)) => on_media.push((operation.operation_id, media)),
                    (None, None) => {}
                }
            }
        }
        let media_keys: Vec<String> = on_media
            .iter()
            .map(|(_, media)| media_key(*media).key.to_string())
            .collect();
        let media_paths: BTreeMap<MediaId, String> = self
            .store
            .load_rows(&MEDIA_TABLE, &media_keys)
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::Media(media) => Some((media.media_id, media.path)),
                _ => None,
            })
            .collect();
        for (operation, media) in on_media {
            if let Some(path) = media_paths.get(&media) {
                paths.insert(operation, path.clone());
            }
        }
        Ok(paths)
    }
}
