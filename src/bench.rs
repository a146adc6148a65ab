//! `opledger bench`: runs a workload on fresh databases and prints one JSON
//! object with our figure, the raw floor measured in the same run, and the
//! ratio. Tests never assert on these numbers; people read them.

use crate::cli::{BenchArgs, Workload};
use anyhow::Context;
use opledger_domain::Timestamp;
use opledger_engine::bench::LifecycleWorkload;
use opledger_engine::Engine;
use opledger_store::Store;
use opledger_store_sqlite::floor::{self, FloorRow};
use opledger_store_sqlite::{SqliteConfig, SqliteStore, Synchronous};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const START: i64 = 1_796_000_000_000_000;

pub async fn run(database_url: &str, args: &BenchArgs) -> anyhow::Result<()> {
    if database_url.starts_with("postgres") {
        anyhow::bail!("opledger bench runs on SQLite only so far; PostgreSQL benchmarks are not built yet");
    }
    // The benchmark never touches the user's database: it takes the backend
    // and options from the URL and builds its own files.
    let template = SqliteConfig::from_url(database_url).map_err(|error| anyhow::anyhow!(error))?;
    let temporary;
    let dir: PathBuf = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            dir.clone()
        }
        None => {
            temporary = tempdir_in_target()?;
            temporary.path().to_path_buf()
        }
    };
    let report = match args.workload {
        Workload::Append => append(&template, &dir, args).await?,
        Workload::Replay => replay(&template, &dir, args).await?,
        Workload::Lifecycle => lifecycle(&template, &dir, args).await?,
        Workload::Ingest => crate::bench_more::ingest_workload(&template, &dir, args).await?,
        Workload::Status => crate::bench_more::status_workload(&template, &dir, args).await?,
        Workload::Timeline => crate::bench_more::timeline_workload(&template, &dir, args).await?,
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// A temporary folder on the same file system as the current directory, so
/// the benchmark measures the disk the user's database would live on.
fn tempdir_in_target() -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(".opledger-bench-")
        .tempdir_in(".")
        .context("creating a benchmark folder in the current directory")
}

async fn fresh_store(template: &SqliteConfig, dir: &Path, name: &str) -> anyhow::Result<SqliteStore> {
    let path = dir.join(name);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let mut config = SqliteConfig::at(path);
    config.synchronous = template.synchronous;
    Ok(SqliteStore::open(config).await?)
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

fn floor_rows(appends: &[opledger_store::StreamAppend]) -> Vec<FloorRow> {
    let mut rows = Vec::new();
    for append in appends {
        for (index, event) in append.events.iter().enumerate() {
            rows.push(FloorRow {
                stream_id: append.stream_id.to_string(),
                stream_version: index as i64 + 1,
                event_type: event.event.event_type(),
                payload: event.event.payload_json(),
                recorded_at: event.recorded_at.to_rfc3339(),
                actor: event.actor.clone(),
                correlation_id: event.correlation_id.clone(),
            });
        }
    }
    rows
}

fn synchronous_name(template: &SqliteConfig) -> &'static str {
    match template.synchronous {
        Synchronous::Full => "full",
        Synchronous::Normal => "normal",
    }
}

