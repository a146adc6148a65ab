//! The work protocol's working side: claiming (a batch, kind filters and a
//! long-poll), holding a claim (heartbeat, progress) and ending it
//! (complete, fail, release, acknowledge a cancel) one at a time; many
//! reports in one transaction are [`super::reports`].
//!
//! Every report is fenced by the engine exactly as on the CLI: a stale
//! token or revision is 409 and appends nothing. A claim is bound to the
//! principal (token name) that took it: its lease is looked up (one read)
//! before a report, and another principal's report is 403 and appends
//! nothing; a worker token limited to task kinds may report only on claims
//! of those kinds. The actor recorded is always the principal, with the
//! worker name the body gives beside it. A long-poll
//! waits on the service's wake (bumped by every commit of this process and
//! by the head poll for other processes' commits), never re-reading the
//! database in a loop; it rechecks every [`CLAIM_RECHECK`] so a retry
//! whose backoff ends is found without a commit. It must not know SQL or
//! the backend.

use super::work::TaskOutcomeAnswer;
use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{parse_uuid, Caller, IdempotencyKey, JsonBody, OptionalBody};
use axum::extract::{Path, State};
use axum::Json;
use opledger_domain::quoted;
use opledger_engine::{ClaimRequest, CommandContext, Completion, Fence, Progress, TaskClaim};
use opledger_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;
use utoipa::ToSchema;

/// How often a waiting claim looks again without a wake: a task whose
/// retry backoff ends becomes claimable without any commit.
pub const CLAIM_RECHECK: Duration = Duration::from_secs(1);

/// The lease a claim takes when the body names none.
pub const DEFAULT_LEASE_MS: i64 = 60_000;

/// A claim of up to `limit` tasks, waiting up to `wait_ms` for one.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    /// The worker's name, recorded on each claim.
    pub worker: String,
    /// Task kinds to take; empty takes any the token allows.
    #[serde(default)]
    pub kinds: Vec<String>,
    /// The versions of each kind the worker's code implements, e.g.
    /// `{"embedding": ["2"]}`: it is offered only tasks requested at one of
    /// them. A kind it states none for is offered at any version — the
    /// unsafe legacy mode, in which old code may run work requested for a
    /// newer version. Each kind here must be one of `kinds`.
    #[serde(default)]
    pub versions: BTreeMap<String, BTreeSet<String>>,
    /// The lease (60 000 ms when absent); heartbeats extend it.
    #[serde(default)]
    pub lease_ms: Option<i64>,
    /// How many tasks to take at most (1 when absent).
    #[serde(default)]
    pub limit: Option<usize>,
    /// How long to wait for claimable work when there is none (0: answer at
    /// once; capped at 30 000).
    #[serde(default)]
    pub wait_ms: u64,
}

/// One claimed task: everything a worker needs to run it and report back.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClaimView {
    pub claim_token: String,
    pub operation_id: String,
    pub media_id: Option<String>,
    pub region_id: Option<String>,
    /// The media item's file.
    pub path: Option<String>,
    pub task_kind: String,
    /// The version of the kind the task was requested at: the version the
    /// worker must run (null for a task recorded before versions were).
    pub kind_version: Option<String>,
    /// The revision claimed: the fence of every report.
    pub revision: String,
    #[schema(value_type = Object)]
    pub inputs: Value,
    pub lease_expires_at: String,
    /// 1 for the first claim of this revision.
    pub attempt: i64,
    pub media_kind: Option<String>,
    pub content_digest: Option<String>,
}

impl From<TaskClaim> for ClaimView {
    fn from(claim: TaskClaim) -> Self {
        ClaimView {
            claim_token: claim.claim_token,
            operation_id: claim.operation_id.to_string(),
            media_id: claim.media_id.map(|id| id.to_string()),
            region_id: claim.region_id.map(|id| id.to_string()),
            path: claim.path,
            task_kind: claim.task_kind,
            kind_version: claim.kind_version,
            revision: claim.revision,
            inputs: claim.inputs,
            lease_expires_at: claim.lease_expires_at.to_rfc3339(),
            attempt: claim.attempt,
            media_kind: claim.media_kind,
            content_digest: claim.content_digest,
        }
    }
}

