//! `append` and `replay`: the generated log written through the engine
//! (batched, from concurrent clients, one event per transaction) and
//! rebuilt from the log, each beside its floor.

use crate::backend::BenchBackend;
use crate::events::GeneratedEvents;
use crate::floor::floor_rows;
use crate::stats::{median, peak_rss, per_second, reset_peak_rss, round3};
use crate::{BenchError, Options, START};
use opledger_domain::Timestamp;
use opledger_engine::Engine;
use opledger_store::Store;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Concurrent clients of the `batched_concurrent` figure.
const CLIENTS: usize = 4;

/// One timed pass of our batched path over a fresh database.
async fn ours_batched<B: BenchBackend>(backend: &B, options: &Options, clients: usize) -> Result<Duration, BenchError> {
    let appends = GeneratedEvents::new(Timestamp::from_micros(START)).appends(options.events);
    let batches = GeneratedEvents::batches(appends, options.batch);
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
        task.await.map_err(BenchError::task("append client"))??;
    }
    Ok(started.elapsed())
}

async fn ours_unbatched<B: BenchBackend>(backend: &B, options: &Options) -> Result<Duration, BenchError> {
    let appends = GeneratedEvents::new(Timestamp::from_micros(START)).appends(options.unbatched_events);
    let singles = GeneratedEvents::one_event_each(appends);
    let store = backend.fresh_store("append-unbatched").await?;
    let (engine, _) = Engine::open(store).await?;
    let started = Instant::now();
    for single in singles {
        engine.append(vec![single]).await?;
    }
    Ok(started.elapsed())
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

/// Reads `events`, `batch`, `unbatched_events` and `rounds`.
pub async fn append<B: BenchBackend>(backend: &B, options: &Options) -> Result<Value, BenchError> {
    let start = Timestamp::from_micros(START);
    let appends = GeneratedEvents::new(start).appends(options.events);
    let events: u64 = appends.iter().map(|append| append.events.len() as u64).sum();
    let rows = floor_rows(&appends);
    let single_appends = GeneratedEvents::new(start).appends(options.unbatched_events);
    let single_rows = floor_rows(&single_appends);
    let single_events = single_rows.len() as u64;

    // Our path and the floor alternate, round after round, and each figure
    // is the median of its rounds: the disk's fsync latency drifts over
    // minutes on shared machines, and alternating keeps both sides on the
    // same disk weather.
    let rounds = options.rounds.max(1);
    let (mut batched, mut floor_batched, mut concurrent) = (Vec::new(), Vec::new(), Vec::new());
    let mut floor_multi_row = Vec::new();
    let (mut unbatched, mut floor_unbatched) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        batched.push(ours_batched(backend, options, 1).await?);
        let floor_store = backend.fresh_store("append-floor").await?;
        floor_batched.push(backend.plain_inserts(&floor_store, &rows, options.batch).await?);
        drop(floor_store);
        let floor_store = backend.fresh_store("append-floor-multi-row").await?;
        floor_multi_row.push(backend.multi_row_inserts(&floor_store, &rows, options.batch).await?);
        drop(floor_store);
        concurrent.push(ours_batched(backend, options, CLIENTS).await?);
        unbatched.push(ours_unbatched(backend, options).await?);
        let floor_store = backend.fresh_store("append-floor-unbatched").await?;
        floor_unbatched.push(backend.plain_inserts(&floor_store, &single_rows, 1).await?);
        drop(floor_store);
    }
    let floor_batched = median(&mut floor_batched);
    let batched = median(&mut batched);
    let multi_row_rate = per_second(events, median(&mut floor_multi_row));
    let (durability, setting) = backend.durability();
    Ok(json!({
        "workload": "append",
        "backend": backend.name(),
        (durability): setting,
        "rounds": rounds,
        "batched": figure(
            events,
            options.batch,
            batched,
            floor_batched,
            json!({
                "floor_multi_row_events_per_sec": multi_row_rate.round(),
                "ratio_to_multi_row_floor": round3(per_second(events, batched) / multi_row_rate),
            })
        ),
        "batched_concurrent": figure(
            events,
            options.batch,
            median(&mut concurrent),
            floor_batched,
            json!({"clients": CLIENTS})
        ),
        "unbatched": figure(single_events, 1, median(&mut unbatched), median(&mut floor_unbatched), json!({})),
        "floor": format!("{} (one row each); the multi-row floor inserts up to 90 rows per statement", backend.floor_description()),
        "workload_events": "media registrations, each followed by 4 thumbnail operations living created, claimed, started, progress, succeeded",
    }))
}

/// Reads `events`.
pub async fn replay<B: BenchBackend>(backend: &B, options: &Options) -> Result<Value, BenchError> {
    let store = backend.fresh_store("replay").await?;
    let (engine, _) = Engine::open(store).await?;
    let mut generated = GeneratedEvents::new(Timestamp::from_micros(START));
    let build_started = Instant::now();
    let mut built = 0u64;
    while built < options.events {
        let appends = generated.appends((options.events - built).min(100_000));
        built += appends.iter().map(|append| append.events.len() as u64).sum::<u64>();
        for batch in GeneratedEvents::batches(appends, 1000) {
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
    let (durability, setting) = backend.durability();
    Ok(json!({
        "workload": "replay",
        "backend": engine.store().backend(),
        (durability): setting,
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
