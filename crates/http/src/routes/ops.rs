//! Operations for readers: the filtered, paged listing (`ops list`), one
//! operation explained (`describe`, with its "why" sentence) and its
//! history (`timeline`), in the shapes the CLI's `--json` prints.
//!
//! It must not know how listings walk indexes or why an operation stands
//! where it stands: the engine answers, this shapes the answer.

use super::params::{Query, PAGE_KEYS};
use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiResult, ErrorBody};
use crate::extract::{parse_uuid, Caller, Params};
use axum::extract::{Path, State};
use axum::Json;
use chrono::Utc;
use opledger_domain::{BatchId, EventEnvelope, MediaId, OperationId, OperationStatus, Timestamp};
use opledger_engine::{Description, OperationItem, OpsFilter};
use opledger_explain::QueuePosition;
use opledger_store::Store;
use serde::Serialize;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// One operation as listings show it.
#[derive(Debug, Serialize, ToSchema)]
pub struct OperationView {
    #[schema(value_type = String, format = Uuid)]
    pub operation_id: OperationId,
    /// A task kind, or `ingestion.file`.
    pub kind: String,
    #[schema(value_type = String)]
    pub status: OperationStatus,
    /// A file ingestion's stage.
    pub stage: Option<String>,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub media_id: Option<MediaId>,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub region_id: Option<opledger_domain::RegionId>,
    pub path: Option<String>,
    /// The worker holding it now.
    pub worker: Option<String>,
    pub attempt_count: i64,
    pub interruption_count: i64,
    pub status_reason: Option<String>,
    pub last_error: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

impl From<OperationItem> for OperationView {
    fn from(item: OperationItem) -> Self {
        OperationView {
            operation_id: item.operation_id,
            kind: item.kind,
            status: item.status,
            stage: item.stage,
            media_id: item.media_id,
            region_id: item.region_id,
            path: item.path,
            worker: item.worker,
            attempt_count: item.attempt_count,
            interruption_count: item.interruption_count,
            status_reason: item.status_reason,
            last_error: item.last_error,
            created_at: item.created_at,
            updated_at: item.updated_at,
        }
    }
}

/// One page of operations.
#[derive(Debug, Serialize, ToSchema)]
pub struct OperationPage {
    pub items: Vec<OperationView>,
    /// The cursor of the next page (`after=`); null when the listing ended.
    pub next: Option<String>,
}

/// One event of an operation's history, every field of its envelope.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventView {
    /// The event's position in the log.
    pub seq: i64,
    /// `operation-ID`, `media-ID`, `batch-ID`, ...
    pub stream_id: String,
    pub stream_version: i64,
    pub event_type: String,
    pub schema_version: u32,
    #[schema(value_type = String, format = DateTime)]
    pub recorded_at: Timestamp,
    pub actor: String,
    pub correlation_id: String,
    pub causation_id: Option<String>,
    /// The event's payload; its fields depend on `event_type`.
    #[schema(value_type = Object)]
    pub payload: Value,
}

impl EventView {
    pub fn of(event: &EventEnvelope) -> Self {
        EventView {
            seq: event.seq,
            stream_id: event.stream_id.to_string(),
            stream_version: event.stream_version,
            event_type: event.event_type().to_string(),
            schema_version: event.schema_version,
            recorded_at: event.recorded_at,
            actor: event.actor.clone(),
            correlation_id: event.correlation_id.clone(),
            causation_id: event.causation_id.clone(),
            // A payload is JSON the domain wrote; text that is not stays text.
            payload: serde_json::from_str(&event.event.payload_json())
                .unwrap_or_else(|_| Value::String(event.event.payload_json())),
        }
    }
}

/// Claims, failures and interruptions against the kind's budgets.
#[derive(Debug, Serialize, ToSchema)]
pub struct Attempts {
    pub claims: i64,
    pub failures: Option<i64>,
    pub max_attempts: Option<u32>,
    pub interruptions: i64,
    pub max_interruptions: Option<u32>,
}

