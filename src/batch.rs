//! `opledger batch`, `opledger review` and `opledger capabilities`: thin
//! glue from the command line to the engine, and what they print.

use crate::cli::{BatchCommand, BatchCreateArgs, ReviewActionArg, ReviewCommand};
use crate::query::{next_line, page_request};
use crate::UsageError;
use opledger_domain::projections::{BatchItemRow, BatchRow, CapabilityRow, ReviewRow};
use opledger_domain::review::ReviewAction;
use opledger_domain::MediaId;
use opledger_engine::{BatchCancelCounts, BatchPage, BatchRequest, BatchSummary, BatchView, Engine, Listing};
use opledger_store::Store;
use serde_json::{json, Value};
use std::collections::BTreeMap;

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values always serialize")
    );
}

pub async fn batch<S: Store>(engine: &Engine<S>, command: &BatchCommand, as_json: bool) -> anyhow::Result<()> {
    match command {
        BatchCommand::Create(args) => {
            let request = batch_request(args)?;
            let view = engine.create_batch(&args.retry.context("cli"), request).await?;
            show(&view, as_json);
        }
        BatchCommand::Show { batch_id, page } => {
            let page = engine
                .batch_page(*batch_id, &page_request(page, Listing::BatchItems)?)
                .await?;
            show_page(&page, as_json);
        }
        BatchCommand::List { active, page } => {
            let page = engine
                .batch_list(*active, &page_request(page, Listing::Batches)?)
                .await?;
            if as_json {
                print_json(&json!({
                    "items": page.items.iter().map(batch_json).collect::<Vec<_>>(),
                    "next": page.next,
                }));
            } else {
                if page.items.is_empty() {
                    println!("no batches on this page");
                }
                for batch in &page.items {
                    println!("{}", progress_line(batch));
                }
                next_line(&page.next);
            }
        }
        BatchCommand::Cancel {
            batch_id,
            reason,
            verbose,
            retry,
        } => {
            let (view, counts) = engine
                .cancel_batch_counted(&retry.context("cli"), *batch_id, reason)
                .await?;
            show_cancel(&view, &counts, *verbose, as_json);
        }
        BatchCommand::Resume {
            batch_id,
            reason,
            retry,
        } => show(
            &engine.resume_batch(&retry.context("cli"), *batch_id, reason).await?,
            as_json,
        ),
    }
    Ok(())
}

fn batch_request(args: &BatchCreateArgs) -> anyhow::Result<BatchRequest> {
    let mut inputs = BTreeMap::new();
    for given in &args.inputs {
        let Some((kind, text)) = given.split_once('=') else {
            return Err(UsageError(format!("--inputs {} must be KIND=JSON", opledger_domain::quoted(given))).into());
        };
        let value: Value = serde_json::from_str(text).map_err(|error| {
            UsageError(format!(
                "--inputs for {} is not JSON ({error}): {}",
                opledger_domain::quote(kind),
                opledger_domain::quoted(text)
            ))
        })?;
        inputs.insert(kind.trim().to_string(), value);
    }
    Ok(BatchRequest {
        name: args.name.clone(),
        media: args.media.clone(),
        kinds: args.kind.clone(),
        inputs,
        priority: args.priority,
    })
}

fn batch_json(batch: &BatchRow) -> Value {
    let summary = BatchSummary::of(batch);
    json!({
        "batch_id": summary.batch_id,
        "name": summary.name,
        "batch_kind": batch.batch_kind,
        "status": summary.status,
        "active": opledger_domain::batches::is_active(&batch.progress),
        "cancel_requested": batch.cancel_requested,
        "total": summary.total,
        "settled": summary.settled,
        "succeeded": summary.succeeded,
        "failed": summary.failed,
        "skipped": summary.skipped,
        "cancelled": summary.cancelled,
        "blocked": summary.blocked,
        "remaining": summary.remaining,
        "resumes": batch.resumes,
        "created_at": batch.created_at,
        "updated_at": batch.updated_at,
    })
}

fn item_json(item: &BatchItemRow) -> Value {
    json!({
        "operation_id": item.operation_id,
        "label": item.label,
        "outcome": item.outcome.map(|outcome| outcome.as_str()),
        "last_status": item.last_status,
        "reason": item.reason,
        "runs": item.runs,
        "settled_at": item.settled_at,
        "history": serde_json::from_str::<Value>(&item.history).unwrap_or(Value::Null),
    })
}

fn progress_line(batch: &BatchRow) -> String {
    let progress = &batch.progress;
    format!(
        "{}  {:<24} {:<24} {}/{} settled: {} succeeded, {} failed, {} skipped, {} cancelled, {} blocked, {} remaining",
        batch.batch_id,
        batch.name,
        batch.status,
        progress.settled,
        progress.total,
        progress.succeeded,
        progress.failed,
        progress.skipped,
        progress.cancelled,
        progress.blocked,
        progress.remaining()
    )
}

fn show(view: &BatchView, as_json: bool) {
    if as_json {
        let mut value = batch_json(&view.batch);
        value["items"] = Value::Array(view.items.iter().map(item_json).collect());
        print_json(&value);
        return;
    }
    println!("{}", progress_line(&view.batch));
    show_items(view);
}

