//! Which claims a process's compute threads are running right now, kept in
//! a file that outlives the process however it ends. A closure handed to
//! [`crate::ComputeThreads`] from a job's task carries the job's claim
//! token; the thread writes it into its slot of the file before running
//! the closure and clears it after. The file is written without a sync:
//! a process that dies (an abort, SIGKILL) leaves its writes in the
//! operating system's cache, which is all a next run on the same machine
//! reads. A power loss takes the record with it, and the claims are then
//! judged as if there were none.
//!
//! *Why:* a process holds many claims while its threads run a few of
//! them; when a task kills the process (an allocation that aborts), the
//! record tells the next run which claims were running — one of them is
//! the culprit — and which were only waiting their turn, which did nothing
//! wrong and should not count an interruption.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes per thread's slot: a claim token and room to spare.
const SLOT: usize = 128;

tokio::task_local! {
    /// The claim token of the job whose task is running in this task.
    pub(crate) static CLAIM: String;
}

/// A process's record of the claims its compute threads run.
#[derive(Debug)]
pub struct FlightRecord {
    file: File,
    path: PathBuf,
}

impl FlightRecord {
    /// Creates (or empties) the record at `path`.
    pub fn create(path: impl Into<PathBuf>) -> io::Result<FlightRecord> {
        let path = path.into();
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        Ok(FlightRecord { file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The claim tokens the record at `path` holds: those its process's
    /// threads were running when it last wrote it.
    pub fn read(path: &Path) -> io::Result<BTreeSet<String>> {
        let bytes = std::fs::read(path)?;
        Ok(bytes
            .chunks(SLOT)
            .filter_map(|slot| {
                let end = slot.iter().position(|byte| *byte == 0).unwrap_or(slot.len());
                std::str::from_utf8(&slot[..end]).ok()
            })
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Thread `slot` runs `token` now. A record that cannot be written is
    /// only a record lost: the work goes on.
    pub(crate) fn running(&self, slot: usize, token: &str) {
        let mut bytes = [0_u8; SLOT];
        let length = token.len().min(SLOT - 1);
        bytes[..length].copy_from_slice(&token.as_bytes()[..length]);
        let _ = self.file.write_all_at(&bytes, (slot * SLOT) as u64);
    }

    /// Thread `slot` runs nothing of a claim now.
    pub(crate) fn idle(&self, slot: usize) {
        let _ = self.file.write_all_at(&[0_u8; SLOT], (slot * SLOT) as u64);
    }
}

/// The claim of the job this code runs for, if it runs in one.
pub(crate) fn current_claim() -> Option<String> {
    CLAIM.try_with(Clone::clone).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_holds_the_tokens_its_slots_run_until_they_are_idle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flight");
        let record = FlightRecord::create(&path).unwrap();
        record.running(0, "token-a");
        record.running(3, "token-b");
        assert_eq!(
            FlightRecord::read(&path).unwrap(),
            BTreeSet::from(["token-a".to_string(), "token-b".to_string()])
        );
        record.idle(0);
        assert_eq!(
            FlightRecord::read(&path).unwrap(),
            BTreeSet::from(["token-b".to_string()])
        );
        // Created again (the next process), it is empty.
        drop(FlightRecord::create(&path).unwrap());
        assert!(FlightRecord::read(&path).unwrap().is_empty());
    }
}
