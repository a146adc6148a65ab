//! `opledger ingest` on the files a real folder holds besides good images:
//! folders and files it cannot read (permissions, checked without root's
//! overrides), names that are not UTF-8, a file still being written, a
//! folder with nothing new, corrupt files counted alike by the summary and
//! its batch, and where thumbnails are recorded. `replay --verify` after
//! each.

use crate::common;
use crate::ingest_support;

use common::{describe, opledger};
use ingest_support::{count, engine, events, ingest, run_ingest, verify, without_overrides};
use opledger_domain::{Event, OperationStatus};
use opledger_media::{generate_samples_with, hash_file, path_text, SampleOptions};
use serde_json::Value;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn samples(dir: &Path, count: usize, corrupt: usize) -> Vec<PathBuf> {
    let set = generate_samples_with(&dir.join("photos"), &SampleOptions::new(count, 7).with_corrupt(corrupt)).unwrap();
    set.images
        .into_iter()
        .map(|path| std::fs::canonicalize(path).unwrap())
        .collect()
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn summary_of(output: &std::process::Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}", describe(output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", describe(output)))
}

/// Open review entries of the summary by (kind, path).
fn entries(summary: &Value) -> Vec<(String, String, String)> {
    summary["review_entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["kind"].as_str().unwrap().to_string(),
                entry["path"].as_str().unwrap_or("").to_string(),
                entry["detail"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_subfolder_is_a_review_entry_not_an_abort_and_is_closed_once_readable() {
    let dir = tempfile::tempdir().unwrap();
    let images = samples(dir.path(), 4, 0);
    let locked = dir.path().join("photos").join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::copy(&images[0], locked.join("inside.png")).unwrap();
    chmod(&locked, 0o000);
    let locked = std::fs::canonicalize(&locked).unwrap();

    let summary = summary_of(&run_ingest(without_overrides(dir.path()), &[]));
    chmod(&locked, 0o755);
    assert_eq!(count(&summary, "files"), 4, "{summary}");
    assert_eq!(count(&summary, "unreadable_folders"), 1, "{summary}");
    let folder_entries: Vec<_> = entries(&summary)
        .into_iter()
        .filter(|(_, path, _)| *path == locked.display().to_string())
        .collect();
    assert_eq!(folder_entries.len(), 1, "{summary}");
    assert_eq!(folder_entries[0].0, "ingestion.file");
    assert!(folder_entries[0].2.contains("Permission denied"), "{summary}");
    let engine = engine(dir.path()).await;
    let folder = locked.display().to_string();
    let recorded = engine.ingestions_by_path(std::slice::from_ref(&folder)).await.unwrap();
    assert_eq!(recorded[&folder].status, OperationStatus::FailedTerminal);

    // Readable again: its files are ingested, its entry closed, and the
    // folder is not taken for a file gone from disk.
    let again = ingest(dir.path(), &[]);
    assert_eq!(count(&again, "files"), 5, "{again}");
    assert_eq!(count(&again, "new"), 1, "{again}");
    assert_eq!(count(&again, "missing"), 0, "{again}");
    assert!(entries(&again).is_empty(), "{again}");
    let recorded = engine.ingestions_by_path(std::slice::from_ref(&folder)).await.unwrap();
    assert_eq!(recorded[&folder].status, OperationStatus::Succeeded);
    let third = ingest(dir.path(), &[]);
    assert_eq!(count(&third, "missing"), 0, "{third}");
    drop(engine);
    verify(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_unreadable_for_its_permissions_is_retried_by_the_next_ingest_once_readable() {
    let dir = tempfile::tempdir().unwrap();
    let images = samples(dir.path(), 3, 0);
    chmod(&images[1], 0o000);
    let first = summary_of(&run_ingest(without_overrides(dir.path()), &[]));
    assert_eq!(count(&first, "failed"), 1, "{first}");
    let unreadable = images[1].display().to_string();
    let detail = entries(&first)
        .into_iter()
        .find(|(kind, path, _)| kind == "ingestion.file" && *path == unreadable)
        .unwrap_or_else(|| panic!("no entry for the unreadable file: {first}"))
        .2;
    assert!(detail.contains("Permission denied"), "{detail}");
    assert!(!detail.contains(&unreadable), "the detail repeats the path: {detail}");

    // Still unreadable: its failure stands, nothing is tried again.
    let still = summary_of(&run_ingest(without_overrides(dir.path()), &[]));
    assert_eq!(count(&still, "operations_created"), 0, "{still}");
    assert!(still["batch_id"].is_null(), "{still}");

    chmod(&images[1], 0o644);
    let retried = ingest(dir.path(), &[]);
    assert_eq!(count(&retried, "new"), 1, "{retried}");
    assert_eq!(count(&retried, "failed"), 0, "{retried}");
    assert_eq!(count(&retried, "tasks_run"), 3, "{retried}");
    assert!(entries(&retried).is_empty(), "the entry is closed: {retried}");
    let engine = engine(dir.path()).await;
    let ingestions = engine
        .ingestions_by_path(std::slice::from_ref(&unreadable))
        .await
        .unwrap();
    assert_eq!(ingestions[&unreadable].status, OperationStatus::Succeeded);
    drop(engine);
    verify(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_name_that_is_not_utf8_is_ingested_by_its_real_bytes_under_a_reversible_text() {
    let dir = tempfile::tempdir().unwrap();
    let images = samples(dir.path(), 2, 0);
    // Latin-1 "café.png", and a name differing only in its invalid byte.
    let photos = std::fs::canonicalize(dir.path().join("photos")).unwrap();
    let latin1 = photos.join(OsStr::from_bytes(b"caf\xE9.png"));
    let other = photos.join(OsStr::from_bytes(b"caf\xE8.png"));
    std::fs::copy(&images[0], &latin1).unwrap();
    std::fs::copy(&images[1], &other).unwrap();

    let summary = ingest(dir.path(), &[]);
    assert_eq!(count(&summary, "files"), 4, "{summary}");
    assert_eq!(count(&summary, "failed"), 0, "{summary}");
    assert!(entries(&summary).is_empty(), "{summary}");
    let engine = engine(dir.path()).await;
    let texts = [path_text(&latin1), path_text(&other)];
    assert!(texts[0].ends_with("caf\u{FFFD}E9.png"), "{}", texts[0]);
    let media = engine.media_by_path(&texts).await.unwrap();
    assert_eq!(media.len(), 2, "two items, not one lossy path");
    assert_eq!(
        media[&texts[0]].content_digest.as_deref(),
        Some(hash_file(&latin1).unwrap().digest().as_str())
    );
    // Every task succeeded: they found the file by its real bytes.
    let succeeded = events(&engine)
        .await
        .iter()
        .filter(|event| matches!(event.event, Event::OperationSucceeded(_)))
        .count();
    assert_eq!(succeeded, 4 * 4);

    let again = ingest(dir.path(), &[]);
    assert_eq!(count(&again, "unchanged"), 4, "{again}");
    std::fs::remove_file(&latin1).unwrap();
    let gone = ingest(dir.path(), &[]);
    assert_eq!(count(&gone, "missing"), 1, "{gone}");
    let recorded = engine.ingestions_by_path(&texts[..1]).await.unwrap();
    assert_eq!(recorded[&texts[0]].status, OperationStatus::MissingConfirmed);
    drop(engine);
    verify(dir.path());
}

#[test]
fn an_ingest_with_nothing_new_changed_or_missing_creates_no_batch() {
    let dir = tempfile::tempdir().unwrap();
    samples(dir.path(), 3, 1);
    let first = ingest(dir.path(), &[]);
    assert!(first["batch_id"].is_string(), "{first}");
    let again = ingest(dir.path(), &[]);
    assert!(again["batch_id"].is_null(), "{again}");
    let listed = opledger(dir.path()).args(["--json", "batch", "list"]).output().unwrap();
    let batches: Value =
        serde_json::from_slice(&listed.stdout).unwrap_or_else(|error| panic!("{error}: {}", describe(&listed)));
    assert_eq!(batches["items"].as_array().map(Vec::len), Some(1), "{batches}");
    let plain = opledger(dir.path()).args(["ingest", "photos"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&plain.stdout).contains("batch"),
        "{}",
        describe(&plain)
    );
    verify(dir.path());
}

#[test]
fn the_batch_of_an_ingest_counts_files_whose_image_tasks_failed_as_its_summary_does() {
    let dir = tempfile::tempdir().unwrap();
    let made = opledger(dir.path())
        .args(["sample-media", "photos", "--count", "6", "--corrupt", "2"])
        .output()
        .unwrap();
    assert_eq!(made.status.code(), Some(0), "{}", describe(&made));
    let summary = ingest(dir.path(), &[]);
    assert_eq!(count(&summary, "failed"), 2, "{summary}");
    let batch_id = summary["batch_id"].as_str().unwrap();
    let shown = opledger(dir.path())
        .args(["--json", "batch", "show", batch_id])
        .output()
        .unwrap();
    let batch: Value =
        serde_json::from_slice(&shown.stdout).unwrap_or_else(|error| panic!("{error}: {}", describe(&shown)));
    assert_eq!(batch["failed"].as_u64(), Some(2), "{batch}");
    assert_eq!(batch["succeeded"].as_u64(), Some(6), "{batch}");
    assert_eq!(batch["status"].as_str(), Some("completed_with_failures"), "{batch}");
    let plain = opledger(dir.path()).args(["batch", "show", batch_id]).output().unwrap();
    let text = String::from_utf8_lossy(&plain.stdout);
    assert!(text.contains("2 failed"), "{text}");
    assert!(text.contains("image tasks failed: metadata"), "{text}");
    verify(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_still_growing_when_scanned_is_unchanged_on_the_next_run_once_settled() {
    let dir = tempfile::tempdir().unwrap();
    samples(dir.path(), 2, 0);
    let growing = dir.path().join("photos").join("growing.bin");
    let writer = {
        let growing = growing.clone();
        std::thread::spawn(move || {
            let mut file = std::fs::File::create(&growing).unwrap();
            for round in 0..10u8 {
                file.write_all(&[round; 4096]).unwrap();
                file.flush().unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let first = ingest(dir.path(), &["--settle-ms", "400"]);
    writer.join().unwrap();
    assert_eq!(count(&first, "files"), 3, "{first}");
    let engine = engine(dir.path()).await;
    let canonical = std::fs::canonicalize(&growing).unwrap();
    let media = engine.media_by_path(&[canonical.display().to_string()]).await.unwrap();
    assert_eq!(media[&canonical.display().to_string()].byte_size, Some(10 * 4096));
    // The file did not change after it settled: nothing to do.
    let again = ingest(dir.path(), &[]);
    assert_eq!(count(&again, "unchanged"), 3, "{again}");
    assert_eq!(count(&again, "operations_created"), 0, "{again}");
    assert!(again["batch_id"].is_null(), "{again}");
    drop(engine);
    verify(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thumbnails_are_recorded_by_absolute_path_with_a_relative_database_url() {
    let dir = tempfile::tempdir().unwrap();
    samples(dir.path(), 2, 0);
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let output = opledger(dir.path())
        .args([
            "--json",
            "--database-url",
            "data/ledger.db",
            "ingest",
            "photos",
            "--workers",
            "1",
        ])
        .output()
        .unwrap();
    summary_of(&output);
    let store = opledger_store_sqlite::SqliteStore::open(opledger_store_sqlite::SqliteConfig::at(
        dir.path().join("data/ledger.db"),
    ))
    .await
    .unwrap();
    let engine = opledger_engine::Engine::open(store).await.unwrap().0;
    let thumbnails: Vec<PathBuf> = events(&engine)
        .await
        .iter()
        .filter_map(|event| match &event.event {
            Event::OperationSucceeded(succeeded) => succeeded.output["path"].as_str().map(PathBuf::from),
            _ => None,
        })
        .collect();
    assert_eq!(thumbnails.len(), 2);
    let expected = std::fs::canonicalize(dir.path().join("data/thumbnails")).unwrap();
    for thumbnail in &thumbnails {
        assert!(thumbnail.is_absolute(), "{}", thumbnail.display());
        assert_eq!(thumbnail.parent(), Some(expected.as_path()));
        assert!(thumbnail.exists());
    }
    drop(engine);
    let verified = opledger(dir.path())
        .args(["--database-url", "data/ledger.db", "replay", "--verify"])
        .output()
        .unwrap();
    assert_eq!(verified.status.code(), Some(0), "{}", describe(&verified));
}

/// Whether `text` holds an ANSI colour (SGR) sequence: ESC `[` digits and
/// semicolons, then `m`. Cursor movements a progress bar draws are not.
fn has_colour(text: &str) -> bool {
    text.match_indices("\x1b[").any(|(at, _)| {
        let rest = &text[at + 2..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == ';'))
            .unwrap_or(rest.len());
        rest[end..].starts_with('m')
    })
}

#[test]
fn the_plain_output_says_plurals_right_repeats_no_path_and_has_no_colour_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let images = samples(dir.path(), 3, 1);
    let plain = opledger(dir.path())
        .args(["ingest", "photos", "--workers", "1"])
        .env("OPLEDGER_LOG", "info")
        .output()
        .unwrap();
    assert_eq!(plain.status.code(), Some(0), "{}", describe(&plain));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&plain.stderr),
    );
    assert!(stdout.contains("4 files in"), "{stdout}");
    assert!(stdout.contains("16 operations created, 12 tasks run"), "{stdout}");
    assert!(stdout.contains("review queue (3 entries;"), "{stdout}");
    assert!(stderr.contains("INFO"), "the log is on: {stderr}");
    assert!(!has_colour(&stdout) && !has_colour(&stderr), "{stderr}");
    for line in stdout.lines().filter(|line| line.trim_start().starts_with('#')) {
        let path = line.split_whitespace().nth(3).unwrap();
        assert_eq!(line.matches(path).count(), 1, "the path is repeated: {line}");
    }
    // One file touched (same bytes, a new modification time): one new
    // ingestion and no task, in the singular.
    let touched = std::fs::File::options().append(true).open(&images[0]).unwrap();
    touched
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(60))
        .unwrap();
    drop(touched);
    let one = opledger(dir.path()).args(["ingest", "photos"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&one.stdout).contains("; 1 operation created, 0 tasks run"),
        "{}",
        describe(&one)
    );
    verify(dir.path());
}

/// On a terminal (a pseudo-terminal from `script`): a progress bar with
/// whole-number rates and no `0/0` before the folder is walked, and colour
/// in the log unless `NO_COLOR` is set.
#[test]
fn on_a_terminal_the_bar_shows_whole_rates_and_colour_follows_no_color() {
    let dir = tempfile::tempdir().unwrap();
    samples(dir.path(), 40, 0);
    let on_terminal = |no_color: bool, database: &str| {
        let mut command = std::process::Command::new("script");
        command
            .args(["-qec"])
            .arg(format!(
                "{} --database-url {database} ingest photos --workers 1 --batch-name terminal",
                common::BIN
            ))
            .arg("/dev/null")
            .current_dir(dir.path())
            .env("OPLEDGER_LOG", "info")
            .env("COLUMNS", "160")
            .env_remove("NO_COLOR")
            .env_remove("OPLEDGER_DATABASE_URL");
        if no_color {
            command.env("NO_COLOR", "1");
        }
        let output = command.output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let coloured = on_terminal(false, "a.db");
    assert!(has_colour(&coloured), "{coloured:?}");
    assert!(!coloured.contains("0/0 files"), "{coloured:?}");
    let pieces: Vec<&str> = coloured.split(" files/s").collect();
    assert!(pieces.len() > 1, "no rate shown: {coloured:?}");
    for before in &pieces[..pieces.len() - 1] {
        let number = before.rsplit(' ').next().unwrap();
        assert!(
            number.chars().all(|c| c.is_ascii_digit()),
            "not a whole rate: {number:?} in {coloured:?}"
        );
    }
    let plain = on_terminal(true, "b.db");
    assert!(!has_colour(&plain), "{plain:?}");
}

/// A FIFO in the folder must never block the ingest (opening one waits
/// for a writer), and links, sockets and FIFOs are counted as skipped with
/// their reasons, never opened and never silently dropped.
#[test]
fn fifos_sockets_and_symbolic_links_are_skipped_with_a_reason_and_never_opened() {
    let dir = tempfile::tempdir().unwrap();
    let images = samples(dir.path(), 2, 0);
    let photos = dir.path().join("photos");
    let fifo = photos.join("pipe.jpg");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let _socket = std::os::unix::net::UnixListener::bind(photos.join("socket.png")).unwrap();
    let outside = dir.path().join("outside.png");
    std::fs::copy(&images[0], &outside).unwrap();
    std::os::unix::fs::symlink(&outside, photos.join("leads-out.png")).unwrap();
    std::os::unix::fs::symlink(&images[1], photos.join("leads-in.png")).unwrap();

    let started = std::time::Instant::now();
    let summary = ingest(dir.path(), &[]);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the FIFO blocked the ingest"
    );
    assert_eq!(summary["files"], 2, "{summary}");
    assert_eq!(summary["failed"], 0, "{summary}");
    let skipped: Vec<(String, String)> = summary["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            let path = entry["path"].as_str().unwrap();
            let name = Path::new(path).file_name().unwrap().to_string_lossy().to_string();
            (name, entry["reason"].as_str().unwrap().to_string())
        })
        .collect();
    let names: Vec<&str> = skipped.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["leads-in.png", "leads-out.png", "pipe.jpg", "socket.png"],
        "{summary}"
    );
    assert!(skipped[0].1.contains("symbolic link"), "{skipped:?}");
    assert!(skipped[2].1.contains("FIFO"), "{skipped:?}");
    assert!(skipped[3].1.contains("socket"), "{skipped:?}");

    let plain = opledger(dir.path()).args(["ingest", "photos"]).output().unwrap();
    let text = String::from_utf8_lossy(&plain.stdout);
    assert!(
        text.contains("4 skipped") && text.contains("a FIFO (named pipe)"),
        "{}",
        describe(&plain)
    );
    verify(dir.path());
}
