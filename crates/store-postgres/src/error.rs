//! PostgreSQL SQLSTATE codes mapped to the neutral [`ErrorKind`]s. This is
//! the only place that knows them; nothing above the store compares them.
//! The kinds mirror SQLite's mapping (`crates/store-sqlite/src/error.rs`), so
//! the engine cannot tell the backends apart by their failures.

use opledger_domain::quote;
use opledger_store::{ErrorKind, StoreError};

/// disk_full: the server could not extend a file.
const DISK_FULL: &str = "53100";

/// The log's append-only trigger (migrations/postgres/0001_event_log.sql).
pub(crate) const APPEND_ONLY: &str = "OL001";
/// The log's next-seq / next-stream-version trigger (same file).
pub(crate) const NOT_NEXT: &str = "OL002";

/// Maps a driver error to a neutral store error, keeping PostgreSQL's
/// message and code for the humans who read it.
pub fn map(error: sqlx::Error, context: &str) -> StoreError {
    let (kind, code) = match &error {
        sqlx::Error::Database(database) => {
            let code = database.code().map(|code| code.into_owned());
            (code.as_deref().map_or(ErrorKind::Unavailable, kind_of), code)
        }
        sqlx::Error::RowNotFound => (ErrorKind::NotFound, None),
        // The connection is gone or never came: retrying later may succeed.
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_) => (ErrorKind::Unavailable, None),
        // A stored value of the wrong type or shape.
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) | sqlx::Error::ColumnNotFound(_) => {
            (ErrorKind::Corrupt, None)
        }
        _ => (ErrorKind::Unavailable, None),
    };
    StoreError::new(kind, message(code.as_deref(), context, &error))
}

/// The message of a mapped error: what failed (its context, which may be
/// a statement, quoted short) and the server's words. A full disk is said
/// first, in plain words: it is what the reader must act on.
fn message(code: Option<&str>, context: &str, error: &dyn std::fmt::Display) -> String {
    let context = quote(context);
    match code {
        Some(DISK_FULL) => {
            format!("disk full: the PostgreSQL server could not write ({error}; SQLSTATE {DISK_FULL}) while {context}")
        }
        Some(code) => format!("{context}: {error} (SQLSTATE {code})"),
        None => format!("{context}: {error}"),
    }
}

/// The neutral kind of a SQLSTATE.
pub(crate) fn kind_of(sqlstate: &str) -> ErrorKind {
    match sqlstate {
        // Someone else won: a unique key was taken (as on SQLite, where two
        // writers racing to create the same row is a Conflict), or the
        // transaction lost a serialization race or a deadlock.
        "23505" | "23P01" | "40001" | "40P01" => ErrorKind::Conflict,
        // The log's triggers, mapped as SQLite maps its trigger refusals: an
        // insert that is not the next seq means another writer got there
        // first; UPDATE/DELETE on the log only ever come from outside the store.
        APPEND_ONLY | NOT_NEXT => ErrorKind::Conflict,
        // not_null, foreign_key, check, restrict, integrity (generic).
        "23502" | "23503" | "23514" | "23001" | "23000" => ErrorKind::Constraint,
        // data_corrupted, index_corrupted.
        "XX001" | "XX002" => ErrorKind::Corrupt,
        // lock_not_available (lock_timeout ran out), query_canceled (a
        // statement timeout or an operator's cancel), the operator or a
        // crash ended the backend, the server cannot connect now.
        "55P03" | "57014" | "57P01" | "57P02" | "57P03" | "57P04" => ErrorKind::Unavailable,
        _ => match &sqlstate[..sqlstate.len().min(2)] {
            // connection_exception, insufficient_resources (disk full, out of
            // memory, too many connections), system errors (I/O).
            "08" | "53" | "58" => ErrorKind::Unavailable,
            // Any other integrity violation.
            "23" => ErrorKind::Constraint,
            // data_exception: a value the column cannot hold (bad uuid text,
            // out of range): input the domain should have refused.
            "22" => ErrorKind::Constraint,
            _ => ErrorKind::Unavailable,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_neutral_kinds() {
        let cases = [
            ("23505", ErrorKind::Conflict),
            ("23P01", ErrorKind::Conflict),
            ("40001", ErrorKind::Conflict),
            ("40P01", ErrorKind::Conflict),
            (APPEND_ONLY, ErrorKind::Conflict),
            (NOT_NEXT, ErrorKind::Conflict),
            ("23503", ErrorKind::Constraint),
            ("23514", ErrorKind::Constraint),
            ("23502", ErrorKind::Constraint),
            ("23001", ErrorKind::Constraint),
            ("22P02", ErrorKind::Constraint),
            ("22003", ErrorKind::Constraint),
            ("XX001", ErrorKind::Corrupt),
            ("XX002", ErrorKind::Corrupt),
            ("08006", ErrorKind::Unavailable),
            ("08001", ErrorKind::Unavailable),
            ("57P01", ErrorKind::Unavailable),
            ("57014", ErrorKind::Unavailable),
            ("55P03", ErrorKind::Unavailable),
            ("53100", ErrorKind::Unavailable),
            ("53300", ErrorKind::Unavailable),
            ("58030", ErrorKind::Unavailable),
            ("42P01", ErrorKind::Unavailable),
            ("X", ErrorKind::Unavailable),
        ];
        for (code, kind) in cases {
            assert_eq!(kind_of(code), kind, "{code}");
        }
    }

    /// A full disk is said first, and a long statement in the context is
    /// quoted short.
    #[test]
    fn a_full_disk_is_said_first_and_the_statement_quoted_short() {
        let statement = format!("CREATE UNLOGGED TABLE s.t ({})", "column_name text, ".repeat(100));
        let text = message(Some(DISK_FULL), &statement, &"could not extend file");
        assert!(text.starts_with("disk full: "), "{text}");
        assert!(text.len() < 400, "{} bytes: {text}", text.len());
        assert_eq!(kind_of(DISK_FULL), ErrorKind::Unavailable);
    }

    #[test]
    fn driver_errors_without_a_sqlstate_map_by_what_failed() {
        assert_eq!(map(sqlx::Error::PoolTimedOut, "acquiring").kind, ErrorKind::Unavailable);
        assert_eq!(map(sqlx::Error::RowNotFound, "reading").kind, ErrorKind::NotFound);
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(map(sqlx::Error::Io(io), "writing").kind, ErrorKind::Unavailable);
        assert_eq!(
            map(sqlx::Error::ColumnNotFound("payload".into()), "decoding").kind,
            ErrorKind::Corrupt
        );
    }
}
