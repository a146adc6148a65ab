//! `opledger bench`: runs a workload on fresh databases and prints one JSON
//! object with our figure, the raw floor measured in the same run, and the
//! ratio. Tests never assert on these numbers; people read them.
//!
//! The workloads are written once, generic over [`BenchBackend`]: how to get
//! a fresh store of the backend the URL names, and that backend's raw floor
//! (its store crate's `floor` module). The code is generic over `Store`,
//! never over a driver.

use crate::cli::{BenchArgs, Workload};
use anyhow::Context;
use opledger_domain::Timestamp;
use opledger_engine::bench::LifecycleWorkload;
use opledger_engine::Engine;
use opledger_store::floor::FloorRow;
use opledger_store::Store;
use opledger_store_postgres::{PostgresConfig, PostgresStore};
use opledger_store_sqlite::{SqliteConfig, SqliteStore, Synchronous};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const START: i64 = 1_796_000_000_000_000;

pub async fn run(database_url: &str, args: &BenchArgs) -> anyhow::Result<()> {
    // The benchmark never touches the user's database: it takes the backend
    // and options from the URL and builds its own databases (files beside
    // the current directory, or databases of its own on the same server).
    let report = if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
        let server = PostgresConfig::from_url(database_url).map_err(|error| anyhow::anyhow!(error))?;
        let backend = PostgresBench::new(server);
        let report = run_workload(&backend, args).await;
        backend.drop_databases().await;
        report?
    } else {
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
        match args.workload {
            Workload::Ingest => crate::bench_more::ingest_workload(&template, &dir, args).await?,
            Workload::Status => crate::bench_more::status_workload(&template, &dir, args).await?,
            Workload::Timeline => crate::bench_more::timeline_workload(&template, &dir, args).await?,
            Workload::Append | Workload::Replay | Workload::Lifecycle => {
                run_workload(&SqliteBench { template, dir }, args).await?
            }
        }
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

async fn run_workload<B: BenchBackend>(backend: &B, args: &BenchArgs) -> anyhow::Result<Value> {
    match args.workload {
        Workload::Append => append(backend, args).await,
        Workload::Replay => replay(backend, args).await,
        Workload::Lifecycle => lifecycle(backend, args).await,
        Workload::Ingest | Workload::Status | Workload::Timeline => anyhow::bail!(
            "opledger bench {} runs on SQLite only so far",
            match args.workload {
                Workload::Ingest => "ingest",
                Workload::Status => "status",
                _ => "timeline",
            }
        ),
    }
}

/// What a workload needs of a backend: fresh stores, and the raw floor
/// measured the plainest way that backend's driver allows.
trait BenchBackend: Sync {
    type Store: Store;

    /// `sqlite` or `postgres`.
    fn name(&self) -> &'static str;

    /// The durability setting the figures were measured with, as a key of
    /// the report and its value.
    fn durability(&self) -> (&'static str, &'static str);

    /// A new, empty store named `name` (any earlier one of that name is gone).
    async fn fresh_store(&self, name: &str) -> anyhow::Result<Self::Store>;

    /// Plain prepared single-row INSERTs of `rows`, `batch` per transaction.
    async fn plain_inserts(&self, store: &Self::Store, rows: &[FloorRow], batch: usize) -> anyhow::Result<Duration>;

    /// Multi-row INSERTs (up to 90 rows a statement), `batch` per transaction.
    async fn multi_row_inserts(&self, store: &Self::Store, rows: &[FloorRow], batch: usize)
        -> anyhow::Result<Duration>;

    /// One plain scan of the whole log, decoding every payload.
    async fn plain_scan(&self, store: &Self::Store) -> anyhow::Result<(u64, Duration)>;

    /// How the floor was measured, for the report.
    fn floor_description(&self) -> &'static str;
}

struct SqliteBench {
    template: SqliteConfig,
    dir: PathBuf,
}

impl BenchBackend for SqliteBench {
    type Store = SqliteStore;

    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn durability(&self) -> (&'static str, &'static str) {
        let setting = match self.template.synchronous {
            Synchronous::Full => "full",
            Synchronous::Normal => "normal",
        };
        ("synchronous", setting)
    }

    async fn fresh_store(&self, name: &str) -> anyhow::Result<SqliteStore> {
        let path = self.dir.join(format!("{name}.db"));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        let mut config = SqliteConfig::at(path);
        config.synchronous = self.template.synchronous;
        Ok(SqliteStore::open(config).await?)
    }

    async fn plain_inserts(&self, store: &SqliteStore, rows: &[FloorRow], batch: usize) -> anyhow::Result<Duration> {
        Ok(opledger_store_sqlite::floor::plain_inserts(store, rows, batch).await?)
    }

    async fn multi_row_inserts(
        &self,
        store: &SqliteStore,
        rows: &[FloorRow],
        batch: usize,
    ) -> anyhow::Result<Duration> {
        Ok(opledger_store_sqlite::floor::multi_row_inserts(store, rows, batch).await?)
    }

    async fn plain_scan(&self, store: &SqliteStore) -> anyhow::Result<(u64, Duration)> {
        Ok(opledger_store_sqlite::floor::plain_scan(store).await?)
    }

    fn floor_description(&self) -> &'static str {
        "plain prepared INSERTs into a table with the log's columns and stream index, no triggers, no projections, same transaction sizes, same synchronous setting"
    }
}

