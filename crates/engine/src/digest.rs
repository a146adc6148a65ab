//! A digest of every projection table: one SHA-256 over the rows the live
//! tables hold, the same on every backend for the same log. Golden replay
//! fixtures (`tests/fixtures/logs/`) record it for the log they hold, so a
//! change in what any fold makes of an old event is caught.

use crate::error::EngineError;
use crate::Engine;
use opledger_domain::projections::all_specs;
use opledger_domain::revision::sha256_hex;
use opledger_store::Store;

impl<S: Store> Engine<S> {
    /// SHA-256 (hex) over every live projection table in the build's order
    /// (projections, then each one's tables parents first): for each table
    /// its name, then each row as a line of its table's name and its cells
    /// as JSON (`Cell::to_json`), the lines sorted. Reads whole tables: for
    /// tests and fixtures, not for a large ledger.
    pub async fn projection_digest(&self) -> Result<String, EngineError> {
        let mut text = String::new();
        for spec in all_specs() {
            for table in spec.tables {
                let rows = self.store.scan_table(table).await?;
                let mut lines: Vec<String> = rows
                    .iter()
                    .map(|row| {
                        let cells: Vec<serde_json::Value> = row.to_cells().iter().map(|cell| cell.to_json()).collect();
                        format!("{}\t{}\n", table.name, serde_json::Value::Array(cells))
                    })
                    .collect();
                lines.sort();
                text.push_str(&format!("# {} {}\n", table.name, lines.len()));
                text.extend(lines);
            }
        }
        Ok(sha256_hex(text.as_bytes()))
    }
}
