//! One ingest at a time per database: an exclusive lock on a file beside
//! it, held for the run and released by the operating system when the
//! process ends, however it ends. Holding it is what lets a run treat
//! ingestions claimed by an earlier run as dead.
//!
//! The file also records who holds it: the worker name of each run that
//! took it and has not yet released what it held (one per line). A run
//! that takes the lock reads the names left there; those runs ended
//! without releasing their claims (killed), so it releases their task
//! claims at once instead of waiting for their leases to expire, then
//! records itself. A run that ends, normally or stopped, clears the record
//! once its claims are released.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The most of the record a run reads (a few hundred names).
const RECORD_LIMIT: u64 = 64 * 1024;

/// The held lock; dropping it releases it.
#[derive(Debug)]
pub struct IngestLock {
    file: File,
    pub path: PathBuf,
    /// Runs that held the lock before and did not release their claims.
    previous: Vec<String>,
}

impl IngestLock {
    /// Takes the lock at `path`, waiting for another ingest to finish
    /// (`on_wait` is called once if it has to wait), and reads who held
    /// it without releasing their claims.
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
        let mut text = String::new();
        // A record that is not text (written by something else) names nobody.
        let _ = (&file).take(RECORD_LIMIT).read_to_string(&mut text);
        let previous = text
            .lines()
            .map(str::trim)
            .filter(|name| !name.is_empty() && name.len() <= 200)
            .map(str::to_string)
            .collect();
        Ok(IngestLock {
            file,
            path: path.to_path_buf(),
            previous,
        })
    }

    /// The worker names of runs that held the lock and ended without
    /// releasing their claims: dead, since this run holds the lock now.
    pub fn previous_holders(&self) -> &[String] {
        &self.previous
    }

    /// Records `holders` as the runs whose claims are not released yet
    /// (durably, so a run killed next is known to the one after it).
    pub fn record(&mut self, holders: &[String]) -> io::Result<()> {
        let mut text = String::new();
        for holder in holders {
            text.push_str(holder);
            text.push('\n');
        }
        self.file.set_len(0)?;
        self.file.seek(SeekFrom::Start(0))?;
        self.file.write_all(text.as_bytes())?;
        self.file.sync_data()
    }
}
