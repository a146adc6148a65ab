//! The work protocol's asking side: requesting tasks (one, or many in one
//! transaction) and cancelling one; and the answer shapes the claim side
//! ([`super::claims`]) shares.
//!
//! Handlers check the caller's role and task kinds, parse, call the engine
//! exactly as `opledger task request` and `task cancel` do, and map the
//! answer; the rules (revisions, kinds, transitions) are the engine's. It
//! must not know SQL or the backend.

use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult, ErrorBody, ErrorDetail};
use crate::extract::{parse_uuid, Caller, IdempotencyKey, JsonBody, OptionalBody};
use axum::extract::{Path, State};
use axum::Json;
use opledger_domain::{MediaId, OperationId, RegionId};
use opledger_engine::{CommandContext, RequestOutcome, TaskOutcome, TaskRequest, TaskTarget, MAX_CLAIM_BATCH};
use opledger_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// The most items one batched call (`/task-requests`, `/reports`) carries.
pub const MAX_BATCH: usize = MAX_CLAIM_BATCH;

/// A request for a task kind on a media item or a region.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskRequestBody {
    /// The media item the task runs on (give this or `region_id`).
    #[schema(value_type = Option<String>, format = Uuid)]
    pub media_id: Option<uuid::Uuid>,
    /// The region the task runs on (give this or `media_id`).
    #[schema(value_type = Option<String>, format = Uuid)]
    pub region_id: Option<uuid::Uuid>,
    pub kind: String,
    /// The caller's inputs (a JSON object; `{}` when absent); what the
    /// target provides is filled in.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub inputs: Option<Value>,
    /// Higher runs first; 0 when absent.
    #[serde(default)]
    pub priority: i32,
}

/// What a request did: `opledger task request --json`'s object.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RequestAnswer {
    pub operation_id: String,
    pub requested_revision: String,
    /// False when that revision was already requested: nothing was appended.
    pub created: bool,
    /// `queued`, `blocked`, `not_applicable`, or where an existing task stands.
    pub status: String,
}

impl From<RequestOutcome> for RequestAnswer {
    fn from(outcome: RequestOutcome) -> Self {
        RequestAnswer {
            operation_id: outcome.operation_id.to_string(),
            requested_revision: outcome.requested_revision,
            created: outcome.created,
            status: outcome.status.as_str().to_string(),
        }
    }
}

/// Where a task stands after a report or a cancel.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskOutcomeAnswer {
    pub operation_id: String,
    pub status: String,
    pub requested_revision: String,
    pub completed_revision: Option<String>,
    /// When the task may be claimed again (a retry's backoff).
    pub available_at: String,
    pub attempt_count: i64,
    pub failure_count: i64,
    pub cancel_requested: bool,
    pub last_error: Option<String>,
}

impl From<TaskOutcome> for TaskOutcomeAnswer {
    fn from(outcome: TaskOutcome) -> Self {
        TaskOutcomeAnswer {
            operation_id: outcome.operation_id.to_string(),
            status: outcome.status.as_str().to_string(),
            requested_revision: outcome.requested_revision,
            completed_revision: outcome.completed_revision,
            available_at: outcome.available_at.to_rfc3339(),
            attempt_count: outcome.attempt_count,
            failure_count: outcome.failure_count,
            cancel_requested: outcome.cancel_requested,
            last_error: outcome.last_error,
        }
    }
}

/// One item's refusal inside a batched answer, in the service's error shape.
pub fn item_error(error: ApiError) -> ErrorBody {
    ErrorBody {
        error: ErrorDetail {
            code: error.code.to_string(),
            message: error.message,
            details: error.details,
        },
    }
}

/// The engine's request for a body, or why the body is not one (checked
/// against the caller's task kinds).
fn task_request(caller: &Caller, body: TaskRequestBody) -> ApiResult<TaskRequest> {
    caller.may_work_on(&body.kind)?;
    let target = match (body.media_id, body.region_id) {
        (Some(media), None) => TaskTarget::Media(MediaId(media)),
        (None, Some(region)) => TaskTarget::Region(RegionId(region)),
        _ => return Err(ApiError::invalid("give exactly one of media_id and region_id")),
    };
    Ok(TaskRequest {
        target,
        kind: body.kind,
        inputs: body.inputs.unwrap_or_else(|| Value::Object(Default::default())),
        priority: body.priority,
    })
}