/// The claim a worker holds.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimFacts {
    pub worker: String,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub lease_expires_at: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub heartbeat_at: Option<Timestamp>,
}

/// Where a claimable task stands in its kind's claim order.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueFacts {
    /// Claimable tasks of the kind a worker would take first.
    pub ahead: u64,
    pub higher_priority: u64,
    /// The count stopped at its bound: at least `ahead`.
    pub at_least: bool,
}

impl From<QueuePosition> for QueueFacts {
    fn from(queue: QueuePosition) -> Self {
        QueueFacts {
            ahead: queue.ahead,
            higher_priority: queue.higher_priority,
            at_least: queue.at_least,
        }
    }
}

/// One operation explained: what `opledger describe --json` prints.
#[derive(Debug, Serialize, ToSchema)]
pub struct DescribeView {
    #[schema(value_type = String, format = Uuid)]
    pub operation_id: OperationId,
    pub kind: String,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub media_id: Option<MediaId>,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub region_id: Option<opledger_domain::RegionId>,
    pub path: Option<String>,
    #[schema(value_type = String)]
    pub status: OperationStatus,
    pub stage: Option<String>,
    pub priority: i64,
    pub status_reason: Option<String>,
    /// The capability a blocked operation waits for.
    #[schema(value_type = Option<Object>)]
    pub blocked_on: Option<Value>,
    pub cancel_requested: bool,
    pub attempts: Attempts,
    pub claim: Option<ClaimFacts>,
    pub requested_revision: Option<String>,
    pub completed_revision: Option<String>,
    /// The task's current output: what its worker reported with
    /// `completed_revision`, the revision it belongs to (null until a
    /// result is recorded, after a result of nothing, and for a file
    /// ingestion). Untrusted data as the worker sent it: show it as JSON
    /// or text, never as markup.
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub available_at: Option<Timestamp>,
    pub last_error: Option<String>,
    pub queue: Option<QueueFacts>,
    /// Why it stands where it stands: `standing` names the situation, the
    /// other fields are that situation's facts.
    #[schema(value_type = Object)]
    pub why: Value,
    /// The "why" as one sentence (times in UTC).
    pub sentence: String,
    #[schema(value_type = String, format = DateTime)]
    pub described_at: Timestamp,
    pub timeline: Vec<EventView>,
}

impl DescribeView {
    pub fn of(description: &Description) -> Self {
        let operation = &description.operation;
        let state = description.task.as_ref().map(|task| &task.state);
        let policy = description.policy.as_ref();
        DescribeView {
            operation_id: operation.operation_id,
            kind: operation.kind.clone(),
            media_id: operation.media_id,
            region_id: operation.region_id,
            path: description.path.clone(),
            status: operation.status,
            stage: operation.stage.map(|stage| stage.as_str().to_string()),
            priority: operation.priority,
            status_reason: operation.status_reason.clone(),
            blocked_on: operation
                .blocked_on
                .as_ref()
                .and_then(|blocked| serde_json::to_value(blocked).ok()),
            cancel_requested: operation.cancel_requested,
            attempts: Attempts {
                claims: operation.attempt_count,
                failures: state.map(|state| state.failure_count),
                max_attempts: policy.map(|policy| policy.max_attempts),
                interruptions: state.map_or(operation.interruption_count, |state| state.interruption_count),
                max_interruptions: policy.map(|policy| policy.max_interruptions),
            },
            claim: operation.worker.as_ref().map(|worker| ClaimFacts {
                worker: worker.clone(),
                lease_expires_at: description.lease_ends(),
                heartbeat_at: description.task.as_ref().and_then(|task| task.heartbeat_at()),
            }),
            requested_revision: state
                .map(|state| state.requested_revision.clone())
                .or_else(|| operation.revision.clone()),
            completed_revision: state.and_then(|state| state.completed_revision.clone()),
            output: state
                .and_then(|state| state.output.as_deref())
                .and_then(|output| serde_json::from_str(output).ok()),
            available_at: state.map(|state| state.available_at).or(operation.available_at),
            last_error: operation.last_error.clone(),
            queue: description.queue.map(QueueFacts::from),
            why: serde_json::to_value(&description.why).unwrap_or(Value::Null),
            sentence: description.why.sentence(description.described_at, &Utc),
            described_at: description.described_at,
            timeline: description.timeline.iter().map(EventView::of).collect(),
        }
    }
}

