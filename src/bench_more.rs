//! `opledger bench ingest|status|timeline`: the reference pipeline's files/s
//! and the share of its wall time the ledger takes, and the latency of the
//! dashboard summary and of one operation's timeline in a large log. Each
//! prints JSON with its floor measured in the same run.

use crate::cli::BenchArgs;
use opledger_domain::projections::{Row, OPERATIONS_TABLE};
use opledger_domain::Timestamp;
use opledger_engine::bench::LifecycleWorkload;
use opledger_engine::Engine;
use opledger_ingest::{ingest, IngestOptions, NoProgress};
use opledger_media::{decode_image, dhash, encode_image, generate_samples, sha256_hex, thumbnail, ThumbnailFormat};
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const START: i64 = 1_796_000_000_000_000;

fn percentile(samples: &mut [Duration], quantile: f64) -> f64 {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * quantile).round() as usize;
    samples[index].as_secs_f64() * 1_000.0
}

fn round3(value: f64) -> f64 {
    (value * 1_000.0).round() / 1_000.0
}

async fn store_at(template: &SqliteConfig, path: PathBuf) -> anyhow::Result<SqliteStore> {
    let mut config = template.clone();
    config.path = path;
    Ok(SqliteStore::open(config).await?)
}

/// Ingests `--files` generated images with each worker count, and the same
/// image work without the ledger (read, SHA-256 check and decode per task;
/// thumbnail encoded and written; dHash) on as many threads: the floor.
pub async fn ingest_workload(template: &SqliteConfig, dir: &Path, args: &BenchArgs) -> anyhow::Result<Value> {
    // Each round writes into folders of its own, removed only when the
    // workload is done. *Why:* ext4 avoids reusing inodes freed in the last
    // half minute, and after the 2,000 thumbnails of a round were deleted,
    // every file the next round created paid for a scan past them
    // (`recently_deleted`, `find_inode_bit`: 8% of the ingest's image
    // thread against 2% of the floor's, which ran later).
    let runs_dir = dir.join("ingest-runs");
    if runs_dir.exists() {
        std::fs::remove_dir_all(&runs_dir)?;
    }
    let photos = dir.join("photos");
    let files = generate_samples(&photos, args.files, 11)?;
    // Settled long ago as far as the quiet period is concerned.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut runs = Vec::new();
    for &workers in &args.workers {
        // Ingest and floor alternate round by round, so a drift of the
        // machine's speed falls on both; the share comes from the medians.
        let mut walls = Vec::new();
        let mut floors = Vec::new();
        let mut event_floors = Vec::new();
        let mut events = 0;
        let mut summary = None;
        for round in 0..args.rounds.max(1) {
            // A fresh ledger each round: one left by an earlier round would
            // find every file unchanged and measure an idempotent rerun.
            let run_dir = runs_dir.join(format!("workers-{workers}-round-{round}"));
            std::fs::create_dir_all(&run_dir)?;
            let store = store_at(template, run_dir.join("ledger.db")).await?;
            let (engine, _) = Engine::open(store).await?;
            let mut options = IngestOptions::new(
                &photos,
                run_dir.join("thumbnails"),
                run_dir.join("ledger.db.ingest-lock"),
            );
            options.workers = workers;
            options.settle_quiet = Duration::from_millis(500);
            let started = Instant::now();
            let ingested = ingest(engine.clone(), options, Arc::new(NoProgress)).await?;
            walls.push(started.elapsed());
            let rows = crate::bench::logged_floor_rows(engine.store(), 0).await?;
            drop(engine);
            floors.push(image_floor(&files, &run_dir.join("floor-thumbnails"), workers).await?);
            // The ledger's own floor: the events this round appended, as
            // plain multi-row INSERTs (100 a transaction, no triggers, no
            // projections) into a fresh database beside it.
            let floor_store = store_at(template, run_dir.join("events-floor.db")).await?;
            event_floors.push(opledger_store_sqlite::floor::multi_row_inserts(&floor_store, &rows, 100).await?);
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
        let wall = percentile(&mut walls, 0.5) / 1_000.0;
        let floor = percentile(&mut floors, 0.5) / 1_000.0;
        let events_floor = percentile(&mut event_floors, 0.5) / 1_000.0;
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
    std::fs::remove_dir_all(&runs_dir)?;
    Ok(json!({
        "workload": "ingest",
        "backend": "sqlite",
        "files": files.len(),
        "runs": runs,
        "cores": cores,
        "floor": "the same image work without the ledger on as many threads (every file queued at once): per file one SHA-256 read, then per task a read, a SHA-256 check and a decode, plus the thumbnail's shrink, PNG encode and write and the dHash",
        "events_floor": "the events each round appended, read back and inserted as plain multi-row INSERTs, 100 a transaction, into a table with the log's columns and stream index (no triggers, no projections, same synchronous setting); ledger_share_if_it_only_inserted_its_events is (events_floor / cores) / (image floor + events_floor / cores), given when the workers fill every core",
    }))
}

async fn image_floor(files: &[PathBuf], thumbnails: &Path, workers: usize) -> anyhow::Result<Duration> {
    use futures::StreamExt;
    std::fs::create_dir_all(thumbnails)?;
    // The same threads the ingest's image work runs on, every file queued
    // at once: the floor pays no wake-up between one file and the next.
    let compute = opledger_worker::ComputeThreads::new(workers, "floor-image")?;
    let started = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(files.iter().cloned().enumerate())
        .map(|(index, file)| {
            let out = thumbnails.join(format!("{index}.png"));
            let compute = compute.clone();
            async move {
                compute
                    .run(move || -> anyhow::Result<()> {
                        let bytes = std::fs::read(&file)?;
                        let _digest = sha256_hex(&bytes);
                        for task in 0..3 {
                            let bytes = std::fs::read(&file)?;
                            let _check = sha256_hex(&bytes);
                            let decoded = decode_image(&bytes)?;
                            match task {
                                0 => {}
                                1 => {
                                    let small = thumbnail(&decoded.image, 256)?;
                                    std::fs::write(&out, encode_image(&small, ThumbnailFormat::Png)?)?;
                                }
                                _ => {
                                    let _ = dhash(&decoded.image);
                                }
                            }
                        }
                        Ok(())
                    })
                    .await
                    .map_err(anyhow::Error::from)
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

/// Builds a log of `--events` events (media items with operations through
/// their whole lifecycle) and returns the engine over it.
async fn built_log(
    template: &SqliteConfig,
    dir: &Path,
    workload: &str,
    events: u64,
) -> anyhow::Result<(Engine<SqliteStore>, u64)> {
    let path = dir.join(format!("{workload}-{events}.db"));
    if path.exists() {
        std::fs::remove_file(&path)?;
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
    let store = store_at(template, path).await?;
    let (engine, _) = Engine::open(store).await?;
    // Media tasks: capability states and review entries exist, so the
    // summary's every part has rows to count.
    let mut workload = LifecycleWorkload::with_media_tasks(Timestamp::from_micros(START));
    let mut built = 0u64;
    while built < events {
        let appends = workload.appends((events - built).min(100_000));
        built += appends.iter().map(|append| append.events.len() as u64).sum::<u64>();
        for batch in LifecycleWorkload::batches(appends, 1000) {
            engine.append(batch).await?;
        }
    }
    Ok((engine, built))
}

/// p50/p99 of the dashboard summary (`status`: operations and capabilities
/// by status, active batches, review queue, projection lag). Floor: one
/// plain grouped count of the operations table.
pub async fn status_workload(template: &SqliteConfig, dir: &Path, args: &BenchArgs) -> anyhow::Result<Value> {
    let (engine, built) = built_log(template, dir, "status", args.events).await?;
    let operations = engine.store().count_rows(&OPERATIONS_TABLE).await?;
    let samples = args.samples.max(10);
    let mut ours = Vec::with_capacity(samples);
    let mut floor = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        engine.status().await?;
        ours.push(started.elapsed());
        let started = Instant::now();
        engine.store().count_by(&OPERATIONS_TABLE, "status").await?;
        floor.push(started.elapsed());
    }
    let p99 = percentile(&mut ours, 0.99);
    let floor_p99 = percentile(&mut floor, 0.99);
    Ok(json!({
        "workload": "status",
        "backend": engine.store().backend(),
        "events": built,
        "operations": operations,
        "samples": samples,
        "p50_ms": round3(percentile(&mut ours, 0.5)),
        "p99_ms": round3(p99),
        "floor_p50_ms": round3(percentile(&mut floor, 0.5)),
        "floor_p99_ms": round3(floor_p99),
        "ratio_to_floor_p99": round3(p99 / floor_p99),
        "floor": "one plain GROUP BY status count of media_operations through the read pool",
    }))
}

/// p50/p99 of one operation's timeline (its events in order, decoded) for
/// operations spread over the whole log. Floor: the same stream read as
/// rows without decoding into typed events is not exposed by the store, so
/// the floor is the operation's projected row by primary key.
pub async fn timeline_workload(template: &SqliteConfig, dir: &Path, args: &BenchArgs) -> anyhow::Result<Value> {
    let (engine, built) = built_log(template, dir, "timeline", args.events).await?;
    let operations: Vec<_> = engine
        .store()
        .find_rows(&OPERATIONS_TABLE, &[], 100_000)
        .await?
        .into_iter()
        .filter_map(|row| match row {
            Row::Operation(operation) => Some(operation.operation_id),
            _ => None,
        })
        .collect();
    anyhow::ensure!(!operations.is_empty(), "the built log has no operations");
    let samples = args.samples.max(10);
    let mut ours = Vec::with_capacity(samples);
    let mut floor = Vec::with_capacity(samples);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut events = 0usize;
    for _ in 0..samples {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let operation_id = operations[(state % operations.len() as u64) as usize];
        let started = Instant::now();
        events += engine.timeline(operation_id).await?.len();
        ours.push(started.elapsed());
        let started = Instant::now();
        engine.operation(operation_id).await?;
        floor.push(started.elapsed());
    }
    let p99 = percentile(&mut ours, 0.99);
    Ok(json!({
        "workload": "timeline",
        "backend": engine.store().backend(),
        "events": built,
        "operations_sampled_from": operations.len(),
        "samples": samples,
        "events_per_timeline": round3(events as f64 / samples as f64),
        "p50_ms": round3(percentile(&mut ours, 0.5)),
        "p99_ms": round3(p99),
        "floor_p50_ms": round3(percentile(&mut floor, 0.5)),
        "floor_p99_ms": round3(percentile(&mut floor, 0.99)),
        "floor": "the operation's projected row by primary key through the read pool",
    }))
}