/// Requests a task kind on a target at the revision its inputs determine:
/// what `opledger task request --json` prints. A worker token limited to
/// task kinds may request only those.
#[utoipa::path(post, path = "/api/v1/tasks", tag = "work",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body = TaskRequestBody,
    responses((status = 200, body = RequestAnswer), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn request<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    JsonBody(body): JsonBody<TaskRequestBody>,
) -> ApiResult<Json<RequestAnswer>> {
    caller.require(Role::Worker)?;
    let request = task_request(&caller, body)?;
    let outcome = app
        .engine()
        .request_task(&key.context(caller.name.clone()), request)
        .await?;
    if outcome.created {
        app.wake().bump();
    }
    Ok(Json(outcome.into()))
}

/// Many task requests in one call.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskRequestsBody {
    pub requests: Vec<TaskRequestBody>,
}

/// One request's answer or its error, in the order asked.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum RequestItem {
    Requested(RequestAnswer),
    Refused(ErrorBody),
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RequestItems {
    pub items: Vec<RequestItem>,
}

/// Requests many tasks in one transaction (a scheduler enqueueing a
/// folder): each item is answered on its own, a refused one does not stop
/// the others.
#[utoipa::path(post, path = "/api/v1/task-requests", tag = "work",
    request_body = TaskRequestsBody,
    responses((status = 200, body = RequestItems), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn request_many<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    JsonBody(body): JsonBody<TaskRequestsBody>,
) -> ApiResult<Json<RequestItems>> {
    caller.require(Role::Worker)?;
    key.refuse("POST /api/v1/task-requests")?;
    if body.requests.len() > MAX_BATCH {
        return Err(ApiError::invalid(format!(
            "one call carries at most {MAX_BATCH} requests, not {}",
            body.requests.len()
        )));
    }
    // Authorization is for the whole call, not per item: a token limited
    // to other kinds is refused before anything is requested.
    for request in &body.requests {
        caller.may_work_on(&request.kind)?;
    }
    // Items refused here keep their place; the rest go to the engine together.
    let checked: Vec<ApiResult<TaskRequest>> = body
        .requests
        .into_iter()
        .map(|request| task_request(&caller, request))
        .collect();
    let valid: Vec<TaskRequest> = checked.iter().filter_map(|item| item.as_ref().ok().cloned()).collect();
    let mut answers = if valid.is_empty() {
        Vec::new()
    } else {
        app.engine()
            .request_tasks(&CommandContext::actor(caller.name.clone()), valid)
            .await?
    }
    .into_iter();
    let mut created = false;
    let items = checked
        .into_iter()
        .map(|item| match item {
            Err(error) => RequestItem::Refused(item_error(error)),
            Ok(_) => match answers.next() {
                Some(Ok(outcome)) => {
                    created |= outcome.created;
                    RequestItem::Requested(outcome.into())
                }
                Some(Err(error)) => RequestItem::Refused(item_error(error.into())),
                None => RequestItem::Refused(item_error(ApiError::internal("the engine answered fewer requests"))),
            },
        })
        .collect();
    if created {
        app.wake().bump();
    }
    Ok(Json(RequestItems { items }))
}

/// Why a task is cancelled.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    #[serde(default)]
    pub reason: Option<String>,
}

/// Cancels a task: at once when no worker holds it; otherwise its worker
/// sees `cancel_requested` at its next heartbeat.
#[utoipa::path(post, path = "/api/v1/operations/{id}/cancel", tag = "work",
    params(("id" = String, Path, description = "The task's operation id"), ("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body(content = Option<CancelBody>),
    responses((status = 200, body = TaskOutcomeAnswer), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<CancelBody>,
) -> ApiResult<Json<TaskOutcomeAnswer>> {
    caller.require(Role::Admin)?;
    let operation_id = OperationId(parse_uuid("operation", &id)?);
    let reason = body.reason.unwrap_or_default();
    let outcome = app
        .engine()
        .cancel_task(&key.context(caller.name.clone()), operation_id, &reason)
        .await?;
    app.wake().bump();
    Ok(Json(outcome.into()))
}
