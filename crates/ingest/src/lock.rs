//! One ingest at a time per ledger: the ledger's own `ingest` lock
//! ([`opledger_store::Store::lock_ledger`]: on SQLite a lock file beside
//! the database's real file, whatever path reached it; on PostgreSQL a
//! session advisory lock of the database, whatever folder the command runs
//! in), held for the run and released however the process ends. Holding it
//! is what lets a run treat the claims of every other ingest run as dead;
//! so a run that loses it (a PostgreSQL session that ended under it, as in
//! a server restart) stops at once and fails, rather than go on beside
//! the run that may take it next ([`IngestLock::watch`]).
//!
//! Which runs died holding claims needs no record of its own: every run
//! acts under a worker name of the form `ingest-<run id>`
//! ([`run_worker`]), and while a run holds the lock no other run is alive,
//! so every claim the ledger shows held by another such name belongs to a
//! run that ended without releasing it (killed). The run releases those
//! claims at once instead of waiting for their leases to expire.
//!
//! What a run was doing when it died is in its flight record
//! (`opledger_worker::FlightRecord`, `.<worker>.running` in the thumbnails
//! folder): the claims its image threads were running. Only those are
//! counted as interrupted (one of them may have killed it); its other
//! claims were only waiting and are given back without counting, so a
//! file that crashes the process is quarantined alone, not with the tasks
//! claimed beside it.

use crate::StopSignal;
use opledger_engine::{Engine, RunningWhenGone};
use opledger_store::{LedgerLock, Store, StoreError};
use opledger_worker::FlightRecord;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The name of the ledger lock an ingest holds.
pub const INGEST_LOCK: &str = "ingest";

/// The held lock; dropping it releases it.
pub struct IngestLock<S: Store> {
    /// Shared only with the run's watch ([`IngestLock::watch`]), which
    /// holds it weakly: dropping this releases the lock.
    lock: Arc<S::Lock>,
}

/// How often a run looks whether its lock was lost.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// A run's watch over its lock: once the lock is lost (on PostgreSQL, the
/// session holding it ended, as in a server restart, and the server
/// released it), another ingest may take it and treat this run's claims as
/// a dead run's. The watch stops the run at once, and the run ends with
/// the reason ([`LockWatch::lost`]) instead of going on beside the other.
pub(crate) struct LockWatch {
    lost: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LockWatch {
    /// Why the lock was lost, if it was.
    pub(crate) fn lost(&self) -> Option<String> {
        self.lost
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Why the lock was lost, waiting up to `patience` for a loss the watch
    /// has not heard of yet: a lock's session is looked at only now and
    /// then, and the other ingest that took it over may be seen first.
    pub(crate) async fn lost_within(&self, patience: Duration) -> Option<String> {
        let until = tokio::time::Instant::now() + patience;
        loop {
            if let Some(reason) = self.lost() {
                return Some(reason);
            }
            if self.task.is_finished() || tokio::time::Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for LockWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<S: Store> IngestLock<S> {
    /// Takes the ledger's ingest lock, waiting for another ingest to finish
    /// (`on_wait` is called once if it has to wait).
    pub async fn acquire(engine: &Engine<S>, on_wait: impl FnOnce()) -> Result<IngestLock<S>, StoreError> {
        let lock = match engine.store().try_lock_ledger(INGEST_LOCK).await? {
            Some(lock) => lock,
            None => {
                on_wait();
                engine.store().lock_ledger(INGEST_LOCK).await?
            }
        };
        Ok(IngestLock { lock: Arc::new(lock) })
    }

    /// Starts the run's watch over the lock: once it is lost, `stop` is
    /// asked to stop at once (running tasks interrupted).
    pub(crate) fn watch(&self, stop: &StopSignal) -> LockWatch {
        let held = Arc::downgrade(&self.lock);
        let lost = Arc::new(Mutex::new(None));
        let (found, stop) = (lost.clone(), stop.clone());
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                let Some(lock) = held.upgrade() else { return };
                let Some(reason) = lock.lost() else { continue };
                tracing::error!(lock = %lock.describe(), %reason, "the ingest lock was lost; stopping");
                *found.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(reason);
                // Twice: at once, since another ingest may be taking over.
                stop.stop("the loss of the ingest lock");
                stop.stop("the loss of the ingest lock");
                return;
            }
        });
        LockWatch { lost, task }
    }

    /// What is locked, for messages.
    pub fn describe(&self) -> String {
        self.lock.describe()
    }

    /// The lock's file, if it is one (the walk leaves it alone).
    pub fn file(&self) -> Option<&Path> {
        self.lock.file()
    }
}

/// The worker name of the ingest run whose id is `run` (32 hex digits, a
/// UUID's simple form): its ingestions and image tasks are claimed under it.
pub fn run_worker(run: &str) -> String {
    format!("ingest-{run}")
}

/// Whether `worker` is the name of an ingest run ([`run_worker`]).
pub fn is_run_worker(worker: &str) -> bool {
    worker
        .strip_prefix("ingest-")
        .is_some_and(|id| id.len() == 32 && id.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f')))
}

/// The flight record of the run acting as `worker`, in `dir`.
pub(crate) fn flight_record_path(dir: &Path, worker: &str) -> PathBuf {
    dir.join(format!(".{worker}.running"))
}

/// The flight records ingest runs left in `dir`: what each was running
/// when it ended, and the files.
pub(crate) fn left_flight_records(dir: &Path) -> (RunningWhenGone, Vec<PathBuf>) {
    let mut running = RunningWhenGone::new();
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (running, files);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(worker) = name
            .to_str()
            .and_then(|name| name.strip_prefix('.'))
            .and_then(|name| name.strip_suffix(".running"))
            .filter(|worker| is_run_worker(worker))
        else {
            continue;
        };
        // A record that cannot be read is no record: that run's claims
        // count as interrupted.
        if let Ok(tokens) = FlightRecord::read(&entry.path()) {
            running.insert(worker.to_string(), tokens);
        }
        files.push(entry.path());
    }
    (running, files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_names_of_ingest_runs_are_run_workers() {
        assert!(is_run_worker(&run_worker("0123456789abcdef0123456789abcdef")));
        for other in [
            "ingest-",
            "ingest-worker",
            "worker-0123456789abcdef0123456789abcdef",
            "ingest-0123456789ABCDEF0123456789ABCDEF",
            "ingest-0123456789abcdef0123456789abcdef0",
        ] {
            assert!(!is_run_worker(other), "{other}");
        }
    }
}
