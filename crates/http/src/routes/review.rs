//! The review queue: the paged list of open entries, resolving one entry,
//! and resolving every entry a filter matches (with `dry_run`) — what
//! `opledger review` does, in the shapes its `--json` prints.
//!
//! It must not know what an action does to the work: the engine records
//! the action and refuses (409/422) what its rules refuse.

use super::params::{plain_text, Query};
use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{Caller, IdempotencyKey, JsonBody, Params};
use axum::extract::{Path, State};
use axum::Json;
use opledger_domain::projections::ReviewRow;
use opledger_domain::review::{ReasonCode, ReviewAction};
use opledger_domain::{quoted, BatchId, MediaId, OperationId, OperationStatus, Timestamp};
use opledger_engine::{BulkResolution, Listing, ReviewFilter};
use opledger_store::Store;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// One review entry.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewEntry {
    pub entry_id: i64,
    #[schema(value_type = String, format = Uuid)]
    pub operation_id: OperationId,
    /// The operation's kind.
    pub kind: String,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub media_id: Option<MediaId>,
    /// The file an ingestion names, or the media item's path.
    pub path: Option<String>,
    /// `failed_terminal`, `dead_lettered`, `blocked`, `missing_required`, `source_missing`.
    pub reason_code: String,
    #[schema(value_type = String)]
    pub operation_status: OperationStatus,
    pub detail: Option<String>,
    /// `open` or `resolved`.
    #[schema(value_type = String)]
    pub state: opledger_domain::review::EntryState,
    pub resolution: Option<String>,
    pub resolution_reason: Option<String>,
    pub resolved_by: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub opened_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub resolved_at: Option<Timestamp>,
}

impl ReviewEntry {
    fn of(entry: &ReviewRow, path: Option<String>) -> Self {
        ReviewEntry {
            entry_id: entry.entry_id,
            operation_id: entry.operation_id,
            kind: entry.kind.clone(),
            media_id: entry.media_id,
            path: path.or_else(|| entry.path.clone()),
            reason_code: entry.reason_code.clone(),
            operation_status: entry.operation_status,
            detail: entry.detail.clone(),
            state: entry.state,
            resolution: entry.resolution.clone(),
            resolution_reason: entry.resolution_reason.clone(),
            resolved_by: entry.resolved_by.clone(),
            opened_at: entry.opened_at,
            resolved_at: entry.resolved_at,
        }
    }
}

/// One page of open review entries.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewPage {
    pub items: Vec<ReviewEntry>,
    /// The cursor of the next page (`after=`); null when the listing ended.
    pub next: Option<String>,
}

/// The review listing's paging.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReviewParams {
    /// Entries on the page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` cursor of the page before.
    pub after: Option<String>,
}

/// Open entries, oldest first, a page at a time: what `opledger review
/// list --json` prints.
#[utoipa::path(get, path = "/api/v1/review", tag = "read", params(ReviewParams),
    responses((status = 200, body = ReviewPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    params: Params<Vec<(String, String)>>,
) -> ApiResult<Json<ReviewPage>> {
    caller.require(Role::Reader)?;
    let query = Query::of(params, &["limit", "after"])?;
    let page = app.engine().review_page(&query.page(Listing::Review)?).await?;
    Ok(Json(ReviewPage {
        items: page
            .items
            .into_iter()
            .map(|view| ReviewEntry::of(&view.entry, view.path))
            .collect(),
        next: page.next,
    }))
}

/// What a person decided.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Run the work again; the entry closes when it succeeds.
    Retry,
    /// Not worth doing: the entry closes, the work stays as it is.
    Dismiss,
    /// Seen and accepted as it is.
    Acknowledge,
}

impl From<Action> for ReviewAction {
    fn from(action: Action) -> Self {
        match action {
            Action::Retry => ReviewAction::Retry,
            Action::Dismiss => ReviewAction::Dismiss,
            Action::Acknowledge => ReviewAction::Acknowledge,
        }
    }
}

/// How to resolve one entry: what `opledger review resolve ENTRY` takes.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resolve {
    pub action: Action,
    /// Retry at this revision (the requested one, or one requested before).
    pub revision: Option<String>,
    /// Why: recorded with the action.
    #[serde(default)]
    pub reason: String,
}

