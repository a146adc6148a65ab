//! Running counts a projection keeps beside its rows, so a dashboard reads
//! a handful of numbers instead of counting a table that grows with the
//! log. Each counts table holds named rows of a JSON object of counts,
//! changed by the same fold (and so the same transaction) as the rows they
//! count; replay rebuilds them like any row. Rows that vanish by cascade
//! (a removed media item takes its regions and capability states with it)
//! are loaded by a [`super::RowQuery`] before the event is folded, so the
//! fold sees them go and subtracts them.

use super::cells::{Cell, CellReader, ColumnSpec, ColumnType, MapError, TableSpec};
use super::working_set::{Key, RowKey, WorkingSet};
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

/// The capability counts row of stale capabilities by task kind.
pub const STALE_BY_KIND: &str = "stale_by_kind";

/// The review queue's counts row: entries by state.
pub const BY_STATE: &str = "by_state";

/// One named set of counts.
#[derive(Debug, Clone, PartialEq)]
pub struct CountsRow {
    pub table: &'static TableSpec,
    pub name: String,
    /// Value → count, zeros left out; stored as a JSON object (sorted
    /// keys, so one set of counts has one text). Held parsed: a fold
    /// changes counts rows several times per event, and parsing and
    /// re-serializing the text each time was a tenth of replay's fold.
    pub counts: BTreeMap<String, i64>,
}

impl CountsRow {
    pub fn to_cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text(self.name.clone()),
            Cell::Json(serde_json::to_string(&self.counts).expect("a map of counts serializes")),
        ]
    }

    pub fn from_cells(table: &'static TableSpec, cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(table, cells);
        let name = reader.text()?;
        let text = reader.text()?;
        let counts = serde_json::from_str(&text).map_err(|error| {
            MapError::new(
                table.name,
                format!("counts of {name:?} are not a JSON object of integers ({error}): {text}"),
            )
        })?;
        Ok(CountsRow { table, name, counts })
    }
}

/// The key of a counts row named by a constant: no allocation, as folds
/// name counts rows several times per event.
pub fn counts_key(table: &'static TableSpec, name: &'static str) -> RowKey {
    RowKey::new(table, Key::Name(std::borrow::Cow::Borrowed(name)))
}

/// Adds `delta` to the count of `value` in the named counts row, in place.
pub(crate) fn add_count(rows: &mut WorkingSet, table: &'static TableSpec, name: &'static str, value: &str, delta: i64) {
    let key = counts_key(table, name);
    let changed = rows.modify(&key, |row| {
        if let Row::Counts(row) = row {
            bump(&mut row.counts, value, delta);
        }
    });
    if !changed {
        let mut counts = BTreeMap::new();
        bump(&mut counts, value, delta);
        rows.put(Row::Counts(CountsRow {
            table,
            name: name.to_string(),
            counts,
        }));
    }
}

fn bump(counts: &mut BTreeMap<String, i64>, value: &str, delta: i64) {
    match counts.get_mut(value) {
        Some(count) => *count += delta,
        None => {
            counts.insert(value.to_string(), delta);
        }
    }
    if counts.get(value) == Some(&0) {
        counts.remove(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_round_trip_through_their_cells_as_sorted_json() {
        let row = CountsRow {
            table: &OPERATION_COUNTS_TABLE,
            name: "by_status".into(),
            counts: BTreeMap::from([("queued".to_string(), 3), ("failed_terminal".to_string(), 1)]),
        };
        let cells = row.to_cells();
        assert_eq!(cells[1], Cell::Json(r#"{"failed_terminal":1,"queued":3}"#.into()));
        assert_eq!(CountsRow::from_cells(&OPERATION_COUNTS_TABLE, cells).unwrap(), row);
    }

    #[test]
    fn stored_counts_that_are_not_a_json_object_of_integers_are_refused() {
        for text in ["", "[1]", r#"{"queued":"three"}"#, r#"{"queued":1.5}"#] {
            let cells = vec![Cell::Text("by_status".into()), Cell::Json(text.into())];
            let error = CountsRow::from_cells(&OPERATION_COUNTS_TABLE, cells).unwrap_err();
            assert!(error.reason.contains("by_status"), "{text}: {}", error.reason);
        }
    }

    #[test]
    fn a_count_that_returns_to_zero_leaves_the_row() {
        let mut rows = WorkingSet::default();
        let key = counts_key(&OPERATION_COUNTS_TABLE, "by_status");
        rows.insert_loaded(key.clone(), None);
        add_count(&mut rows, &OPERATION_COUNTS_TABLE, "by_status", "queued", 1);
        add_count(&mut rows, &OPERATION_COUNTS_TABLE, "by_status", "running", 1);
        add_count(&mut rows, &OPERATION_COUNTS_TABLE, "by_status", "queued", -1);
        let Some(Row::Counts(row)) = rows.get(&key) else {
            panic!("no counts row")
        };
        assert_eq!(row.counts, BTreeMap::from([("running".to_string(), 1)]));
    }
}
