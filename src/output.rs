//! What commands print: text for people, JSON (`--json`) for programs.

use opledger_domain::{EventEnvelope, MediaId};
use opledger_engine::{IntegrityCheck, ReplayStats, StatusReport, VerifyReport};
use serde_json::{json, Value};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write to standard output failed (its reader went away, as
/// `head` does once it has its lines): from then on nothing more is
/// written, and `main` ends the command quietly with exit 141.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes to standard output, never panicking: a failed write is recorded
/// (see [`flush`]) instead. Every `print!`/`println!` of this crate comes
/// here (the macros in `main.rs`).
pub(crate) fn write_stdout(text: std::fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    if std::io::stdout().lock().write_fmt(text).is_err() {
        CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Flushes standard output; false when anything written so far did not
/// reach it.
pub(crate) fn flush() -> bool {
    if !CLOSED.load(Ordering::Relaxed) && std::io::stdout().lock().flush().is_err() {
        CLOSED.store(true, Ordering::Relaxed);
    }
    !CLOSED.load(Ordering::Relaxed)
}

/// At most `bound` bytes of a stored text for plain output (cut at a
/// character boundary), saying how much was left out; `--json` shows all.
pub(crate) fn clipped(text: &str, bound: usize) -> String {
    if text.len() <= bound {
        return text.to_string();
    }
    let mut end = bound;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… ({} bytes in all; --json shows everything)",
        &text[..end],
        text.len()
    )
}

pub(crate) fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values always serialize")
    );
}

/// The status summary as `status --json` prints it.
/// The same object the HTTP API's `/api/v1/status` answers.
pub fn status_value(report: &StatusReport) -> Value {
    serde_json::to_value(report).unwrap_or(Value::Null)
}

pub fn status(report: &StatusReport, as_json: bool) {
    if as_json {
        print_json(&status_value(report));
        return;
    }
    println!("opledger ({}), log head at seq {}", report.backend, report.head);
    println!("media: {} items, {} regions", report.media, report.regions);
    println!("operations: {}", report.operations);
    for (status, count) in report.operations_by_status.iter().filter(|(_, count)| *count > 0) {
        println!("  {status:<18} {count}");
    }
    let capabilities: i64 = report.capabilities_by_status.iter().map(|(_, count)| count).sum();
    println!("capabilities: {capabilities}");
    for (status, count) in report.capabilities_by_status.iter().filter(|(_, count)| *count > 0) {
        println!("  {status:<18} {count}");
    }
    if !report.stale_by_kind.is_empty() {
        println!("stale results by kind (opledger reprocess --stale):");
        for (kind, count) in &report.stale_by_kind {
            println!("  {kind:<18} {count}");
        }
    }
    println!("active batches: {}", report.active_batches.len());
    for batch in &report.active_batches {
        println!(
            "  {} {:<20} {}/{} settled ({} succeeded, {} failed, {} skipped, {} cancelled, {} blocked), {} remaining",
            batch.batch_id,
            batch.name,
            batch.settled,
            batch.total,
            batch.succeeded,
            batch.failed,
            batch.skipped,
            batch.cancelled,
            batch.blocked,
            batch.remaining
        );
    }
    println!("review queue: {} open", report.review_queue);
    if !report.blocked_by_reason.is_empty() {
        // One line per reason: a tool that is not installed blocks every
        // file's task alike, and is said once.
        println!("blocked, by reason:");
        for blocked in &report.blocked_by_reason {
            let reason = if blocked.reason.is_empty() {
                "(no reason given)"
            } else {
                blocked.reason.as_str()
            };
            let count = if blocked.counted_all {
                blocked.count.to_string()
            } else {
                format!("{}+", blocked.count)
            };
            println!("  {reason}: {count} ({})", blocked.kinds.join(", "));
            if let Some(remedy) = remedy(reason) {
                println!("    {remedy}");
            }
        }
    }
    println!("{}", integrity_line(report.integrity.as_ref()));
    println!("projections:");
    for projection in &report.projections {
        println!(
            "  {:<18} v{}  at seq {}  lag {}",
            projection.name, projection.version, projection.position, projection.lag
        );
    }
}

/// When the log's integrity was last checked, and what was found.
/// What clears a block whose reason the ingest itself gives: the next
/// ingest retries such tasks once it has what they lacked.
fn remedy(reason: &str) -> Option<&'static str> {
    match reason {
        opledger_media::NO_FFMPEG => {
            Some("install ffmpeg (Debian: apt-get install ffmpeg) and run the ingest again: it retries them")
        }
        opledger_media::NO_HEIF_SUPPORT => {
            Some("ingest again with a build that decodes HEIF (cargo build --release --features heif): it retries them")
        }
        _ => None,
    }
}

