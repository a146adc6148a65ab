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

mod batches;
mod capability_states;
mod cells;
mod counts;
mod media_registry;
mod operations;
mod processing_states;
mod review_queue;
mod task_kinds;
mod working_set;

pub use batches::{
    batch_item_id, batch_item_key, batch_key, BatchItemRow, BatchRow, Batches, BATCHES, BATCHES_TABLE,
    BATCH_ITEMS_TABLE,
};
pub use capability_states::{
    capability_key, version_key, CapabilityRow, CapabilityStates, CAPABILITY_STATES, CAPABILITY_STATES_TABLE,
};
pub use cells::{Cell, ColumnSpec, ColumnType, MapError, TableSpec};
pub use counts::{
    counts_key, CountsRow, BY_STATE, CAPABILITY_COUNTS_TABLE, MEDIA_COUNTS_TABLE, OPERATION_COUNTS_TABLE,
    REVIEW_COUNTS_TABLE, STALE_BY_KIND,
};
pub use media_registry::{
    media_key, region_key, MediaRegistry, MediaRow, RegionRow, MEDIA_COUNT, MEDIA_REGISTRY, MEDIA_TABLE, REGIONS_TABLE,
};
pub use operations::{
    operation_key, MediaOperations, OperationRow, BY_STATUS, INGESTION_FILE, MEDIA_OPERATIONS, OPERATIONS_TABLE,
};
pub use processing_states::{
    state_key, state_locations, state_table, ProcessingStateRow, ProcessingStates, MEDIA_STATES_TABLE,
    PROCESSING_STATES, REGION_STATES_TABLE,
};
pub use review_queue::{review_key, ReviewQueue, ReviewRow, REVIEW_QUEUE, REVIEW_TABLE};
pub use task_kinds::{task_kind_key, TaskKindRow, TaskKinds, TASK_KINDS, TASK_KINDS_TABLE};
pub use working_set::{Key, RowChange, RowKey, RowQuery, Stored, WorkingSet};

use crate::envelope::EventEnvelope;
use crate::error::FoldError;
use crate::tasks::TargetType;

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
    /// Projections whose tables this one's tables reference (foreign keys).
    /// A projection and everything connected to it this way form a family
    /// that is always rebuilt together, so a reference never points from a
    /// rebuilt table into one that is about to be dropped.
    pub depends_on: &'static [&'static str],
}

/// A fold from events into one projection's tables.
pub trait Projector: Sync {
    fn spec(&self) -> &'static ProjectionSpec;

    /// The rows `event` reads or writes; they must be in the working set
    /// (present or known absent) before [`Projector::apply`] is called.
    fn keys(&self, event: &EventEnvelope, keys: &mut Vec<RowKey>);

    /// Rows `event` reads that cannot be named by key; the caller loads
    /// every stored row matching each query (rows already known stay as
    /// they are). Most events need none.
    fn queries(&self, _event: &EventEnvelope, _queries: &mut Vec<RowQuery>) {}

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
    ProcessingState(ProcessingStateRow),
    Capability(CapabilityRow),
    Batch(BatchRow),
    BatchItem(BatchItemRow),
    Review(ReviewRow),
    Counts(CountsRow),
    TaskKind(TaskKindRow),
}

