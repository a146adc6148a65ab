//! `opledger review resolve --all`: the open entries a filter matches,
//! resolved one recorded action each (or, with `--dry-run`, listed).

use crate::cli::ResolveArgs;
use crate::output::print_json;
use opledger_domain::review::ReviewAction;
use opledger_engine::{BulkResolution, Engine, ReviewFilter};
use opledger_store::Store;
use serde_json::json;

pub async fn resolve_all<S: Store>(
    engine: &Engine<S>,
    args: &ResolveArgs,
    action: ReviewAction,
    as_json: bool,
) -> anyhow::Result<()> {
    let filter = ReviewFilter {
        kind: args.kind.clone(),
        reason_code: args.reason_code,
        batch: args.batch,
    };
    let limit = args.limit.map(|limit| usize::try_from(limit).unwrap_or(usize::MAX));
    let report = engine
        .resolve_reviews(
            &args.retry.context("cli"),
            &filter,
            action,
            &args.reason,
            args.dry_run,
            limit,
        )
        .await?;
    if as_json {
        print_json(&report_json(&report, action));
    } else {
        print_report(&report, action);
    }
    Ok(())
}

fn report_json(report: &BulkResolution, action: ReviewAction) -> serde_json::Value {
    json!({
        "matched": report.matched,
        "resolved": report.resolved,
        "skipped": report.skipped,
        "dry_run": report.dry_run,
        "action": action.as_str(),
        "remaining": report.remaining(),
        "entries": report
            .entries
            .iter()
            .map(|entry| json!({
                "entry_id": entry.entry_id,
                "operation_id": entry.operation_id,
                "kind": entry.kind,
                "path": entry.path,
                "media_id": entry.media_id,
                "reason_code": entry.reason_code,
                "operation_status": entry.operation_status,
            }))
            .collect::<Vec<_>>(),
    })
}

fn print_report(report: &BulkResolution, action: ReviewAction) {
    if report.dry_run {
        println!(
            "dry run: would {action} {} of {} matching open entries (nothing recorded)",
            report.entries.len(),
            report.matched
        );
        for entry in &report.entries {
            println!(
                "  #{:<8} {:<16} {:<16} operation {}  {}",
                entry.entry_id,
                entry.reason_code,
                entry.kind,
                entry.operation_id,
                entry
                    .path
                    .clone()
                    .or_else(|| entry.media_id.map(|id| format!("media {id}")))
                    .unwrap_or_default()
            );
        }
    } else {
        println!(
            "{action}: {} resolved, {} skipped, of {} matching open entries",
            report.resolved,
            report.skipped.len(),
            report.matched
        );
        for skipped in &report.skipped {
            println!("  skipped #{}: {}", skipped.entry_id, skipped.reason);
        }
    }
    if report.remaining() > 0 {
        println!(
            "{} matching entries left open by --limit; run again for the next ones",
            report.remaining()
        );
    }
}
