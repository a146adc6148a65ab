//! `media_detail`: a media item with everything about it, found by id or
//! by path; `list_media`: items by path, filtered by media kind, path
//! prefix and a capability's status.

use super::ops::OperationItem;
use super::{cut, page_of, window, Listing, Page, PageRequest, JOINED_WALK_PER_PAGE};
use crate::error::EngineError;
use crate::Engine;
use opledger_domain::projections::{
    operation_key, BatchRow, CapabilityRow, Cell, MediaRow, OperationRow, ReviewRow, Row, BATCHES_TABLE,
    BATCH_ITEMS_TABLE, CAPABILITY_STATES_TABLE, MEDIA_STATES_TABLE, MEDIA_TABLE, OPERATIONS_TABLE, REVIEW_TABLE,
};
use opledger_domain::review::EntryState;
use opledger_domain::{BatchId, CapabilityStatus, MediaId, OperationId, OperationStatus, Timestamp};
use opledger_store::page::prefix_successor;
use opledger_store::{Direction, PageQuery, Store};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// The capability whose task writes an item's thumbnail file (its output
/// names the file as `path`), by the convention the reference pipeline's
/// kinds follow (`crates/media/kinds.toml`).
pub const THUMBNAIL_CAPABILITY: &str = "thumbnail";

/// The order of media listings: by path.
const ORDER: [&str; 2] = ["path", "id"];

/// The most operations, or items at one path, a detail shows: far more
/// than one item has, a bound on what a read returns.
const DETAIL_ROWS: usize = 1_000;

/// How a media item is named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaRef {
    Id(MediaId),
    /// The item registered at this path (the latest registered, when
    /// several are).
    Path(String),
}

/// Which media items a listing shows. None selects all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MediaFilter {
    /// Of this media kind (`image`, ...).
    pub kind: Option<String>,
    /// Whose path starts with this text (compared as bytes: exact case).
    pub path_prefix: Option<String>,
    /// Whose capability of this name ...
    pub capability: Option<String>,
    /// ... is in one of these statuses (any status when empty).
    pub capability_statuses: Vec<CapabilityStatus>,
}

/// One media item as listings show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MediaItem {
    pub media_id: MediaId,
    pub path: String,
    pub media_kind: String,
    pub content_digest: Option<String>,
    pub byte_size: Option<i64>,
    pub registered_at: Timestamp,
    pub updated_at: Timestamp,
}

impl MediaItem {
    pub fn of(row: &MediaRow) -> Self {
        MediaItem {
            media_id: row.media_id,
            path: row.path.clone(),
            media_kind: row.media_kind.clone(),
            content_digest: row.content_digest.clone(),
            byte_size: row.byte_size,
            registered_at: row.registered_at,
            updated_at: row.updated_at,
        }
    }
}

/// One capability of an item: can it serve it now, and if not, why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapabilityItem {
    pub capability: String,
    pub status: CapabilityStatus,
    pub task_kind: String,
    pub operation_id: OperationId,
    pub required: bool,
    /// The task version that produced the result on hand.
    pub produced_version: Option<String>,
    /// The task version now current.
    pub current_version: Option<String>,
    pub reason: Option<String>,
    pub updated_at: Timestamp,
}

impl CapabilityItem {
    pub fn of(row: &CapabilityRow) -> Self {
        CapabilityItem {
            capability: row.capability.clone(),
            status: row.status,
            task_kind: row.task_kind.clone(),
            operation_id: row.operation_id,
            required: row.required,
            produced_version: row.produced_version.clone(),
            current_version: row.current_version.clone(),
            reason: row.reason.clone(),
            updated_at: row.updated_at,
        }
    }
}

/// One review entry as listings show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReviewItem {
    pub entry_id: i64,
    pub operation_id: OperationId,
    pub kind: String,
    pub media_id: Option<MediaId>,
    pub path: Option<String>,
    pub reason_code: String,
    pub operation_status: OperationStatus,
    pub detail: Option<String>,
    pub state: EntryState,
    pub opened_at: Timestamp,
}

impl ReviewItem {
    pub fn of(row: &ReviewRow) -> Self {
        ReviewItem {
            entry_id: row.entry_id,
            operation_id: row.operation_id,
            kind: row.kind.clone(),
            media_id: row.media_id,
            path: row.path.clone(),
            reason_code: row.reason_code.clone(),
            operation_status: row.operation_status,
            detail: row.detail.clone(),
            state: row.state,
            opened_at: row.opened_at,
        }
    }
}

/// A batch an item's operations are in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchMembership {
    pub batch_id: BatchId,
    pub name: String,
    pub status: String,
    /// The item's operations that are items of the batch.
    pub operation_ids: Vec<OperationId>,
}

