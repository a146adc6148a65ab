//! Statements stepped directly on the SQLite handle of a sqlx connection,
//! which sqlx lends out with `lock_handle`: the log scan (replay,
//! `read_all`) and bulk row writes (replay into scratch). The writer needs
//! none of this: it owns a plain rusqlite connection (`writer_connection.rs`).
//!
//! Through the driver, every row travels between SQLite's thread and ours
//! and every parameter is copied twice; for a replay of a million events
//! that handoff cost more than SQLite's own work. Everything unsafe is in
//! this file and bounded by guards: statements are finalized on every path,
//! and no pointer into a row outlives the step that produced it.

use crate::ddl::{self, Copy};
use crate::error::map;
use libsqlite3_sys as ffi;
use opledger_domain::projections::{Cell, Row, RowChange, TableSpec};
use opledger_domain::EventEnvelope;
use opledger_store::log::{self, RecordedAt, StoredEvent};
use opledger_store::StoreError;
use sqlx::SqliteConnection;
use std::ffi::{c_int, CStr};
use std::ptr::{self, NonNull};

const READ_EVENTS: &CStr = c"SELECT seq, stream_id, stream_version, event_type, schema_version, payload, \
      recorded_at, actor, correlation_id, causation_id \
      FROM main.media_operation_events WHERE seq > ?1 ORDER BY seq LIMIT ?2";

/// Finalizes the statement however the read ends.
struct Statement(*mut ffi::sqlite3_stmt);

impl Drop for Statement {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful prepare and is finalized once.
        unsafe {
            ffi::sqlite3_finalize(self.0);
        }
    }
}

fn sqlite_error(db: *mut ffi::sqlite3, context: &str) -> StoreError {
    // SAFETY: db is the open handle we hold the lock on; errmsg returns a
    // NUL-terminated string owned by SQLite, copied out at once.
    let message = unsafe { CStr::from_ptr(ffi::sqlite3_errmsg(db)).to_string_lossy().into_owned() };
    let code = unsafe { ffi::sqlite3_extended_errcode(db) };
    StoreError::new(
        crate::error::kind_of(code),
        format!("{context}: {message} (SQLite code {code})"),
    )
}

/// Prepares `sql` on `db`.
///
/// SAFETY: `db` must be a handle the caller holds locked.
unsafe fn prepare(db: *mut ffi::sqlite3, sql: &str, context: &str) -> Result<Statement, StoreError> {
    let mut raw_statement = ptr::null_mut();
    let length = c_int::try_from(sql.len()).map_err(|_| StoreError::unavailable("statement too long"))?;
    let rc = ffi::sqlite3_prepare_v2(db, sql.as_ptr().cast(), length, &mut raw_statement, ptr::null_mut());
    if rc != ffi::SQLITE_OK {
        return Err(sqlite_error(db, context));
    }
    Ok(Statement(raw_statement))
}

/// Binds one cell as parameter `index` (1-based).
///
/// SAFETY: `statement` must be a live prepared statement; text is bound with
/// SQLITE_TRANSIENT, so SQLite copies it before this returns.
unsafe fn bind(statement: *mut ffi::sqlite3_stmt, index: c_int, cell: &Cell) -> c_int {
    let bind_text = |text: &str| {
        ffi::sqlite3_bind_text(
            statement,
            index,
            text.as_ptr().cast(),
            text.len() as c_int,
            ffi::SQLITE_TRANSIENT(),
        )
    };
    match cell {
        Cell::Null => ffi::sqlite3_bind_null(statement, index),
        Cell::Integer(value) => ffi::sqlite3_bind_int64(statement, index, *value),
        Cell::Real(value) => ffi::sqlite3_bind_double(statement, index, *value),
        Cell::Text(value) | Cell::Json(value) => bind_text(value),
        Cell::Bool(value) => ffi::sqlite3_bind_int64(statement, index, i64::from(*value)),
        Cell::Timestamp(value) => bind_text(&value.to_rfc3339()),
        Cell::Uuid(value) => bind_text(value.hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer())),
    }
}

/// Runs `statement` once per parameter row.
///
/// SAFETY: `db` is locked by the caller and `statement` was prepared on it.
unsafe fn run_each<'a>(
    db: *mut ffi::sqlite3,
    statement: &Statement,
    rows: impl Iterator<Item = Vec<Cell>> + 'a,
    context: &str,
) -> Result<(), StoreError> {
    for cells in rows {
        for (index, cell) in cells.iter().enumerate() {
            if bind(statement.0, index as c_int + 1, cell) != ffi::SQLITE_OK {
                return Err(sqlite_error(db, context));
            }
        }
        let rc = ffi::sqlite3_step(statement.0);
        ffi::sqlite3_reset(statement.0);
        if rc != ffi::SQLITE_DONE {
            return Err(sqlite_error(db, context));
        }
    }
    Ok(())
}

