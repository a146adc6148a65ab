//! `opledger media show|list` and `opledger ops list`: the query layer's
//! answers, printed. Flags are parsed here so a refusal names its flag and
//! quotes at most a little of what was given.

use crate::cli::{MediaListArgs, MediaShowArgs, OpsListArgs, PageArgs};
use crate::UsageError;
use opledger_domain::{BatchId, CapabilityStatus, MediaId, OperationStatus, Timestamp};
use opledger_engine::{
    decode_cursor, Engine, Listing, MediaDetail, MediaFilter, MediaItem, MediaRef, OperationItem, OpsFilter, Page,
    PageRequest,
};
use opledger_store::Store;
use serde::Serialize;
use std::str::FromStr;

/// A short quote of what a flag was given.
pub(crate) fn quote(text: &str) -> String {
    const SHOWN: usize = 60;
    if text.chars().count() <= SHOWN {
        format!("{text:?}")
    } else {
        format!("{:?}…", text.chars().take(SHOWN).collect::<String>())
    }
}

/// A flag's value parsed as `T`, or a usage error naming the flag.
fn parse<T: FromStr>(flag: &str, text: &str, what: &str) -> Result<T, UsageError> {
    text.trim()
        .parse()
        .map_err(|_| UsageError(format!("{flag}: {} is not {what}", quote(text))))
}

fn time(flag: &str, text: &Option<String>) -> Result<Option<Timestamp>, UsageError> {
    text.as_deref()
        .map(|text| {
            Timestamp::parse(text.trim()).map_err(|_| {
                UsageError(format!(
                    "{flag}: {} is not an RFC 3339 time (e.g. 2026-12-01T09:30:00Z)",
                    quote(text)
                ))
            })
        })
        .transpose()
}

fn vocabulary<T: FromStr>(flag: &str, values: &[String], all: &[&str]) -> Result<Vec<T>, UsageError> {
    values
        .iter()
        .map(|text| {
            text.parse()
                .map_err(|_| UsageError(format!("{flag}: {} is not one of {}", quote(text), all.join(", "))))
        })
        .collect()
}

/// The page the flags ask for; a cursor that is not one of `listing`'s is
/// refused naming `--after`.
pub(crate) fn page_request(args: &PageArgs, listing: Listing) -> Result<PageRequest, UsageError> {
    if let Some(after) = &args.after {
        decode_cursor(listing, after).map_err(|error| UsageError(format!("--after: {error}")))?;
    }
    Ok(PageRequest {
        limit: args.limit,
        after: args.after.clone(),
    })
}

fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// The plain line that says how to get the next page.
pub(crate) fn next_line(next: &Option<String>) {
    if let Some(next) = next {
        println!("next page: --after {next}");
    }
}

pub async fn media_show<S: Store>(engine: &Engine<S>, args: &MediaShowArgs, as_json: bool) -> anyhow::Result<()> {
    let media = match (&args.media_id, &args.path) {
        (Some(id), _) => MediaRef::Id(parse::<MediaId>("MEDIA_ID", id, "a media id")?),
        (None, Some(path)) => MediaRef::Path(path.clone()),
        (None, None) => unreachable!("clap requires an id or --path"),
    };
    let detail = engine.media_detail(&media).await?;
    if as_json {
        return print_json(&detail);
    }
    print_detail(&detail);
    Ok(())
}

