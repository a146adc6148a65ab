//! The ledger's named locks (`opledger_store::lock`): a session advisory
//! lock, held on a connection of its own for as long as the handle lives.
//! Advisory locks belong to the database, so every client of one ledger,
//! from any host or folder, takes the same lock, and the server releases
//! it when the session ends, however the process holding it ends.

use crate::error;
use opledger_store::{LedgerLock, StoreError};
use sqlx::PgConnection;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// A held lock: its session, kept by a task of its own that looks at it
/// every [`CHECK_EVERY`]. Dropping the handle tells the task to close the
/// connection, which ends the session and releases the lock (as soon as
/// the server sees the session end; if the runtime is gone, the socket's
/// close ends it).
///
/// *Why a watch:* the server ends the session, and with it the lock,
/// whenever the connection goes (a restart, a failover, a dropped network)
/// without the holder hearing of it; another process can take the lock
/// from then on. The task notices the session gone and says so
/// ([`LedgerLock::lost`]), so the holder stops instead of running beside
/// the next one.
pub struct PostgresLock {
    key: i64,
    name: String,
    /// Why the lock may be held by no one or another, once it is known.
    lost: Arc<Mutex<Option<String>>>,
    /// Dropped with the handle: the task closes the session.
    _release: oneshot::Sender<()>,
}

/// How often the holder's session is looked at.
const CHECK_EVERY: Duration = Duration::from_millis(500);

impl PostgresLock {
    fn hold(connection: PgConnection, key: i64, name: &str) -> PostgresLock {
        let lost = Arc::new(Mutex::new(None));
        let (release, released) = oneshot::channel();
        tokio::spawn(keep(connection, released, lost.clone()));
        PostgresLock {
            key,
            name: name.to_string(),
            lost,
            _release: release,
        }
    }
}

/// Keeps the lock's session until the handle is dropped, looking at it
/// every [`CHECK_EVERY`]; records why once the session is gone.
async fn keep(mut connection: PgConnection, mut released: oneshot::Receiver<()>, lost: Arc<Mutex<Option<String>>>) {
    loop {
        tokio::select! {
            _ = &mut released => {
                let _ = sqlx::Connection::close(connection).await;
                return;
            }
            () = tokio::time::sleep(CHECK_EVERY) => {
                if let Err(error) = sqlx::query("SELECT 1").execute(&mut connection).await {
                    *lost.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(format!(
                        "the session holding it ended ({error}), which released it on the server"
                    ));
                    return;
                }
            }
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

    fn lost(&self) -> Option<String> {
        self.lost
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// The advisory lock key of the ledger lock `name` (as `pg_locks` shows
/// it: `classid` its high 32 bits, `objid` its low ones, `objsubid` 1):
/// FNV-1a of a prefix and the name, so it is stable across builds and apart
/// from the append lock's key.
pub fn key(name: &str) -> i64 {
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
    Ok(taken.then(|| PostgresLock::hold(connection, key, name)))
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
    Ok(PostgresLock::hold(connection, key, name))
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
