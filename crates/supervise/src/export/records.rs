//! What an export holds, taken from the folded rows: plain rows (one per
//! operation, or per batch item) or the capability pivot. Sorted by key,
//! so one position always gives the same records in the same order.

use super::spilled::SpilledRows;
use super::What;
use opledger_domain::projections::{
    OperationRow, Row, BATCHES_TABLE, BATCH_ITEMS_TABLE, CAPABILITY_STATES_TABLE, OPERATIONS_TABLE,
};
use opledger_domain::{BatchId, Timestamp};
use opledger_store::StoreError;
use serde_json::Value;
use std::collections::BTreeMap;

/// The records of one export.
#[derive(Debug)]
pub enum Records {
    Rows {
        columns: &'static [&'static str],
        rows: Rows,
    },
    /// capability → status → count, both in name order.
    Pivot(BTreeMap<String, BTreeMap<String, u64>>),
}

/// The data rows of a plain export.
#[derive(Debug)]
pub enum Rows {
    /// Every operation of the folded rows, in key order, each decoded and
    /// turned into its cells only as it is written. *Why:* an operations
    /// export of a large ledger holds every operation; holding each whole
    /// too would triple the child's memory.
    Operations { folded: SpilledRows, count: u64 },
    /// Rows taken out and ordered beforehand (one batch's items).
    Listed(Vec<Vec<Value>>),
}

impl Rows {
    pub fn len(&self) -> u64 {
        match self {
            Rows::Operations { count, .. } => *count,
            Rows::Listed(rows) => rows.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hands each row's cells to `each`, in order; an error stops the walk.
    pub fn each<E: From<StoreError>>(&self, mut each: impl FnMut(&[Value]) -> Result<(), E>) -> Result<(), E> {
        match self {
            Rows::Operations { folded, .. } => {
                for row in folded.rows(&OPERATIONS_TABLE) {
                    if let Row::Operation(operation) = row? {
                        each(&operation_cells(&operation))?;
                    }
                }
                Ok(())
            }
            Rows::Listed(rows) => rows.iter().try_for_each(|row| each(row)),
        }
    }
}

fn operation_cells(operation: &OperationRow) -> [Value; 10] {
    [
        text(operation.operation_id.to_string()),
        text(operation.kind.clone()),
        text(operation.status.as_str().to_string()),
        optional(operation.media_id.map(|id| id.to_string())),
        optional(operation.region_id.map(|id| id.to_string())),
        optional(operation.path.clone()),
        Value::from(operation.attempt_count),
        optional(operation.status_reason.clone()),
        time(operation.created_at),
        time(operation.updated_at),
    ]
}

/// The columns of the operations export.
pub const OPERATION_COLUMNS: &[&str] = &[
    "operation_id",
    "kind",
    "status",
    "media_id",
    "region_id",
    "path",
    "attempt_count",
    "status_reason",
    "created_at",
    "updated_at",
];

/// Why an export has no records.
#[derive(Debug)]
pub enum RecordsError {
    /// What it asks for did not exist at its position (a batch).
    Missing(String),
    /// A folded row could not be read back.
    Store(StoreError),
}

impl From<StoreError> for RecordsError {
    fn from(error: StoreError) -> Self {
        RecordsError::Store(error)
    }
}

/// The columns of the batch items export.
pub const BATCH_ITEM_COLUMNS: &[&str] = &["position", "operation_id", "label", "outcome", "last_status", "runs"];

impl Records {
    /// The records `what` takes from the folded rows; a batch export of a
    /// batch that did not exist at the position is refused with why.
    pub fn of(what: What, batch: Option<BatchId>, rows: SpilledRows) -> Result<Records, RecordsError> {
        match what {
            What::Operations => {
                let count = rows.count(&OPERATIONS_TABLE) as u64;
                Ok(Records::Rows {
                    columns: OPERATION_COLUMNS,
                    rows: Rows::Operations { folded: rows, count },
                })
            }
            What::CapabilityCounts => {
                let mut pivot: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
                for row in rows.rows(&CAPABILITY_STATES_TABLE) {
                    if let Row::Capability(capability) = row? {
                        *pivot
                            .entry(capability.capability.clone())
                            .or_default()
                            .entry(capability.status.as_str().to_string())
                            .or_default() += 1;
                    }
                }
                Ok(Records::Pivot(pivot))
            }
            What::BatchItems => {
                let batch =
                    batch.ok_or_else(|| RecordsError::Missing("a batch_items export needs --batch".to_string()))?;
                let mut known = false;
                for row in rows.rows(&BATCHES_TABLE) {
                    known |= matches!(row?, Row::Batch(found) if found.batch_id == batch);
                }
                if !known {
                    return Err(RecordsError::Missing(format!(
                        "batch {batch} did not exist at this position of the log"
                    )));
                }
                let mut items: Vec<(i64, Vec<Value>)> = Vec::new();
                for row in rows.rows(&BATCH_ITEMS_TABLE) {
                    if let Row::BatchItem(item) = row? {
                        if item.batch_id == batch {
                            items.push((
                                item.position,
                                vec![
                                    Value::from(item.position),
                                    text(item.operation_id.to_string()),
                                    text(item.label.clone()),
                                    optional(item.outcome.map(|outcome| outcome.as_str().to_string())),
                                    optional(item.last_status.clone()),
                                    Value::from(item.runs),
                                ],
                            ));
                        }
                    }
                }
                items.sort_by_key(|(position, _)| *position);
                Ok(Records::Rows {
                    columns: BATCH_ITEM_COLUMNS,
                    rows: Rows::Listed(items.into_iter().map(|(_, row)| row).collect()),
                })
            }
        }
    }

    /// Records the file will hold: data rows (CSV, or JSON rows), or the
    /// pivot's cells with its subtotals and total — the same number in
    /// either format.
    pub fn total(&self) -> u64 {
        match self {
            Records::Rows { rows, .. } => rows.len(),
            Records::Pivot(pivot) => self.regular_rows() + pivot.len() as u64 + 1,
        }
    }

    /// Regular result rows: subtotal and total rows apart.
    pub fn regular_rows(&self) -> u64 {
        match self {
            Records::Rows { rows, .. } => rows.len(),
            Records::Pivot(pivot) => pivot.values().map(|statuses| statuses.len() as u64).sum(),
        }
    }
}

fn text(value: String) -> Value {
    Value::String(value)
}

fn optional(value: Option<String>) -> Value {
    value.map_or(Value::Null, Value::String)
}

fn time(at: Timestamp) -> Value {
    Value::String(at.to_rfc3339())
}
