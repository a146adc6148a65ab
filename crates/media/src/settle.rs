//! Settling: a file that is still being written (a camera card being
//! copied, a download in progress) must not be hashed or decoded until it
//! stops changing, or the ledger would record a digest of half a file.
//!
//! A file is *settled* when its size and modification time have not changed
//! for a quiet period (default 500 ms). Two ways to know:
//!
//! - **At a glance** ([`is_settled`], [`Settler::check`]): its mtime is
//!   already older than the quiet period. This is the common case (an ingest
//!   of a folder that is not being written to) and costs one `stat`, no
//!   waiting: a thousand static files do not wait 500 ms each.
//! - **By watching** ([`Settler::settle`]): otherwise, stat it every poll
//!   interval; any change of size or mtime restarts the quiet period; once
//!   a poll sees the same size and mtime and either a quiet period has
//!   passed since the last change was seen, or the mtime itself is a quiet
//!   period old, the file is settled.
//!
//! [`Settler::settle_and_hash`] is the ingest's hashing stage in one call:
//! settle, hash, and settle again if the file changed while it was read.
//!
//! Time comes from a [`SettleClock`] (now and sleep), so tests drive the
//! polls themselves instead of racing the wall clock.

use crate::error::MediaError;
use crate::hash::{hash_file, ContentHash};
use futures::future::BoxFuture;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use thiserror::Error;

/// How a settling check sees a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileState {
    pub size: u64,
    pub modified: SystemTime,
}

/// Stats `path` (follows symlinks, as reading it will).
pub fn file_state(path: &Path) -> io::Result<FileState> {
    let metadata = std::fs::metadata(path)?;
    Ok(FileState {
        size: metadata.len(),
        modified: metadata.modified()?,
    })
}

/// Whether a file in `state` is settled at a glance: its mtime is at least
/// `quiet` before `now`. An mtime in the future (clock skew, a copy that
/// kept the source's time) is not settled at a glance; watching decides.
pub fn is_settled(state: &FileState, now: SystemTime, quiet: Duration) -> bool {
    now.duration_since(state.modified).is_ok_and(|age| age >= quiet)
}

/// Where settling gets the time and how it waits.
pub trait SettleClock: Send + Sync {
    /// Wall-clock time, comparable with file mtimes.
    fn now(&self) -> SystemTime;
    /// Waits about `duration`.
    fn sleep(&self, duration: Duration) -> BoxFuture<'_, ()>;
}

/// The system clock and tokio's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemSettleClock;

impl SettleClock for SystemSettleClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'_, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// Why a file did not settle.
#[derive(Debug, Error)]
pub enum SettleError {
    /// It could not be stat'ed (gone, permissions): the caller decides
    /// whether a vanished file is missing or merely moved.
    #[error("checking whether {} settled: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// It was still changing when [`Settler::with_max_wait`] ran out.
    #[error("{} was still changing after {waited:?} (last seen: {} bytes)", path.display(), last.size)]
    StillChanging {
        path: PathBuf,
        waited: Duration,
        last: FileState,
    },
}

impl SettleError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, SettleError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// A settled file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The size and mtime it settled at.
    pub state: FileState,
    /// How many polls it took; 0 when it was settled at a glance.
    pub polls: u32,
}

/// Waits for files to settle. Cheap to clone.
#[derive(Clone)]
pub struct Settler {
    quiet: Duration,
    poll: Duration,
    max_wait: Option<Duration>,
    clock: Arc<dyn SettleClock>,
}

impl std::fmt::Debug for Settler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settler")
            .field("quiet", &self.quiet)
            .field("poll", &self.poll)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl Default for Settler {
    /// 500 ms quiet, polled every 100 ms, no limit, on the system clock.
    fn default() -> Self {
        Settler::new(Settler::DEFAULT_QUIET)
    }
}

impl Settler {
    pub const DEFAULT_QUIET: Duration = Duration::from_millis(500);

    /// A settler with this quiet period, polled five times per period (at
    /// least every 10 ms), without a limit, on the system clock.
    pub fn new(quiet: Duration) -> Self {
        Settler {
            quiet,
            poll: (quiet / 5).max(Duration::from_millis(10)),
            max_wait: None,
            clock: Arc::new(SystemSettleClock),
        }
    }

