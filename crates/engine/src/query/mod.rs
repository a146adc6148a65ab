//! The query layer: what support staff, operators and dashboards ask of
//! the projections, with typed filters and cursor pagination — a media
//! item with everything about it (`media_detail`), listings of operations
//! (`list_operations`), media items (`list_media`), review entries, batches
//! and a batch's items. The CLI prints these answers; an HTTP service
//! serves the same ones.
//!
//! Every listing is a walk of one index in a fixed order, a page at a time
//! ([`opledger_store::page`]): the store walks rows past the cursor's
//! position, checks the filters no index serves on each row it passes, and
//! passes at most a fixed number of rows per page, so a page costs the
//! same whatever the ledger's size. A filter that matches rarely can make
//! a page short, even empty, with a `next` cursor still given; a listing
//! ends when `next` is null. Filters that need another table (a batch's
//! membership, a capability's status) are checked here, on a bounded
//! window of the walk.
//!
//! **The paging guarantee.** Positions are of columns that never change
//! once a row exists (creation time and id, path and id, a batch position,
//! an entry id), and a cursor is a position, never an offset. So paging
//! from the first page to the end returns every row that existed when the
//! first page was read and matches the listing's fixed filters exactly
//! once, whatever is written meanwhile; rows created after the first page
//! sort before its position (newest first) or, for paths, wherever their
//! path falls. A row's status can change while paging: a status filter is
//! checked when the row's page is read, so such a row appears at most once,
//! and does appear when it matched throughout.
//!
//! The layer knows no SQL and no backend: it builds [`PageQuery`]s and
//! key lookups of the store contract.

mod cursor;
mod lists;
mod media;
mod ops;

pub use cursor::{decode as decode_cursor, encode as encode_cursor, Listing};
pub use lists::{BatchItemView, BatchPage, ReviewView};
pub use media::{
    BatchMembership, CapabilityItem, MediaDetail, MediaFilter, MediaItem, MediaRef, ReviewItem, THUMBNAIL_CAPABILITY,
};
pub use ops::{OperationItem, OpsFilter};

use crate::error::EngineError;
use opledger_domain::projections::{Cell, Row};
use opledger_store::page::position_of;
use opledger_store::{Page as StorePage, PageQuery};
use serde::Serialize;

/// Rows a page shows when the caller does not say.
pub const DEFAULT_PAGE_LIMIT: usize = 50;
/// The most rows one page shows.
pub const MAX_PAGE_LIMIT: usize = 1_000;
/// The most rows a filtered walk passes for one page: what bounds a page
/// whose filter rarely matches.
pub const WALK_PER_PAGE: usize = 2_000;
/// The most rows of a walk whose filter needs another table (a batch's
/// membership, a capability's status) one page checks.
pub const JOINED_WALK_PER_PAGE: usize = 500;

/// Which page of a listing: how many rows at most, and where to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    pub limit: usize,
    /// The `next` cursor of the page before; None: the first page.
    pub after: Option<String>,
}

impl Default for PageRequest {
    fn default() -> Self {
        PageRequest {
            limit: DEFAULT_PAGE_LIMIT,
            after: None,
        }
    }
}

impl PageRequest {
    pub fn first(limit: usize) -> Self {
        PageRequest { limit, after: None }
    }

    /// The limit, refused outside 1 to [`MAX_PAGE_LIMIT`].
    fn checked_limit(&self) -> Result<usize, EngineError> {
        if (1..=MAX_PAGE_LIMIT).contains(&self.limit) {
            Ok(self.limit)
        } else {
            Err(EngineError::invalid(format!(
                "limit: a page holds 1 to {MAX_PAGE_LIMIT} rows, not {}",
                self.limit
            )))
        }
    }

    /// The position the cursor names in `listing` (None: the first page).
    fn position(&self, listing: Listing) -> Result<Option<Vec<Cell>>, EngineError> {
        self.after
            .as_deref()
            .map(|text| cursor::decode(listing, text).map_err(|error| EngineError::invalid(format!("after: {error}"))))
            .transpose()
    }
}

/// One page of a listing: `{"items": [...], "next": CURSOR | null}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// The cursor of the next page; null when the listing ended.
    pub next: Option<String>,
}

impl<T> Page<T> {
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            items: self.items.into_iter().map(f).collect(),
            next: self.next,
        }
    }
}

/// Keeps the first `limit` of the rows a window's filter kept: when more
/// were kept, the page resumes after its last row; otherwise where the
/// window's walk stopped (None: the walk reached the end).
fn cut(mut rows: Vec<Row>, limit: usize, walked: Option<Vec<Cell>>, order: &[&'static str]) -> StorePage {
    if rows.len() > limit {
        rows.truncate(limit);
        let resume = rows.last().map(|row| position_of(row, order));
        return StorePage { rows, resume };
    }
    StorePage { rows, resume: walked }
}

/// A store page as a listing's page: its rows turned into items, its
/// resume position into a cursor.
fn page_of<T>(listing: Listing, page: StorePage, item: impl FnMut(Row) -> Option<T>) -> Page<T> {
    Page {
        next: page.resume.map(|position| cursor::encode(listing, &position)),
        items: page.rows.into_iter().filter_map(item).collect(),
    }
}

/// A query whose walk passes at most `walk` rows and keeps every match: a
/// window the caller filters further.
fn window(mut query: PageQuery, walk: usize) -> PageQuery {
    query.limit = walk;
    query.walk = walk;
    query
}
