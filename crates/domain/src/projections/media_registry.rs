//! The media registry: which media items and regions exist.

use super::cells::{integer_or_null, text_or_null, Cell, CellReader, ColumnSpec, ColumnType, MapError, TableSpec};
use super::counts::{add_count, counts_key, MEDIA_COUNTS_TABLE};

/// The counts row of registered media items and their regions
/// (`media_counts`: `{"media": N, "regions": M}`).
pub const MEDIA_COUNT: &str = "registered";
use super::working_set::{RowKey, RowQuery, WorkingSet};
use super::{ProjectionSpec, Projector, Row};
use crate::envelope::EventEnvelope;
use crate::error::FoldError;
use crate::events::Event;
use crate::ids::{MediaId, RegionId};
use crate::time::Timestamp;

pub static MEDIA_TABLE: TableSpec = TableSpec {
    name: "media",
    columns: &[
        ColumnSpec::required("id", ColumnType::Uuid),
        ColumnSpec::required("path", ColumnType::Text),
        ColumnSpec::required("media_kind", ColumnType::Text),
        ColumnSpec::optional("content_digest", ColumnType::Text),
        ColumnSpec::optional("byte_size", ColumnType::Integer),
        ColumnSpec::required("registered_at", ColumnType::Timestamp),
        ColumnSpec::required("updated_at", ColumnType::Timestamp),
        ColumnSpec::required("version", ColumnType::Integer),
    ],
    key_columns: 1,
};

pub static REGIONS_TABLE: TableSpec = TableSpec {
    name: "media_regions",
    columns: &[
        ColumnSpec::required("id", ColumnType::Uuid),
        ColumnSpec::required("media_id", ColumnType::Uuid),
        ColumnSpec::required("x", ColumnType::Integer),
        ColumnSpec::required("y", ColumnType::Integer),
        ColumnSpec::required("width", ColumnType::Integer),
        ColumnSpec::required("height", ColumnType::Integer),
        ColumnSpec::required("region_revision", ColumnType::Integer),
        ColumnSpec::required("created_at", ColumnType::Timestamp),
    ],
    key_columns: 1,
};

pub static MEDIA_REGISTRY: ProjectionSpec = ProjectionSpec {
    name: "media_registry",
    version: 4,
    tables: &[&MEDIA_TABLE, &REGIONS_TABLE, &MEDIA_COUNTS_TABLE],
    question: "Which media items and regions exist, where is each file, and what is its content digest?",
    depends_on: &[],
};

/// One media item.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaRow {
    pub media_id: MediaId,
    pub path: String,
    pub media_kind: String,
    pub content_digest: Option<String>,
    pub byte_size: Option<i64>,
    pub registered_at: Timestamp,
    pub updated_at: Timestamp,
    /// The media stream's version after the last event folded in.
    pub version: i64,
}

impl MediaRow {
    pub fn to_cells(&self) -> Vec<Cell> {
        vec![
            Cell::Uuid(self.media_id.0),
            Cell::Text(self.path.clone()),
            Cell::Text(self.media_kind.clone()),
            text_or_null(&self.content_digest),
            integer_or_null(self.byte_size),
            Cell::Timestamp(self.registered_at),
            Cell::Timestamp(self.updated_at),
            Cell::Integer(self.version),
        ]
    }

    pub fn from_cells(cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(&MEDIA_TABLE, cells);
        Ok(MediaRow {
            media_id: MediaId(reader.uuid()?),
            path: reader.text()?,
            media_kind: reader.text()?,
            content_digest: reader.optional_text()?,
            byte_size: reader.optional_integer()?,
            registered_at: reader.timestamp()?,
            updated_at: reader.timestamp()?,
            version: reader.integer()?,
        })
    }
}

/// One region of a media item.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionRow {
    pub region_id: RegionId,
    pub media_id: MediaId,
    pub x: i64,
    pub y: i64,
    pub width: i64,
    pub height: i64,
    pub region_revision: i64,
    pub created_at: Timestamp,
}

impl RegionRow {
    pub fn to_cells(&self) -> Vec<Cell> {
        vec![
            Cell::Uuid(self.region_id.0),
            Cell::Uuid(self.media_id.0),
            Cell::Integer(self.x),
            Cell::Integer(self.y),
            Cell::Integer(self.width),
            Cell::Integer(self.height),
            Cell::Integer(self.region_revision),
            Cell::Timestamp(self.created_at),
        ]
    }

    pub fn from_cells(cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(&REGIONS_TABLE, cells);
        Ok(RegionRow {
            region_id: RegionId(reader.uuid()?),
            media_id: MediaId(reader.uuid()?),
            x: reader.integer()?,
            y: reader.integer()?,
            width: reader.integer()?,
            height: reader.integer()?,
            region_revision: reader.integer()?,
            created_at: reader.timestamp()?,
        })
    }
}

pub fn media_key(media_id: MediaId) -> RowKey {
    RowKey::new(&MEDIA_TABLE, media_id.key())
}

pub fn region_key(region_id: RegionId) -> RowKey {
    RowKey::new(&REGIONS_TABLE, region_id.key())
}

/// Folds media and region events into `media` and `media_regions`.
pub struct MediaRegistry;

