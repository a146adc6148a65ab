//! `status` and `timeline`: the latency of the dashboard summary (with the
//! query layer's listings beside it, `listings.rs`) and of one operation's
//! timeline in a large generated log, each beside a plain read of the same
//! tables.

use crate::backend::store_at;
use crate::events::GeneratedEvents;
use crate::stats::{millis, quantile, round3};
use crate::{BenchError, Options, START};
use opledger_domain::projections::{Row, OPERATIONS_TABLE};
use opledger_domain::Timestamp;
use opledger_engine::Engine;
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

/// Builds a log of `--events` events (media items with operations through
/// their whole lifecycle) and returns the engine over it.
pub(crate) async fn built_log(
    template: &SqliteConfig,
    dir: &Path,
    workload: &str,
    events: u64,
) -> Result<(Engine<SqliteStore>, u64), BenchError> {
    let path = dir.join(format!("{workload}-{events}.db"));
    if path.exists() {
        std::fs::remove_file(&path).map_err(BenchError::io(format!("removing {}", path.display())))?;
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
    let store = store_at(template, path).await?;
    let (engine, _) = Engine::open(store).await?;
    // Media tasks: capability states and review entries exist, so the
    // summary's every part has rows to count.
    let mut generated = GeneratedEvents::with_media_tasks(Timestamp::from_micros(START));
    let mut built = 0u64;
    while built < events {
        let appends = generated.appends((events - built).min(100_000));
        built += appends.iter().map(|append| append.events.len() as u64).sum::<u64>();
        for batch in GeneratedEvents::batches(appends, 1000) {
            engine.append(batch).await?;
        }
    }
    Ok((engine, built))
}

/// p50/p99 of the dashboard summary (`status`: operations and capabilities
/// by status, active batches, review queue, projection lag). Floor: one
/// plain grouped count of the operations table.
pub async fn status(template: &SqliteConfig, dir: &Path, options: &Options) -> Result<Value, BenchError> {
    let (engine, built) = built_log(template, dir, "status", options.events).await?;
    let operations = engine.store().count_rows(&OPERATIONS_TABLE).await?;
    let samples = options.samples.max(10);
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
    ours.sort_unstable();
    floor.sort_unstable();
    let p99 = millis(quantile(&ours, 0.99));
    let floor_p99 = millis(quantile(&floor, 0.99));
    let listings = crate::listings::listings(&engine, samples).await?;
    Ok(json!({
        "workload": "status",
        "backend": engine.store().backend(),
        "events": built,
        "operations": operations,
        "samples": samples,
        "p50_ms": round3(millis(quantile(&ours, 0.5))),
        "p99_ms": round3(p99),
        "floor_p50_ms": round3(millis(quantile(&floor, 0.5))),
        "floor_p99_ms": round3(floor_p99),
        "ratio_to_floor_p99": round3(p99 / floor_p99),
        "floor": "one plain GROUP BY status count of media_operations through the read pool",
        "listings": listings,
    }))
}

/// p50/p99 of one operation's timeline (its events in order, decoded) for
/// operations spread over the whole log. Floor: the same stream read as
/// rows without decoding into typed events is not exposed by the store, so
/// the floor is the operation's projected row by primary key.
pub async fn timeline(template: &SqliteConfig, dir: &Path, options: &Options) -> Result<Value, BenchError> {
    let (engine, built) = built_log(template, dir, "timeline", options.events).await?;
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
    if operations.is_empty() {
        return Err(BenchError::Invalid("the built log has no operations".into()));
    }
    let samples = options.samples.max(10);
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
    ours.sort_unstable();
    floor.sort_unstable();
    let p99 = millis(quantile(&ours, 0.99));
    Ok(json!({
        "workload": "timeline",
        "backend": engine.store().backend(),
        "events": built,
        "operations_sampled_from": operations.len(),
        "samples": samples,
        "events_per_timeline": round3(events as f64 / samples as f64),
        "p50_ms": round3(millis(quantile(&ours, 0.5))),
        "p99_ms": round3(p99),
        "floor_p50_ms": round3(millis(quantile(&floor, 0.5))),
        "floor_p99_ms": round3(millis(quantile(&floor, 0.99))),
        "floor": "the operation's projected row by primary key through the read pool",
    }))
}