fn print_detail(detail: &MediaDetail) {
    let media = &detail.media;
    println!("media       {}", media.media_id);
    println!("path        {}", media.path);
    println!("kind        {}", media.media_kind);
    println!("digest      {}", media.content_digest.as_deref().unwrap_or("-"));
    println!(
        "size        {}",
        media.byte_size.map_or("-".to_string(), |size| format!("{size} bytes"))
    );
    println!("registered  {}", media.registered_at);
    println!("thumbnail   {}", detail.thumbnail.as_deref().unwrap_or("-"));
    if !detail.others_at_path.is_empty() {
        let others: Vec<String> = detail.others_at_path.iter().map(|id| id.to_string()).collect();
        println!("also here   {}", others.join(", "));
    }
    println!("capabilities");
    if detail.capabilities.is_empty() {
        println!("  none requested yet");
    }
    for capability in &detail.capabilities {
        println!(
            "  {:<16} {:<18} version {:<8} {}",
            capability.capability,
            capability.status,
            capability.produced_version.as_deref().unwrap_or("-"),
            capability.reason.as_deref().unwrap_or("")
        );
    }
    println!("operations");
    for operation in &detail.operations {
        println!("  {}", operation_line(operation));
    }
    println!("batches");
    if detail.batches.is_empty() {
        println!("  none");
    }
    for batch in &detail.batches {
        println!("  {}  {:<24} {}", batch.batch_id, batch.name, batch.status);
    }
    println!("open review entries");
    if detail.review.is_empty() {
        println!("  none");
    }
    for entry in &detail.review {
        println!(
            "  #{:<8} {:<16} {:<16} {}  {}",
            entry.entry_id,
            entry.reason_code,
            entry.kind,
            entry.operation_id,
            entry.detail.as_deref().unwrap_or("")
        );
    }
}

/// One operation on one line: time, id, kind, status, what it works on, why.
fn operation_line(operation: &OperationItem) -> String {
    let target = operation
        .path
        .clone()
        .or_else(|| operation.media_id.map(|id| format!("media {id}")))
        .or_else(|| operation.region_id.map(|id| format!("region {id}")))
        .unwrap_or_default();
    let why = operation
        .last_error
        .as_deref()
        .or(operation.status_reason.as_deref())
        .unwrap_or("");
    format!(
        "{}  {}  {:<16} {:<16} {}  {}",
        operation.created_at, operation.operation_id, operation.kind, operation.status, target, why
    )
}

pub async fn media_list<S: Store>(engine: &Engine<S>, args: &MediaListArgs, as_json: bool) -> anyhow::Result<()> {
    let statuses: Vec<&str> = CapabilityStatus::ALL.iter().map(|status| status.as_str()).collect();
    let filter = MediaFilter {
        kind: args.kind.clone(),
        path_prefix: args.path_prefix.clone(),
        capability: args.capability.clone(),
        capability_statuses: vocabulary("--capability-status", &args.capability_statuses, &statuses)?,
    };
    let page = engine
        .list_media(&filter, &page_request(&args.page, Listing::Media)?)
        .await?;
    if as_json {
        return print_json(&page);
    }
    print_media(&page);
    Ok(())
}

fn print_media(page: &Page<MediaItem>) {
    if page.items.is_empty() {
        println!("no media items on this page");
    }
    for media in &page.items {
        println!(
            "{}  {:<8} {:>12}  {}",
            media.media_id,
            media.media_kind,
            media.byte_size.map_or("-".to_string(), |size| size.to_string()),
            media.path
        );
    }
    next_line(&page.next);
}

pub async fn ops_list<S: Store>(engine: &Engine<S>, args: &OpsListArgs, as_json: bool) -> anyhow::Result<()> {
    let statuses: Vec<&str> = OperationStatus::ALL.iter().map(|status| status.as_str()).collect();
    let filter = OpsFilter {
        statuses: vocabulary("--status", &args.statuses, &statuses)?,
        kinds: args.kinds.clone(),
        batch: args
            .batch
            .as_deref()
            .map(|text| parse::<BatchId>("--batch", text, "a batch id"))
            .transpose()?,
        media: args
            .media
            .as_deref()
            .map(|text| parse::<MediaId>("--media", text, "a media id"))
            .transpose()?,
        since: time("--since", &args.since)?,
        until: time("--until", &args.until)?,
        worker: args.worker.clone(),
    };
    let page = engine
        .list_operations(&filter, &page_request(&args.page, filter.listing())?)
        .await?;
    if as_json {
        return print_json(&page);
    }
    if page.items.is_empty() {
        println!("no operations on this page");
    }
    for operation in &page.items {
        println!("{}", operation_line(operation));
    }
    next_line(&page.next);
    Ok(())
}
