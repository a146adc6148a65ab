//! `opledger ingest` and `opledger sample-media`: options from the command
//! line, a progress display, and the summary.

use crate::cli::{IngestArgs, SampleMediaArgs};
use crate::UsageError;
use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use opledger_engine::Engine;
use opledger_ingest::{ingest, IngestOptions, IngestProgress, IngestSummary, StopSignal};
use opledger_media::{generate_samples_with, SampleOptions};
use opledger_store::Store;
use serde_json::json;
use std::collections::BTreeMap;
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

/// Where the reference pipeline writes thumbnails: `thumbnails/` beside
/// the SQLite database (in the current folder for PostgreSQL). Absolute,
/// because the paths are recorded in the ledger and must name the same file
/// whatever folder a later command runs in; `serve` serves files from it.
pub fn thumbnails_dir(database_url: &str) -> PathBuf {
    let (dir, _) = database_dir(database_url);
    std::fs::canonicalize(&dir).unwrap_or(dir).join("thumbnails")
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

/// Runs an ingest; SIGINT and SIGTERM stop it early (a second one stops
/// it at once). The summary says whether it was stopped (`interrupted`);
/// `main` turns that into the exit code.
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
    let (_, database_file) = database_dir(database_url);
    let mut options = IngestOptions::new(&args.dir, thumbnails_dir(database_url));
    options.batch_name = args.batch_name.clone();
    if let Some(workers) = args.workers {
        options.workers = workers;
    }
    options.settle_quiet = Duration::from_millis(args.settle_ms);
    options.give_up_after = Duration::from_secs(args.give_up_after);
    options.exclude = database_file.into_iter().collect();
    let progress: Arc<dyn IngestProgress> = if !as_json && std::io::stderr().is_terminal() {
        Arc::new(Bar::new())
    } else {
        Arc::new(Lines::new(!as_json))
    };
    let signals = watch_signals(&options.stop)?;
    let summary = ingest(engine.clone(), options, progress).await;
    signals.abort();
    let summary = summary?;
    print_summary(&summary, as_json);
    if let Some(interrupted) = &summary.interrupted {
        eprintln!(
            "opledger: ingest stopped by {}: {} left unsettled, {} interrupted; run the same command again to resume",
            interrupted.by,
            plural(interrupted.files_left, "file", "files"),
            plural(interrupted.tasks_interrupted as usize, "running task", "running tasks"),
        );
    }
    Ok(summary)
}

/// SIGINT and SIGTERM ask the ingest to stop: the first to stop claiming
/// and let running tasks finish, a second to interrupt them at once.
fn watch_signals(stop: &StopSignal) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let stop = stop.clone();
    Ok(tokio::spawn(async move {
        loop {
            let by = tokio::select! {
                Some(()) = interrupt.recv() => "SIGINT",
                Some(()) = terminate.recv() => "SIGTERM",
                else => return,
            };
            if stop.is_requested() {
                eprintln!("opledger: {by}: interrupting the running tasks");
            } else {
                eprintln!("opledger: {by}: stopping; running tasks may finish (again to interrupt them)");
            }
            stop.stop(by);
        }
    }))
}

/// `1 file`, `2 files`.
pub(crate) fn plural(count: usize, one: &str, many: &str) -> String {
    if count == 1 {
        format!("1 {one}")
    } else {
        format!("{count} {many}")
    }
}

/// A review entry's detail without the path its line already shows.
fn detail_without_path(detail: &str, path: Option<&str>) -> String {
    let Some(path) = path.filter(|path| !path.is_empty()) else {
        return detail.to_string();
    };
    // Task errors name the file as it displays (lossily, for a name that
    // is not UTF-8); the ledger's text of it is what the line shows.
    let shown = opledger_media::text_path(path).display().to_string();
    let mut detail = detail.to_string();
    for form in [path, shown.as_str()] {
        detail = detail.replace(&format!(" (file {form})"), "").replace(form, "the file");
    }
    detail
}

/// The most skipped entries listed by name (`--json` lists them all).
const SKIPPED_SHOWN: usize = 10;

/// Entries of the folder that were not opened, with why.
fn print_skipped(skipped: &[opledger_ingest::SkippedFile]) {
    if skipped.is_empty() {
        return;
    }
    println!("skipped, not regular files (never opened):");
    for entry in skipped.iter().take(SKIPPED_SHOWN) {
        println!("  {}: {}", opledger_domain::quoted(&entry.path), entry.reason);
    }
    if skipped.len() > SKIPPED_SHOWN {
        println!("  … and {} more (--json lists them all)", skipped.len() - SKIPPED_SHOWN);
    }
}

