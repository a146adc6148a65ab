//! What commands print: text for people, JSON (`--json`) for programs.

use opledger_domain::{EventEnvelope, MediaId, Timestamp};
use opledger_engine::{
    HeartbeatOutcome, IntegrityCheck, Progress, RecoveryReport, ReplayStats, RequestOutcome, StatusReport, TaskClaim,
    TaskOutcome, TaskTarget, TaskView, VerifyReport,
};
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

/// The most bytes of one stored text (an output, an error, a reason) that
/// `task show` prints in plain output.
const SHOWN_TEXT_BYTES: usize = 300;

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
            "  {} {:<20} {}/{} settled ({} succeeded, {} failed, {} skipped, {} cancelled), {} remaining",
            batch.batch_id,
            batch.name,
            batch.settled,
            batch.total,
            batch.succeeded,
            batch.failed,
            batch.skipped,
            batch.cancelled,
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

fn time_json(at: Option<Timestamp>) -> Value {
    at.map_or(Value::Null, |at| Value::String(at.to_rfc3339()))
}

/// Stored JSON text as an embedded value (text that is not JSON stays text).
fn embedded_json(text: Option<&str>) -> Value {
    text.map_or(Value::Null, |text| {
        serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
    })
}

fn target_text(target: TaskTarget) -> String {
    match target {
        TaskTarget::Media(id) => format!("media {id}"),
        TaskTarget::Region(id) => format!("region {id}"),
    }
}

pub fn requested(outcome: &RequestOutcome, target: TaskTarget, kind: &str, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "requested_revision": outcome.requested_revision,
            "created": outcome.created,
            "status": outcome.status.as_str(),
        }));
        return;
    }
    let what = if outcome.status == opledger_domain::OperationStatus::NotApplicable {
        "not applicable to this item"
    } else if outcome.created {
        "requested"
    } else {
        "already requested (nothing changed)"
    };
    println!(
        "{kind} on {}: {what} at revision {}, operation {}",
        target_text(target),
        outcome.requested_revision,
        outcome.operation_id
    );
}

fn claim_json(claim: &TaskClaim) -> Value {
    json!({
        "claim_token": claim.claim_token,
        "operation_id": claim.operation_id.to_string(),
        "media_id": claim.media_id.map(|id| id.to_string()),
        "region_id": claim.region_id.map(|id| id.to_string()),
        "task_kind": claim.task_kind,
        "revision": claim.revision,
        "inputs": claim.inputs,
        "lease_expires_at": claim.lease_expires_at.to_rfc3339(),
        "attempt": claim.attempt,
        "path": claim.path,
        "media_kind": claim.media_kind,
        "content_digest": claim.content_digest,
    })
}

/// One claim as an object (`{"claim_token": null}` when none), or with
/// `many` every claim under `"claims"`.
pub fn claims(claims: &[TaskClaim], many: bool, as_json: bool) {
    if as_json {
        let value = if many {
            json!({ "claims": claims.iter().map(claim_json).collect::<Vec<_>>() })
        } else {
            claims
                .first()
                .map_or_else(|| json!({ "claim_token": null }), claim_json)
        };
        print_json(&value);
        return;
    }
    if claims.is_empty() {
        println!("nothing to claim");
    }
    for claim in claims {
        let target = match (claim.media_id, claim.region_id) {
            (_, Some(region)) => format!("region {region}"),
            (Some(media), None) => format!("media {media}"),
            (None, None) => "no target".to_string(),
        };
        println!(
            "claimed {} on {target}: token {} until {} (operation {}, revision {}, attempt {})",
            claim.task_kind,
            claim.claim_token,
            claim.lease_expires_at,
            claim.operation_id,
            claim.revision,
            claim.attempt
        );
    }
}

pub fn heartbeat(outcome: &HeartbeatOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "lease_expires_at": outcome.lease_expires_at.to_rfc3339(),
            "cancel_requested": outcome.cancel_requested,
        }));
        return;
    }
    if outcome.cancel_requested {
        println!(
            "lease held until {}; CANCEL REQUESTED: stop, remove temporary outputs, then run `opledger task ack-cancel`",
            outcome.lease_expires_at
        );
    } else {
        println!("lease held until {}", outcome.lease_expires_at);
    }
}

pub fn progress(progress: &Progress, as_json: bool) {
    if as_json {
        print_json(&json!({ "ok": true }));
        return;
    }
    match progress.total {
        Some(total) => println!("progress recorded: {} {}/{total}", progress.phase, progress.processed),
        None => println!("progress recorded: {} {}", progress.phase, progress.processed),
    }
}

pub fn completed(outcome: &TaskOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "status": outcome.status.as_str(),
            "requested_revision": outcome.requested_revision,
            "completed_revision": outcome.completed_revision,
        }));
        return;
    }
    if outcome.completed_revision.as_deref() == Some(outcome.requested_revision.as_str()) {
        println!(
            "task {} is {} at revision {}",
            outcome.operation_id, outcome.status, outcome.requested_revision
        );
    } else {
        println!(
            "task {} is {}: the result was recorded against the claimed revision; revision {} is requested now",
            outcome.operation_id, outcome.status, outcome.requested_revision
        );
    }
}