fn integrity_line(check: Option<&IntegrityCheck>) -> String {
    let Some(check) = check else {
        return "log integrity: never checked (opledger replay --verify)".to_string();
    };
    let when = check.verified_at.to_rfc3339();
    if check.intact {
        let hash = check.head_hash.as_deref().map_or(String::new(), |hash| {
            format!(", chain hash {}…", &hash[..hash.len().min(12)])
        });
        return format!(
            "log integrity: intact up to seq {}, checked {when}{hash}",
            check.position
        );
    }
    let mut found = Vec::new();
    if let Some(seq) = check.broken_at {
        found.push(format!("the chain broken at seq {seq}"));
    }
    if check.differing_tables > 0 {
        found.push(format!(
            "{} projection tables differing from the log",
            check.differing_tables
        ));
    }
    format!("log integrity: the check of {when} found {}", found.join(" and "))
}

pub fn envelope_json(event: &EventEnvelope) -> Value {
    let payload: Value = serde_json::from_str(&event.event.payload_json()).expect("payloads are JSON");
    json!({
        "seq": event.seq,
        "stream_id": event.stream_id,
        "stream_version": event.stream_version,
        "event_type": event.event_type(),
        "schema_version": event.schema_version,
        "recorded_at": event.recorded_at,
        "actor": event.actor,
        "correlation_id": event.correlation_id,
        "causation_id": event.causation_id,
        "payload": payload,
    })
}

/// Every field of every event: seq, UTC time, type, actor, causation,
/// correlation, and the payload whole (`--verbose`).
pub fn timeline_verbose(events: &[EventEnvelope]) {
    for event in events {
        let mut payload: Value = serde_json::from_str(&event.event.payload_json()).expect("payloads are JSON");
        if let Value::Object(fields) = &mut payload {
            // The stream already names the operation.
            fields.remove("operation_id");
        }
        println!(
            "#{:<6} {}  {:<28} by {:<12} cause {}  correlation {}",
            event.seq,
            event.recorded_at,
            event.event_type(),
            event.actor,
            event.causation_id.as_deref().unwrap_or("-"),
            event.correlation_id
        );
        if payload.as_object().is_some_and(|fields| !fields.is_empty()) {
            println!("         {payload}");
        }
    }
}

pub fn replay(stats: &ReplayStats, as_json: bool) {
    if as_json {
        print_json(&json!({
            "events": stats.events,
            "position": stats.position,
            "seconds": stats.elapsed.as_secs_f64(),
        }));
    } else {
        println!(
            "replayed {} events up to seq {} in {:.2}s (into scratch tables; the live ones are untouched)",
            stats.events,
            stats.position,
            stats.elapsed.as_secs_f64()
        );
    }
}

pub fn verify(report: &VerifyReport, as_json: bool) {
    if as_json {
        let differences: Vec<Value> = report
            .diffs
            .iter()
            .map(|diff| {
                let columns: Vec<&str> = diff.table.column_names().collect();
                let rows: Vec<Value> = diff
                    .rows
                    .iter()
                    .map(|row| {
                        let render = |cells: &Option<Vec<opledger_domain::projections::Cell>>| {
                            cells.as_ref().map(|cells| {
                                columns
                                    .iter()
                                    .zip(cells)
                                    .map(|(column, cell)| (column.to_string(), cell.to_json()))
                                    .collect::<serde_json::Map<_, _>>()
                            })
                        };
                        json!({"key": row.key, "live": render(&row.live), "replayed": render(&row.replayed)})
                    })
                    .collect();
                json!({
                    "table": diff.table.name,
                    "live_rows": diff.live_rows,
                    "replayed_rows": diff.replayed_rows,
                    "rows": rows,
                })
            })
            .collect();
        let chain = match &report.chain {
            Ok(point) => json!({"intact": true, "head_hash": point.hash.to_hex()}),
            Err(broken) => json!({"intact": false, "broken_at": broken.seq, "reason": broken.to_string()}),
        };
        print_json(&json!({
            "identical": report.is_identical(),
            "position": report.position,
            "events": report.events,
            "chain": chain,
            "differences": differences,
        }));
        return;
    }
    if report.is_identical() {
        println!(
            "replay matches the live projections at seq {} ({} events folded); the log's chain is intact",
            report.position, report.events
        );
    } else {
        if report.diffs.is_empty() {
            println!(
                "the log FAILS its integrity check (checked up to seq {}):",
                report.position
            );
        } else {
            println!("replay DIFFERS from the live projections at seq {}:", report.position);
        }
        print!("{}", report.render());
    }
}

pub fn media_added(media_id: MediaId, as_json: bool) {
    if as_json {
        print_json(&json!({ "media_id": media_id }));
    } else {
        println!("{media_id}");
    }
}

/// `replay --rebuild`: (projection, version, events folded) per projection.
pub fn rebuilt(rebuilt: &[(String, u32, u64)], as_json: bool) {
    if as_json {
        let projections: Vec<Value> = rebuilt
            .iter()
            .map(|(name, version, events)| json!({"name": name, "version": version, "events": events}))
            .collect();
        print_json(&json!({ "rebuilt": projections }));
        return;
    }
    println!(
        "rebuilt {} projections from the log, each through shadow tables swapped in:",
        rebuilt.len()
    );
    for (name, version, events) in rebuilt {
        println!("  {name:<26} v{version}  {events} events folded");
    }
}
