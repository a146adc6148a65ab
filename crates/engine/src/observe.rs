//! What a caller may learn of the engine's writes as they happen: for each
//! write command, how long it waited for the store's writer, how long its
//! work inside the transaction took (load, decide, append, fold), and how
//! long the commit took until the store acknowledged it. The HTTP service
//! turns them into latency histograms; the engine itself knows no metrics
//! crate, so any caller can observe it in its own way.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Which kind of write a command was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// A command that may append to the log (through `Store::write`).
    Log,
    /// A command that changes liveness only (lease rows; `Store::write_liveness`).
    Liveness,
}

impl WriteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteKind::Log => "log",
            WriteKind::Liveness => "liveness",
        }
    }
}

/// One write command's timings. `queued + work + commit == total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteTimings {
    pub kind: WriteKind,
    /// Whether the store acknowledged the commit (false: the command or
    /// its transaction failed, and nothing of it was written).
    pub committed: bool,
    /// From the call until the transaction began running it: waiting for
    /// the store's writer (SQLite's group commit, PostgreSQL's write lock).
    pub queued: Duration,
    /// The command's work inside its transaction: load, decide, append,
    /// fold, react.
    pub work: Duration,
    /// From the end of that work until the commit was acknowledged (for a
    /// group commit, the rest of the group's work and its one commit).
    pub commit: Duration,
    /// From the call until the answer.
    pub total: Duration,
}

/// Receives the engine's write timings. Called on the calling task once
/// the store answered, so an implementation must be quick and must not
/// block: record numbers and return.
pub trait WriteObserver: Send + Sync {
    fn written(&self, timings: WriteTimings);
}

/// The instants a transaction body records for its command's timings.
#[derive(Debug, Default)]
pub(crate) struct WorkClock {
    marks: Mutex<Marks>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Marks {
    began: Option<Instant>,
    ended: Option<Instant>,
}

impl WorkClock {
    pub(crate) fn begin(&self) {
        self.update(|marks| marks.began = Some(Instant::now()));
    }

    pub(crate) fn end(&self) {
        self.update(|marks| marks.ended = Some(Instant::now()));
    }

    fn update(&self, change: impl FnOnce(&mut Marks)) {
        // A poisoned lock only means a body panicked while marking; the
        // marks are plain values, still usable.
        let mut marks = self.marks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        change(&mut marks);
    }

    /// The timings of a command called at `called` and answered now. A body
    /// that never ran (the writer refused it) counts as all queueing; one
    /// that failed before its end, as all work.
    pub(crate) fn timings(&self, kind: WriteKind, committed: bool, called: Instant) -> WriteTimings {
        let answered = Instant::now();
        let marks = *self.marks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let began = marks.began.unwrap_or(answered).max(called);
        let ended = marks.ended.unwrap_or(answered).max(began);
        WriteTimings {
            kind,
            committed,
            queued: began - called,
            work: ended - began,
            commit: answered.saturating_duration_since(ended),
            total: answered - called,
        }
    }
}
