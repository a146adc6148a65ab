//! `export`: seconds and peak RSS of exporting `operations` as CSV from a
//! generated log of `--events` events, beside the floor of a plain scan
//! and decode of the same log in the same run.
//!
//! The export runs as it does under a supervisor: in a child process (the
//! running binary's `__run-supervised export`), so its peak RSS is its own,
//! not the generator's: the child's `VmHWM` (`/proc/PID/status`), read
//! every 10 ms while it runs. *Why not `getrusage(RUSAGE_CHILDREN)`:* the
//! child is spawned sharing the generator's memory until it execs, and
//! the kernel keeps the larger of that memory's high-water mark and the
//! child's own as the child's `ru_maxrss`, so a small export reported the
//! generator's size.

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
    let mut child = std::process::Command::new(exe)
        .env("OPLEDGER_DATABASE_URL", &database)
        .arg("__run-supervised")
        .arg("export")
        .arg("--spec")
        .arg(serde_json::to_string(&spec).expect("a spec serializes"))
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(BenchError::io("running the export child"))?;
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0;
    let ended = loop {
        if let Some(kib) = high_water_kib(&status_file) {
            peak_kib = peak_kib.max(kib);
        }
        if let Some(ended) = child
            .try_wait()
            .map_err(BenchError::io("waiting for the export child"))?
        {
            break ended;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let seconds = started.elapsed().as_secs_f64();
    if !ended.success() {
        return Err(BenchError::Invalid(format!("the export child ended with {ended}")));
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
        "peak_rss_mib": round3(peak_kib as f64 / 1024.0),
        "floor_scan_seconds": round3(floor_seconds),
        "floor_scanned_events": scanned,
        "of_floor": round3(floor_seconds / seconds),
    }))
}

/// A running process's peak resident set (`VmHWM`), in KiB; None once it
/// has exited.
fn high_water_kib(status_file: &str) -> Option<u64> {
    let status = std::fs::read_to_string(status_file).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}
