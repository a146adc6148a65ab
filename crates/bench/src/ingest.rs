//! `ingest`: the reference pipeline's files/s with N workers, and the share
//! of its wall time the ledger takes, against two floors measured in the
//! same run: the same image work without the ledger, and the bare INSERTs
//! of the events each round appended.

use crate::backend::store_at;
use crate::floor::{self, logged_floor_rows};
use crate::stats::{median, round3};
use crate::{BenchError, Options};
use opledger_engine::Engine;
use opledger_ingest::{IngestOptions, NoProgress};
use opledger_media::{
    decode_working, dhash, encode_image, generate_samples, sha256_hex, DecodeLimits, ThumbnailFormat,
    DEFAULT_WORKING_SIDE,
};
use opledger_store_sqlite::SqliteConfig;
use opledger_worker::ComputeThreads;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Ingests `--files` generated images with each worker count, and the same
/// image work without the ledger (per file: the registration's read and
/// SHA-256, then one read, SHA-256 check and working decode shared by the
/// three tasks; thumbnail encoded and written; dHash) on as many threads:
/// the floor.
pub async fn ingest(template: &SqliteConfig, dir: &Path, options: &Options) -> Result<Value, BenchError> {
    // Each round writes into folders of its own, removed only when the
    // workload is done. *Why:* ext4 avoids reusing inodes freed in the last
    // half minute, and after the 2,000 thumbnails of a round were deleted,
    // every file the next round created paid for a scan past them
    // (`recently_deleted`, `find_inode_bit`: 8% of the ingest's image
    // thread against 2% of the floor's, which ran later).
    let runs_dir = dir.join("ingest-runs");
    if runs_dir.exists() {
        std::fs::remove_dir_all(&runs_dir).map_err(BenchError::io(format!("removing {}", runs_dir.display())))?;
    }
    let photos = dir.join("photos");
    let files = generate_samples(&photos, options.files, 11)?;
    // Settled long ago as far as the quiet period is concerned.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut runs = Vec::new();
    for &workers in &options.workers {
        // Ingest and floor alternate round by round, so a drift of the
        // machine's speed falls on both; the share comes from the medians.
        let mut walls = Vec::new();
        let mut floors = Vec::new();
        let mut event_floors = Vec::new();
        let mut events = 0;
        let mut summary = None;
        for round in 0..options.rounds.max(1) {
            // A fresh ledger each round: one left by an earlier round would
            // find every file unchanged and measure an idempotent rerun.
            let run_dir = runs_dir.join(format!("workers-{workers}-round-{round}"));
            std::fs::create_dir_all(&run_dir).map_err(BenchError::io(format!("creating {}", run_dir.display())))?;
            let store = store_at(template, run_dir.join("ledger.db")).await?;
            let (engine, _) = Engine::open(store).await?;
            let mut ingest_options = IngestOptions::new(&photos, run_dir.join("thumbnails"));
            ingest_options.workers = workers;
            ingest_options.settle_quiet = Duration::from_millis(500);
            let started = Instant::now();
            let ingested = opledger_ingest::ingest(engine.clone(), ingest_options, Arc::new(NoProgress)).await?;
            walls.push(started.elapsed());
            let rows = logged_floor_rows(engine.store(), 0).await?;
            drop(engine);
            floors.push(image_floor(&files, &run_dir.join("floor-thumbnails"), workers).await?);
            // The ledger's own floor: the events this round appended, as
            // plain multi-row INSERTs (100 a transaction, no triggers, no
            // projections) into a fresh database beside it.
            let floor_store = store_at(template, run_dir.join("events-floor.db")).await?;
            event_floors.push(floor::sqlite::multi_row_inserts(&floor_store, &rows, 100).await?);
            drop(floor_store);
            events = rows.len();
            summary = Some(ingested);
        }
        let summary = summary.expect("at least one round");
        let seconds = |samples: &[Duration]| {
            samples
                .iter()
                .map(|sample| round3(sample.as_secs_f64()))
                .collect::<Vec<_>>()
        };
        let (rounds_seconds, rounds_floor_seconds) = (seconds(&walls), seconds(&floors));
        let wall = median(&mut walls).as_secs_f64();
        let floor = median(&mut floors).as_secs_f64();
        let events_floor = median(&mut event_floors).as_secs_f64();
        let share = 1.0 - floor / wall;
        // When the image work alone keeps every core busy, whatever CPU the
        // ledger uses lengthens the wall. Even a ledger that did nothing but
        // the bare INSERTs of its events, spread evenly over the cores,
        // would then take this share; with fewer workers than cores it
        // could hide on an idle core, and no such bound follows.
        let share_bound = (workers >= cores).then(|| {
            let added = events_floor / cores as f64;
            round3(added / (floor + added))
        });
        runs.push(json!({
            "workers": workers,
            "files": summary.files,
            "seconds": round3(wall),
            "files_per_sec": (summary.files as f64 / wall).round(),
            "tasks_run": summary.tasks_run,
            "image_work_floor_seconds": round3(floor),
            "ledger_share_of_wall": round3(share.max(0.0)),
            "events": events,
            "events_insert_floor_seconds": round3(events_floor),
            "ledger_share_if_it_only_inserted_its_events": share_bound,
            "rounds_seconds": rounds_seconds,
            "rounds_floor_seconds": rounds_floor_seconds,
        }));
    }
    std::fs::remove_dir_all(&runs_dir).map_err(BenchError::io(format!("removing {}", runs_dir.display())))?;
    Ok(json!({
        "workload": "ingest",
        "backend": "sqlite",
        "files": files.len(),
        "runs": runs,
        "cores": cores,
        "floor": "the same image work without the ledger on as many threads (every file queued at once): per file one SHA-256 read, then one read, SHA-256 check and working decode shared by its three tasks, plus the thumbnail's shrink, PNG encode and write and the dHash",
        "events_floor": "the events each round appended, read back and inserted as plain multi-row INSERTs, 100 a transaction, into a table with the log's columns and stream index (no triggers, no projections, same synchronous setting); ledger_share_if_it_only_inserted_its_events is (events_floor / cores) / (image floor + events_floor / cores), given when the workers fill every core",
    }))
}

