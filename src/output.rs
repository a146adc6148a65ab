//! What commands print: text for people, JSON (`--json`) for programs.

use opledger_domain::{EventEnvelope, MediaId};
use opledger_engine::{ReplayStats, StatusReport, VerifyReport};
use serde_json::{json, Value};

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values always serialize")
    );
}

pub fn status(report: &StatusReport, as_json: bool) {
    if as_json {
        let by_status: serde_json::Map<String, Value> = report
            .operations_by_status
            .iter()
            .map(|(status, count)| (status.clone(), json!(count)))
            .collect();
        print_json(&json!({
            "backend": report.backend,
            "head": report.head,
            "media": report.media,
            "regions": report.regions,
            "operations": report.operations,
            "operations_by_status": by_status,
            "projections": report.projections,
        }));
        return;
    }
    println!("opledger ({}), log head at seq {}", report.backend, report.head);
    println!("media: {} items, {} regions", report.media, report.regions);
    println!("operations: {}", report.operations);
    for (status, count) in report.operations_by_status.iter().filter(|(_, count)| *count > 0) {
        println!("  {status:<18} {count}");
    }
    println!("projections:");
    for projection in &report.projections {
        println!(
            "  {:<18} v{}  at seq {}  lag {}",
            projection.name, projection.version, projection.position, projection.lag
        );
    }
}

fn envelope_json(event: &EventEnvelope) -> Value {
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

pub fn timeline(events: &[EventEnvelope], as_json: bool) {
    if as_json {
        print_json(&Value::Array(events.iter().map(envelope_json).collect()));
        return;
    }
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
        print_json(&json!({
            "identical": report.is_identical(),
            "position": report.position,
            "events": report.events,
            "differences": differences,
        }));
        return;
    }
    if report.is_identical() {
        println!(
            "replay matches the live projections at seq {} ({} events folded)",
            report.position, report.events
        );
    } else {
        println!("replay DIFFERS from the live projections at seq {}:", report.position);
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