pub fn failed(outcome: &TaskOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "status": outcome.status.as_str(),
            "attempt_count": outcome.attempt_count,
            "failure_count": outcome.failure_count,
            "available_at": outcome.available_at.to_rfc3339(),
            "last_error": outcome.last_error,
        }));
        return;
    }
    let next = if outcome.status.is_terminal() {
        String::new()
    } else {
        format!(", available again at {}", outcome.available_at)
    };
    println!(
        "task {} is {} after {} attempt(s) and {} failure(s){next}",
        outcome.operation_id, outcome.status, outcome.attempt_count, outcome.failure_count
    );
}

pub fn cancelled(outcome: &TaskOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "status": outcome.status.as_str(),
            "cancel_requested": outcome.cancel_requested,
        }));
        return;
    }
    if outcome.status.is_claimed() {
        println!(
            "cancel requested for task {} ({}): its worker sees it at its next heartbeat",
            outcome.operation_id, outcome.status
        );
    } else {
        println!("task {} is {}", outcome.operation_id, outcome.status);
    }
}

pub fn released(outcome: &TaskOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "status": outcome.status.as_str(),
            "attempt_count": outcome.attempt_count,
        }));
        return;
    }
    println!("task {} is {} (claim given back)", outcome.operation_id, outcome.status);
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

pub fn cancel_acknowledged(outcome: &TaskOutcome, as_json: bool) {
    if as_json {
        print_json(&json!({
            "operation_id": outcome.operation_id.to_string(),
            "status": outcome.status.as_str(),
        }));
        return;
    }
    println!("task {} is {}", outcome.operation_id, outcome.status);
}

pub fn task(view: &TaskView, as_json: bool) {
    let state = &view.state;
    let progress = view.lease.as_ref().and_then(|lease| {
        lease.phase.as_ref().map(|phase| {
            json!({
                "phase": phase,
                "processed": lease.processed,
                "total": lease.total,
                "at": time_json(lease.progressed_at),
            })
        })
    });
    let value = json!({
        "operation_id": state.operation_id.to_string(),
        "task_kind": state.task_kind,
        "media_id": state.media_id().map(|id| id.to_string()),
        "region_id": state.region_id().map(|id| id.to_string()),
        "status": state.status.as_str(),
        "status_reason": state.status_reason,
        "priority": state.priority,
        "requested_revision": state.requested_revision,
        "completed_revision": state.completed_revision,
        "claimed_revision": state.claimed_revision,
        "inputs": embedded_json(Some(&state.inputs)),
        "output": embedded_json(state.output.as_deref()),
        "attempt_count": state.attempt_count,
        "failure_count": state.failure_count,
        "interruption_count": state.interruption_count,
        "available_at": state.available_at.to_rfc3339(),
        "last_error": state.last_error,
        "cancel_requested": state.cancel_requested,
        "claim_token": state.claim_token,
        "worker": state.worker,
        "claimed_at": time_json(state.claimed_at),
        "lease_expires_at": time_json(view.lease_expires_at()),
        "heartbeat_at": time_json(view.heartbeat_at()),
        "progress": progress,
        "updated_at": state.updated_at.to_rfc3339(),
    });
    if as_json {
        print_json(&value);
        return;
    }
    let target = match (state.media_id(), state.region_id()) {
        (_, Some(region)) => format!("region {region}"),
        (Some(media), None) => format!("media {media}"),
        (None, None) => state.target_id.to_string(),
    };
    println!(
        "task {} ({} on {target}): {}",
        state.operation_id, state.task_kind, state.status
    );
    if let Some(reason) = &state.status_reason {
        println!("  reason:     {}", clipped(reason, SHOWN_TEXT_BYTES));
    }
    println!("  requested:  {}", state.requested_revision);
    println!("  completed:  {}", state.completed_revision.as_deref().unwrap_or("-"));
    println!(
        "  attempts:   {} ({} failed, {} interrupted), available at {}",
        state.attempt_count, state.failure_count, state.interruption_count, state.available_at
    );
    if let Some(error) = &state.last_error {
        println!("  last error: {}", clipped(error, SHOWN_TEXT_BYTES));
    }
    if let Some(token) = &state.claim_token {
        println!(
            "  claim:      {token} by {} until {}{}",
            state.worker.as_deref().unwrap_or("?"),
            view.lease_expires_at()
                .map_or_else(|| "-".to_string(), |at| at.to_rfc3339()),
            view.heartbeat_at()
                .map(|at| format!(", last heartbeat {at}"))
                .unwrap_or_default()
        );
    }
    if let Some(progress) = &progress {
        println!(
            "  progress:   {} {}{}",
            progress["phase"].as_str().unwrap_or(""),
            progress["processed"],
            if progress["total"].is_null() {
                String::new()
            } else {
                format!("/{}", progress["total"])
            }
        );
    }
    if state.cancel_requested {
        println!("  cancel requested");
    }
    if let Some(output) = &state.output {
        println!("  output:     {}", clipped(output, SHOWN_TEXT_BYTES));
    }
}

pub fn recovery(report: &RecoveryReport, as_json: bool) {
    if as_json {
        print_json(&json!({
            "interrupted": report.interrupted,
            "requeued": report.requeued,
            "cancelled": report.cancelled,
            "failed": report.failed,
            "skipped": report.skipped,
        }));
        return;
    }
    println!(
        "recovery: {} expired claim(s) interrupted ({} requeued, {} cancelled, {} failed), {} skipped",
        report.interrupted, report.requeued, report.cancelled, report.failed, report.skipped
    );
}
