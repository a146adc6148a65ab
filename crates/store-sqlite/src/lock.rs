//! The ledger's named locks (`opledger_store::lock`): an exclusive lock on
//! a file beside the database's real file (`<file>.<name>-lock`, the path
//! with every symlink resolved), so every path that reaches one database
//! file takes one lock. The operating system releases it when the process
//! ends, however it ends.

use opledger_store::{LedgerLock, StoreError};
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

/// A held lock; dropping it closes the file, which releases it.
#[derive(Debug)]
pub struct SqliteLock {
    _file: File,
    path: PathBuf,
}

impl LedgerLock for SqliteLock {
    fn describe(&self) -> String {
        format!("the lock file {}", self.path.display())
    }

    fn file(&self) -> Option<&Path> {
        Some(&self.path)
    }
}

/// The lock file of `name` for the database at `database`: beside the file
/// the path resolves to.
fn lock_path(database: &Path, name: &str) -> Result<PathBuf, StoreError> {
    opledger_store::lock::check_name(name)?;
    let real = std::fs::canonicalize(database).map_err(|error| {
        StoreError::unavailable(format!(
            "cannot find the database file {} to lock it: {error}",
            database.display()
        ))
    })?;
    let mut path = real.into_os_string();
    path.push(format!(".{name}-lock"));
    Ok(PathBuf::from(path))
}

fn open(path: &Path) -> Result<File, StoreError> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|error| StoreError::unavailable(format!("cannot open the lock file {}: {error}", path.display())))
}

/// Takes the lock if no one holds it.
pub(crate) fn try_lock(database: &Path, name: &str) -> Result<Option<SqliteLock>, StoreError> {
    let path = lock_path(database, name)?;
    let file = open(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(SqliteLock { _file: file, path })),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(error)) => Err(StoreError::unavailable(format!(
            "cannot lock {}: {error}",
            path.display()
        ))),
    }
}

/// Takes the lock, waiting (on a blocking thread) for its holder.
pub(crate) async fn lock(database: &Path, name: &str) -> Result<SqliteLock, StoreError> {
    let path = lock_path(database, name)?;
    tokio::task::spawn_blocking(move || {
        let file = open(&path)?;
        file.lock()
            .map_err(|error| StoreError::unavailable(format!("cannot lock {}: {error}", path.display())))?;
        Ok(SqliteLock { _file: file, path })
    })
    .await
    .map_err(|error| StoreError::unavailable(format!("waiting for a ledger lock: {error}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The database file reached through a symlink, or through a symlinked
    /// folder, is one lock, kept beside the real file.
    #[tokio::test]
    async fn a_lock_taken_through_a_symlink_is_the_lock_of_the_real_file() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("ledger.db");
        std::fs::write(&real, b"").unwrap();
        let link = dir.path().join("alias.db");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let folder = dir.path().join("folder-alias");
        std::os::unix::fs::symlink(dir.path(), &folder).unwrap();

        let held = try_lock(&link, "ingest").unwrap().expect("free");
        assert_eq!(
            held.file().unwrap(),
            std::fs::canonicalize(dir.path()).unwrap().join("ledger.db.ingest-lock")
        );
        assert!(
            try_lock(&real, "ingest").unwrap().is_none(),
            "the real path sees it held"
        );
        assert!(try_lock(&folder.join("ledger.db"), "ingest").unwrap().is_none());
        drop(held);
        assert!(try_lock(&real, "ingest").unwrap().is_some());
    }
}
