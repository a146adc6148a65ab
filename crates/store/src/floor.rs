//! The shape of a benchmark's raw floor row, shared by every backend's floor
//! (`opledger_store_sqlite::floor`, `opledger_store_postgres::floor`) so
//! `opledger bench` hands each the very same rows.

/// One row of a floor table: the event log's columns, already encoded the
/// way the log stores them (payload as JSON text, time as RFC 3339).
#[derive(Debug, Clone)]
pub struct FloorRow {
    pub stream_id: String,
    pub stream_version: i64,
    pub event_type: &'static str,
    pub payload: String,
    pub recorded_at: String,
    pub actor: String,
    pub correlation_id: String,
}