fn print_summary(summary: &IngestSummary, as_json: bool) {
    if as_json {
        let value = json!({
            "batch_id": summary.batch_id,
            "files": summary.files,
            "new": summary.new,
            "unchanged": summary.unchanged,
            "changed": summary.changed,
            "resumed": summary.resumed,
            "failed": summary.failed,
            "missing": summary.missing,
            "unreadable_folders": summary.unreadable_folders,
            "skipped": summary.skipped,
            "operations_created": summary.operations_created,
            "review_entries": summary.review_entries,
            "tasks_run": summary.tasks_run,
            "wall_seconds": summary.wall_seconds,
            "interrupted": summary.interrupted,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("JSON values serialize")
        );
        return;
    }
    let mut folders = String::new();
    if summary.unreadable_folders > 0 {
        folders = format!(
            ", {}",
            plural(summary.unreadable_folders, "unreadable folder", "unreadable folders")
        );
    }
    if !summary.skipped.is_empty() {
        folders.push_str(&format!(", {} skipped", summary.skipped.len()));
    }
    println!(
        "{} in {:.1} s: {} new, {} unchanged, {} changed, {} resumed, {} failed, {} missing{folders}; {} created, {} run",
        plural(summary.files, "file", "files"),
        summary.wall_seconds,
        summary.new,
        summary.unchanged,
        summary.changed,
        summary.resumed,
        summary.failed,
        summary.missing,
        plural(summary.operations_created, "operation", "operations"),
        plural(summary.tasks_run as usize, "task", "tasks"),
    );
    if let Some(batch_id) = summary.batch_id {
        println!("batch {batch_id} (opledger batch show {batch_id})");
    }
    print_skipped(&summary.skipped);
    print_review(&summary.review_entries);
}

/// The most review entries listed one by one; the rest are counted by
/// reason (a folder of videos without ffmpeg has two entries a file).
const REVIEW_SHOWN: usize = 20;

fn print_review(entries: &[opledger_ingest::ReviewEntry]) {
    for line in review_lines(entries) {
        println!("{line}");
    }
}

/// The summary's review queue: the first entries one a line, the rest
/// counted by reason code (and a block's reason, which many files share;
/// a failure's error is its file's own).
fn review_lines(entries: &[opledger_ingest::ReviewEntry]) -> Vec<String> {
    if entries.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![format!(
        "review queue ({}; opledger review list):",
        plural(entries.len(), "entry", "entries")
    )];
    for entry in entries.iter().take(REVIEW_SHOWN) {
        let detail = detail_without_path(entry.detail.as_deref().unwrap_or(""), entry.path.as_deref());
        lines.push(format!(
            "  #{:<8} {:<16} {:<16} {}  {}",
            entry.entry_id,
            entry.reason_code,
            entry.kind,
            entry.path.as_deref().unwrap_or(""),
            detail
        ));
    }
    if entries.len() > REVIEW_SHOWN {
        let mut rest: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for entry in &entries[REVIEW_SHOWN..] {
            let reason = match entry.reason_code.as_str() {
                "blocked" => entry.detail.as_deref().unwrap_or(""),
                _ => "",
            };
            *rest.entry((entry.reason_code.as_str(), reason)).or_default() += 1;
        }
        let rest: Vec<String> = rest
            .into_iter()
            .map(|((code, reason), count)| match reason {
                "" => format!("{count} {code}"),
                reason => format!("{count} {code} ({reason})"),
            })
            .collect();
        lines.push(format!(
            "  … and {} more: {} (--json lists them all)",
            entries.len() - REVIEW_SHOWN,
            rest.join(", ")
        ));
    }
    lines
}

/// A progress bar on a terminal: files settled of total, rate, ETA, failures.
struct Bar {
    bar: ProgressBar,
}

impl Bar {
    fn new() -> Self {
        // Until the folder is walked there is no total: a spinner, not 0/0.
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] finding files…").expect("a valid template"),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Bar { bar }
    }
}

impl IngestProgress for Bar {
    fn started(&self, total: usize, unchanged: usize) {
        self.bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} files  {rate}  ETA {eta}  {msg}",
            )
            .expect("a valid template")
            .with_key("rate", |state: &ProgressState, out: &mut dyn std::fmt::Write| {
                let _ = write!(out, "{:.0} files/s", state.per_sec());
            }),
        );
        self.bar.set_length(total as u64);
        self.bar.set_position(unchanged as u64);
        self.bar.set_message("0 failed");
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
            eprintln!("ingest: {}, {unchanged} unchanged", plural(total, "file", "files"));
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

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_ingest::ReviewEntry;

    fn entry(entry_id: i64, reason_code: &str, detail: &str) -> ReviewEntry {
        ReviewEntry {
            entry_id,
            path: Some(format!("/photos/{entry_id}.mp4")),
            kind: "poster_frame".into(),
            reason_code: reason_code.into(),
            detail: Some(detail.into()),
        }
    }

    #[test]
    fn a_long_review_queue_lists_its_first_entries_and_counts_the_rest_by_reason() {
        let mut entries: Vec<ReviewEntry> = (1..=2_000)
            .map(|id| entry(id, "blocked", "ffmpeg not installed"))
            .collect();
        entries.push(entry(
            2_001,
            "failed_terminal",
            "not a decodable image: /photos/2001.mp4",
        ));
        entries.push(entry(2_002, "failed_terminal", "truncated"));
        let lines = review_lines(&entries);
        assert_eq!(lines.len(), 1 + REVIEW_SHOWN + 1, "{lines:#?}");
        assert_eq!(lines[0], "review queue (2002 entries; opledger review list):");
        assert!(lines[1].starts_with("  #1 "), "{}", lines[1]);
        assert_eq!(
            lines[REVIEW_SHOWN + 1],
            "  … and 1982 more: 1980 blocked (ffmpeg not installed), 2 failed_terminal (--json lists them all)"
        );
    }

    #[test]
    fn a_short_review_queue_lists_every_entry_and_an_empty_one_nothing() {
        let entries: Vec<ReviewEntry> = (1..=3).map(|id| entry(id, "failed_terminal", "truncated")).collect();
        assert_eq!(review_lines(&entries).len(), 4);
        assert!(review_lines(&[]).is_empty());
    }
}