/// Resolves one entry by a recorded action (admin); answers the entry.
#[utoipa::path(post, path = "/api/v1/review/{entry}/resolve", tag = "admin",
    params(("entry" = i64, Path, description = "The entry's id"), ("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body = Resolve,
    responses((status = 200, body = ReviewEntry), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resolve<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    Path(entry): Path<String>,
    JsonBody(body): JsonBody<Resolve>,
) -> ApiResult<Json<ReviewEntry>> {
    caller.require(Role::Admin)?;
    let entry_id: i64 = entry
        .trim()
        .parse()
        .map_err(|_| ApiError::malformed(format!("entry {} is not an entry id (a number)", quoted(&entry))))?;
    plain_text("reason", &body.reason)?;
    if let Some(revision) = &body.revision {
        plain_text("revision", revision)?;
    }
    let resolved = app
        .engine()
        .resolve_review(
            &key.context(caller.name.clone()),
            entry_id,
            body.action.into(),
            body.revision,
            &body.reason,
        )
        .await?;
    app.wake().bump();
    Ok(Json(ReviewEntry::of(&resolved, None)))
}

/// Which open entries to resolve, and how: what `opledger review resolve
/// --all` takes.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveAll {
    pub action: Action,
    /// Why: recorded with each action.
    #[serde(default)]
    pub reason: String,
    /// Only entries of this operation kind.
    pub kind: Option<String>,
    /// Only entries with this reason code (`failed_terminal`,
    /// `dead_lettered`, `blocked`, `missing_required`, `source_missing`).
    pub reason_code: Option<String>,
    /// Only entries of operations in this batch.
    #[schema(value_type = Option<String>, format = Uuid)]
    pub batch: Option<BatchId>,
    /// List what would be resolved, and record nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Resolve at most this many entries.
    #[schema(minimum = 1)]
    pub limit: Option<u64>,
}

/// An entry a bulk resolution took.
#[derive(Debug, Serialize, ToSchema)]
pub struct TakenEntry {
    pub entry_id: i64,
    #[schema(value_type = String, format = Uuid)]
    pub operation_id: OperationId,
    pub kind: String,
    pub path: Option<String>,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub media_id: Option<MediaId>,
    pub reason_code: String,
    #[schema(value_type = String)]
    pub operation_status: OperationStatus,
}

/// An entry taken but not resolved, and why.
#[derive(Debug, Serialize, ToSchema)]
pub struct Skipped {
    pub entry_id: i64,
    pub reason: String,
}

/// What a bulk resolution did (or, dry, would do): what `opledger review
/// resolve --all --json` prints.
#[derive(Debug, Serialize, ToSchema)]
pub struct BulkReport {
    /// Open entries the filter matched.
    pub matched: usize,
    /// Entries resolved (none in a dry run).
    pub resolved: usize,
    pub skipped: Vec<Skipped>,
    pub dry_run: bool,
    pub action: String,
    /// Matched entries left open by `limit`.
    pub remaining: usize,
    /// The entries taken, oldest first.
    pub entries: Vec<TakenEntry>,
}

impl BulkReport {
    fn of(report: &BulkResolution, action: ReviewAction) -> Self {
        BulkReport {
            matched: report.matched,
            resolved: report.resolved,
            skipped: report
                .skipped
                .iter()
                .map(|skipped| Skipped {
                    entry_id: skipped.entry_id,
                    reason: skipped.reason.clone(),
                })
                .collect(),
            dry_run: report.dry_run,
            action: action.as_str().to_string(),
            remaining: report.remaining(),
            entries: report
                .entries
                .iter()
                .map(|entry| TakenEntry {
                    entry_id: entry.entry_id,
                    operation_id: entry.operation_id,
                    kind: entry.kind.clone(),
                    path: entry.path.clone(),
                    media_id: entry.media_id,
                    reason_code: entry.reason_code.clone(),
                    operation_status: entry.operation_status,
                })
                .collect(),
        }
    }
}

/// Resolves every open entry a filter matches (admin), each as its own
/// recorded action; with `dry_run` lists them and records nothing.
#[utoipa::path(post, path = "/api/v1/review/resolve", tag = "admin", request_body = ResolveAll,
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this resolution for its retries: each entry's resolution is recorded under KEY/ENTRY, so a retry answers the entries already resolved from their records (they are no longer open, and are not listed again).")),
    responses((status = 200, body = BulkReport), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resolve_all<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    JsonBody(body): JsonBody<ResolveAll>,
) -> ApiResult<Json<BulkReport>> {
    caller.require(Role::Admin)?;
    plain_text("reason", &body.reason)?;
    if let Some(kind) = &body.kind {
        plain_text("kind", kind)?;
    }
    let reason_code = body
        .reason_code
        .as_deref()
        .map(|text| {
            text.parse::<ReasonCode>()
                .map_err(|_| ApiError::invalid(format!("reason_code {} is not a reason code", quoted(text))))
        })
        .transpose()?;
    let filter = ReviewFilter {
        kind: body.kind,
        reason_code,
        batch: body.batch,
    };
    let action = ReviewAction::from(body.action);
    let limit = body.limit.map(|limit| usize::try_from(limit).unwrap_or(usize::MAX));
    let report = app
        .engine()
        .resolve_reviews(
            &key.context(caller.name.clone()),
            &filter,
            action,
            &body.reason,
            body.dry_run,
            limit,
        )
        .await?;
    if !report.dry_run && report.resolved > 0 {
        app.wake().bump();
    }
    Ok(Json(BulkReport::of(&report, action)))
}