/// The filters of the operations listing (documentation: the handler
/// reads them through [`Query`]).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OpsParams {
    /// Only operations in these statuses (repeat for several).
    #[param(style = Form, explode)]
    pub status: Option<Vec<String>>,
    /// Only operations of these kinds (repeat for several).
    #[param(style = Form, explode)]
    pub kind: Option<Vec<String>>,
    /// Only the items of this batch (last item first).
    #[param(format = Uuid)]
    pub batch: Option<String>,
    /// Only operations on this media item.
    #[param(format = Uuid)]
    pub media: Option<String>,
    /// Created at or after this time (RFC 3339).
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Created before this time (RFC 3339).
    #[param(format = DateTime)]
    pub until: Option<String>,
    /// Held now by this worker.
    pub worker: Option<String>,
    /// Rows on the page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` cursor of the page before.
    pub after: Option<String>,
}

const OPS_KEYS: [&str; 9] = [
    "status",
    "kind",
    "batch",
    "media",
    "since",
    "until",
    "worker",
    PAGE_KEYS[0],
    PAGE_KEYS[1],
];

/// Operations newest first (with `batch`: last item first), a page at a
/// time: what `opledger ops list --json` prints.
#[utoipa::path(get, path = "/api/v1/operations", tag = "read", params(OpsParams),
    responses((status = 200, body = OperationPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    params: Params<Vec<(String, String)>>,
) -> ApiResult<Json<OperationPage>> {
    caller.require(Role::Reader)?;
    let query = Query::of(params, &OPS_KEYS)?;
    let statuses: Vec<&str> = OperationStatus::ALL.iter().map(|status| status.as_str()).collect();
    let filter = OpsFilter {
        statuses: query.vocabulary("status", &statuses)?,
        kinds: query.all("kind"),
        batch: query.parsed::<BatchId>("batch", "a batch id")?,
        media: query.parsed::<MediaId>("media", "a media id")?,
        since: query.time("since")?,
        until: query.time("until")?,
        worker: query.one("worker")?,
    };
    let page = query.page(filter.listing())?;
    let page = app.engine().list_operations(&filter, &page).await?;
    Ok(Json(OperationPage {
        items: page.items.into_iter().map(OperationView::from).collect(),
        next: page.next,
    }))
}

/// One operation explained: its state, its budgets, its claim, why it
/// stands where it stands (a sentence, times in UTC) and its history:
/// what `opledger describe --json` prints.
#[utoipa::path(get, path = "/api/v1/operations/{id}", tag = "read",
    params(("id" = String, Path, description = "The operation's id", format = Uuid)),
    responses((status = 200, body = DescribeView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn describe<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<DescribeView>> {
    caller.require(Role::Reader)?;
    let operation_id = OperationId(parse_uuid("operation id", &id)?);
    let description = app.engine().describe(operation_id).await?;
    Ok(Json(DescribeView::of(&description)))
}

/// An operation's events in stream order: what `opledger timeline --json`
/// prints.
#[utoipa::path(get, path = "/api/v1/operations/{id}/timeline", tag = "read",
    params(("id" = String, Path, description = "The operation's id", format = Uuid)),
    responses((status = 200, body = Vec<EventView>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn timeline<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<EventView>>> {
    caller.require(Role::Reader)?;
    let operation_id = OperationId(parse_uuid("operation id", &id)?);
    let events = app.engine().timeline(operation_id).await?;
    Ok(Json(events.iter().map(EventView::of).collect()))
}
