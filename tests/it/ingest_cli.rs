//! `opledger ingest` end to end: the real binary on real folders of real
//! PNG/JPEG files (and corrupt ones), a real SQLite file, real processes
//! killed with SIGKILL. Checks the summary's counts, the thumbnails, the
//! capability states, the review queue, idempotence, change, crash-resume,
//! settling of a file still being written, and `replay --verify` after each;
//! and what `opledger bench ingest` reports beside its figures.

use crate::common;

use common::{describe, opledger};
use futures::TryStreamExt;
use opledger_domain::projections::{CapabilityRow, Row, CAPABILITY_STATES_TABLE, MEDIA_TABLE};
use opledger_domain::{CapabilityStatus, Event, EventEnvelope, OperationStatus};
use opledger_engine::Engine;
use opledger_media::{generate_samples_with, hash_file, SampleOptions};
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `opledger --json ingest photos ...` in `dir`; the parsed summary.
fn ingest(dir: &Path, extra: &[&str]) -> Value {
    let output = opledger(dir)
        .args(["--json", "ingest", "photos", "--workers", "2"])
        .args(extra)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", describe(&output)))
}

fn verify(dir: &Path) {
    let output = opledger(dir).args(["replay", "--verify"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

fn count(summary: &Value, key: &str) -> u64 {
    summary[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing from {summary}"))
}

async fn engine(dir: &Path) -> Engine<SqliteStore> {
    let store = SqliteStore::open(SqliteConfig::at(dir.join("opledger.db")))
        .await
        .unwrap();
    Engine::open(store).await.unwrap().0
}

async fn events(engine: &Engine<SqliteStore>) -> Vec<EventEnvelope> {
    engine.store().read_all(0, 1_000).try_collect().await.unwrap()
}

/// Capability states by media path and capability.
async fn capabilities(engine: &Engine<SqliteStore>) -> BTreeMap<(String, String), CapabilityStatus> {
    let paths: BTreeMap<_, _> = engine
        .store()
        .scan_table(&MEDIA_TABLE)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|row| match row {
            Row::Media(media) => Some((media.media_id, media.path)),
            _ => None,
        })
        .collect();
    engine
        .store()
        .scan_table(&CAPABILITY_STATES_TABLE)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|row| match row {
            Row::Capability(CapabilityRow {
                media_id,
                capability,
                status,
                ..
            }) => Some(((paths[&media_id].clone(), capability), status)),
            _ => None,
        })
        .collect()
}

fn samples(dir: &Path, count: usize, corrupt: usize) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let set = generate_samples_with(&dir.join("photos"), &SampleOptions::new(count, 7).with_corrupt(corrupt)).unwrap();
    let canonical = |paths: Vec<PathBuf>| {
        paths
            .into_iter()
            .map(|path| std::fs::canonicalize(path).unwrap())
            .collect()
    };
    (canonical(set.images), canonical(set.corrupt))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_of_a_generated_folder_counts_exactly_writes_thumbnails_and_reviews_only_corrupt_files() {
    let dir = tempfile::tempdir().unwrap();
    let (images, corrupt) = samples(dir.path(), 12, 3);
    let summary = ingest(dir.path(), &[]);
    assert_eq!(count(&summary, "files"), 15);
    assert_eq!(count(&summary, "new"), 15);
    assert_eq!(count(&summary, "unchanged"), 0);
    assert_eq!(count(&summary, "changed"), 0);
    assert_eq!(count(&summary, "failed"), 3);
    // One ingestion per file and three tasks per file.
    assert_eq!(count(&summary, "operations_created"), 15 * 4);
    assert_eq!(count(&summary, "tasks_run"), 15 * 3);
    assert!(summary["batch_id"].is_string());

    // Thumbnails: one per image, decoding with the longest side 256 (or the
    // image's own, never enlarged), aspect kept.
    let thumbnails: Vec<PathBuf> = std::fs::read_dir(dir.path().join("thumbnails"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(thumbnails.len(), images.len(), "{thumbnails:?}");
    let mut sides = BTreeSet::new();
    for thumbnail in &thumbnails {
        let decoded = image::open(thumbnail).unwrap();
        sides.insert(decoded.width().max(decoded.height()));
    }
    let expected: BTreeSet<u32> = images
        .iter()
        .map(|image| {
            let (width, height) = image::image_dimensions(image).unwrap();
            width.max(height).min(256)
        })
        .collect();
    assert_eq!(sides, expected);

    // Capability states: every image's three succeeded, every corrupt file's failed.
    let engine = engine(dir.path()).await;
    let states = capabilities(&engine).await;
    assert_eq!(states.len(), 15 * 3);
    for ((path, capability), status) in &states {
        let is_corrupt = corrupt.iter().any(|bad| bad.display().to_string() == *path);
        let expected = if is_corrupt {
            CapabilityStatus::FailedTerminal
        } else {
            CapabilityStatus::Succeeded
        };
        assert_eq!(*status, expected, "{path} {capability}");
    }
    // Review entries for the corrupt files only, with the decoder's reason.
    let entries = summary["review_entries"].as_array().unwrap();
    assert_eq!(entries.len(), 3 * 3);
    let reviewed: BTreeSet<String> = entries
        .iter()
        .map(|entry| entry["path"].as_str().unwrap().to_string())
        .collect();
    let corrupt_paths: BTreeSet<String> = corrupt.iter().map(|path| path.display().to_string()).collect();
    assert_eq!(reviewed, corrupt_paths);
    assert!(entries
        .iter()
        .all(|entry| entry["detail"].as_str().unwrap().contains("not a decodable image")));
    // Each file's stages are on its timeline, in order.
    let stages: Vec<String> = events(&engine)
        .await
        .iter()
        .filter(|event| event.stream_id.as_str().starts_with("operation-"))
        .filter_map(|event| match &event.event {
            Event::OperationStageChanged(changed) => Some(format!("{}:{}", event.stream_id, changed.stage)),
            _ => None,
        })
        .collect();
    let first_stream = stages[0].split(':').next().unwrap().to_string();
    let first: Vec<&str> = stages
        .iter()
        .filter(|entry| entry.starts_with(&first_stream))
        .map(|entry| entry.split(':').nth(1).unwrap())
        .collect();
    assert_eq!(first, ["settling", "hashing", "parsing", "registered", "completed"]);
    drop(engine);
    verify(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_run_does_nothing_and_a_modified_file_reruns_only_its_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let (images, _) = samples(dir.path(), 8, 1);
    let first = ingest(dir.path(), &[]);
    assert_eq!(count(&first, "new"), 9);

    let again = ingest(dir.path(), &[]);
    assert_eq!(count(&again, "unchanged"), 9);
    assert_eq!(count(&again, "operations_created"), 0);
    assert_eq!(count(&again, "tasks_run"), 0);
    assert_eq!(count(&again, "new") + count(&again, "changed"), 0);

    // Replace one image with another picture: exactly its three tasks run,
    // at new revisions (new digest), and a new thumbnail appears.
    let target = &images[3];
    let replacement = image::RgbImage::from_fn(300, 200, |x, y| image::Rgb([(x % 256) as u8, (y % 256) as u8, 99]));
    let extension = target.extension().unwrap().to_string_lossy().to_string();
    let format = if extension == "png" {
        image::ImageFormat::Png
    } else {
        image::ImageFormat::Jpeg
    };
    std::thread::sleep(Duration::from_millis(20));
    image::DynamicImage::ImageRgb8(replacement)
        .save_with_format(target, format)
        .unwrap();
    // Past the settling quiet period.
    std::thread::sleep(Duration::from_millis(600));
    let changed = ingest(dir.path(), &[]);
    assert_eq!(count(&changed, "changed"), 1);
    assert_eq!(count(&changed, "unchanged"), 8);
    assert_eq!(count(&changed, "tasks_run"), 3);
    assert_eq!(
        count(&changed, "operations_created"),
        1,
        "one new ingestion; the tasks get new revisions"
    );
    let engine = engine(dir.path()).await;
    let media = engine.media_by_path(&[target.display().to_string()]).await.unwrap();
    let row = &media[&target.display().to_string()];
    assert_eq!(
        row.content_digest.as_deref(),
        Some(hash_file(target).unwrap().digest().as_str())
    );
    let states = capabilities(&engine).await;
    for capability in ["metadata", "thumbnail", "perceptual_hash"] {
        assert_eq!(
            states[&(target.display().to_string(), capability.to_string())],
            CapabilityStatus::Succeeded
        );
    }
    assert_eq!(std::fs::read_dir(dir.path().join("thumbnails")).unwrap().count(), 8 + 1);

    // A deleted file is recorded, not dropped.
    std::fs::remove_file(&images[0]).unwrap();
    let after = ingest(dir.path(), &[]);
    assert_eq!(count(&after, "missing"), 1);
    assert_eq!(count(&after, "files"), 8);
    let gone_path = images[0].display().to_string();
    let gone = engine
        .ingestions_by_path(std::slice::from_ref(&gone_path))
        .await
        .unwrap()[&gone_path]
        .clone();
    assert_eq!(gone.status, OperationStatus::MissingConfirmed);
    drop(engine);
    verify(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_run_the_next_run_finishes_without_rerunning_completed_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let (images, _) = samples(dir.path(), 160, 0);
    let mut child = opledger(dir.path())
        .args(["--json", "ingest", "photos", "--workers", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once some tasks have completed (read from another connection).
    let database = dir.path().join("opledger.db");
    let started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the ingest finished ({status}) before it could be killed; give it more files");
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no task completed in time"
        );
        if database.exists() && completed_tasks(&database).await >= 30 {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = completed_tasks(&database).await;
    assert!(before >= 30);
    // A kill between writing a thumbnail and renaming it into place leaves
    // its temporary file behind; make sure one is there, whatever the
    // moment of this kill was. The next run must remove it.
    std::fs::write(
        dir.path()
            .join("thumbnails")
            .join(".abandoned.png.c7c86cc43affb918.01a23182-e42f-73da-a0a0-5e609a0b7fb6.tmp"),
        b"half a thumbnail",
    )
    .unwrap();

    let summary = ingest(dir.path(), &[]);
    assert_eq!(count(&summary, "files"), 160);
    assert_eq!(count(&summary, "failed"), 0);
    let engine = engine(dir.path()).await;
    // Every file's ingestion completed.
    let paths: Vec<String> = images.iter().map(|image| image.display().to_string()).collect();
    let ingestions = engine.ingestions_by_path(&paths).await.unwrap();
    for image in &images {
        let operation = &ingestions[&image.display().to_string()];
        assert_eq!(operation.status, OperationStatus::Succeeded, "{}", image.display());
    }
    // No completed task ran twice: each task succeeded exactly once, and
    // no task that had succeeded before the kill was claimed again.
    let log = events(&engine).await;
    let mut succeeded: BTreeMap<String, usize> = BTreeMap::new();
    let mut claims_after_success: Vec<String> = Vec::new();
    let mut done: BTreeSet<String> = BTreeSet::new();
    for event in &log {
        let stream = event.stream_id.as_str().to_string();
        match &event.event {
            Event::OperationSucceeded(_) => {
                *succeeded.entry(stream.clone()).or_default() += 1;
                done.insert(stream);
            }
            Event::OperationClaimed(_) if done.contains(&stream) => claims_after_success.push(stream),
            _ => {}
        }
    }
    assert!(succeeded.values().all(|times| *times == 1), "a task succeeded twice");
    assert!(
        claims_after_success.is_empty(),
        "completed work was claimed again: {claims_after_success:?}"
    );
    assert_eq!(succeeded.len(), 160 * 4, "every ingestion and task succeeded once");
    // The dead run's claims were taken over on the timeline.
    assert!(
        log.iter()
            .any(|event| matches!(event.event, Event::OperationInterrupted(_))),
        "recovery's interruptions are on the timeline"
    );
    // No temporary thumbnail was left behind.
    let leftovers: Vec<String> = std::fs::read_dir(dir.path().join("thumbnails"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().to_string())
        .filter(|name| !name.ends_with(".png"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    drop(engine);
    verify(dir.path());
}

/// Task completions in the log so far, read on a connection of its own.
async fn completed_tasks(database: &Path) -> usize {
    let Ok(store) = SqliteStore::open(SqliteConfig::at(database)).await else {
        return 0;
    };
    let log: Vec<EventEnvelope> = match store.read_all(0, 1_000).try_collect().await {
        Ok(log) => log,
        Err(_) => return 0,
    };
    let ingestions: BTreeSet<&str> = log
        .iter()
        .filter_map(|event| match &event.event {
            Event::OperationCreated(created) if created.kind == "ingestion.file" => Some(event.stream_id.as_str()),
            _ => None,
        })
        .collect();
    log.iter()
        .filter(|event| matches!(event.event, Event::OperationSucceeded(_)))
        .filter(|event| !ingestions.contains(event.stream_id.as_str()))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_still_being_written_is_not_hashed_until_it_settles() {
    let dir = tempfile::tempdir().unwrap();
    samples(dir.path(), 3, 0);
    // A file that keeps growing for a while after the ingest starts.
    let growing = dir.path().join("photos").join("growing.bin");
    let writer = {
        let growing = growing.clone();
        std::thread::spawn(move || {
            let mut file = std::fs::File::create(&growing).unwrap();
            for round in 0..15u8 {
                file.write_all(&[round; 4096]).unwrap();
                file.flush().unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let summary = ingest(dir.path(), &["--settle-ms", "400"]);
    writer.join().unwrap();
    assert_eq!(count(&summary, "files"), 4);
    let engine = engine(dir.path()).await;
    let canonical = std::fs::canonicalize(&growing).unwrap();
    let media = engine.media_by_path(&[canonical.display().to_string()]).await.unwrap();
    let row = &media[&canonical.display().to_string()];
    // The digest is of the whole file, as it was once it stopped growing.
    assert_eq!(row.byte_size, Some(15 * 4096));
    assert_eq!(
        row.content_digest.as_deref(),
        Some(hash_file(&canonical).unwrap().digest().as_str())
    );
    drop(engine);
    verify(dir.path());
}

/// `opledger bench ingest --photos` generates camera-like JPEGs (a
/// quarter turned by their EXIF orientation), ingests every one, and
/// reports its figures beside the decode floor of the same run.
#[test]
fn bench_ingest_of_photos_ingests_every_photo_and_reports_the_floor_and_the_ledger_share() {
    let dir = tempfile::tempdir().unwrap();
    let output = opledger(dir.path())
        .args([
            "bench",
            "ingest",
            "--photos",
            "4",
            "--megapixels",
            "0.3",
            "--rounds",
            "1",
            "--json",
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let report: Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", describe(&output)));
    assert_eq!(report["mode"], "photos", "{report}");
    assert_eq!(report["files"].as_u64(), Some(4), "{report}");
    assert_eq!(report["tasks_run"].as_u64(), Some(12), "three tasks a photo: {report}");
    assert_eq!(
        (report["width"].as_u64(), report["height"].as_u64()),
        (Some(640), Some(480))
    );
    for figure in [
        "files_per_sec",
        "floor_files_per_sec",
        "cpu_seconds_per_file",
        "wall_ratio_to_floor",
    ] {
        assert!(
            report[figure].as_f64().is_some_and(|value| value > 0.0),
            "{figure}: {report}"
        );
    }
    let share = report["ledger_share_of_cpu"].as_f64().expect("ledger_share_of_cpu");
    assert!((0.0..=1.0).contains(&share), "{report}");
}

/// `opledger bench ingest` measures the ledger against two floors: the
/// image work alone, and the bare INSERTs of the events each round
/// appended. The events are read back from the round's own log, so they
/// cover every task the round ran; the bound that follows from them is
/// given only when the workers fill every core.
#[test]
fn bench_ingest_reports_the_rounds_events_and_their_plain_insert_floor() {
    let dir = tempfile::tempdir().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let workers = format!("1,{cores}");
    let output = opledger(dir.path())
        .args([
            "bench",
            "ingest",
            "--files",
            "24",
            "--rounds",
            "1",
            "--json",
            "--workers",
            &workers,
        ])
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let report: Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", describe(&output)));
    assert_eq!(report["cores"].as_u64(), Some(cores as u64), "{report}");
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{report}");
    for run in runs {
        let workers = run["workers"].as_u64().expect("workers") as usize;
        let tasks_run = run["tasks_run"].as_u64().expect("tasks_run");
        let events = run["events"].as_u64().expect("events");
        assert!(tasks_run >= 3 * 20, "{run}");
        // Every task is at least requested, claimed and ended by an event
        // of its own, and every file has stage changes besides.
        assert!(events > 3 * tasks_run, "{run}");
        let insert_floor = run["events_insert_floor_seconds"]
            .as_f64()
            .expect("events_insert_floor_seconds");
        assert!(insert_floor > 0.0, "{run}");
        let bound = &run["ledger_share_if_it_only_inserted_its_events"];
        if workers >= cores {
            let bound = bound
                .as_f64()
                .unwrap_or_else(|| panic!("no bound with every core busy: {run}"));
            assert!(bound > 0.0 && bound < 1.0, "{run}");
        } else {
            assert!(bound.is_null(), "a bound with an idle core: {run}");
        }
    }
    // The rounds' folders are gone; the generated photos stay for the next run.
    assert!(!dir.path().join("ingest-runs").exists());
}
