//! The raw floor for benchmarks on PostgreSQL: the same rows written and read
//! the plainest way this driver allows, on the same server, so `opledger
//! bench` can report our figure as a ratio of it; and the throwaway databases
//! the benchmark runs in (it never touches the database the user named).

use crate::error::map;
use crate::{PostgresConfig, PostgresStore};
use opledger_store::StoreError;
use sqlx::{ConnectOptions, Connection, Executor, PgConnection, Row};
use std::time::{Duration, Instant};

pub use opledger_store::floor::FloorRow;

/// Creates database `name` (dropping any leftover of that name first) on the
/// server of `server`, connecting through the database `server` names.
/// Returns the configuration of the new database.
pub async fn create_database(server: &PostgresConfig, name: &str) -> Result<PostgresConfig, StoreError> {
    let mut connection = admin_connection(server).await?;
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        connection
            .execute(sql.as_str())
            .await
            .map_err(|error| map(error, &format!("creating database {name}")))?;
    }
    let _ = connection.close().await;
    Ok(server.clone().with_database(name))
}

/// Drops database `name`, forcing off connections still open to it.
pub async fn drop_database(server: &PostgresConfig, name: &str) -> Result<(), StoreError> {
    let mut connection = admin_connection(server).await?;
    let result = connection
        .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
        .await
        .map(|_| ())
        .map_err(|error| map(error, &format!("dropping database {name}")));
    let _ = connection.close().await;
    result
}

/// A connection for CREATE and DROP DATABASE, which take a while and would
/// otherwise be logged as slow statements.
async fn admin_connection(server: &PostgresConfig) -> Result<PgConnection, StoreError> {
    server
        .options
        .clone()
        .disable_statement_logging()
        .connect()
        .await
        .map_err(|error| map(error, &format!("connecting to {}", server.describe())))
}

/// Inserts `rows` into a plain table with the log's columns and its stream
/// index, but no triggers, no advisory lock and no projections, `batch` rows
/// per transaction, each row a plain prepared INSERT (one round trip each).
/// Returns the elapsed time.
pub async fn plain_inserts(store: &PostgresStore, rows: &[FloorRow], batch: usize) -> Result<Duration, StoreError> {
    inserts(store, rows, batch, 1).await
}

/// Like [`plain_inserts`], but each statement inserts up to 90 rows at once:
/// the stricter floor.
pub async fn multi_row_inserts(store: &PostgresStore, rows: &[FloorRow], batch: usize) -> Result<Duration, StoreError> {
    inserts(store, rows, batch, 90).await
}

async fn inserts(
    store: &PostgresStore,
    rows: &[FloorRow],
    batch: usize,
    rows_per_statement: usize,
) -> Result<Duration, StoreError> {
    let mut connection = store.raw_connection().await?;
    connection
        .execute(
            "DROP TABLE IF EXISTS bench_floor_events; \
             CREATE TABLE bench_floor_events (seq bigint PRIMARY KEY, stream_id text COLLATE \"C\" NOT NULL, \
             stream_version bigint NOT NULL, event_type text NOT NULL, schema_version integer NOT NULL, \
             payload text NOT NULL, recorded_at timestamptz NOT NULL, actor text NOT NULL, \
             correlation_id text NOT NULL, causation_id text); \
             CREATE UNIQUE INDEX bench_floor_events_by_stream ON bench_floor_events (stream_id, stream_version);",
        )
        .await
        .map_err(|error| map(error, "creating the floor table"))?;
    let started = Instant::now();
    let mut seq = 0i64;
    for chunk in rows.chunks(batch.max(1)) {
        connection
            .execute("BEGIN")
            .await
            .map_err(|error| map(error, "floor begin"))?;
        for statement_rows in chunk.chunks(rows_per_statement) {
            let values: Vec<String> = (0..statement_rows.len())
                .map(|index| {
                    let at = index * 8;
                    format!(
                        "(${}, ${}, ${}, ${}, 1, ${}, ${}::timestamptz, ${}, ${}, NULL)",
                        at + 1,
                        at + 2,
                        at + 3,
                        at + 4,
                        at + 5,
                        at + 6,
                        at + 7,
                        at + 8
                    )
                })
                .collect();
            let sql = format!(
                "INSERT INTO bench_floor_events (seq, stream_id, stream_version, event_type, schema_version, \
                 payload, recorded_at, actor, correlation_id, causation_id) VALUES {}",
                values.join(", ")
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
        connection
            .execute("COMMIT")
            .await
            .map_err(|error| map(error, "floor commit"))?;
    }
    let elapsed = started.elapsed();
    connection
        .execute("DROP TABLE bench_floor_events")
        .await
        .map_err(|error| map(error, "dropping the floor table"))?;
    let _ = connection.close().await;
    Ok(elapsed)
}

/// Scans the whole log with one plain SELECT and decodes every payload with
/// serde into untyped JSON: the least work that still reads every event.
/// Returns (events read, elapsed).
pub async fn plain_scan(store: &PostgresStore) -> Result<(u64, Duration), StoreError> {
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
    let _ = connection.close().await;
    Ok((count, elapsed))
}
