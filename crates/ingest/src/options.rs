//! How an ingest is asked to run, how it tells its progress, and how it is
//! asked to stop early.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How an ingest runs.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// The folder to ingest, walked recursively.
    pub root: PathBuf,
    pub batch_name: Option<String>,
    /// Local workers running the image tasks (at least 1).
    pub workers: usize,
    /// Where thumbnails are written (`<revision>.png`).
    pub thumbnails_dir: PathBuf,
    /// Paths never ingested (the database and its companion files): any
    /// file at or under one of them is left alone.
    pub exclude: Vec<PathBuf>,
    /// How long a file's size and modification time must stay unchanged
    /// before it is read.
    pub settle_quiet: Duration,
    /// The lease of the workers' claims; a crashed run's claims are taken
    /// over by recovery this long after it died, unless the next ingest
    /// knows it died (see [`crate::IngestLock`]).
    pub lease: Duration,
    /// How long image tasks already running may take to finish once a stop
    /// was asked for; the ones still running then are interrupted.
    pub stop_grace: Duration,
    /// Asks the run to stop early (see [`StopSignal`]).
    pub stop: StopSignal,
    /// How long the image workers' claims may fail on storage trouble (a
    /// full disk, an unreachable server) in a row, backing off, before the
    /// run stops with that error; what it held is taken over by the next
    /// run.
    pub give_up_after: Duration,
    /// `ffprobe` and `ffmpeg`, found on `PATH` once for the run; `None`
    /// where they are not installed: videos' kinds are then requested
    /// `blocked` with [`opledger_media::NO_FFMPEG`].
    pub ffmpeg: Option<opledger_media::Ffmpeg>,
}

impl IngestOptions {
    pub fn new(root: impl Into<PathBuf>, thumbnails_dir: impl Into<PathBuf>) -> Self {
        IngestOptions {
            root: root.into(),
            batch_name: None,
            workers: std::thread::available_parallelism().map_or(2, usize::from),
            thumbnails_dir: thumbnails_dir.into(),
            exclude: Vec::new(),
            settle_quiet: Duration::from_millis(500),
            lease: Duration::from_secs(10),
            stop_grace: Duration::from_secs(5),
            stop: StopSignal::new(),
            give_up_after: Duration::from_secs(60),
            ffmpeg: opledger_media::Ffmpeg::find(),
        }
    }
}

/// How far a stop has been asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopLevel {
    /// Not asked.
    Run,
    /// Stop claiming and reading files; let running tasks finish (within
    /// [`IngestOptions::stop_grace`]). `by` says who asked (`SIGINT`).
    Finish { by: String },
    /// Interrupt running tasks at once as well.
    Now { by: String },
}

/// Asks a running ingest to stop early; cheap to clone, one per run. The
/// first [`StopSignal::stop`] stops claiming and reading: the files not
/// finished are released for the next run, and running tasks get the
/// grace to finish; a second one interrupts them at once.
#[derive(Debug, Clone)]
pub struct StopSignal {
    level: Arc<watch::Sender<StopLevel>>,
}

impl Default for StopSignal {
    fn default() -> Self {
        StopSignal::new()
    }
}

impl StopSignal {
    pub fn new() -> Self {
        StopSignal {
            level: Arc::new(watch::Sender::new(StopLevel::Run)),
        }
    }

    /// Asks the run to stop (`by`: who asks, for the summary); asked a
    /// second time, to stop at once.
    pub fn stop(&self, by: &str) {
        self.level.send_modify(|level| {
            *level = match level {
                StopLevel::Run => StopLevel::Finish { by: by.to_string() },
                StopLevel::Finish { by } | StopLevel::Now { by } => StopLevel::Now { by: by.clone() },
            }
        });
    }

    /// Who asked the run to stop, if anyone did.
    pub fn requested_by(&self) -> Option<String> {
        match &*self.level.borrow() {
            StopLevel::Run => None,
            StopLevel::Finish { by } | StopLevel::Now { by } => Some(by.clone()),
        }
    }

    pub fn is_requested(&self) -> bool {
        *self.level.borrow() != StopLevel::Run
    }

    /// Resolves once a stop is asked for.
    pub async fn requested(&self) {
        let mut level = self.level.subscribe();
        let _ = level.wait_for(|level| *level != StopLevel::Run).await;
    }

    /// Resolves once a stop *at once* is asked for.
    pub async fn requested_now(&self) {
        let mut level = self.level.subscribe();
        let _ = level.wait_for(|level| matches!(level, StopLevel::Now { .. })).await;
    }
}

/// Told as the run goes; implementations draw a progress bar or print lines.
pub trait IngestProgress: Send + Sync {
    /// The folder was walked: `total` files, of which `unchanged` need nothing.
    fn started(&self, total: usize, unchanged: usize);
    /// Files settled so far (done, failed or unchanged), and how many failed.
    fn settled(&self, settled: usize, failed: usize);
    fn finished(&self);
}

/// Reports nothing.
pub struct NoProgress;

impl IngestProgress for NoProgress {
    fn started(&self, _: usize, _: usize) {}
    fn settled(&self, _: usize, _: usize) {}
    fn finished(&self) {}
}
