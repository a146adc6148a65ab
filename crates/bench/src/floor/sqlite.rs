//! The floors on SQLite, through sqlx on the store's raw connection (the
//! writer's settings: WAL and the same `synchronous`).

use super::{decode_payloads, FloorRow, INSERT_INTO_FLOOR, MULTI_ROW, SCAN_LOG};
use crate::BenchError;
use opledger_store_sqlite::SqliteStore;
use sqlx::sqlite::SqliteRow;
use sqlx::{Connection, Executor, Row, SqliteConnection};
use std::time::{Duration, Instant};

/// Inserts `rows` into a plain table with the log's columns and its stream
/// index, but no triggers and no projections, `batch` rows per durable
/// transaction, each row a plain prepared INSERT. Returns the elapsed time.
pub async fn plain_inserts(store: &SqliteStore, rows: &[FloorRow], batch: usize) -> Result<Duration, BenchError> {
    inserts(store, rows, batch, 1).await
}

/// Like [`plain_inserts`], but each statement inserts up to 90 rows at once:
/// the fastest plain way this driver offers, and the stricter floor.
pub async fn multi_row_inserts(store: &SqliteStore, rows: &[FloorRow], batch: usize) -> Result<Duration, BenchError> {
    inserts(store, rows, batch, MULTI_ROW).await
}

async fn script(connection: &mut SqliteConnection, sql: &str, context: &'static str) -> Result<(), BenchError> {
    connection
        .execute(sql)
        .await
        .map(|_| ())
        .map_err(BenchError::floor(context))
}

async fn inserts(
    store: &SqliteStore,
    rows: &[FloorRow],
    batch: usize,
    rows_per_statement: usize,
) -> Result<Duration, BenchError> {
    let mut connection = store.raw_connection().await?;
    script(
        &mut connection,
        "DROP TABLE IF EXISTS bench_floor_events; \
         CREATE TABLE bench_floor_events (seq INTEGER PRIMARY KEY NOT NULL, stream_id TEXT NOT NULL, \
         stream_version INTEGER NOT NULL, event_type TEXT NOT NULL, schema_version INTEGER NOT NULL, \
         payload TEXT NOT NULL, recorded_at TEXT NOT NULL, actor TEXT NOT NULL, correlation_id TEXT NOT NULL, \
         causation_id TEXT); \
         CREATE UNIQUE INDEX bench_floor_events_by_stream ON bench_floor_events (stream_id, stream_version);",
        "creating the floor table",
    )
    .await?;
    let started = Instant::now();
    let mut seq = 0i64;
    for chunk in rows.chunks(batch.max(1)) {
        script(&mut connection, "BEGIN IMMEDIATE", "floor begin").await?;
        for statement_rows in chunk.chunks(rows_per_statement) {
            let sql = format!(
                "{INSERT_INTO_FLOOR}{}",
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
                .map_err(BenchError::floor("floor insert"))?;
        }
        script(&mut connection, "COMMIT", "floor commit").await?;
    }
    let elapsed = started.elapsed();
    script(
        &mut connection,
        "DROP TABLE bench_floor_events",
        "dropping the floor table",
    )
    .await?;
    let _ = connection.close().await;
    Ok(elapsed)
}

/// Scans the whole log with one plain SELECT and decodes every payload with
/// serde into untyped JSON. Returns (events read, elapsed).
pub async fn plain_scan(store: &SqliteStore) -> Result<(u64, Duration), BenchError> {
    fn payload(row: &SqliteRow) -> Result<&str, sqlx::Error> {
        row.try_get(5)
    }
    let mut connection = store.raw_connection().await?;
    let started = Instant::now();
    let count = decode_payloads(sqlx::query(SCAN_LOG).fetch(&mut connection), payload).await?;
    let elapsed = started.elapsed();
    let _ = connection.close().await;
    Ok((count, elapsed))
}

/// The first page of operations newest first, the plainest way: every
/// column of `limit` rows by the listing index, fetched but not decoded
/// into typed rows. The floor of `ops list`'s first page.
pub async fn first_operations_page(connection: &mut SqliteConnection, limit: usize) -> Result<usize, BenchError> {
    let columns = opledger_domain::projections::OPERATIONS_TABLE
        .column_names()
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!("SELECT {columns} FROM media_operations ORDER BY created_at DESC, id DESC LIMIT ?");
    let rows = sqlx::query(&sql)
        .bind(limit as i64)
        .fetch_all(&mut *connection)
        .await
        .map_err(BenchError::floor("reading the first page"))?;
    Ok(rows.len())
}