/// The claims taken; empty when none came within `wait_ms`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimsAnswer {
    pub claims: Vec<ClaimView>,
}

/// Claims up to `limit` available tasks of the kinds asked (restricted to
/// the token's). With `wait_ms`, waits until work is committed — by this
/// service or, seen within `head_poll`, another process — or `wait_ms`
/// passed. While the service shuts down it answers no claims at once.
#[utoipa::path(post, path = "/api/v1/claims", tag = "work",
    params(("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body = ClaimBody,
    responses((status = 200, body = ClaimsAnswer), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn claim<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    JsonBody(body): JsonBody<ClaimBody>,
) -> ApiResult<Json<ClaimsAnswer>> {
    caller.require(Role::Worker)?;
    let kinds = caller.claimable_kinds(&body.kinds)?;
    let request = ClaimRequest {
        kinds,
        worker: body.worker.clone(),
        lease_ms: body.lease_ms.unwrap_or(DEFAULT_LEASE_MS),
        limit: body.limit.unwrap_or(1),
        principal: Some(caller.name.clone()),
        versions: body.versions.clone(),
    };
    // Under a key, a claim that took nothing is not recorded (see
    // `Engine::claim_tasks`): the long poll tries again under the same key.
    let context = key.context(actor(&caller, Some(&body.worker)));
    let wait = Duration::from_millis(body.wait_ms).min(app.config().max_wait);
    let deadline = Instant::now() + wait;
    // Subscribed before the first try, so a commit between a try and the
    // wait still wakes it.
    let mut wake = app.wake().subscribe();
    loop {
        if app.is_stopping() {
            return Ok(Json(ClaimsAnswer { claims: Vec::new() }));
        }
        let claims = app.engine().claim_tasks(&context, request.clone()).await?;
        if !claims.is_empty() {
            app.wake().bump();
            return Ok(Json(ClaimsAnswer {
                claims: claims.into_iter().map(ClaimView::from).collect(),
            }));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Json(ClaimsAnswer { claims: Vec::new() }));
        }
        let recheck = (deadline - now).min(CLAIM_RECHECK);
        tokio::select! {
            changed = wake.changed() => {
                if changed.is_err() {
                    return Ok(Json(ClaimsAnswer { claims: Vec::new() }));
                }
            }
            _ = tokio::time::sleep(recheck) => {}
            _ = app.stopped() => {}
        }
    }
}

/// The fence and actor every report on a claim may carry.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct FenceFields {
    /// The revision claimed; checked when given.
    #[serde(default)]
    pub revision: Option<String>,
    /// The worker's name, recorded beside the token's name as the actor.
    #[serde(default)]
    pub worker: Option<String>,
}

/// The fence of a report on `token`, after the caller may report on it.
pub(crate) async fn fenced<S: Store>(
    app: &App<S>,
    caller: &Caller,
    token: &str,
    fields: &FenceFields,
) -> ApiResult<Fence> {
    caller.require(Role::Worker)?;
    parse_uuid("claim token", token)?;
    may_report_on(app, caller, token).await?;
    Ok(Fence {
        claim_token: token.to_string(),
        revision: fields.revision.clone(),
    })
}

pub(crate) fn context(caller: &Caller, fields: &FenceFields, key: &IdempotencyKey) -> CommandContext {
    key.context(actor(caller, fields.worker.as_deref()))
}

/// The actor a command of `caller` records: the authenticated principal,
/// with the worker name the body gives beside it when that differs, so the
/// log answers which token did it.
pub(crate) fn actor(caller: &Caller, worker: Option<&str>) -> String {
    match worker {
        Some(worker) if worker != caller.name => format!("{} (worker {worker})", caller.name),
        _ => caller.name.clone(),
    }
}

