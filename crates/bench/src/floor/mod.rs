//! The raw floors: the same rows written and read the plainest way each
//! driver allows, on the same machine (or server) in the same run, so every
//! figure is reported beside what no store could beat on that disk. They
//! reach the database only through the stores' raw connections
//! (`SqliteStore::raw_connection`, `PostgresStore::raw_connection`).

pub mod postgres;
pub mod sqlite;

use crate::BenchError;
use futures::{Stream, TryStreamExt};
use opledger_store::{Store, StreamAppend};

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

/// Rows a floor statement inserts at most: the stricter, multi-row floor.
pub const MULTI_ROW: usize = 90;

/// The rows of `appends`, each stream's versions counted from 1.
pub fn floor_rows(appends: &[StreamAppend]) -> Vec<FloorRow> {
    let mut rows = Vec::new();
    for append in appends {
        for (index, event) in append.events.iter().enumerate() {
            rows.push(FloorRow {
                stream_id: append.stream_id.to_string(),
                stream_version: index as i64 + 1,
                event_type: event.event.event_type(),
                payload: event.event.payload_json(),
                recorded_at: event.recorded_at.to_rfc3339(),
                actor: event.actor.clone(),
                correlation_id: event.correlation_id.clone(),
            });
        }
    }
    rows
}

/// The events a run appended after `from`, read back from the log as the
/// rows of a floor: the floor then inserts the very events the run wrote.
pub async fn logged_floor_rows<S: Store>(store: &S, from: i64) -> Result<Vec<FloorRow>, BenchError> {
    let mut rows = Vec::new();
    let mut events = store.read_all(from, 10_000);
    while let Some(envelope) = futures::StreamExt::next(&mut events).await {
        let envelope = envelope?;
        rows.push(FloorRow {
            stream_id: envelope.stream_id.to_string(),
            stream_version: envelope.stream_version,
            event_type: envelope.event.event_type(),
            payload: envelope.event.payload_json(),
            recorded_at: envelope.recorded_at.to_rfc3339(),
            actor: envelope.actor.clone(),
            correlation_id: envelope.correlation_id.clone(),
        });
    }
    Ok(rows)
}

/// The start of every floor INSERT: the log's columns, in order.
const INSERT_INTO_FLOOR: &str = "INSERT INTO bench_floor_events (seq, stream_id, stream_version, event_type, \
                                 schema_version, payload, recorded_at, actor, correlation_id, causation_id) VALUES ";

/// The scan floor's query: every event of the log, in order.
const SCAN_LOG: &str =
    "SELECT seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, \
                        correlation_id, causation_id FROM media_operation_events ORDER BY seq";

/// The scan floor's work on the rows of [`SCAN_LOG`]: decodes each row's
/// payload (column 5, borrowed from the row) with serde into untyped JSON,
/// the least work that still reads every event. Returns the rows counted.
async fn decode_payloads<R, S>(rows: S, payload: fn(&R) -> Result<&str, sqlx::Error>) -> Result<u64, BenchError>
where
    S: Stream<Item = Result<R, sqlx::Error>>,
{
    futures::pin_mut!(rows);
    let mut count = 0u64;
    while let Some(row) = rows.try_next().await.map_err(BenchError::floor("floor scan"))? {
        let text = payload(&row).map_err(BenchError::floor("floor scan"))?;
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|error| BenchError::Store(opledger_store::StoreError::corrupt(error.to_string())))?;
        std::hint::black_box(value);
        count += 1;
    }
    Ok(count)
}
