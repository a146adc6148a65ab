//! A ledger's named exclusive locks, for work that must run once at a time
//! per ledger whichever process, host, folder or path reaches it (the
//! ingest). The lock belongs to the ledger itself, not to the name it was
//! reached by: a SQLite file reached through a symlink, or a PostgreSQL
//! database named from two working folders, is one lock. It is released
//! when its handle is dropped and, however a process ends, by the
//! operating system or the server.

use std::path::Path;

/// A held lock of a ledger (see [`crate::Store::lock_ledger`]). Dropping
/// it releases it.
pub trait LedgerLock: Send + Sync + 'static {
    /// What is locked, for messages (a file, a server lock).
    fn describe(&self) -> String;

    /// The file the lock is held on, when it is one: a walk of a folder
    /// that holds it leaves it alone.
    fn file(&self) -> Option<&Path>;

    /// Why the lock may no longer be this holder's, once that is known
    /// (a lock held by a server session ends with the session, whatever
    /// ended it): a holder that sees it stops what the lock guarded. None
    /// while it is held; a lock that cannot be lost while its handle lives
    /// (a file lock) always answers None.
    fn lost(&self) -> Option<String> {
        None
    }
}

/// A lock name is a short word: it names the lock in a file name or a
/// server's lock key, never anything a user typed.
pub fn check_name(name: &str) -> Result<(), crate::StoreError> {
    if name.is_empty() || name.len() > 32 || !name.bytes().all(|byte| byte.is_ascii_lowercase() || byte == b'-') {
        return Err(crate::StoreError::constraint(format!(
            "a ledger lock name is 1 to 32 lowercase letters or dashes, not {}",
            opledger_domain::quote(name)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_are_short_lowercase_words() {
        assert!(check_name("ingest").is_ok());
        assert!(check_name("ingest-media").is_ok());
        for bad in ["", "Ingest", "../x", "a b", &"x".repeat(33)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
