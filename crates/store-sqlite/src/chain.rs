//! The log's hash chain on SQLite: the head's link an append goes on from,
//! the fill of a log written before the chain existed, the chain check's
//! read, and the record of the last integrity check. The rule itself is
//! `opledger_domain::chain`; the checks of it are `opledger_store`'s.

use crate::error::{map, map_rusqlite};
use crate::writer_connection;
use opledger_domain::chain::{self, ChainEntry, ChainHash, ChainPoint, GENESIS};
use opledger_domain::projections::Cell;
use opledger_domain::Timestamp;
use opledger_store::append::LogHead;
use opledger_store::log::{self, RecordedAt, StoredEvent};
use opledger_store::{StoreError, Verification};
use rusqlite::Connection;
use sqlx::sqlite::SqliteRow;
use sqlx::{Row as _, SqlitePool};

/// The log's columns and the stored link, in the order the readers below take them.
const CHAIN_COLUMNS: &str = "seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, \
                             actor, correlation_id, causation_id, chain_hash";

/// Rows the fill reads and writes per statement round.
const FILL_CHUNK: i64 = 10_000;

/// The last event: its link and its time (the start of the chain on an
/// empty log). A link that is missing or not a hash is taken as the
/// genesis hash, and a time that does not parse as unknown: the append
/// goes on (a tampered row must not stop the ledger), and the check names
/// the row where the chain breaks.
pub(crate) fn head(connection: &Connection) -> Result<LogHead, StoreError> {
    let context = "reading the log head";
    let mut head = LogHead::START;
    writer_connection::select(
        connection,
        "SELECT seq, chain_hash, recorded_at FROM media_operation_events ORDER BY seq DESC LIMIT 1",
        &[],
        context,
        |row| {
            let seq: i64 = row.get(0).map_err(|error| map_rusqlite(error, context))?;
            let hash: Option<String> = row.get(1).map_err(|error| map_rusqlite(error, context))?;
            let recorded_at: Option<String> = row.get(2).ok();
            head = LogHead {
                point: ChainPoint {
                    seq,
                    hash: hash.and_then(|text| ChainHash::from_hex(&text).ok()).unwrap_or(GENESIS),
                },
                recorded_at: recorded_at.and_then(|text| Timestamp::parse(&text).ok()),
            };
            Ok(())
        },
    )?;
    Ok(head)
}

/// One row of [`CHAIN_COLUMNS`] on the writer's connection.
fn writer_entry(row: &rusqlite::Row<'_>) -> Result<ChainEntry, StoreError> {
    let seq: i64 = row.get(0).map_err(|error| map_rusqlite(error, "reading seq"))?;
    let column = |error: rusqlite::Error| StoreError::corrupt_at(seq, error.to_string());
    let text = |index: usize| -> Result<&str, StoreError> {
        row.get_ref(index)
            .map_err(column)?
            .as_str()
            .map_err(|error| StoreError::corrupt_at(seq, format!("column {index}: {error}")))
    };
    let chain_hash: Option<String> = row.get(10).map_err(column)?;
    log::chain_entry(
        &StoredEvent {
            seq,
            stream_id: row.get(1).map_err(column)?,
            stream_version: row.get(2).map_err(column)?,
            event_type: text(3)?,
            schema_version: row.get(4).map_err(column)?,
            payload: text(5)?,
            recorded_at: RecordedAt::Text(text(6)?),
            actor: row.get(7).map_err(column)?,
            correlation_id: row.get(8).map_err(column)?,
            causation_id: row.get(9).map_err(column)?,
        },
        chain_hash.as_deref(),
    )
}

