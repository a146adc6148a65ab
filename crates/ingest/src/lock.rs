//! One ingest at a time per database: an exclusive lock on a file beside
//! it, held for the run and released by the operating system when the
//! process ends, however it ends. Holding it is what lets a run treat
//! ingestions claimed by an earlier run as dead.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

/// The held lock; dropping it releases it.
#[derive(Debug)]
pub struct IngestLock {
    _file: File,
    pub path: PathBuf,
}

impl IngestLock {
    /// Takes the lock at `path`, waiting for another ingest to finish
    /// (`on_wait` is called once if it has to wait).
    pub fn acquire(path: &Path, on_wait: impl FnOnce()) -> io::Result<IngestLock> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                on_wait();
                file.lock()?;
            }
            Err(TryLockError::Error(error)) => return Err(error),
        }
        Ok(IngestLock {
            _file: file,
            path: path.to_path_buf(),
        })
    }
}
