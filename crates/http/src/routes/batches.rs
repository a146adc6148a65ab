//! Batches: the paged list, one batch with a page of its items, and, for
//! admins, creating, cancelling and resuming one — what `opledger batch`
//! does, in the shapes its `--json` prints.
//!
//! It must not know when a batch may be cancelled or resumed: the engine
//! refuses (409) what its rules refuse.

use super::params::{plain_text, Query};
use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiResult, ErrorBody};
use crate::extract::{parse_uuid, Caller, IdempotencyKey, JsonBody, OptionalBody, Params};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use opledger_domain::projections::{BatchItemRow, BatchRow};
use opledger_domain::{BatchId, MediaId, OperationId, Timestamp};
use opledger_engine::{BatchRequest, BatchSummary, BatchView, Listing};
use opledger_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

/// A batch and its progress.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchInfo {
    #[schema(format = Uuid)]
    pub batch_id: String,
    pub name: String,
    /// `ingest`, `request`, `reprocess`, ...
    pub batch_kind: String,
    pub status: String,
    /// Some item is still unsettled.
    pub active: bool,
    pub cancel_requested: bool,
    pub total: i64,
    pub settled: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub skipped: i64,
    pub cancelled: i64,
    /// Items that cannot run: a need of their kind ended without a result.
    pub blocked: i64,
    pub remaining: i64,
    pub resumes: i64,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

impl BatchInfo {
    pub fn of(batch: &BatchRow) -> Self {
        let summary = BatchSummary::of(batch);
        BatchInfo {
            batch_id: summary.batch_id,
            name: summary.name,
            batch_kind: batch.batch_kind.clone(),
            status: summary.status,
            active: opledger_domain::batches::is_active(&batch.progress),
            cancel_requested: batch.cancel_requested,
            total: summary.total,
            settled: summary.settled,
            succeeded: summary.succeeded,
            failed: summary.failed,
            skipped: summary.skipped,
            cancelled: summary.cancelled,
            blocked: summary.blocked,
            remaining: summary.remaining,
            resumes: batch.resumes,
            created_at: batch.created_at,
            updated_at: batch.updated_at,
        }
    }
}

/// One item of a batch.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchItem {
    #[schema(value_type = String, format = Uuid)]
    pub operation_id: OperationId,
    pub label: String,
    /// How the item ended for its batch; null while unsettled.
    pub outcome: Option<String>,
    pub last_status: Option<String>,
    pub reason: Option<String>,
    pub runs: i64,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub settled_at: Option<Timestamp>,
    /// The item's settlements, oldest first.
    #[schema(value_type = Object)]
    pub history: Value,
    /// The file an ingestion names, or the media item's path (shown by
    /// the batch's page of items).
    pub path: Option<String>,
}

impl BatchItem {
    fn of(item: &BatchItemRow, path: Option<String>) -> Self {
        BatchItem {
            operation_id: item.operation_id,
            label: item.label.clone(),
            outcome: item.outcome.map(|outcome| outcome.as_str().to_string()),
            last_status: item.last_status.clone(),
            reason: item.reason.clone(),
            runs: item.runs,
            settled_at: item.settled_at,
            history: serde_json::from_str(&item.history).unwrap_or(Value::Null),
            path,
        }
    }
}

/// A batch with its items (all of them, or one page with `next`).
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchDetail {
    #[serde(flatten)]
    pub batch: BatchInfo,
    pub items: Vec<BatchItem>,
    /// The cursor of the next page of items; null when they ended.
    pub next: Option<String>,
}

impl BatchDetail {
    fn of(view: &BatchView) -> Self {
        BatchDetail {
            batch: BatchInfo::of(&view.batch),
            items: view.items.iter().map(|item| BatchItem::of(item, None)).collect(),
            next: None,
        }
    }
}

/// One page of batches.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchPage {
    pub items: Vec<BatchInfo>,
    /// The cursor of the next page (`after=`); null when the listing ended.
    pub next: Option<String>,
}

/// The batch listing's parameters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BatchListParams {
    /// Only batches with unsettled items.
    pub active: Option<bool>,
    /// Rows on the page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` cursor of the page before.
    pub after: Option<String>,
}

/// Batches newest first, a page at a time: what `opledger batch list
/// --json` prints.
#[utoipa::path(get, path = "/api/v1/batches", tag = "read", params(BatchListParams),
    responses((status = 200, body = BatchPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    params: Params<Vec<(String, String)>>,
) -> ApiResult<Json<BatchPage>> {
    caller.require(Role::Reader)?;
    let query = Query::of(params, &["active", "limit", "after"])?;
    let active = query.parsed::<bool>("active", "true or false")?.unwrap_or(false);
    let page = app.engine().batch_list(active, &query.page(Listing::Batches)?).await?;
    Ok(Json(BatchPage {
        items: page.items.iter().map(BatchInfo::of).collect(),
        next: page.next,
    }))
}

/// The paging of a batch's items.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ItemPageParams {
    /// Items on the page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` cursor of the page before.
    pub after: Option<String>,
}

