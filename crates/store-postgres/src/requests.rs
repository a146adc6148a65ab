//! The `command_requests` table (migration 0005) inside the write
//! transaction: a command recorded under its caller's request id, read
//! back by a retry under the writers' advisory lock, and swept by age.

use crate::error::map;
use chrono::{DateTime, Utc};
use opledger_domain::Timestamp;
use opledger_store::{CommandRecord, StoreError};
use sqlx::PgConnection;

/// A stored row: id, command, fingerprint, answer, first and last seq, time.
type Stored = (String, String, String, String, Option<i64>, Option<i64>, DateTime<Utc>);

pub(crate) async fn command_record(
    conn: &mut PgConnection,
    request_id: &str,
) -> Result<Option<CommandRecord>, StoreError> {
    let row: Option<Stored> = sqlx::query_as(
        "SELECT request_id, command, fingerprint, answer, first_seq, last_seq, recorded_at \
         FROM command_requests WHERE request_id = $1",
    )
    .bind(request_id)
    .fetch_optional(conn)
    .await
    .map_err(|error| map(error, "reading a recorded command"))?;
    Ok(row.map(
        |(request_id, command, fingerprint, answer, first, last, recorded_at)| CommandRecord {
            request_id,
            command,
            fingerprint,
            answer,
            seqs: first.zip(last),
            recorded_at: Timestamp::from_datetime(recorded_at),
        },
    ))
}

pub(crate) async fn record_command(conn: &mut PgConnection, record: &CommandRecord) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO command_requests \
         (request_id, command, fingerprint, answer, first_seq, last_seq, recorded_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&record.request_id)
    .bind(&record.command)
    .bind(&record.fingerprint)
    .bind(&record.answer)
    .bind(record.seqs.map(|(first, _)| first))
    .bind(record.seqs.map(|(_, last)| last))
    .bind(record.recorded_at.to_datetime())
    .execute(conn)
    .await
    .map(|_| ())
    .map_err(|error| map(error, "recording a command under its request id"))
}

/// Oldest first, through `command_requests_by_recorded`, a bounded number
/// per call so a sweep never holds the writers' lock for long.
pub(crate) async fn forget_commands(
    conn: &mut PgConnection,
    recorded_before: Timestamp,
    limit: usize,
) -> Result<u64, StoreError> {
    sqlx::query(
        "DELETE FROM command_requests WHERE request_id IN \
         (SELECT request_id FROM command_requests WHERE recorded_at < $1 ORDER BY recorded_at LIMIT $2)",
    )
    .bind(recorded_before.to_datetime())
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .execute(conn)
    .await
    .map(|done| done.rows_affected())
    .map_err(|error| map(error, "forgetting old recorded commands"))
}
