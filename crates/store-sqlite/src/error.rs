//! SQLite error codes mapped to the neutral [`ErrorKind`]s. This is the only
//! place that knows SQLite's codes; nothing above the store compares them.
//! Both drivers of this crate (sqlx for the read pool, rusqlite for the
//! writer thread) come through here, so one code means one kind whichever
//! connection reported it.

use opledger_domain::quote;
use opledger_store::{ErrorKind, StoreError};

/// Primary and extended result codes that matter here (sqlite3.h).
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_NOMEM: i32 = 7;
const SQLITE_READONLY: i32 = 8;
const SQLITE_IOERR: i32 = 10;
const SQLITE_CORRUPT: i32 = 11;
const SQLITE_FULL: i32 = 13;
const SQLITE_CANTOPEN: i32 = 14;
const SQLITE_CONSTRAINT: i32 = 19;
const SQLITE_NOTADB: i32 = 26;
const SQLITE_CONSTRAINT_CHECK: i32 = 275;
const SQLITE_CONSTRAINT_FOREIGNKEY: i32 = 787;
const SQLITE_CONSTRAINT_NOTNULL: i32 = 1299;
const SQLITE_CONSTRAINT_PRIMARYKEY: i32 = 1555;
const SQLITE_CONSTRAINT_TRIGGER: i32 = 1811;
const SQLITE_CONSTRAINT_UNIQUE: i32 = 2067;

/// The message of a mapped error: what failed (its context, which may be
/// a statement, quoted short) and SQLite's words. A full disk is said
/// first, in plain words: it is what the reader must act on, and a
/// statement's text before it would only bury it.
fn message(code: Option<i32>, context: &str, error: &dyn std::fmt::Display) -> String {
    let context = quote(context);
    match code {
        Some(code) if code & 0xff == SQLITE_FULL => {
            format!("disk full: SQLite could not write ({error}; SQLite code {code}) while {context}")
        }
        Some(code) => format!("{context}: {error} (SQLite code {code})"),
        None => format!("{context}: {error}"),
    }
}

/// Maps a driver error to a neutral store error, keeping SQLite's message.
pub fn map(error: sqlx::Error, context: &str) -> StoreError {
    let mut code = None;
    let kind = match &error {
        sqlx::Error::Database(database) => {
            let number = database.code().and_then(|code| code.parse::<i32>().ok()).unwrap_or(0);
            code = Some(number);
            kind_of(number)
        }
        sqlx::Error::RowNotFound => ErrorKind::NotFound,
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => ErrorKind::Unavailable,
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) | sqlx::Error::ColumnNotFound(_) => {
            ErrorKind::Corrupt
        }
        _ => ErrorKind::Unavailable,
    };
    // sqlx's message of a database error already names the code.
    let shown = match &error {
        sqlx::Error::Database(database) => database.message().to_string(),
        other => other.to_string(),
    };
    StoreError::new(kind, message(code, context, &shown))
}

/// Maps an error of the writer's own connection (rusqlite) to a neutral
/// store error, by the same codes as [`map`]: both drivers report SQLite's
/// extended result code, and nothing above the store can tell which one ran.
pub fn map_rusqlite(error: rusqlite::Error, context: &str) -> StoreError {
    use rusqlite::Error;
    let (kind, code) = match &error {
        Error::SqliteFailure(failure, _) => (kind_of(failure.extended_code), Some(failure.extended_code)),
        Error::QueryReturnedNoRows => (ErrorKind::NotFound, None),
        // A stored value of the wrong type or shape, as sqlx's decode errors.
        Error::FromSqlConversionFailure(..)
        | Error::IntegralValueOutOfRange(..)
        | Error::Utf8Error(_)
        | Error::InvalidColumnType(..)
        | Error::InvalidColumnIndex(_)
        | Error::InvalidColumnName(_) => (ErrorKind::Corrupt, None),
        _ => (ErrorKind::Unavailable, None),
    };
    StoreError::new(kind, message(code, context, &error))
}

