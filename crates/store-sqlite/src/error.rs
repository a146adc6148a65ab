//! SQLite error codes mapped to the neutral [`ErrorKind`]s. This is the only
//! place that knows SQLite's codes; nothing above the store compares them.

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

/// Maps a driver error to a neutral store error, keeping SQLite's message.
pub fn map(error: sqlx::Error, context: &str) -> StoreError {
    let kind = match &error {
        sqlx::Error::Database(database) => {
            let code = database.code().and_then(|code| code.parse::<i32>().ok()).unwrap_or(0);
            kind_of(code)
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
    StoreError::new(kind, format!("{context}: {error}"))
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
    }
}