/// Each fresh store is a database of its own on the server the URL names
/// (`opledger_bench_<pid>_<name>`), dropped when the run ends.
struct PostgresBench {
    server: PostgresConfig,
    prefix: String,
    created: std::sync::Mutex<Vec<String>>,
}

impl PostgresBench {
    fn new(server: PostgresConfig) -> Self {
        PostgresBench {
            server,
            prefix: format!("opledger_bench_{}", std::process::id()),
            created: std::sync::Mutex::new(Vec::new()),
        }
    }

    async fn drop_databases(&self) {
        let names = std::mem::take(&mut *self.created.lock().expect("bench database list"));
        for name in names {
            if let Err(error) = opledger_store_postgres::floor::drop_database(&self.server, &name).await {
                eprintln!("could not drop benchmark database {name}: {error}");
            }
        }
    }
}

impl BenchBackend for PostgresBench {
    type Store = PostgresStore;

    fn name(&self) -> &'static str {
        "postgres"
    }

    fn durability(&self) -> (&'static str, &'static str) {
        // The server's own setting applies (on by default: every commit is
        // flushed before it is acknowledged); the benchmark does not change it.
        ("synchronous_commit", "server setting")
    }

    async fn fresh_store(&self, name: &str) -> anyhow::Result<PostgresStore> {
        let database = format!("{}_{}", self.prefix, name.replace('-', "_"));
        let config = opledger_store_postgres::floor::create_database(&self.server, &database).await?;
        {
            let mut created = self.created.lock().expect("bench database list");
            if !created.contains(&database) {
                created.push(database);
            }
        }
        let mut config = config;
        // The lifecycle's 16 workers each hold a write connection while
        // they wait for the append lock; the rest are readers.
        config.write_connections = config.write_connections.max(16);
        config.read_connections = config.read_connections.max(16);
        Ok(PostgresStore::open(config).await?)
    }

    async fn plain_inserts(&self, store: &PostgresStore, rows: &[FloorRow], batch: usize) -> anyhow::Result<Duration> {
        Ok(opledger_store_postgres::floor::plain_inserts(store, rows, batch).await?)
    }

    async fn multi_row_inserts(
        &self,
        store: &PostgresStore,
        rows: &[FloorRow],
        batch: usize,
    ) -> anyhow::Result<Duration> {
        Ok(opledger_store_postgres::floor::multi_row_inserts(store, rows, batch).await?)
    }

    async fn plain_scan(&self, store: &PostgresStore) -> anyhow::Result<(u64, Duration)> {
        Ok(opledger_store_postgres::floor::plain_scan(store).await?)
    }

    fn floor_description(&self) -> &'static str {
        "plain prepared INSERTs (one round trip each) into a table with the log's columns and stream index, no triggers, no advisory lock, no projections, same transaction sizes, on the same server"
    }
}