    /// How often a file that is not settled at a glance is stat'ed
    /// (at least 1 ms, so a zero never spins).
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll.max(Duration::from_millis(1));
        self
    }

    /// Gives up with [`SettleError::StillChanging`] after watching this long
    /// (a log file that grows forever would otherwise hold its caller).
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    pub fn with_clock(mut self, clock: Arc<dyn SettleClock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn quiet(&self) -> Duration {
        self.quiet
    }

    pub fn poll(&self) -> Duration {
        self.poll
    }

    async fn stat(&self, path: &Path) -> Result<FileState, SettleError> {
        let metadata = tokio::fs::metadata(path).await;
        metadata
            .and_then(|metadata| {
                Ok(FileState {
                    size: metadata.len(),
                    modified: metadata.modified()?,
                })
            })
            .map_err(|source| SettleError::Io {
                path: path.to_path_buf(),
                source,
            })
    }

    /// The quick check: `Some(state)` if the file is settled at a glance,
    /// `None` if it would have to be watched. Never waits.
    pub async fn check(&self, path: &Path) -> Result<Option<FileState>, SettleError> {
        let state = self.stat(path).await?;
        Ok(is_settled(&state, self.clock.now(), self.quiet).then_some(state))
    }

    /// Returns once `path` is settled (at a glance, or by watching it), with
    /// the size and mtime it settled at.
    pub async fn settle(&self, path: &Path) -> Result<Settled, SettleError> {
        let started = self.clock.now();
        let mut last = self.stat(path).await?;
        if is_settled(&last, started, self.quiet) {
            return Ok(Settled { state: last, polls: 0 });
        }
        let mut unchanged_since = started;
        let mut polls = 0_u32;
        loop {
            if let Some(max_wait) = self.max_wait {
                let waited = elapsed(started, self.clock.now());
                if waited >= max_wait {
                    return Err(SettleError::StillChanging {
                        path: path.to_path_buf(),
                        waited,
                        last,
                    });
                }
            }
            self.clock.sleep(self.poll).await;
            polls = polls.saturating_add(1);
            let now = self.clock.now();
            let current = self.stat(path).await?;
            if current != last {
                last = current;
                unchanged_since = now;
                continue;
            }
            if elapsed(unchanged_since, now) >= self.quiet || is_settled(&current, now, self.quiet) {
                return Ok(Settled { state: current, polls });
            }
        }
    }
}

impl Settler {
    /// How many times [`Settler::settle_and_hash`] settles again when the
    /// file changed while it was being hashed, before giving up.
    pub const HASH_ROUNDS: u32 = 3;

    /// Settles `path`, hashes it, and checks that it did not change while it
    /// was hashed (same size and mtime after as when it settled, and as many
    /// bytes hashed as it has); if it did, settles again. The digest is
    /// then of the settled file, not of a file being rewritten under the
    /// reader. Gives up with [`SettleError::StillChanging`] after
    /// [`Settler::HASH_ROUNDS`] rounds.
    pub async fn settle_and_hash(&self, path: &Path) -> Result<(Settled, ContentHash), SettleError> {
        let started = self.clock.now();
        let io_error = |source: io::Error| SettleError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut last = None;
        for _ in 0..Self::HASH_ROUNDS {
            let settled = self.settle(path).await?;
            let owned = path.to_path_buf();
            let hashed = tokio::task::spawn_blocking(move || hash_file(&owned))
                .await
                .map_err(|error| io_error(io::Error::other(format!("hashing did not finish: {error}"))))?
                .map_err(|error| match error {
                    MediaError::Io { source, .. } => io_error(source),
                    other => io_error(io::Error::other(other.to_string())),
                })?;
            let after = self.stat(path).await?;
            if after == settled.state && hashed.byte_size == after.size {
                return Ok((settled, hashed));
            }
            last = Some(after);
        }
        Err(SettleError::StillChanging {
            path: path.to_path_buf(),
            waited: elapsed(started, self.clock.now()),
            last: last.expect("at least one round ran"),
        })
    }
}

/// `to - from`, or zero if the clock went backwards.
fn elapsed(from: SystemTime, to: SystemTime) -> Duration {
    to.duration_since(from).unwrap_or(Duration::ZERO)
}
