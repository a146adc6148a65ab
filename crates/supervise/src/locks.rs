//! File locks (`flock`): the slots, the execution lock of a job and a
//! supervisor's liveness lock. The OS releases a lock however its holder
//! ends — exit, SIGKILL, a crash — so a lock that can be taken proves that
//! whoever held it is gone.

use crate::SuperviseError;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

/// An exclusive lock on a file, held until dropped.
#[derive(Debug)]
pub struct FileLock {
    // Closing the file releases the lock.
    _file: File,
    path: PathBuf,
}

impl FileLock {
    /// Takes the lock on `path` (created when missing) if nobody holds it.
    pub fn try_take(path: &Path) -> Result<Option<FileLock>, SuperviseError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(SuperviseError::io(format!("opening the lock {}", path.display())))?;
        match file.try_lock() {
            Ok(()) => Ok(Some(FileLock {
                _file: file,
                path: path.to_path_buf(),
            })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(source)) => Err(SuperviseError::Io {
                context: format!("locking {}", path.display()),
                source,
            }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether somebody holds the lock on `path` now (a missing file: nobody).
pub fn is_held(path: &Path) -> Result<bool, SuperviseError> {
    if !path.exists() {
        return Ok(false);
    }
    Ok(FileLock::try_take(path)?.is_none())
}