/// Writes changed rows to one copy, one prepared single-row statement per
/// table stepped once per row: upserts parents first, then deletes children
/// first. Used where rows come by the thousand (replay into scratch tables).
pub async fn write_rows(
    conn: &mut SqliteConnection,
    table_order: &[&'static TableSpec],
    copy: Copy<'_>,
    changes: &[RowChange],
) -> Result<(), StoreError> {
    let mut handle = conn
        .lock_handle()
        .await
        .map_err(|error| map(error, "locking the connection for a bulk write"))?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: the handle stays locked for the whole block; every statement is
    // finalized by its guard.
    unsafe {
        for table in table_order {
            let mut upserts = changes
                .iter()
                .filter(|change| change.key.table == table.name)
                .filter_map(|change| change.after.as_deref())
                .peekable();
            if upserts.peek().is_none() {
                continue;
            }
            let name = ddl::table_name(table.name, copy);
            let columns: Vec<&str> = table.column_names().collect();
            let updates: Vec<String> = columns
                .iter()
                .skip(table.key_columns)
                .map(|column| format!("{column} = excluded.{column}"))
                .collect();
            let sql = format!(
                "INSERT INTO {name} ({}) VALUES ({}) ON CONFLICT ({}) DO UPDATE SET {}",
                columns.join(", "),
                vec!["?"; columns.len()].join(", "),
                columns[0],
                updates.join(", ")
            );
            let statement = prepare(db, &sql, &format!("writing {name}"))?;
            run_each(db, &statement, upserts.map(Row::to_cells), &format!("writing {name}"))?;
        }
        for table in table_order.iter().rev() {
            let mut deletes = changes
                .iter()
                .filter(|change| change.key.table == table.name && change.after.is_none())
                .map(|change| vec![Cell::Text(change.key.key.to_string())])
                .peekable();
            if deletes.peek().is_none() {
                continue;
            }
            let name = ddl::table_name(table.name, copy);
            let sql = format!("DELETE FROM {name} WHERE {} = ?", table.columns[0].name);
            let statement = prepare(db, &sql, &format!("deleting from {name}"))?;
            run_each(db, &statement, deletes, &format!("deleting from {name}"))?;
        }
    }
    Ok(())
}

/// Column `index` of the current row as UTF-8 text, or None for NULL.
///
/// SAFETY: `statement` must be positioned on a row (last step returned
/// SQLITE_ROW); the returned slice is valid until the next step or finalize,
/// so callers copy or parse it before stepping again.
unsafe fn text<'row>(statement: *mut ffi::sqlite3_stmt, index: c_int) -> Option<&'row [u8]> {
    let pointer = ffi::sqlite3_column_text(statement, index);
    if pointer.is_null() {
        return None;
    }
    let length = ffi::sqlite3_column_bytes(statement, index);
    Some(std::slice::from_raw_parts(pointer, length.max(0) as usize))
}

/// Reads up to `limit` events after `after`, stepping SQLite directly.
pub async fn read_events(
    conn: &mut SqliteConnection,
    after: i64,
    limit: usize,
) -> Result<Vec<EventEnvelope>, StoreError> {
    let mut handle = conn
        .lock_handle()
        .await
        .map_err(|error| map(error, "locking the connection for a log scan"))?;
    let db: NonNull<ffi::sqlite3> = handle.as_raw_handle();
    let db = db.as_ptr();
    let mut events = Vec::with_capacity(limit.min(100_000));
    // SAFETY: the handle is locked for this whole block, so sqlx's worker
    // does not use it concurrently; the statement guard finalizes it.
    unsafe {
        let mut raw_statement = ptr::null_mut();
        let rc = ffi::sqlite3_prepare_v2(db, READ_EVENTS.as_ptr(), -1, &mut raw_statement, ptr::null_mut());
        if rc != ffi::SQLITE_OK {
            return Err(sqlite_error(db, "preparing the log scan"));
        }
        let statement = Statement(raw_statement);
        ffi::sqlite3_bind_int64(statement.0, 1, after);
        ffi::sqlite3_bind_int64(statement.0, 2, i64::try_from(limit).unwrap_or(i64::MAX));
        loop {
            match ffi::sqlite3_step(statement.0) {
                ffi::SQLITE_ROW => events.push(decode_row(statement.0)?),
                ffi::SQLITE_DONE => break,
                _ => return Err(sqlite_error(db, "scanning the event log")),
            }
        }
    }
    Ok(events)
}

/// SAFETY: as for [`text`]: `statement` is positioned on a row.
unsafe fn decode_row(statement: *mut ffi::sqlite3_stmt) -> Result<EventEnvelope, StoreError> {
    let seq = ffi::sqlite3_column_int64(statement, 0);
    let corrupt = |what: String| StoreError::corrupt_at(seq, what);
    let string = |index: c_int, name: &str| -> Result<&str, StoreError> {
        let bytes = text(statement, index).ok_or_else(|| corrupt(format!("{name} is NULL")))?;
        std::str::from_utf8(bytes).map_err(|error| corrupt(format!("{name} is not UTF-8: {error}")))
    };
    let causation_id = match text(statement, 9) {
        None => None,
        Some(bytes) => Some(
            std::str::from_utf8(bytes)
                .map_err(|error| corrupt(format!("causation_id is not UTF-8: {error}")))?
                .to_string(),
        ),
    };
    log::decode(StoredEvent {
        seq,
        stream_id: string(1, "stream_id")?.to_string(),
        stream_version: ffi::sqlite3_column_int64(statement, 2),
        event_type: string(3, "event_type")?,
        schema_version: ffi::sqlite3_column_int64(statement, 4),
        payload: string(5, "payload")?,
        recorded_at: RecordedAt::Text(string(6, "recorded_at")?),
        actor: string(7, "actor")?.to_string(),
        correlation_id: string(8, "correlation_id")?.to_string(),
        causation_id,
    })
}