impl Row {
    pub fn table(&self) -> &'static TableSpec {
        match self {
            Row::Media(_) => &MEDIA_TABLE,
            Row::Region(_) => &REGIONS_TABLE,
            Row::Operation(_) => &OPERATIONS_TABLE,
            Row::ProcessingState(row) => row.table(),
            Row::Capability(_) => &CAPABILITY_STATES_TABLE,
            Row::Batch(_) => &BATCHES_TABLE,
            Row::BatchItem(_) => &BATCH_ITEMS_TABLE,
            Row::Review(_) => &REVIEW_TABLE,
            Row::Counts(row) => row.table,
            Row::TaskKind(_) => &TASK_KINDS_TABLE,
        }
    }

    pub fn key(&self) -> RowKey {
        match self {
            Row::Media(row) => RowKey::new(&MEDIA_TABLE, row.media_id.key()),
            Row::Region(row) => RowKey::new(&REGIONS_TABLE, row.region_id.key()),
            Row::Operation(row) => RowKey::new(&OPERATIONS_TABLE, row.operation_id.key()),
            Row::ProcessingState(row) => RowKey::new(row.table(), row.operation_id.key()),
            Row::Capability(row) => capability_key(row.operation_id),
            Row::Batch(row) => batch_key(row.batch_id),
            Row::BatchItem(row) => batch_item_key(row.batch_id, row.operation_id),
            Row::Review(row) => review_key(row.operation_id),
            Row::Counts(row) => RowKey::new(row.table, Key::from_text(&row.name)),
            Row::TaskKind(row) => task_kind_key(&row.name),
        }
    }

    /// The row whose deletion deletes this one (ON DELETE CASCADE).
    pub fn parent(&self) -> Option<RowKey> {
        match self {
            Row::Region(row) => Some(RowKey::new(&MEDIA_TABLE, row.media_id.key())),
            Row::ProcessingState(row) => Some(row.parent_key()),
            Row::Capability(row) => Some(media_key(row.media_id)),
            Row::BatchItem(row) => Some(batch_key(row.batch_id)),
            Row::Media(_) | Row::Operation(_) | Row::Batch(_) | Row::Review(_) | Row::Counts(_) | Row::TaskKind(_) => {
                None
            }
        }
    }

    pub fn to_cells(&self) -> Vec<Cell> {
        match self {
            Row::Media(row) => row.to_cells(),
            Row::Region(row) => row.to_cells(),
            Row::Operation(row) => row.to_cells(),
            Row::ProcessingState(row) => row.to_cells(),
            Row::Capability(row) => row.to_cells(),
            Row::Batch(row) => row.to_cells(),
            Row::BatchItem(row) => row.to_cells(),
            Row::Review(row) => row.to_cells(),
            Row::Counts(row) => row.to_cells(),
            Row::TaskKind(row) => row.to_cells(),
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
            "media_processing_states" => {
                ProcessingStateRow::from_cells(TargetType::Media, cells).map(Row::ProcessingState)
            }
            "region_processing_states" => {
                ProcessingStateRow::from_cells(TargetType::Region, cells).map(Row::ProcessingState)
            }
            "entity_capability_states" => CapabilityRow::from_cells(cells).map(Row::Capability),
            "batches" => BatchRow::from_cells(cells).map(Row::Batch),
            "batch_items" => BatchItemRow::from_cells(cells).map(Row::BatchItem),
            "review_queue" => ReviewRow::from_cells(cells).map(Row::Review),
            "media_operation_counts" => CountsRow::from_cells(&OPERATION_COUNTS_TABLE, cells).map(Row::Counts),
            "media_counts" => CountsRow::from_cells(&MEDIA_COUNTS_TABLE, cells).map(Row::Counts),
            "entity_capability_counts" => CountsRow::from_cells(&CAPABILITY_COUNTS_TABLE, cells).map(Row::Counts),
            "review_queue_counts" => CountsRow::from_cells(&REVIEW_COUNTS_TABLE, cells).map(Row::Counts),
            "task_kinds" => TaskKindRow::from_cells(cells).map(Row::TaskKind),
            other => Err(MapError::new(other, "not a projection table".to_string())),
        }
    }
}

/// Every projection this build maintains, in the order they are folded.
pub fn all_projectors() -> &'static [&'static dyn Projector] {
    // Order matters: the processing states reference the task kinds the
    // same event may just have recorded; capability states read the
    // processing state, and the review queue the operation and the
    // capability, that the same event just produced.
    &[
        &TaskKinds,
        &MediaRegistry,
        &MediaOperations,
        &ProcessingStates,
        &CapabilityStates,
        &Batches,
        &ReviewQueue,
    ]
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

/// A JSON value's compact text, as `Display` renders it but without the
/// formatting machinery between (folds serialize inputs and outputs of
/// every operation they create or complete).
pub(crate) fn json_text(value: &serde_json::Value) -> String {
    serde_json::to_string(value).expect("a JSON value serializes")
}

/// The rows a stream owns: the media row of `media-<id>`; the operation
/// row, the processing-state, capability and review rows of
/// `operation-<id>`; the batch row of `batch-<id>`. Such rows are born
/// with their stream's first event, so when a fold sees an event at stream
/// version 1 they cannot exist yet and need not be looked up.
pub fn rows_owned_by(stream: &crate::envelope::StreamId, owned: &mut Vec<RowKey>) {
    let text = stream.as_str();
    if let Some(id) = text.strip_prefix("media-") {
        owned.push(RowKey::new(&MEDIA_TABLE, Key::from_text(id)));
    } else if let Some(id) = text.strip_prefix("operation-") {
        let key = Key::from_text(id);
        owned.push(RowKey::new(&OPERATIONS_TABLE, key.clone()));
        owned.push(RowKey::new(&MEDIA_STATES_TABLE, key.clone()));
        owned.push(RowKey::new(&REGION_STATES_TABLE, key.clone()));
        owned.push(RowKey::new(&CAPABILITY_STATES_TABLE, key.clone()));
        owned.push(RowKey::new(&REVIEW_TABLE, key));
    } else if let Some(id) = text.strip_prefix("batch-") {
        owned.push(RowKey::new(&BATCHES_TABLE, Key::from_text(id)));
    }
}

/// The spec of the projection named `name`.
pub fn spec_by_name(name: &str) -> Option<&'static ProjectionSpec> {
    all_projectors()
        .iter()
        .map(|projector| projector.spec())
        .find(|spec| spec.name == name)
}

/// The projections connected to `spec` through `depends_on` in either
/// direction, `spec` included, in fold order (parents first). They are
/// rebuilt together.
pub fn family_of(spec: &'static ProjectionSpec) -> Vec<&'static ProjectionSpec> {
    let specs = all_specs();
    let mut family: Vec<&'static str> = vec![spec.name];
    let mut grew = true;
    while grew {
        grew = false;
        for candidate in &specs {
            let linked = candidate.depends_on.iter().any(|parent| family.contains(parent))
                || family.iter().any(|member| {
                    spec_by_name(member).is_some_and(|member| member.depends_on.contains(&candidate.name))
                });
            if linked && !family.contains(&candidate.name) {
                family.push(candidate.name);
                grew = true;
            }
        }
    }
    specs
        .into_iter()
        .filter(|candidate| family.contains(&candidate.name))
        .collect()
}
