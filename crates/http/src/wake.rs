//! Waking those who wait for the log to move — claim long-polls and event
//! streams — without re-reading the database in a loop.
//!
//! Every write this process makes bumps the wake as soon as it committed.
//! Writes of other processes (another `serve` on the same PostgreSQL
//! database, a CLI worker) are seen by one task per process that reads the
//! log's head position every `head_poll` (250 ms by default) and bumps the
//! wake when it moved: one indexed read, whatever the number of waiters.

use tokio::sync::watch;

/// A counter that moves whenever the log may have moved.
#[derive(Debug)]
pub struct Wake {
    moved: watch::Sender<u64>,
}

impl Default for Wake {
    fn default() -> Self {
        Wake::new()
    }
}

impl Wake {
    pub fn new() -> Self {
        let (moved, _) = watch::channel(0);
        Wake { moved }
    }

    /// The log may have moved: wake every waiter.
    pub fn bump(&self) {
        self.moved.send_modify(|count| *count = count.wrapping_add(1));
    }

    /// A receiver that sees every bump after this call.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        let mut receiver = self.moved.subscribe();
        receiver.mark_unchanged();
        receiver
    }
}