/// Everything about one media item: what support staff look up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MediaDetail {
    pub media: MediaItem,
    /// Other items registered at the same path (a detail by path shows the
    /// latest registered).
    pub others_at_path: Vec<MediaId>,
    /// Every capability, by name.
    pub capabilities: Vec<CapabilityItem>,
    /// Its operations (tasks on the item, and ingestions of its file),
    /// newest first.
    pub operations: Vec<OperationItem>,
    /// The batches its operations are items of, newest first.
    pub batches: Vec<BatchMembership>,
    /// Its open review entries, oldest first.
    pub review: Vec<ReviewItem>,
    /// The file the current thumbnail task wrote, if it wrote one.
    pub thumbnail: Option<String>,
}

fn rows_of<T>(rows: Vec<Row>, pick: impl Fn(Row) -> Option<T>) -> Vec<T> {
    rows.into_iter().filter_map(pick).collect()
}

impl<S: Store> Engine<S> {
    /// A media item with its capabilities, operations, batches, open
    /// review entries and thumbnail. By path, through the registry's index
    /// of paths; several items at one path show the latest registered,
    /// naming the others.
    pub async fn media_detail(&self, media: &MediaRef) -> Result<MediaDetail, EngineError> {
        let (item, others_at_path) = match media {
            MediaRef::Id(media_id) => (self.media(*media_id).await?, Vec::new()),
            MediaRef::Path(path) => self.media_at_path(path).await?,
        };
        let media_cell = Cell::Uuid(item.media_id.0);
        let mut capabilities = rows_of(
            self.store
                .find_rows(
                    &CAPABILITY_STATES_TABLE,
                    &[("media_id", media_cell.clone())],
                    DETAIL_ROWS,
                )
                .await?,
            |row| match row {
                Row::Capability(capability) => Some(capability),
                _ => None,
            },
        );
        capabilities.sort_by(|a, b| a.capability.cmp(&b.capability));

        // Tasks on the item, newest first from its index, and the
        // ingestions of its file (by path).
        let mut query = PageQuery::new(
            &OPERATIONS_TABLE,
            &["created_at", "id"],
            Direction::Descending,
            DETAIL_ROWS,
        );
        query.equal.push(("media_id", media_cell));
        let mut operations: BTreeMap<OperationId, OperationRow> = BTreeMap::new();
        let on_item = self.store.page_rows(&query).await?.rows;
        let of_file = self
            .store
            .find_rows(
                &OPERATIONS_TABLE,
                &[("path", Cell::Text(item.path.clone()))],
                DETAIL_ROWS,
            )
            .await?;
        for row in on_item.into_iter().chain(of_file) {
            if let Row::Operation(operation) = row {
                operations.insert(operation.operation_id, operation);
            }
        }
        let mut operations: Vec<OperationRow> = operations.into_values().collect();
        operations.sort_by_key(|row| std::cmp::Reverse((row.created_at, row.operation_id)));
        let ids: Vec<Cell> = operations
            .iter()
            .map(|operation| Cell::Uuid(operation.operation_id.0))
            .collect();
        let keys: Vec<String> = operations
            .iter()
            .map(|operation| operation_key(operation.operation_id).key.to_string())
            .collect();

        let mut memberships: BTreeMap<BatchId, Vec<OperationId>> = BTreeMap::new();
        for row in self
            .store
            .find_rows_in(&BATCH_ITEMS_TABLE, "operation_id", &ids)
            .await?
        {
            if let Row::BatchItem(item) = row {
                memberships.entry(item.batch_id).or_default().push(item.operation_id);
            }
        }
        let batch_keys: Vec<String> = memberships.keys().map(|id| id.to_string()).collect();
        let mut batches: Vec<BatchRow> =
            rows_of(
                self.store.load_rows(&BATCHES_TABLE, &batch_keys).await?,
                |row| match row {
                    Row::Batch(batch) => Some(batch),
                    _ => None,
                },
            );
        batches.sort_by_key(|row| std::cmp::Reverse((row.created_at, row.batch_id)));
        let batches = batches
            .into_iter()
            .map(|batch| BatchMembership {
                operation_ids: memberships.remove(&batch.batch_id).unwrap_or_default(),
                batch_id: batch.batch_id,
                name: batch.name,
                status: batch.status.as_str().to_string(),
            })
            .collect();

        let mut review = rows_of(self.store.load_rows(&REVIEW_TABLE, &keys).await?, |row| match row {
            Row::Review(entry) if entry.state == EntryState::Open => Some(entry),
            _ => None,
        });
        review.sort_by_key(|entry| entry.entry_id);

        let thumbnail = match capabilities
            .iter()
            .find(|capability| capability.capability == THUMBNAIL_CAPABILITY)
        {
            Some(capability) => self.output_path(capability.operation_id).await?,
            None => None,
        };
        Ok(MediaDetail {
            media: MediaItem::of(&item),
            others_at_path,
            capabilities: capabilities.iter().map(CapabilityItem::of).collect(),
            operations: operations.iter().map(OperationItem::of).collect(),
            batches,
            review: review.iter().map(ReviewItem::of).collect(),
            thumbnail,
        })
    }

