//! `opledger ingest` and `opledger sample-media`: options from the command
//! line, a progress display, and the summary.

use crate::cli::{IngestArgs, SampleMediaArgs};
use crate::UsageError;
use indicatif::{ProgressBar, ProgressStyle};
use opledger_engine::Engine;
use opledger_ingest::{ingest, IngestOptions, IngestProgress, IngestSummary};
use opledger_media::{generate_samples_with, SampleOptions};
use opledger_store::Store;
use serde_json::json;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where a database's companions go: beside a SQLite file; in the current
/// folder for a server database.
fn database_dir(database_url: &str) -> (PathBuf, Option<PathBuf>) {
    if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
        return (PathBuf::from("."), None);
    }
    let rest = database_url
        .strip_prefix("sqlite://")
        .or_else(|| database_url.strip_prefix("sqlite:"))
        .unwrap_or(database_url);
    let file = PathBuf::from(rest.split('?').next().unwrap_or(rest));
    let dir = file
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    (dir, Some(file))
}

/// The folder to ingest must exist: checked before the store is opened,
/// so a mistyped folder leaves no database behind.
pub fn check_folder(args: &IngestArgs) -> Result<(), UsageError> {
    if args.dir.is_dir() {
        Ok(())
    } else {
        Err(UsageError(format!(
            "{} is not a folder",
            opledger_domain::quoted(&args.dir.to_string_lossy())
        )))
    }
}

pub async fn run<S: Store>(
    engine: &Engine<S>,
    args: &IngestArgs,
    database_url: &str,
    as_json: bool,
) -> anyhow::Result<IngestSummary> {
    check_folder(args)?;
    if args.workers == Some(0) {
        return Err(UsageError("--workers must be at least 1".into()).into());
    }
    let (dir, database_file) = database_dir(database_url);
    let lock_path = match &database_file {
        Some(file) => PathBuf::from(format!("{}.ingest-lock", file.display())),
        None => dir.join("opledger-ingest.lock"),
    };
    let mut options = IngestOptions::new(&args.dir, dir.join("thumbnails"), lock_path);
    options.batch_name = args.batch_name.clone();
    if let Some(workers) = args.workers {
        options.workers = workers;
    }
    options.settle_quiet = Duration::from_millis(args.settle_ms);
    options.exclude = database_file.into_iter().collect();
    let progress: Arc<dyn IngestProgress> = if !as_json && std::io::stderr().is_terminal() {
        Arc::new(Bar::new())
    } else {
        Arc::new(Lines::new(!as_json))
    };
    let summary = ingest(engine.clone(), options, progress).await?;
    print_summary(&summary, as_json);
    Ok(summary)
}

fn print_summary(summary: &IngestSummary, as_json: bool) {
    if as_json {
        let value = json!({
            "batch_id": summary.batch_id,
            "files": summary.files,
            "new": summary.new,
            "unchanged": summary.unchanged,
            "changed": summary.changed,
            "failed": summary.failed,
            "missing": summary.missing,
            "operations_created": summary.operations_created,
            "review_entries": summary.review_entries,
            "tasks_run": summary.tasks_run,
            "wall_seconds": summary.wall_seconds,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("JSON values serialize")
        );
        return;
    }
    println!(
        "{} files in {:.1} s: {} new, {} unchanged, {} changed, {} failed, {} missing; {} operations created, {} tasks run",
        summary.files,
        summary.wall_seconds,
        summary.new,
        summary.unchanged,
        summary.changed,
        summary.failed,
        summary.missing,
        summary.operations_created,
        summary.tasks_run
    );
    if let Some(batch_id) = summary.batch_id {
        println!("batch {batch_id} (opledger batch show {batch_id})");
    }
    if !summary.review_entries.is_empty() {
        println!(
            "review queue ({} entries; opledger review list):",
            summary.review_entries.len()
        );
        for entry in &summary.review_entries {
            println!(
                "  #{:<8} {:<16} {:<16} {}  {}",
                entry.entry_id,
                entry.reason_code,
                entry.kind,
                entry.path.as_deref().unwrap_or(""),
                entry.detail.as_deref().unwrap_or("")
            );
        }
    }
}

/// A progress bar on a terminal: files settled of total, rate, ETA, failures.
struct Bar {
    bar: ProgressBar,
}

impl Bar {
    fn new() -> Self {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} files  {per_sec}  ETA {eta}  {msg}",
            )
            .expect("a valid template"),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Bar { bar }
    }
}

impl IngestProgress for Bar {
    fn started(&self, total: usize, unchanged: usize) {
        self.bar.set_length(total as u64);
        self.bar.set_position(unchanged as u64);
        self.bar.reset_eta();
    }

    fn settled(&self, settled: usize, failed: usize) {
        self.bar.set_position(settled as u64);
        self.bar.set_message(format!("{failed} failed"));
    }

    fn finished(&self) {
        self.bar.finish_and_clear();
    }
}

/// Plain lines every few seconds when not on a terminal (logs, CI).
struct Lines {
    enabled: bool,
    state: Mutex<(Instant, usize, Instant)>,
}

impl Lines {
    fn new(enabled: bool) -> Self {
        let now = Instant::now();
        Lines {
            enabled,
            state: Mutex::new((now, 0, now)),
        }
    }
}

impl IngestProgress for Lines {
    fn started(&self, total: usize, unchanged: usize) {
        let mut state = self.state.lock().expect("progress state");
        state.1 = total;
        if self.enabled {
            eprintln!("ingest: {total} files, {unchanged} unchanged");
        }
    }

    fn settled(&self, settled: usize, failed: usize) {
        let mut state = self.state.lock().expect("progress state");
        if !self.enabled || state.0.elapsed() < Duration::from_secs(2) {
            return;
        }
        state.0 = Instant::now();
        let rate = settled as f64 / state.2.elapsed().as_secs_f64().max(0.001);
        eprintln!(
            "ingest: {settled}/{} files settled, {rate:.0} files/s, {failed} failed",
            state.1
        );
    }

    fn finished(&self) {}
}

pub fn sample_media(args: &SampleMediaArgs, as_json: bool) -> anyhow::Result<()> {
    let options = SampleOptions::new(args.count, args.seed).with_corrupt(args.corrupt);
    let set = generate_samples_with(&args.dir, &options)?;
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "dir": args.dir,
                "images": set.images.len(),
                "corrupt": set.corrupt.len(),
            }))
            .expect("JSON values serialize")
        );
    } else {
        println!(
            "wrote {} images and {} corrupt files under {}",
            set.images.len(),
            set.corrupt.len(),
            args.dir.display()
        );
    }
    Ok(())
}