/// A temporary folder on the same file system as the current directory, so
/// the benchmark measures the disk the user's database would live on.
fn tempdir_in_target() -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(".opledger-bench-")
        .tempdir_in(".")
        .context("creating a benchmark folder in the current directory")
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// The events a run appended after `from`, read back from the log as the
/// rows of the append floor.
pub(crate) async fn logged_floor_rows<S: Store>(store: &S, from: i64) -> anyhow::Result<Vec<FloorRow>> {
    let mut rows = Vec::new();
    let mut events = store.read_all(from, 10_000);
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
    Ok(rows)
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

/// One timed pass of our batched path over fresh databases.
async fn ours_batched<B: BenchBackend>(backend: &B, args: &BenchArgs, clients: usize) -> anyhow::Result<Duration> {
    let appends = LifecycleWorkload::new(Timestamp::from_micros(START)).appends(args.events);
    let batches = LifecycleWorkload::batches(appends, args.batch);
    let store = backend.fresh_store("append-batched").await?;
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

async fn ours_unbatched<B: BenchBackend>(backend: &B, args: &BenchArgs) -> anyhow::Result<Duration> {
    let appends = LifecycleWorkload::new(Timestamp::from_micros(START)).appends(args.unbatched_events);
    let singles = LifecycleWorkload::one_event_each(appends);
    let store = backend.fresh_store("append-unbatched").await?;
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

async fn append<B: BenchBackend>(backend: &B, args: &BenchArgs) -> anyhow::Result<Value> {
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
        batched.push(ours_batched(backend, args, 1).await?);
        let floor_store = backend.fresh_store("append-floor").await?;
        floor_batched.push(backend.plain_inserts(&floor_store, &rows, args.batch).await?);
        drop(floor_store);
        let floor_store = backend.fresh_store("append-floor-multi-row").await?;
        floor_multi_row.push(backend.multi_row_inserts(&floor_store, &rows, args.batch).await?);
        drop(floor_store);
        concurrent.push(ours_batched(backend, args, clients).await?);
        unbatched.push(ours_unbatched(backend, args).await?);
        let floor_store = backend.fresh_store("append-floor-unbatched").await?;
        floor_unbatched.push(backend.plain_inserts(&floor_store, &single_rows, 1).await?);
        drop(floor_store);
    }
    let floor_batched = median(floor_batched);
    let floor_multi_row = median(floor_multi_row);
    let batched = median(batched);
    let multi_row_rate = per_second(events, floor_multi_row);
    Ok(json!({
        "workload": "append",
        "backend": backend.name(),
        (backend.durability().0): backend.durability().1,
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
        "floor": format!("{} (one row each); the multi-row floor inserts up to 90 rows per statement", backend.floor_description()),
        "workload_events": "media registrations, each followed by 4 thumbnail operations living created, claimed, started, progress, succeeded",
    }))
}

/// Tasks through request → claim → complete with every projection updated,
/// for each worker count, on a fresh database each. The floor: the same
/// number of events, read back from our log, as plain INSERTs in
/// transactions of 100 (the append floor's shape).
async fn lifecycle<B: BenchBackend>(backend: &B, args: &BenchArgs) -> anyhow::Result<Value> {
    let media_count = (args.tasks / 2).max(1);
    let mut runs = Vec::new();
    for &workers in &args.workers {
        let store = backend.fresh_store(&format!("lifecycle_{workers}")).await?;
        let (engine, _) = Engine::open(store).await?;
        let media = opledger_engine::bench::register_lifecycle_media(&engine, media_count).await?;
        let head_before = engine.store().head().await?;
        let run = opledger_engine::bench::run_task_lifecycle(&engine, &media, workers.max(1), args.claim_batch).await?;
        // The floor inserts the very events this run appended.
        let rows = logged_floor_rows(engine.store(), head_before).await?;
        drop(engine);
        let floor_store = backend.fresh_store("lifecycle_floor").await?;
        let floor_elapsed = backend.plain_inserts(&floor_store, &rows, 100).await?;
        drop(floor_store);
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
            "claim_latency_by_history": run.claim_latency_by_history(5).iter().map(|slice| json!({
                "completed_from": slice.completed_from,
                "completed_to": slice.completed_to,
                "claims": slice.claims,
                "p50_us": slice.p50_us,
                "p99_us": slice.p99_us,
            })).collect::<Vec<_>>(),
        }));
    }
    Ok(json!({
        "workload": "lifecycle",
        "backend": backend.name(),
        (backend.durability().0): backend.durability().1,
        "runs": runs,
        "workload_tasks": "media items each with a metadata and a thumbnail task: request (revision computed), batch claim, complete; the requester runs alongside the workers; every projection (operations, processing states) updated inline, every step an event on the task's timeline",
        "floor": format!("the events the run appended, read back and inserted in transactions of 100: {}", backend.floor_description()),
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

async fn replay<B: BenchBackend>(backend: &B, args: &BenchArgs) -> anyhow::Result<Value> {
    let store = backend.fresh_store("replay").await?;
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
    let (floor_events, floor_elapsed) = backend.plain_scan(engine.store()).await?;
    let rate = per_second(stats.events, stats.elapsed);
    let floor_rate = per_second(floor_events, floor_elapsed);
    Ok(json!({
        "workload": "replay",
        "backend": engine.store().backend(),
        (backend.durability().0): backend.durability().1,
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
