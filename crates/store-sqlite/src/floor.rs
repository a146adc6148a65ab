//! The raw floor for benchmarks: the same rows written and read the plainest
//! way this driver allows, on the same machine and file system, so
//! `opledger bench` can report our figure as a ratio of it.

use crate::error::map;
use crate::SqliteStore;
use opledger_store::StoreError;
use sqlx::Row;
use std::time::{Duration, Instant};

pub use opledger_store::floor::FloorRow;

/// Inserts `rows` into a plain table with the log's columns and its stream
/// index, but no triggers and no projections, `batch` rows per durable
/// transaction, each row a plain prepared INSERT. Returns the elapsed time.
pub async fn plain_inserts(store: &SqliteStore, rows: &[FloorRow], batch: usize) -> Result<Duration, StoreError> {
    inserts(store, rows, batch, 1).await
}

/// Like [`plain_inserts`], but each statement inserts up to 90 rows at once:
/// the fastest plain way this driver offers, and the stricter floor.
pub async fn multi_row_inserts(store: &SqliteStore, rows: &[FloorRow], batch: usize) -> Result<Duration, StoreError> {
    inserts(store, rows, batch, 90).await
}

async fn inserts(
    store: &SqliteStore,
    rows: &[FloorRow],
    batch: usize,
    rows_per_statement: usize,
) -> Result<Duration, StoreError> {
    let mut connection = store.raw_connection().await?;
    crate::rows::script(
        &mut connection,
        "DROP TABLE IF EXISTS bench_floor_events; \
         CREATE TABLE bench_floor_events (seq INTEGER PRIMARY KEY NOT NULL, stream_id TEXT NOT NULL, \
         stream_version INTEGER NOT NULL, event_type TEXT NOT NULL, schema_version INTEGER NOT NULL, \
         payload TEXT NOT NULL, recorded_at TEXT NOT NULL, actor TEXT NOT NULL, correlation_id TEXT NOT NULL, \
         causation_id TEXT); \
         CREATE UNIQUE INDEX bench_floor_events_by_stream ON bench_floor_events (stream_id, stream_version);",
    )
    .await
    .map_err(|error| map(error, "creating the floor table"))?;
    let started = Instant::now();
    let mut seq = 0i64;
    for chunk in rows.chunks(batch.max(1)) {
        crate::rows::script(&mut connection, "BEGIN IMMEDIATE")
            .await
            .map_err(|error| map(error, "floor begin"))?;
        for statement_rows in chunk.chunks(rows_per_statement) {
            let sql = format!(
                "INSERT INTO bench_floor_events (seq, stream_id, stream_version, event_type, schema_version, \
                 payload, recorded_at, actor, correlation_id, causation_id) VALUES {}",
                vec!["(?, ?, ?, ?, 1, ?, ?, ?, ?, NULL)"; statement_rows.len()].join(", ")
            );
            let mut query = sqlx::query(&sql);
            for row in statement_rows {
                seq += 1;
                query = query
                    .bind(seq)
                    .bind(row.stream_id.as_str())
                    .bind(row.stream_version)
                    .bind(row.event_type)
                    .bind(row.payload.as_str())
                    .bind(row.recorded_at.as_str())
                    .bind(row.actor.as_str())
                    .bind(row.correlation_id.as_str());
            }
            query
                .execute(&mut connection)
                .await
                .map_err(|error| map(error, "floor insert"))?;
        }
        crate::rows::script(&mut connection, "COMMIT")
            .await
            .map_err(|error| map(error, "floor commit"))?;
    }
    let elapsed = started.elapsed();
    crate::rows::script(&mut connection, "DROP TABLE bench_floor_events")
        .await
        .map_err(|error| map(error, "dropping the floor table"))?;
    crate::close_quietly(connection).await;
    Ok(elapsed)
}

/// Scans the whole log with one plain SELECT and decodes every payload with
/// serde into untyped JSON: the least work that still reads every event.
/// Returns (events read, elapsed).
pub async fn plain_scan(store: &SqliteStore) -> Result<(u64, Duration), StoreError> {
    use futures::TryStreamExt;
    let mut connection = store.raw_connection().await?;
    let started = Instant::now();
    let mut count = 0u64;
    {
        let mut rows = sqlx::query(
            "SELECT seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, \
             correlation_id, causation_id FROM media_operation_events ORDER BY seq",
        )
        .fetch(&mut connection);
        while let Some(row) = rows.try_next().await.map_err(|error| map(error, "floor scan"))? {
            let payload: &str = row.try_get(5).map_err(|error| map(error, "floor scan"))?;
            let value: serde_json::Value =
                serde_json::from_str(payload).map_err(|error| StoreError::corrupt(error.to_string()))?;
            std::hint::black_box(value);
            count += 1;
        }
    }
    let elapsed = started.elapsed();
    crate::close_quietly(connection).await;
    Ok((count, elapsed))
}
