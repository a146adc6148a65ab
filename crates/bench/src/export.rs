//! `export`: seconds and peak RSS of exporting `operations` as CSV from a
//! generated log of `--events` events, beside the floor of a plain scan
//! and decode of the same log in the same run.
//!
//! The export runs as it does under a supervisor: in a child process (the
//! running binary's `__run-supervised export`), so its peak RSS is its own
//! (`getrusage(RUSAGE_CHILDREN)` after it is reaped), not the generator's.

use crate::queries::built_log;
use crate::stats::round3;
use crate::{BenchError, Options};
use futures::StreamExt;
use opledger_store::Store;
use opledger_store_sqlite::SqliteConfig;
use opledger_supervise::export::{ExportSpec, Format, What};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

pub async fn export(template: &SqliteConfig, dir: &Path, options: &Options) -> Result<Value, BenchError> {
    let (engine, built) = built_log(template, dir, "export", options.events).await?;
    let database = dir.join(format!("export-{}.db", options.events));
    let head = engine.store().head().await?;

    // The floor: every event read and decoded, nothing else.
    let started = Instant::now();
    let mut scanned = 0u64;
    let mut events = engine.store().read_all(0, 2_000);
    while let Some(event) = events.next().await {
        event?;
        scanned += 1;
    }
    let floor_seconds = started.elapsed().as_secs_f64();
    drop(events);

    let spec = ExportSpec {
        what: What::Operations,
        format: Format::Csv,
        batch: None,
        as_of_seq: head,
        principal: "bench".to_string(),
        policy: "bench".to_string(),
    };
    let out = dir.join("export.csv");
    let _ = std::fs::remove_file(&out);
    let exe = std::env::current_exe().map_err(BenchError::io("finding the opledger binary"))?;
    let started = Instant::now();
    let child = std::process::Command::new(exe)
        .env("OPLEDGER_DATABASE_URL", &database)
        .arg("__run-supervised")
        .arg("export")
        .arg("--spec")
        .arg(serde_json::to_string(&spec).expect("a spec serializes"))
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(BenchError::io("running the export child"))?;
    let seconds = started.elapsed().as_secs_f64();
    if !child.success() {
        return Err(BenchError::Invalid(format!("the export child ended with {child}")));
    }
    let rows = std::fs::read_to_string(&out)
        .map_err(BenchError::io(format!("reading {}", out.display())))?
        .lines()
        .count()
        .saturating_sub(1);
    let bytes = std::fs::metadata(&out).map(|metadata| metadata.len()).unwrap_or(0);
    Ok(json!({
        "workload": "export",
        "backend": engine.store().backend(),
        "events": built,
        "what": "operations",
        "format": "csv",
        "rows": rows,
        "bytes": bytes,
        "seconds": round3(seconds),
        "peak_rss_mib": round3(children_peak_rss_kib() as f64 / 1024.0),
        "floor_scan_seconds": round3(floor_seconds),
        "floor_scanned_events": scanned,
        "of_floor": round3(floor_seconds / seconds),
    }))
}

/// The largest resident set of any child reaped so far, in KiB.
fn children_peak_rss_kib() -> i64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the buffer it is given.
    let done = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) };
    if done != 0 {
        return 0;
    }
    // SAFETY: getrusage returned 0, so it filled the struct.
    unsafe { usage.assume_init() }.ru_maxrss
}