/// A batch's progress and one page of its items in order: what `opledger
/// batch show ID --json` prints.
#[utoipa::path(get, path = "/api/v1/batches/{id}", tag = "read",
    params(("id" = String, Path, description = "The batch's id", format = Uuid), ItemPageParams),
    responses((status = 200, body = BatchDetail), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    Path(id): Path<String>,
    params: Params<Vec<(String, String)>>,
) -> ApiResult<Json<BatchDetail>> {
    caller.require(Role::Reader)?;
    let batch_id = BatchId(parse_uuid("batch id", &id)?);
    let query = Query::of(params, &["limit", "after"])?;
    let page = app
        .engine()
        .batch_page(batch_id, &query.page(Listing::BatchItems)?)
        .await?;
    Ok(Json(BatchDetail {
        batch: BatchInfo::of(&page.batch),
        items: page
            .items
            .items
            .into_iter()
            .map(|view| BatchItem::of(&view.item, view.path))
            .collect(),
        next: page.items.next,
    }))
}

/// A batch to create: what `opledger batch create` takes.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewBatch {
    pub name: String,
    /// The media items.
    #[schema(value_type = Vec<String>)]
    pub media: Vec<MediaId>,
    /// The task kinds to run on every item.
    pub kinds: Vec<String>,
    /// Inputs per kind, over the kind's defaults.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub inputs: BTreeMap<String, Value>,
    /// Higher runs first.
    #[serde(default)]
    pub priority: i32,
}

/// Creates a batch (admin): every kind requested on every item, in one
/// transaction. Answers the batch with all its items.
#[utoipa::path(post, path = "/api/v1/batches", tag = "admin", request_body = NewBatch,
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    responses((status = 201, body = BatchDetail), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    JsonBody(new): JsonBody<NewBatch>,
) -> ApiResult<(StatusCode, Json<BatchDetail>)> {
    caller.require(Role::Admin)?;
    plain_text("name", &new.name)?;
    for kind in new.kinds.iter().chain(new.inputs.keys()) {
        plain_text("a kind", kind)?;
    }
    let request = BatchRequest {
        name: new.name,
        media: new.media,
        kinds: new.kinds,
        inputs: new.inputs,
        priority: new.priority,
    };
    let view = app
        .engine()
        .create_batch(&key.context(caller.name.clone()), request)
        .await?;
    app.wake().bump();
    Ok((StatusCode::CREATED, Json(BatchDetail::of(&view))))
}

/// Why an admin acts; recorded with the action.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Reason {
    #[serde(default)]
    pub reason: String,
}

/// Cancels a batch (admin): waiting items at once, running ones asked to
/// stop. 409 when nothing in it is unsettled.
#[utoipa::path(post, path = "/api/v1/batches/{id}/cancel", tag = "admin",
    params(("id" = String, Path, description = "The batch's id", format = Uuid), ("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body(content = Option<Reason>, description = "Optional: why"),
    responses((status = 200, body = BatchDetail), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<Option<Reason>>,
) -> ApiResult<Json<BatchDetail>> {
    caller.require(Role::Admin)?;
    let body = body.unwrap_or_default();
    let batch_id = BatchId(parse_uuid("batch id", &id)?);
    plain_text("reason", &body.reason)?;
    let view = app
        .engine()
        .cancel_batch(&key.context(caller.name.clone()), batch_id, &body.reason)
        .await?;
    app.wake().bump();
    Ok(Json(BatchDetail::of(&view)))
}

/// Resumes a batch (admin): its failed and cancelled items run again.
/// 409 when no item is failed or cancelled.
#[utoipa::path(post, path = "/api/v1/batches/{id}/resume", tag = "admin",
    params(("id" = String, Path, description = "The batch's id", format = Uuid), ("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body(content = Option<Reason>, description = "Optional: why"),
    responses((status = 200, body = BatchDetail), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resume<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<Option<Reason>>,
) -> ApiResult<Json<BatchDetail>> {
    caller.require(Role::Admin)?;
    let body = body.unwrap_or_default();
    let batch_id = BatchId(parse_uuid("batch id", &id)?);
    plain_text("reason", &body.reason)?;
    let view = app
        .engine()
        .resume_batch(&key.context(caller.name.clone()), batch_id, &body.reason)
        .await?;
    app.wake().bump();
    Ok(Json(BatchDetail::of(&view)))
}