pub(crate) fn kind_of(code: i32) -> ErrorKind {
    match code {
        SQLITE_CONSTRAINT_UNIQUE | SQLITE_CONSTRAINT_PRIMARYKEY => ErrorKind::Conflict,
        // The log's triggers refuse an insert that is not the next seq or
        // stream version: another writer got there first.
        SQLITE_CONSTRAINT_TRIGGER => ErrorKind::Conflict,
        SQLITE_CONSTRAINT | SQLITE_CONSTRAINT_CHECK | SQLITE_CONSTRAINT_FOREIGNKEY | SQLITE_CONSTRAINT_NOTNULL => {
            ErrorKind::Constraint
        }
        SQLITE_CORRUPT | SQLITE_NOTADB => ErrorKind::Corrupt,
        _ => match code & 0xff {
            SQLITE_BUSY | SQLITE_LOCKED | SQLITE_NOMEM | SQLITE_READONLY | SQLITE_IOERR | SQLITE_FULL
            | SQLITE_CANTOPEN => ErrorKind::Unavailable,
            SQLITE_CONSTRAINT => ErrorKind::Constraint,
            SQLITE_CORRUPT | SQLITE_NOTADB => ErrorKind::Corrupt,
            _ => ErrorKind::Unavailable,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_neutral_kinds() {
        assert_eq!(kind_of(SQLITE_CONSTRAINT_UNIQUE), ErrorKind::Conflict);
        assert_eq!(kind_of(SQLITE_CONSTRAINT_PRIMARYKEY), ErrorKind::Conflict);
        assert_eq!(kind_of(SQLITE_CONSTRAINT_FOREIGNKEY), ErrorKind::Constraint);
        assert_eq!(kind_of(SQLITE_CONSTRAINT_CHECK), ErrorKind::Constraint);
        assert_eq!(kind_of(SQLITE_BUSY), ErrorKind::Unavailable);
        assert_eq!(kind_of(517), ErrorKind::Unavailable); // SQLITE_BUSY_SNAPSHOT
        assert_eq!(kind_of(SQLITE_FULL), ErrorKind::Unavailable);
        assert_eq!(kind_of(SQLITE_CORRUPT), ErrorKind::Corrupt);
        assert_eq!(kind_of(SQLITE_CONSTRAINT_TRIGGER), ErrorKind::Conflict);
        assert_eq!(kind_of(SQLITE_CONSTRAINT_NOTNULL), ErrorKind::Constraint);
        assert_eq!(kind_of(SQLITE_NOTADB), ErrorKind::Corrupt);
        assert_eq!(kind_of(SQLITE_LOCKED), ErrorKind::Unavailable);
        assert_eq!(kind_of(522), ErrorKind::Unavailable); // SQLITE_IOERR_SHORT_READ
    }

    /// A full disk is said first, and a long statement in the context is
    /// quoted short.
    #[test]
    fn a_full_disk_is_said_first_and_the_statement_quoted_short() {
        let statement = format!("CREATE TABLE scratch.t ({})", "column_name TEXT, ".repeat(100));
        let text = message(Some(SQLITE_FULL), &statement, &"database or disk is full");
        assert!(text.starts_with("disk full: "), "{text}");
        assert!(text.len() < 400, "{} bytes: {text}", text.len());
        assert_eq!(kind_of(SQLITE_FULL), ErrorKind::Unavailable);
        let other = message(Some(SQLITE_BUSY), "reading", &"database is locked");
        assert_eq!(other, "reading: database is locked (SQLite code 5)");
    }

    /// The writer's driver reports the same codes and so the same kinds.
    #[test]
    fn rusqlite_errors_map_like_sqlx_errors() {
        let connection = rusqlite::Connection::open_in_memory().unwrap();
        connection
            .execute_batch(
                "PRAGMA foreign_keys = ON; \
                 CREATE TABLE parent (id INTEGER PRIMARY KEY); \
                 CREATE TABLE child (id INTEGER PRIMARY KEY, parent INTEGER NOT NULL REFERENCES parent (id), \
                 n INTEGER CHECK (n > 0), u TEXT UNIQUE); \
                 INSERT INTO parent VALUES (1); INSERT INTO child VALUES (1, 1, 1, 'a');",
            )
            .unwrap();
        let kind = |sql: &str| map_rusqlite(connection.execute_batch(sql).unwrap_err(), sql).kind;
        assert_eq!(kind("INSERT INTO parent VALUES (1)"), ErrorKind::Conflict);
        assert_eq!(kind("INSERT INTO child VALUES (2, 1, 1, 'a')"), ErrorKind::Conflict);
        assert_eq!(kind("INSERT INTO child VALUES (2, 9, 1, 'b')"), ErrorKind::Constraint);
        assert_eq!(kind("INSERT INTO child VALUES (2, 1, 0, 'b')"), ErrorKind::Constraint);
        assert_eq!(
            kind("INSERT INTO child VALUES (2, NULL, 1, 'b')"),
            ErrorKind::Constraint
        );
        let decoded = connection.query_row("SELECT 'text'", [], |row| row.get::<_, i64>(0));
        assert_eq!(map_rusqlite(decoded.unwrap_err(), "decoding").kind, ErrorKind::Corrupt);
        let missing = connection.query_row("SELECT 1 WHERE 0", [], |row| row.get::<_, i64>(0));
        assert_eq!(map_rusqlite(missing.unwrap_err(), "reading").kind, ErrorKind::NotFound);
    }
}
