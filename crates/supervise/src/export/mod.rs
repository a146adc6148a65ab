//! The export job: the ledger as of one position of its log, as a CSV or
//! JSON file.
//!
//! What is exported is computed from the log alone — the events up to the
//! pinned `as_of_seq`, folded with the domain's projectors in memory
//! (`fold`) — never read from the live projection tables, so an export is
//! exact while the ledger moves on, and two exports at one position are
//! byte-identical. The records (`records`) are sorted by key and written
//! with a fixed layout (`write`). The child process (`child`) runs it and
//! reports on its standard output.

pub mod child;
pub mod fold;
#[cfg(test)]
mod fold_tests;
pub mod records;
pub mod spilled;
pub mod write;

use opledger_domain::BatchId;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What an export holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum What {
    /// One row per operation.
    Operations,
    /// Capability × status, with subtotals per capability and a total.
    CapabilityCounts,
    /// The items of one batch.
    BatchItems,
}

impl What {
    /// The projection the export's records come from.
    pub fn projection(self) -> &'static str {
        match self {
            What::Operations => "media_operations",
            What::CapabilityCounts => "entity_capability_states",
            What::BatchItems => "batches",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            What::Operations => "operations",
            What::CapabilityCounts => "capability_counts",
            What::BatchItems => "batch_items",
        }
    }
}

impl FromStr for What {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "operations" => Ok(What::Operations),
            "capability_counts" => Ok(What::CapabilityCounts),
            "batch_items" => Ok(What::BatchItems),
            other => Err(format!(
                "{} is not an export; one of: operations, capability_counts, batch_items",
                opledger_domain::quoted(other)
            )),
        }
    }
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Csv,
    Json,
}

impl Format {
    pub fn extension(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Json => "json",
        }
    }
}

impl FromStr for Format {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            other => Err(format!(
                "{} is not an export format; one of: csv, json",
                opledger_domain::quoted(other)
            )),
        }
    }
}

/// One export, as recorded in its operation's inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportSpec {
    pub what: What,
    pub format: Format,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchId>,
    /// The log position the export shows the ledger at.
    pub as_of_seq: i64,
    /// Who created the job (its token is bound to it).
    pub principal: String,
    /// The access-policy revision the job was created under.
    pub policy: String,
}

impl ExportSpec {
    /// What the progress counts count: pivot cells for the pivot in JSON,
    /// data rows otherwise.
    pub fn count_unit(&self) -> &'static str {
        match (self.what, self.format) {
            (What::CapabilityCounts, Format::Json) => "pivot_cells",
            _ => "rows",
        }
    }
}

/// One line the child writes on its standard output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "report", rename_all = "snake_case")]
pub enum ChildReport {
    /// Where it stands; `total` is None while aggregating.
    Progress {
        phase: String,
        processed: u64,
        total: Option<u64>,
        regular_rows: Option<u64>,
    },
    /// The temporary file is complete and fsynced.
    Done {
        size: u64,
        sha256: String,
        processed: u64,
        total: u64,
        regular_rows: u64,
    },
}