/// A cancelled batch: its progress and what the cancel did, in counts (a
/// batch may hold a million items); its items only when asked for.
fn show_cancel(view: &BatchView, counts: &BatchCancelCounts, verbose: bool, as_json: bool) {
    if as_json {
        let mut value = batch_json(&view.batch);
        value["cancel"] = json!(counts);
        if verbose {
            value["items"] = Value::Array(view.items.iter().map(item_json).collect());
        }
        print_json(&value);
        return;
    }
    println!("{}", progress_line(&view.batch));
    println!(
        "cancel: {} of {} items cancelled now, {} running asked to stop{}, {} already settled{}",
        counts.cancelled,
        counts.items,
        counts.asked_to_stop,
        if counts.already_stopping > 0 {
            format!(" ({} asked before)", counts.already_stopping)
        } else {
            String::new()
        },
        counts.already_settled,
        if counts.not_cancellable > 0 {
            format!(
                ", {} interrupted or retrying (not cancellable now)",
                counts.not_cancellable
            )
        } else {
            String::new()
        },
    );
    if verbose {
        show_items(view);
    }
}

fn show_items(view: &BatchView) {
    for item in &view.items {
        println!(
            "  {:<5} {:<60} {:<10} runs {}  {}",
            item.position,
            item.label,
            item.outcome.map_or("-", |outcome| outcome.as_str()),
            item.runs,
            item.reason.as_deref().unwrap_or("")
        );
    }
}

/// A batch and one page of its items: each item's operation and path.
fn show_page(page: &BatchPage, as_json: bool) {
    if as_json {
        let mut value = batch_json(&page.batch);
        value["items"] = Value::Array(
            page.items
                .items
                .iter()
                .map(|view| {
                    let mut item = item_json(&view.item);
                    item["path"] = json!(view.path);
                    item
                })
                .collect(),
        );
        value["next"] = json!(page.items.next);
        print_json(&value);
        return;
    }
    println!("{}", progress_line(&page.batch));
    for view in &page.items.items {
        let item = &view.item;
        println!(
            "  {:<5} {}  {:<10} runs {}  {}  {}",
            item.position,
            item.operation_id,
            item.outcome.map_or("-", |outcome| outcome.as_str()),
            item.runs,
            view.path.as_deref().unwrap_or(&item.label),
            item.reason.as_deref().unwrap_or("")
        );
    }
    next_line(&page.items.next);
}

fn review_json(entry: &ReviewRow) -> Value {
    json!({
        "entry_id": entry.entry_id,
        "operation_id": entry.operation_id,
        "kind": entry.kind,
        "media_id": entry.media_id,
        "path": entry.path,
        "reason_code": entry.reason_code,
        "operation_status": entry.operation_status,
        "detail": entry.detail,
        "state": entry.state,
        "resolution": entry.resolution,
        "resolution_reason": entry.resolution_reason,
        "resolved_by": entry.resolved_by,
        "opened_at": entry.opened_at,
        "resolved_at": entry.resolved_at,
    })
}

pub async fn review<S: Store>(engine: &Engine<S>, command: &ReviewCommand, as_json: bool) -> anyhow::Result<()> {
    match command {
        ReviewCommand::List(page) => {
            let page = engine.review_page(&page_request(page, Listing::Review)?).await?;
            if as_json {
                let items: Vec<Value> = page
                    .items
                    .iter()
                    .map(|view| {
                        let mut entry = review_json(&view.entry);
                        entry["path"] = json!(view.path);
                        entry
                    })
                    .collect();
                print_json(&json!({ "items": items, "next": page.next }));
            } else {
                if page.items.is_empty() && page.next.is_none() {
                    println!("the review queue is empty");
                }
                for view in &page.items {
                    let entry = &view.entry;
                    println!(
                        "#{:<8} {:<16} {:<16} {}  {}  {}",
                        entry.entry_id,
                        entry.reason_code,
                        entry.kind,
                        entry.operation_id,
                        view.path
                            .clone()
                            .or_else(|| entry.media_id.map(|id| format!("media {id}")))
                            .unwrap_or_default(),
                        entry.detail.as_deref().unwrap_or("")
                    );
                }
                next_line(&page.next);
            }
        }
        ReviewCommand::Resolve(args) => {
            let action = match args.action {
                ReviewActionArg::Retry => ReviewAction::Retry,
                ReviewActionArg::Dismiss => ReviewAction::Dismiss,
                ReviewActionArg::Acknowledge => ReviewAction::Acknowledge,
            };
            let Some(entry_id) = args.entry_id else {
                return crate::review_bulk::resolve_all(engine, args, action, as_json).await;
            };
            let entry = engine
                .resolve_review(
                    &args.retry.context("cli"),
                    entry_id,
                    action,
                    args.revision.clone(),
                    &args.reason,
                )
                .await?;
            if as_json {
                print_json(&review_json(&entry));
            } else {
                println!("entry #{} is {} ({})", entry.entry_id, entry.state, action);
            }
        }
    }
    Ok(())
}

fn capability_json(row: &CapabilityRow) -> Value {
    json!({
        "capability": row.capability,
        "task_kind": row.task_kind,
        "status": row.status,
        "required": row.required,
        "operation_id": row.operation_id,
        "requested_version": row.requested_version,
        "produced_version": row.produced_version,
        "current_version": row.current_version,
        "produced_revision": row.produced_revision,
        "reason": row.reason,
        "updated_at": row.updated_at,
    })
}

pub async fn capabilities<S: Store>(engine: &Engine<S>, media_id: MediaId, as_json: bool) -> anyhow::Result<()> {
    let rows = engine.capabilities(media_id).await?;
    if as_json {
        print_json(&json!({
            "media_id": media_id,
            "capabilities": rows.iter().map(capability_json).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    if rows.is_empty() {
        println!("media {media_id}: no capability requested yet");
    }
    for row in &rows {
        println!(
            "{:<16} {:<18} version {}  {}",
            row.capability,
            row.status,
            row.produced_version.as_deref().unwrap_or("-"),
            row.reason.as_deref().unwrap_or("")
        );
    }
    Ok(())
}
