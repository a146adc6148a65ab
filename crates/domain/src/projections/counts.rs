//! Running counts a projection keeps beside its rows, so a dashboard reads
//! a handful of numbers instead of counting a table that grows with the
//! log. Each counts table holds named rows of a JSON object of counts,
//! changed by the same fold (and so the same transaction) as the rows they
//! count; replay rebuilds them like any row. Rows that vanish by cascade
//! (a removed media item takes its regions and capability states with it)
//! are loaded by a [`super::RowQuery`] before the event is folded, so the
//! fold sees them go and subtracts them.

use super::cells::{Cell, CellReader, ColumnSpec, ColumnType, MapError, TableSpec};
use super::working_set::{RowKey, WorkingSet};
use super::Row;
use std::collections::BTreeMap;

macro_rules! counts_table {
    ($static_name:ident, $table:literal) => {
        pub static $static_name: TableSpec = TableSpec {
            name: $table,
            columns: &[
                ColumnSpec::required("name", ColumnType::Text),
                ColumnSpec::required("counts", ColumnType::Json),
            ],
            key_columns: 1,
        };
    };
}

counts_table!(OPERATION_COUNTS_TABLE, "media_operation_counts");
counts_table!(MEDIA_COUNTS_TABLE, "media_counts");
counts_table!(CAPABILITY_COUNTS_TABLE, "entity_capability_counts");
counts_table!(REVIEW_COUNTS_TABLE, "review_queue_counts");

/// The review queue's counts row: entries by state.
pub const BY_STATE: &str = "by_state";

/// One named set of counts.
#[derive(Debug, Clone, PartialEq)]
pub struct CountsRow {
    pub table: &'static TableSpec,
    pub name: String,
    /// JSON object text: value → count, zeros left out.
    pub counts: String,
}

impl CountsRow {
    pub fn to_cells(&self) -> Vec<Cell> {
        vec![Cell::Text(self.name.clone()), Cell::Json(self.counts.clone())]
    }

    pub fn from_cells(table: &'static TableSpec, cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(table, cells);
        Ok(CountsRow {
            table,
            name: reader.text()?,
            counts: reader.text()?,
        })
    }

    /// The counts as a map.
    pub fn parsed(&self) -> BTreeMap<String, i64> {
        serde_json::from_str(&self.counts).unwrap_or_default()
    }
}

pub fn counts_key(table: &'static TableSpec, name: &str) -> RowKey {
    RowKey::new(table, name.to_string())
}

/// Adds `delta` to the count of `value` in the named counts row.
pub(crate) fn add_count(rows: &mut WorkingSet, table: &'static TableSpec, name: &str, value: &str, delta: i64) {
    let key = counts_key(table, name);
    let mut counts = match rows.get(&key) {
        Some(Row::Counts(row)) => row.parsed(),
        _ => BTreeMap::new(),
    };
    let entry = counts.entry(value.to_string()).or_insert(0);
    *entry += delta;
    if *entry == 0 {
        counts.remove(value);
    }
    rows.put(Row::Counts(CountsRow {
        table,
        name: name.to_string(),
        counts: serde_json::to_string(&counts).expect("counts serialize"),
    }));
}