/// A claim is reported on only by the principal that took it (403
/// otherwise), and a token limited to task kinds reports only on claims of
/// those kinds. An unknown claim is left to the engine, which answers 409.
async fn may_report_on<S: Store>(app: &App<S>, caller: &Caller, token: &str) -> ApiResult<()> {
    let lease = app
        .engine()
        .store()
        .lease(token)
        .await
        .map_err(|error| ApiError::from(opledger_engine::EngineError::from(error)))?;
    let Some(lease) = lease else { return Ok(()) };
    if lease
        .principal
        .as_ref()
        .is_some_and(|principal| *principal != caller.name)
    {
        return Err(ApiError::forbidden(format!(
            "this claim was taken by another token; token {} may not report on it",
            quoted(&caller.name)
        )));
    }
    if caller.kinds.is_empty() || caller.role == Some(Role::Admin) {
        return Ok(());
    }
    if let Some(view) = app.engine().task_by_operation(lease.operation_id).await? {
        caller.may_work_on(&view.state.task_kind)?;
    }
    Ok(())
}

/// A heartbeat: optionally a new lease length.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatBody {
    /// Extend the lease by this much (the claim's own length when absent).
    #[serde(default)]
    pub lease_ms: Option<i64>,
    #[serde(default)]
    pub revision: Option<String>,
    #[serde(default)]
    pub worker: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HeartbeatAnswer {
    pub lease_expires_at: String,
    /// Stop, remove temporary outputs, then acknowledge the cancel.
    pub cancel_requested: bool,
}

