//! Projector folds: pure functions from events to read-model rows.
//!
//! A projection owns one or more tables. Its rows are typed ([`Row`]) and
//! mapped to and from backend-neutral cells ([`Cell`]) by explicit mappers, so
//! the store can persist, load and compare any projection table without
//! knowing what it means, and a fold never sees SQL.
//!
//! Folding is two-phase, which keeps it synchronous and pure: a projector
//! first names the rows an event touches ([`Projector::keys`]); the caller
//! loads those into a [`WorkingSet`]; then [`Projector::apply`] changes the set
//! in memory. The caller writes the dirty rows back. The same folds serve the
//! inline path (inside the append's transaction) and replay.

mod cells;
mod media_registry;
mod operations;
mod working_set;

pub use cells::{Cell, ColumnSpec, ColumnType, MapError, TableSpec};
pub use media_registry::{
    media_key, region_key, MediaRegistry, MediaRow, RegionRow, MEDIA_REGISTRY, MEDIA_TABLE, REGIONS_TABLE,
};
pub use operations::{
    operation_key, MediaOperations, OperationRow, INGESTION_FILE, MEDIA_OPERATIONS, OPERATIONS_TABLE,
};
pub use working_set::{RowKey, WorkingSet};

use crate::envelope::EventEnvelope;
use crate::error::FoldError;

/// What a projection is: its name, version and tables.
#[derive(Debug)]
pub struct ProjectionSpec {
    /// Also the folder under `projections/` holding its DDL and fixtures.
    pub name: &'static str,
    /// Bumped whenever the tables or the fold change meaning; a stored
    /// projection at another version is rebuilt from the log at startup.
    pub version: u32,
    /// Parents first: rows are written in this order, so foreign keys hold.
    pub tables: &'static [&'static TableSpec],
    /// The question the projection answers, for `status` and the docs.
    pub question: &'static str,
}

/// A fold from events into one projection's tables.
pub trait Projector: Sync {
    fn spec(&self) -> &'static ProjectionSpec;

    /// The rows `event` reads or writes; they must be in the working set
    /// (present or known absent) before [`Projector::apply`] is called.
    fn keys(&self, event: &EventEnvelope, keys: &mut Vec<RowKey>);

    /// Folds `event` into the working set.
    fn apply(&self, event: &EventEnvelope, rows: &mut WorkingSet) -> Result<(), FoldError>;
}

/// A row of any projection table. The variants are the tables; the mappers
/// (`to_cells` / `from_cells`) are written out per table.
// Rows live in the working set's map and are written out in place; boxing the
// large variant would add an allocation per row for no saving.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    Media(MediaRow),
    Region(RegionRow),
    Operation(OperationRow),
}

impl Row {
    pub fn table(&self) -> &'static TableSpec {
        match self {
            Row::Media(_) => &MEDIA_TABLE,
            Row::Region(_) => &REGIONS_TABLE,
            Row::Operation(_) => &OPERATIONS_TABLE,
        }
    }

    pub fn key(&self) -> RowKey {
        match self {
            Row::Media(row) => RowKey::new(&MEDIA_TABLE, row.media_id.to_string()),
            Row::Region(row) => RowKey::new(&REGIONS_TABLE, row.region_id.to_string()),
            Row::Operation(row) => RowKey::new(&OPERATIONS_TABLE, row.operation_id.to_string()),
        }
    }

    /// The row whose deletion deletes this one (ON DELETE CASCADE).
    pub fn parent(&self) -> Option<RowKey> {
        match self {
            Row::Region(row) => Some(RowKey::new(&MEDIA_TABLE, row.media_id.to_string())),
            Row::Media(_) | Row::Operation(_) => None,
        }
    }

    pub fn to_cells(&self) -> Vec<Cell> {
        match self {
            Row::Media(row) => row.to_cells(),
            Row::Region(row) => row.to_cells(),
            Row::Operation(row) => row.to_cells(),
        }
    }

    /// Maps stored cells of `table` back to a typed row.
    pub fn from_cells(table: &TableSpec, cells: Vec<Cell>) -> Result<Row, MapError> {
        if cells.len() != table.columns.len() {
            return Err(MapError::new(
                table.name,
                format!("expected {} columns, found {}", table.columns.len(), cells.len()),
            ));
        }
        match table.name {
            "media" => MediaRow::from_cells(cells).map(Row::Media),
            "media_regions" => RegionRow::from_cells(cells).map(Row::Region),
            "media_operations" => OperationRow::from_cells(cells).map(Row::Operation),
            other => Err(MapError::new(other, "not a projection table".to_string())),
        }
    }
}

/// Every projection this build maintains, in the order they are folded.
pub fn all_projectors() -> &'static [&'static dyn Projector] {
    &[&MediaRegistry, &MediaOperations]
}

/// Every projection spec, in fold order.
pub fn all_specs() -> Vec<&'static ProjectionSpec> {
    all_projectors().iter().map(|projector| projector.spec()).collect()
}

/// Folds `events` into an empty in-memory working set with every projector.
/// The reference fold, used by golden fixtures and property tests to check
/// what the stores produce.
pub fn fold_in_memory(events: &[EventEnvelope]) -> Result<WorkingSet, FoldError> {
    let mut rows = WorkingSet::default();
    let mut keys = Vec::new();
    for event in events {
        for projector in all_projectors() {
            keys.clear();
            projector.keys(event, &mut keys);
            for key in keys.drain(..) {
                if !rows.is_known(&key) {
                    rows.insert_loaded(key, None);
                }
            }
            projector.apply(event, &mut rows)?;
        }
    }
    Ok(rows)
}

/// The table spec with this name, among every projection's tables.
pub fn table_by_name(name: &str) -> Option<&'static TableSpec> {
    all_projectors()
        .iter()
        .flat_map(|projector| projector.spec().tables.iter().copied())
        .find(|table| table.name == name)
}

/// The row a stream owns, if any: the media row of `media-<id>`, the
/// operation row of `operation-<id>`. Such a row is born with its stream's
/// first event, so when a fold sees an event at stream version 1 the row
/// cannot exist yet and need not be looked up.
pub fn row_owned_by(stream: &crate::envelope::StreamId) -> Option<RowKey> {
    let text = stream.as_str();
    if let Some(id) = text.strip_prefix("media-") {
        return Some(RowKey::new(&MEDIA_TABLE, id.to_string()));
    }
    if let Some(id) = text.strip_prefix("operation-") {
        return Some(RowKey::new(&OPERATIONS_TABLE, id.to_string()));
    }
    None
}