async fn image_floor(files: &[PathBuf], thumbnails: &Path, workers: usize) -> Result<Duration, BenchError> {
    use futures::StreamExt;
    std::fs::create_dir_all(thumbnails).map_err(BenchError::io(format!("creating {}", thumbnails.display())))?;
    // The same threads the ingest's image work runs on, every file queued
    // at once: the floor pays no wake-up between one file and the next.
    let compute =
        ComputeThreads::new(workers, "floor-image").map_err(BenchError::io("starting the floor's threads"))?;
    let started = Instant::now();
    let results: Vec<Result<(), BenchError>> = futures::stream::iter(files.iter().cloned().enumerate())
        .map(|(index, file)| {
            let out = thumbnails.join(format!("{index}.png"));
            let compute = compute.clone();
            async move {
                compute
                    .run(move || -> Result<(), BenchError> {
                        let read = |file: &Path| {
                            std::fs::read(file).map_err(|source| BenchError::Io {
                                context: format!("reading {}", file.display()),
                                source,
                            })
                        };
                        // Registration hashes the file; the first of its
                        // tasks reads, checks and decodes it once for all three.
                        let bytes = read(&file)?;
                        let _digest = sha256_hex(&bytes);
                        let bytes = read(&file)?;
                        let _check = sha256_hex(&bytes);
                        let working = decode_working(&bytes, &DecodeLimits::default(), DEFAULT_WORKING_SIDE)?;
                        let small = working.thumbnail(256)?;
                        std::fs::write(&out, encode_image(&small, ThumbnailFormat::Png)?).map_err(|source| {
                            BenchError::Io {
                                context: format!("writing {}", out.display()),
                                source,
                            }
                        })?;
                        let _ = dhash(&working.image);
                        Ok(())
                    })
                    .await
                    .map_err(BenchError::from)
                    .and_then(|result| result)
            }
        })
        .buffer_unordered(files.len().max(1))
        .collect()
        .await;
    for result in results {
        result?;
    }
    Ok(started.elapsed())
}
