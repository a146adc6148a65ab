//! The ledger's named locks (`opledger_store::lock`): a session advisory
//! lock, held on a connection of its own for as long as the handle lives.
//! Advisory locks belong to the database, so every client of one ledger,
//! from any host or folder, takes the same lock, and the server releases
//! it when the session ends, however the process holding it ends.

use crate::error;
use opledger_store::{LedgerLock, StoreError};
use sqlx::PgConnection;
use std::path::Path;

/// A held lock: its session. Dropping it closes the connection, which
/// ends the session and releases the lock (as soon as the server sees the
/// session end).
pub struct PostgresLock {
    connection: Option<PgConnection>,
    key: i64,
    name: String,
}

impl Drop for PostgresLock {
    fn drop(&mut self) {
        let Some(connection) = self.connection.take() else {
            return;
        };
        // Closed politely where a runtime runs (the server ends the session
        // at once); else the socket's close ends it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = sqlx::Connection::close(connection).await;
            });
        }
    }
}

impl LedgerLock for PostgresLock {
    fn describe(&self) -> String {
        format!("the {} lock of the database (advisory lock {})", self.name, self.key)
    }

    fn file(&self) -> Option<&Path> {
        None
    }
}

/// The advisory lock key of `name`: FNV-1a of a prefix and the name, so it
/// is stable across builds and apart from the append lock's key.
pub(crate) fn key(name: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in "opledger ledger lock ".bytes().chain(name.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

/// Takes the lock on `connection` if no session holds it.
pub(crate) async fn try_lock(mut connection: PgConnection, name: &str) -> Result<Option<PostgresLock>, StoreError> {
    opledger_store::lock::check_name(name)?;
    let key = key(name);
    let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(key)
        .fetch_one(&mut connection)
        .await
        .map_err(|error| error::map(error, &format!("taking the {name} lock")))?;
    Ok(taken.then(|| PostgresLock {
        connection: Some(connection),
        key,
        name: name.to_string(),
    }))
}

/// Takes the lock on `connection`, waiting for the session holding it.
pub(crate) async fn lock(mut connection: PgConnection, name: &str) -> Result<PostgresLock, StoreError> {
    opledger_store::lock::check_name(name)?;
    let key = key(name);
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut connection)
        .await
        .map_err(|error| error::map(error, &format!("waiting for the {name} lock")))?;
    Ok(PostgresLock {
        connection: Some(connection),
        key,
        name: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_stable_and_apart_from_the_append_lock() {
        assert_eq!(key("ingest"), key("ingest"));
        assert_ne!(key("ingest"), key("other"));
        assert_ne!(key("ingest"), crate::tx::APPEND_LOCK);
    }
}