/// One timed pass of our batched path over fresh databases.
async fn ours_batched(
    template: &SqliteConfig,
    dir: &Path,
    args: &BenchArgs,
    clients: usize,
) -> anyhow::Result<Duration> {
    let appends = LifecycleWorkload::new(Timestamp::from_micros(START)).appends(args.events);
    let batches = LifecycleWorkload::batches(appends, args.batch);
    let store = fresh_store(template, dir, "bench-append-batched.db").await?;
    let (engine, _) = Engine::open(store).await?;
    let mut per_client: Vec<Vec<_>> = (0..clients).map(|_| Vec::new()).collect();
    for (index, batch) in batches.into_iter().enumerate() {
        per_client[index % clients].push(batch);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for batches in per_client {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            for batch in batches {
                engine.append(batch).await?;
            }
            Ok::<_, opledger_engine::EngineError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(started.elapsed())
}

async fn ours_unbatched(template: &SqliteConfig, dir: &Path, args: &BenchArgs) -> anyhow::Result<Duration> {
    let appends = LifecycleWorkload::new(Timestamp::from_micros(START)).appends(args.unbatched_events);
    let singles = LifecycleWorkload::one_event_each(appends);
    let store = fresh_store(template, dir, "bench-append-unbatched.db").await?;
    let (engine, _) = Engine::open(store).await?;
    let started = Instant::now();
    for single in singles {
        engine.append(vec![single]).await?;
    }
    Ok(started.elapsed())
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn figure(events: u64, per_transaction: usize, ours: Duration, floor: Duration, extra: Value) -> Value {
    let rate = per_second(events, ours);
    let floor_rate = per_second(events, floor);
    let mut figure = json!({
        "events": events,
        "events_per_transaction": per_transaction,
        "seconds": ours.as_secs_f64(),
        "events_per_sec": rate.round(),
        "floor_events_per_sec": floor_rate.round(),
        "ratio_to_floor": round3(rate / floor_rate),
    });
    if let (Value::Object(figure), Value::Object(extra)) = (&mut figure, extra) {
        figure.extend(extra);
    }
    figure
}

async fn append(template: &SqliteConfig, dir: &Path, args: &BenchArgs) -> anyhow::Result<Value> {
    let start = Timestamp::from_micros(START);
    let appends = LifecycleWorkload::new(start).appends(args.events);
    let events: u64 = appends.iter().map(|append| append.events.len() as u64).sum();
    let rows = floor_rows(&appends);
    let single_appends = LifecycleWorkload::new(start).appends(args.unbatched_events);
    let single_rows = floor_rows(&single_appends);
    let single_events = single_rows.len() as u64;
    let clients = 4;

    // Our path and the floor alternate, round after round, and each figure
    // is the median of its rounds: the disk's fsync latency drifts over
    // minutes on shared machines, and alternating keeps both sides on the
    // same disk weather.
    let rounds = args.rounds.max(1);
    let (mut batched, mut floor_batched, mut concurrent) = (Vec::new(), Vec::new(), Vec::new());
    let mut floor_multi_row = Vec::new();
    let (mut unbatched, mut floor_unbatched) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        batched.push(ours_batched(template, dir, args, 1).await?);
        let floor_store = fresh_store(template, dir, "bench-append-floor.db").await?;
        floor_batched.push(floor::plain_inserts(&floor_store, &rows, args.batch).await?);
        let floor_store = fresh_store(template, dir, "bench-append-floor-multi-row.db").await?;
        floor_multi_row.push(floor::multi_row_inserts(&floor_store, &rows, args.batch).await?);
        concurrent.push(ours_batched(template, dir, args, clients).await?);
        unbatched.push(ours_unbatched(template, dir, args).await?);
        let floor_store = fresh_store(template, dir, "bench-append-floor-unbatched.db").await?;
        floor_unbatched.push(floor::plain_inserts(&floor_store, &single_rows, 1).await?);
    }
    let floor_batched = median(floor_batched);
    let floor_multi_row = median(floor_multi_row);
    let batched = median(batched);
    let multi_row_rate = per_second(events, floor_multi_row);
    Ok(json!({
        "workload": "append",
        "backend": "sqlite",
        "synchronous": synchronous_name(template),
        "rounds": rounds,
        "batched": figure(
            events,
            args.batch,
            batched,
            floor_batched,
            json!({
                "floor_multi_row_events_per_sec": multi_row_rate.round(),
                "ratio_to_multi_row_floor": round3(per_second(events, batched) / multi_row_rate),
            })
        ),
        "batched_concurrent": figure(events, args.batch, median(concurrent), floor_batched, json!({"clients": clients})),
        "unbatched": figure(single_events, 1, median(unbatched), median(floor_unbatched), json!({})),
        "floor": "plain prepared INSERTs (one row each) of the same rows into a table with the log's columns and stream index, no triggers, no projections, same transaction sizes, same synchronous setting; the multi-row floor inserts up to 90 rows per statement",
        "workload_events": "media registrations, each followed by 4 thumbnail operations living created, claimed, started, progress, succeeded",
    }))
}

/// Tasks through request → claim → complete with every projection updated,
/// for each worker count, on a fresh database each. The floor: the same
/// number of events, read back from our log, as plain INSERTs in
/// transactions of 100 (the append floor's shape).
async fn lifecycle(template: &SqliteConfig, dir: &Path, args: &BenchArgs) -> anyhow::Result<Value> {
    let media_count = (args.tasks / 2).max(1);
    let mut runs = Vec::new();
    for &workers in &args.workers {
        let store = fresh_store(template, dir, &format!("bench-lifecycle-{workers}.db")).await?;
        let (engine, _) = Engine::open(store).await?;
        let media = opledger_engine::bench::register_lifecycle_media(&engine, media_count).await?;
        let head_before = engine.store().head().await?;
        let run = opledger_engine::bench::run_task_lifecycle(&engine, &media, workers.max(1), args.claim_batch).await?;
        // The floor inserts the very events this run appended.
        let mut rows = Vec::new();
        let mut events = engine.store().read_all(head_before, 10_000);
        while let Some(envelope) = futures::StreamExt::next(&mut events).await {
            let envelope = envelope?;
            rows.push(FloorRow {
                stream_id: envelope.stream_id.to_string(),
                stream_version: envelope.stream_version,
                event_type: envelope.event.event_type(),
                payload: envelope.event.payload_json(),
                recorded_at: envelope.recorded_at.to_rfc3339(),
                actor: envelope.actor.clone(),
                correlation_id: envelope.correlation_id.clone(),
            });
        }
        let floor_store = fresh_store(template, dir, "bench-lifecycle-floor.db").await?;
        let floor_elapsed = floor::plain_inserts(&floor_store, &rows, 100).await?;
        let tasks_per_sec = per_second(run.tasks, run.elapsed);
        let events_per_sec = per_second(run.events, run.elapsed);
        let floor_events_per_sec = per_second(rows.len() as u64, floor_elapsed);
        runs.push(json!({
            "workers": workers,
            "tasks": run.tasks,
            "claim_batch": run.claim_batch,
            "seconds": run.elapsed.as_secs_f64(),
            "tasks_per_sec": tasks_per_sec.round(),
            "events": run.events,
            "events_per_sec": events_per_sec.round(),
            "floor_events_per_sec": floor_events_per_sec.round(),
            "ratio_to_floor": round3(events_per_sec / floor_events_per_sec),
            "claim_latency_p50_us": run.claim_latency_us(0.5),
            "claim_latency_p99_us": run.claim_latency_us(0.99),
        }));
    }
    Ok(json!({
        "workload": "lifecycle",
        "backend": "sqlite",
        "synchronous": synchronous_name(template),
        "runs": runs,
        "workload_tasks": "media items each with a metadata and a thumbnail task: request (revision computed), batch claim, complete; the requester runs alongside the workers; every projection (operations, processing states) updated inline, every step an event on the task's timeline",
        "floor": "the events the run appended, read back and inserted as plain prepared INSERTs (one row each) in transactions of 100 into a table with the log's columns, no triggers, no projections, same synchronous setting",
    }))
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// The process's peak resident set size in bytes (VmHWM), when readable.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resets the peak RSS to the current RSS (Linux: writing 5 to clear_refs),
/// so the peak measured afterwards belongs to the replay alone.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

async fn replay(template: &SqliteConfig, dir: &Path, args: &BenchArgs) -> anyhow::Result<Value> {
    let store = fresh_store(template, dir, "bench-replay.db").await?;
    let (engine, _) = Engine::open(store).await?;
    let mut workload = LifecycleWorkload::new(Timestamp::from_micros(START));
    let build_started = Instant::now();
    let mut built = 0u64;
    while built < args.events {
        let appends = workload.appends((args.events - built).min(100_000));
        built += appends.iter().map(|append| append.events.len() as u64).sum::<u64>();
        for batch in LifecycleWorkload::batches(appends, 1000) {
            engine.append(batch).await?;
        }
    }
    let build = build_started.elapsed();

    let peak_reset = reset_peak_rss();
    let stats = engine.replay().await?;
    let peak = peak_rss();
    let (floor_events, floor_elapsed) = floor::plain_scan(engine.store()).await?;
    let rate = per_second(stats.events, stats.elapsed);
    let floor_rate = per_second(floor_events, floor_elapsed);
    Ok(json!({
        "workload": "replay",
        "backend": engine.store().backend(),
        "synchronous": synchronous_name(template),
        "events": stats.events,
        "seconds": stats.elapsed.as_secs_f64(),
        "events_per_sec": rate.round(),
        "floor_events_per_sec": floor_rate.round(),
        "ratio_to_floor": round3(rate / floor_rate),
        "peak_rss_mib": peak.map(|bytes| round3(bytes as f64 / 1_048_576.0)),
        "peak_rss_is_replay_only": peak_reset,
        "log_build_events_per_sec": per_second(built, build).round(),
        "floor": "one plain SELECT over the whole log, decoding every payload with serde_json into an untyped value",
    }))
}
