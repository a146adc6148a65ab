//! The `command_requests` table (migration 0005) on the writer's
//! connection: a command recorded under its caller's request id, read back
//! by a retry inside its own write transaction, and swept by age.

use crate::error::map_rusqlite;
use crate::writer_connection::{execute_with, select};
use opledger_domain::projections::Cell;
use opledger_domain::Timestamp;
use opledger_store::{CommandRecord, StoreError};
use rusqlite::Connection;

const SELECT: &str = "SELECT request_id, command, fingerprint, answer, first_seq, last_seq, recorded_at \
     FROM command_requests WHERE request_id = ?";

const INSERT: &str = "INSERT INTO command_requests \
     (request_id, command, fingerprint, answer, first_seq, last_seq, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)";

/// Oldest first, through `command_requests_by_recorded`, a bounded number
/// per call so a sweep never holds the writer for long.
const FORGET: &str = "DELETE FROM command_requests WHERE request_id IN \
     (SELECT request_id FROM command_requests WHERE recorded_at < ? ORDER BY recorded_at LIMIT ?)";

pub(crate) fn command_record(connection: &Connection, request_id: &str) -> Result<Option<CommandRecord>, StoreError> {
    let context = "reading a recorded command";
    let mut found = None;
    select(
        connection,
        SELECT,
        &[Cell::Text(request_id.to_string())],
        context,
        |row| {
            let get_text = |index: usize| {
                row.get::<_, String>(index)
                    .map_err(|error| map_rusqlite(error, context))
            };
            let get_seq = |index: usize| {
                row.get::<_, Option<i64>>(index)
                    .map_err(|error| map_rusqlite(error, context))
            };
            let seqs = match (get_seq(4)?, get_seq(5)?) {
                (Some(first), Some(last)) => Some((first, last)),
                _ => None,
            };
            found = Some(CommandRecord {
                request_id: get_text(0)?,
                command: get_text(1)?,
                fingerprint: get_text(2)?,
                answer: get_text(3)?,
                seqs,
                recorded_at: Timestamp::parse(&get_text(6)?).map_err(StoreError::corrupt)?,
            });
            Ok(())
        },
    )?;
    Ok(found)
}

pub(crate) fn record_command(connection: &Connection, record: &CommandRecord) -> Result<(), StoreError> {
    let (first, last) = match record.seqs {
        Some((first, last)) => (Cell::Integer(first), Cell::Integer(last)),
        None => (Cell::Null, Cell::Null),
    };
    execute_with(
        connection,
        INSERT,
        &[
            Cell::Text(record.request_id.clone()),
            Cell::Text(record.command.clone()),
            Cell::Text(record.fingerprint.clone()),
            Cell::Text(record.answer.clone()),
            first,
            last,
            Cell::Timestamp(record.recorded_at),
        ],
        "recording a command under its request id",
    )
    .map(|_| ())
}

pub(crate) fn forget_commands(
    connection: &Connection,
    recorded_before: Timestamp,
    limit: usize,
) -> Result<u64, StoreError> {
    execute_with(
        connection,
        FORGET,
        &[
            Cell::Timestamp(recorded_before),
            Cell::Integer(i64::try_from(limit).unwrap_or(i64::MAX)),
        ],
        "forgetting old recorded commands",
    )
    .map(|changed| changed as u64)
}