/// Links the events of a log written before the chain existed (migration
/// 0004), in seq order, in one transaction, before the writer takes any
/// work. Only a log whose first event has no link is filled, and only its
/// unlinked prefix: a row without a link after a linked one was not
/// written by opledger, and stays a break for the check to name.
pub(crate) fn fill_unchained(connection: &Connection) -> Result<(), StoreError> {
    writer_connection::execute(connection, "BEGIN IMMEDIATE")?;
    let result = (|| {
        let unchained = writer_connection::select_optional::<bool>(
            connection,
            "SELECT chain_hash IS NULL FROM media_operation_events WHERE seq = 1",
            &[],
            "reading the log's first link",
        )?;
        if unchained != Some(true) {
            return Ok(());
        }
        let mut point = ChainPoint::START;
        loop {
            let mut entries = Vec::new();
            writer_connection::select(
                connection,
                &format!(
                    "SELECT {CHAIN_COLUMNS} FROM media_operation_events \
                     WHERE seq > ? AND chain_hash IS NULL ORDER BY seq LIMIT ?"
                ),
                &[Cell::Integer(point.seq), Cell::Integer(FILL_CHUNK)],
                "reading events to link",
                |row| {
                    entries.push(writer_entry(row)?);
                    Ok(())
                },
            )?;
            let read = entries.len();
            for entry in entries {
                if entry.seq != point.seq + 1 {
                    return Ok(());
                }
                let hash = chain::link(&point.hash, &entry.digest);
                writer_connection::execute_with(
                    connection,
                    "UPDATE media_operation_events SET chain_hash = ? WHERE seq = ?",
                    &[Cell::Text(hash.to_hex()), Cell::Integer(entry.seq)],
                    "linking an event written before the chain",
                )?;
                point = ChainPoint { seq: entry.seq, hash };
            }
            if (read as i64) < FILL_CHUNK {
                return Ok(());
            }
        }
    })();
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    writer_connection::execute(connection, end)?;
    result
}

/// One row of [`CHAIN_COLUMNS`] from a read connection.
fn reader_entry(row: &SqliteRow) -> Result<ChainEntry, StoreError> {
    let seq: i64 = row.try_get(0).map_err(|error| map(error, "reading seq"))?;
    let column = |error: sqlx::Error| StoreError::corrupt_at(seq, error.to_string());
    let chain_hash: Option<&str> = row.try_get(10).map_err(column)?;
    log::chain_entry(
        &StoredEvent {
            seq,
            stream_id: row.try_get(1).map_err(column)?,
            stream_version: row.try_get(2).map_err(column)?,
            event_type: row.try_get(3).map_err(column)?,
            schema_version: row.try_get(4).map_err(column)?,
            payload: row.try_get(5).map_err(column)?,
            recorded_at: RecordedAt::Text(row.try_get(6).map_err(column)?),
            actor: row.try_get(7).map_err(column)?,
            correlation_id: row.try_get(8).map_err(column)?,
            causation_id: row.try_get(9).map_err(column)?,
        },
        chain_hash,
    )
}

/// Up to `limit` events after `after` as the chain check reads them.
pub(crate) async fn read_chain(readers: &SqlitePool, after: i64, limit: usize) -> Result<Vec<ChainEntry>, StoreError> {
    let sql = format!("SELECT {CHAIN_COLUMNS} FROM media_operation_events WHERE seq > ? ORDER BY seq LIMIT ?");
    let fetched = sqlx::query(&sql)
        .bind(after)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(readers)
        .await
        .map_err(|error| map(error, "reading the log's chain"))?;
    fetched.iter().map(reader_entry).collect()
}

/// A `log_verification` row: when, position, head hash, broken at, differing tables.
type StoredVerification = (String, i64, Option<String>, Option<i64>, i64);

pub(crate) async fn last_verification(readers: &SqlitePool) -> Result<Option<Verification>, StoreError> {
    let context = "reading the last integrity check";
    let row: Option<StoredVerification> = sqlx::query_as(
        "SELECT verified_at, position, head_hash, broken_at, differing_tables FROM log_verification WHERE id = 1",
    )
    .fetch_optional(readers)
    .await
    .map_err(|error| map(error, context))?;
    row.map(|(verified_at, position, head_hash, broken_at, differing_tables)| {
        Ok(Verification {
            verified_at: Timestamp::parse(&verified_at).map_err(StoreError::corrupt)?,
            position,
            head_hash: head_hash
                .map(|text| ChainHash::from_hex(&text).map_err(StoreError::corrupt))
                .transpose()?,
            broken_at,
            differing_tables,
        })
    })
    .transpose()
}

pub(crate) fn record_verification(connection: &Connection, verification: &Verification) -> Result<(), StoreError> {
    writer_connection::execute_with(
        connection,
        "INSERT OR REPLACE INTO log_verification \
         (id, verified_at, position, head_hash, broken_at, differing_tables) VALUES (1, ?, ?, ?, ?, ?)",
        &[
            Cell::Text(verification.verified_at.to_rfc3339()),
            Cell::Integer(verification.position),
            verification
                .head_hash
                .map_or(Cell::Null, |hash| Cell::Text(hash.to_hex())),
            verification.broken_at.map_or(Cell::Null, Cell::Integer),
            Cell::Integer(verification.differing_tables),
        ],
        "recording an integrity check",
    )
    .map(|_| ())
}