impl Projector for MediaRegistry {
    fn spec(&self) -> &'static ProjectionSpec {
        &MEDIA_REGISTRY
    }

    fn keys(&self, event: &EventEnvelope, keys: &mut Vec<RowKey>) {
        match &event.event {
            Event::MediaRegistered(registered) => {
                keys.push(media_key(registered.media_id));
                keys.push(counts_key(&MEDIA_COUNTS_TABLE, MEDIA_COUNT));
            }
            Event::MediaUpdated(updated) => keys.push(media_key(updated.media_id)),
            Event::MediaRemoved(removed) => {
                keys.push(media_key(removed.media_id));
                keys.push(counts_key(&MEDIA_COUNTS_TABLE, MEDIA_COUNT));
            }
            Event::RegionAdded(added) => {
                keys.push(media_key(added.media_id));
                keys.push(region_key(added.region_id));
                keys.push(counts_key(&MEDIA_COUNTS_TABLE, MEDIA_COUNT));
            }
            Event::RegionRemoved(removed) => {
                keys.push(media_key(removed.media_id));
                keys.push(region_key(removed.region_id));
                keys.push(counts_key(&MEDIA_COUNTS_TABLE, MEDIA_COUNT));
            }
            _ => {}
        }
    }

    fn queries(&self, event: &EventEnvelope, queries: &mut Vec<RowQuery>) {
        // The regions go with their media item; the fold must see them go
        // to keep the regions count true.
        if let Event::MediaRemoved(removed) = &event.event {
            queries.push(RowQuery {
                table: &REGIONS_TABLE,
                column: "media_id",
                value: Cell::Uuid(removed.media_id.0),
            });
        }
    }

    fn apply(&self, event: &EventEnvelope, rows: &mut WorkingSet) -> Result<(), FoldError> {
        let fail = |reason: String| FoldError {
            seq: event.seq,
            event_type: event.event_type(),
            reason,
        };
        match &event.event {
            Event::MediaRegistered(registered) => {
                let key = media_key(registered.media_id);
                if rows.get(&key).is_some() {
                    return Err(fail(format!("media {} is already registered", registered.media_id)));
                }
                rows.put(Row::Media(MediaRow {
                    media_id: registered.media_id,
                    path: registered.path.clone(),
                    media_kind: registered.media_kind.clone(),
                    content_digest: registered.content_digest.clone(),
                    byte_size: registered.byte_size,
                    registered_at: event.recorded_at,
                    updated_at: event.recorded_at,
                    version: event.stream_version,
                }));
                add_count(rows, &MEDIA_COUNTS_TABLE, MEDIA_COUNT, "media", 1);
            }
            Event::MediaUpdated(updated) => {
                let Some(Row::Media(current)) = rows.get(&media_key(updated.media_id)) else {
                    return Err(fail(format!("media {} is not registered", updated.media_id)));
                };
                let mut next = current.clone();
                next.path = updated.path.clone();
                next.content_digest = updated.content_digest.clone();
                next.byte_size = updated.byte_size;
                if let Some(media_kind) = &updated.media_kind {
                    next.media_kind = media_kind.clone();
                }
                next.updated_at = event.recorded_at;
                next.version = event.stream_version;
                rows.put(Row::Media(next));
            }
            Event::MediaRemoved(removed) => {
                let key = media_key(removed.media_id);
                if rows.get(&key).is_none() {
                    return Err(fail(format!("media {} is not registered", removed.media_id)));
                }
                rows.delete(&key);
                add_count(rows, &MEDIA_COUNTS_TABLE, MEDIA_COUNT, "media", -1);
                let regions = rows.take_removed_with(&key, &REGIONS_TABLE).len() as i64;
                if regions > 0 {
                    add_count(rows, &MEDIA_COUNTS_TABLE, MEDIA_COUNT, "regions", -regions);
                }
            }
            Event::RegionAdded(added) => {
                let Some(Row::Media(media)) = rows.get(&media_key(added.media_id)) else {
                    return Err(fail(format!("media {} is not registered", added.media_id)));
                };
                let mut media = media.clone();
                let key = region_key(added.region_id);
                if rows.get(&key).is_some() {
                    return Err(fail(format!("region {} already exists", added.region_id)));
                }
                media.version = event.stream_version;
                media.updated_at = event.recorded_at;
                rows.put(Row::Media(media));
                rows.put(Row::Region(RegionRow {
                    region_id: added.region_id,
                    media_id: added.media_id,
                    x: i64::from(added.bbox.x),
                    y: i64::from(added.bbox.y),
                    width: i64::from(added.bbox.width),
                    height: i64::from(added.bbox.height),
                    region_revision: added.region_revision,
                    created_at: event.recorded_at,
                }));
                add_count(rows, &MEDIA_COUNTS_TABLE, MEDIA_COUNT, "regions", 1);
            }
            Event::RegionRemoved(removed) => {
                let Some(Row::Media(media)) = rows.get(&media_key(removed.media_id)) else {
                    return Err(fail(format!("media {} is not registered", removed.media_id)));
                };
                let mut media = media.clone();
                let key = region_key(removed.region_id);
                match rows.get(&key) {
                    Some(Row::Region(region)) if region.media_id == removed.media_id => {}
                    _ => {
                        return Err(fail(format!(
                            "region {} of media {} does not exist",
                            removed.region_id, removed.media_id
                        )))
                    }
                }
                media.version = event.stream_version;
                media.updated_at = event.recorded_at;
                rows.put(Row::Media(media));
                rows.delete(&key);
                add_count(rows, &MEDIA_COUNTS_TABLE, MEDIA_COUNT, "regions", -1);
            }
            _ => {}
        }
        Ok(())
    }
}