/// Extends a claim's lease and says whether cancellation was requested.
/// Liveness only: nothing is appended.
#[utoipa::path(post, path = "/api/v1/claims/{token}/heartbeat", tag = "work",
    params(("token" = String, Path, description = "The claim token"), ("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body(content = Option<HeartbeatBody>),
    responses((status = 200, body = HeartbeatAnswer), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn heartbeat<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    Path(token): Path<String>,
    OptionalBody(body): OptionalBody<HeartbeatBody>,
) -> ApiResult<Json<HeartbeatAnswer>> {
    let fields = FenceFields {
        revision: body.revision,
        worker: body.worker,
    };
    let fence = fenced(&app, &caller, &token, &fields).await?;
    let outcome = app
        .engine()
        .heartbeat_once(key.0.as_ref(), &fence, body.lease_ms)
        .await?;
    Ok(Json(HeartbeatAnswer {
        lease_expires_at: outcome.lease_expires_at.to_rfc3339(),
        cancel_requested: outcome.cancel_requested,
    }))
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProgressBody {
    pub phase: String,
    pub processed: i64,
    #[serde(default)]
    pub total: Option<i64>,
    #[serde(default)]
    pub revision: Option<String>,
    #[serde(default)]
    pub worker: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProgressAnswer {
    /// `true`.
    pub ok: bool,
}

/// Records progress: a new phase is an event, counters within a phase are
/// liveness.
#[utoipa::path(post, path = "/api/v1/claims/{token}/progress", tag = "work",
    params(("token" = String, Path, description = "The claim token"), ("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body = ProgressBody,
    responses((status = 200, body = ProgressAnswer), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn progress<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    Path(token): Path<String>,
    JsonBody(body): JsonBody<ProgressBody>,
) -> ApiResult<Json<ProgressAnswer>> {
    let fields = FenceFields {
        revision: body.revision,
        worker: body.worker,
    };
    let fence = fenced(&app, &caller, &token, &fields).await?;
    let progress = Progress {
        phase: body.phase,
        processed: body.processed,
        total: body.total,
    };
    app.engine()
        .report_progress(&context(&caller, &fields, &key), &fence, progress)
        .await?;
    app.wake().bump();
    Ok(Json(ProgressAnswer { ok: true }))
}

/// A completion: an output, or no result and why.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteBody {
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    /// It ran and found nothing to produce, for this reason.
    #[serde(default)]
    pub no_result: Option<String>,
    #[serde(default)]
    pub revision: Option<String>,
    #[serde(default)]
    pub worker: Option<String>,
}

pub(crate) fn completion(output: Option<Value>, no_result: Option<String>, limit: usize) -> ApiResult<Completion> {
    match (output, no_result) {
        (Some(_), Some(_)) => Err(ApiError::invalid("give output or no_result, not both")),
        (None, Some(reason)) => Ok(Completion::NoResult { reason }),
        (output, None) => {
            let output = output.unwrap_or(Value::Null);
            let size = serde_json::to_string(&output).map_or(0, |text| text.len());
            if size > limit {
                return Err(ApiError::invalid(format!(
                    "the output is {size} bytes as JSON, more than the {limit} an output may take \
                     (the service's --max-text-bytes)"
                )));
            }
            Ok(Completion::Output(output))
        }
    }
}

/// Completes a claimed task (fenced).
#[utoipa::path(post, path = "/api/v1/claims/{token}/complete", tag = "work",
    params(("token" = String, Path, description = "The claim token"), ("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body(content = Option<CompleteBody>),
    responses((status = 200, body = TaskOutcomeAnswer), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn complete<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    Path(token): Path<String>,
    OptionalBody(body): OptionalBody<CompleteBody>,
) -> ApiResult<Json<TaskOutcomeAnswer>> {
    let fields = FenceFields {
        revision: body.revision,
        worker: body.worker,
    };
    let fence = fenced(&app, &caller, &token, &fields).await?;
    let completion = completion(body.output, body.no_result, app.config().max_text_bytes)?;
    let outcome = app
        .engine()
        .complete_task(&context(&caller, &fields, &key), &fence, completion)
        .await?;
    app.wake().bump();
    Ok(Json(outcome.into()))
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailBody {
    pub error: String,
    /// Final now, no retry.
    #[serde(default)]
    pub terminal: bool,
    #[serde(default)]
    pub revision: Option<String>,
    #[serde(default)]
    pub worker: Option<String>,
}

/// Fails a claimed task (fenced): retried with backoff while attempts
/// remain, unless `terminal`.
#[utoipa::path(post, path = "/api/v1/claims/{token}/fail", tag = "work",
    params(("token" = String, Path, description = "The claim token"), ("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body = FailBody,
    responses((status = 200, body = TaskOutcomeAnswer), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn fail<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    Path(token): Path<String>,
    JsonBody(body): JsonBody<FailBody>,
) -> ApiResult<Json<TaskOutcomeAnswer>> {
    let fields = FenceFields {
        revision: body.revision,
        worker: body.worker,
    };
    let fence = fenced(&app, &caller, &token, &fields).await?;
    let outcome = app
        .engine()
        .fail_task(&context(&caller, &fields, &key), &fence, &body.error, body.terminal)
        .await?;
    app.wake().bump();
    Ok(Json(outcome.into()))
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub revision: Option<String>,
    #[serde(default)]
    pub worker: Option<String>,
}

/// Gives a claim back unused: queued again at once, no attempt counted.
#[utoipa::path(post, path = "/api/v1/claims/{token}/release", tag = "work",
    params(("token" = String, Path, description = "The claim token"), ("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body(content = Option<ReleaseBody>),
    responses((status = 200, body = TaskOutcomeAnswer), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn release<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    Path(token): Path<String>,
    OptionalBody(body): OptionalBody<ReleaseBody>,
) -> ApiResult<Json<TaskOutcomeAnswer>> {
    let fields = FenceFields {
        revision: body.revision,
        worker: body.worker,
    };
    let fence = fenced(&app, &caller, &token, &fields).await?;
    let reason = body.reason.unwrap_or_default();
    let outcome = app
        .engine()
        .release_task(&context(&caller, &fields, &key), &fence, &reason)
        .await?;
    app.wake().bump();
    Ok(Json(outcome.into()))
}

/// The worker stopped after a cancel request and removed its temporary
/// outputs: the task is `cancelled`.
#[utoipa::path(post, path = "/api/v1/claims/{token}/ack-cancel", tag = "work",
    params(("token" = String, Path, description = "The claim token"), ("Idempotency-Key" = Option<String>, Header, description = "Names this command for its retries (1 to 200 visible ASCII characters, e.g. a UUID): retried with the same key, it answers the first attempt's result and records nothing more; the same key for another command is 409. Kept 7 days.")),
    request_body(content = Option<FenceFields>),
    responses((status = 200, body = TaskOutcomeAnswer), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn ack_cancel<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    Path(token): Path<String>,
    OptionalBody(fields): OptionalBody<FenceFields>,
) -> ApiResult<Json<TaskOutcomeAnswer>> {
    let fence = fenced(&app, &caller, &token, &fields).await?;
    let outcome = app
        .engine()
        .acknowledge_cancel(&context(&caller, &fields, &key), &fence)
        .await?;
    app.wake().bump();
    Ok(Json(outcome.into()))
}