    /// The latest registered item at `path` and the ids of any others.
    async fn media_at_path(&self, path: &str) -> Result<(MediaRow, Vec<MediaId>), EngineError> {
        let mut items = rows_of(
            self.store
                .find_rows(&MEDIA_TABLE, &[("path", Cell::Text(path.to_string()))], DETAIL_ROWS)
                .await?,
            |row| match row {
                Row::Media(media) => Some(media),
                _ => None,
            },
        );
        items.sort_by_key(|row| std::cmp::Reverse((row.registered_at, row.media_id)));
        let mut items = items.into_iter();
        let Some(latest) = items.next() else {
            return Err(EngineError::not_found("media item at path", short(path)));
        };
        Ok((latest, items.map(|item| item.media_id).collect()))
    }

    /// The `path` a task's stored output names, if it has one.
    async fn output_path(&self, operation_id: OperationId) -> Result<Option<String>, EngineError> {
        let state = self
            .store
            .load_rows(&MEDIA_STATES_TABLE, &[operation_key(operation_id).key.to_string()])
            .await?
            .into_iter()
            .next();
        Ok(match state {
            Some(Row::ProcessingState(state)) => state
                .output
                .as_deref()
                .and_then(|output| serde_json::from_str::<serde_json::Value>(output).ok())
                .and_then(|output| output.get("path").and_then(|path| path.as_str()).map(str::to_string)),
            _ => None,
        })
    }

    /// One page of media items by path (bytewise order). A capability
    /// filter is checked on a window of the walk, against the items'
    /// capability states.
    pub async fn list_media(&self, filter: &MediaFilter, page: &PageRequest) -> Result<Page<MediaItem>, EngineError> {
        let limit = page.checked_limit()?;
        if filter.capability.is_none() && !filter.capability_statuses.is_empty() {
            return Err(EngineError::invalid(
                "a capability status filter needs the capability it is of",
            ));
        }
        let mut query = PageQuery::new(&MEDIA_TABLE, &ORDER, Direction::Ascending, limit);
        query.after = page.position(Listing::Media)?;
        if let Some(kind) = &filter.kind {
            query.equal.push(("media_kind", Cell::Text(kind.clone())));
        }
        if let Some(prefix) = &filter.path_prefix {
            query.from = Some(Cell::Text(prefix.clone()));
            query.to = prefix_successor(prefix).map(Cell::Text);
        }
        let Some(capability) = &filter.capability else {
            let walked = self.store.page_rows(&query).await?;
            return Ok(page_of(Listing::Media, walked, media_item));
        };
        let walked = self.store.page_rows(&window(query, JOINED_WALK_PER_PAGE)).await?;
        let ids: Vec<Cell> = walked
            .rows
            .iter()
            .filter_map(|row| match row {
                Row::Media(media) => Some(Cell::Uuid(media.media_id.0)),
                _ => None,
            })
            .collect();
        let having: BTreeSet<MediaId> = self
            .store
            .find_rows_in(&CAPABILITY_STATES_TABLE, "media_id", &ids)
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::Capability(state)
                    if &state.capability == capability
                        && (filter.capability_statuses.is_empty()
                            || filter.capability_statuses.contains(&state.status)) =>
                {
                    Some(state.media_id)
                }
                _ => None,
            })
            .collect();
        let kept = walked
            .rows
            .into_iter()
            .filter(|row| matches!(row, Row::Media(media) if having.contains(&media.media_id)))
            .collect();
        Ok(page_of(
            Listing::Media,
            cut(kept, limit, walked.resume, &ORDER),
            media_item,
        ))
    }
}

fn media_item(row: Row) -> Option<MediaItem> {
    match row {
        Row::Media(media) => Some(MediaItem::of(&media)),
        _ => None,
    }
}

/// A path for a message: at most a short quote of it.
fn short(path: &str) -> String {
    const SHOWN: usize = 120;
    if path.chars().count() <= SHOWN {
        path.to_string()
    } else {
        format!("{}…", path.chars().take(SHOWN).collect::<String>())
    }
}
