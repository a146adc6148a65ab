//! How an ingest is asked to run, and how it tells its progress.

use std::path::PathBuf;
use std::time::Duration;

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
    /// The lock file that keeps ingests of one database one at a time.
    pub lock_path: PathBuf,
    /// Paths never ingested (the database and its companion files): any
    /// file at or under one of them is left alone.
    pub exclude: Vec<PathBuf>,
    /// How long a file's size and modification time must stay unchanged
    /// before it is read.
    pub settle_quiet: Duration,
    /// The lease of the workers' claims; a crashed run's claims are taken
    /// over by recovery this long after it died.
    pub lease: Duration,
}

impl IngestOptions {
    pub fn new(root: impl Into<PathBuf>, thumbnails_dir: impl Into<PathBuf>, lock_path: impl Into<PathBuf>) -> Self {
        IngestOptions {
            root: root.into(),
            batch_name: None,
            workers: std::thread::available_parallelism().map_or(2, usize::from),
            thumbnails_dir: thumbnails_dir.into(),
            lock_path: lock_path.into(),
            exclude: Vec::new(),
            settle_quiet: Duration::from_millis(500),
            lease: Duration::from_secs(10),
        }
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
