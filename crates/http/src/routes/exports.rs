//! Exports over HTTP: register one, read where it stands, cancel it, and
//! register a download attempt of its artifact; the file itself streams
//! from [`super::export_file`]. Every route calls what `opledger export`
//! calls (`opledger_supervise`), so an answer is what the command prints.
//!
//! A job token is bound to the principal that made the job (its token
//! entry's `name`) and to that entry's access-policy revision
//! ([`crate::TokenEntry::policy_revision`]). Any named token of role
//! `reader` or above may export — an export is a read of the ledger — and
//! only its own jobs are its to read, cancel and download, whatever its
//! role. Anonymous callers cannot export. It must not know SQL, the
//! backend, or how a supervisor runs a job.

use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{parse_uuid, Caller, JsonBody};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use opledger_domain::{quoted, BatchId, DomainError, OperationId, OperationStatus};
use opledger_engine::{CommandContext, EngineError};
use opledger_store::Store;
use opledger_supervise::attempts::{Attempt, AttemptState};
use opledger_supervise::export::{Format, What};
use opledger_supervise::{jobs, token, ArtifactDir, ExportRequest, ExportStatus, Limits, SuperviseError};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What to export.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportBody {
    /// `operations`, `capability_counts` or `batch_items`.
    #[schema(value_type = String, example = "operations")]
    pub what: What,
    /// `csv` or `json`.
    #[schema(value_type = String, example = "csv")]
    pub format: Format,
    /// The batch of a `batch_items` export (and only of one).
    #[serde(default)]
    pub batch: Option<String>,
    /// An earlier log position to export at (the log's head when absent).
    #[serde(default)]
    pub as_of_seq: Option<i64>,
}

/// A registered export: what `export create --json` prints.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedExport {
    /// The token to read, cancel and download the job with; it is the
    /// caller's alone.
    pub job_token: String,
    pub operation_id: String,
    /// The log position the export shows the ledger at.
    pub as_of_seq: i64,
}

/// Where an export stands: the fields `export status --json` prints (the
/// handler serializes the same value).
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub struct ExportStatusView {
    pub operation_id: String,
    /// `queued`, `running`, `succeeded`, `failed_terminal`, `cancelled`, …
    pub status: String,
    /// `aggregating` then `writing` while it runs.
    pub phase: Option<String>,
    pub processed: Option<u64>,
    /// Null while aggregating: the size is not known yet.
    pub total: Option<u64>,
    /// `rows` or `pivot_cells`.
    pub logical_count_unit: String,
    /// Regular result rows, subtotal and total rows apart.
    pub regular_rows: Option<u64>,
    /// The supervisor's last heartbeat of the job (while it runs).
    pub heartbeat_at: Option<String>,
    /// The last progress written.
    pub updated_at: String,
    pub as_of_seq: i64,
    pub what: String,
    pub format: String,
    pub cancel_requested: bool,
    /// Why it failed or was cancelled.
    pub reason: Option<String>,
    /// The file, while it is kept.
    pub artifact: Option<ArtifactView>,
    /// The artifact existed and expired.
    pub expired: bool,
}

/// A finished export's file.
#[derive(Debug, Serialize, ToSchema)]
#[allow(dead_code)]
pub struct ArtifactView {
    pub size: u64,
    pub sha256: String,
    pub expires_at: String,
    /// The file's name in the artifact directory.
    pub file: String,
}

/// The job's status after a cancel.
#[derive(Debug, Serialize, ToSchema)]
pub struct CancelledExport {
    /// `cancelled` at once for a queued job; a running one stays `running`
    /// (with `cancel_requested`) until its supervisor has stopped the child
    /// and removed its files.
    #[schema(value_type = String)]
    pub status: OperationStatus,
}

/// A download attempt: GET `file` once to stream the artifact.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptView {
    pub attempt_id: u64,
    /// `pending` until a GET takes it; `streaming`, then `started` once its
    /// first chunk reached the connection; `failed`, `expired`.
    #[schema(value_type = String)]
    pub state: AttemptState,
    pub created_at: String,
    /// A pending attempt not taken by then expires (45 s after it was made).
    pub expires_at: String,
    /// Where to GET the file.
    pub file: String,
}

impl AttemptView {
    fn of(attempt: Attempt, job_token: &str) -> Self {
        AttemptView {
            attempt_id: attempt.attempt_id,
            state: attempt.state,
            created_at: attempt.created_at.to_rfc3339(),
            expires_at: attempt.expires_at.to_rfc3339(),
            file: format!("/api/v1/exports/{job_token}/file?attempt={}", attempt.attempt_id),
        }
    }
}

/// The service's artifact directory, or 503 without one.
pub(super) fn artifact_dir<S: Store>(app: &App<S>) -> ApiResult<&ArtifactDir> {
    app.config().artifact_dir.as_ref().ok_or_else(|| {
        ApiError::unavailable(
            "this service has no artifact directory (opledger serve --artifact-dir DIR, or OPLEDGER_ARTIFACT_DIR)",
        )
    })
}

/// A job token from the path: 400 when it is not a token at all.
pub(super) fn job_token(text: &str) -> ApiResult<&str> {
    if token::is_token_shaped(text) {
        Ok(text)
    } else {
        Err(ApiError::malformed(format!("{} is not a job token", quoted(text))))
    }
}

/// A refusal of supervision as HTTP: a token that does not verify for the
/// caller (another principal's, or made under an older policy revision) is
/// 403; an expired artifact, or a job that is gone or no longer succeeded,
/// is 410; the engine's errors keep their usual status (no supervisor
/// alive is 503).
pub(super) fn refusal(error: SuperviseError) -> ApiError {
    match error {
        SuperviseError::Token(message) => ApiError::forbidden(message),
        SuperviseError::Gone(message) => ApiError::gone(message),
        SuperviseError::Engine(EngineError::Domain(DomainError::NotFound { what, id })) => {
            ApiError::gone(format!("the {what} {} of this job is gone", quoted(&id)))
        }
        SuperviseError::Engine(engine) => ApiError::from(engine),
        SuperviseError::Io { .. } => {
            tracing::error!(%error, "the artifact directory failed");
            ApiError::internal("the artifact directory failed on this request; it is logged")
        }
    }
}

/// Registers an export of the ledger as of its log's head (or
/// `as_of_seq`), run by a supervisor (`opledger supervise`) sharing the
/// service's artifact directory; 503 when none is alive, as the command's
/// exit 5. The job token answered is bound to the caller.
#[utoipa::path(post, path = "/api/v1/exports", tag = "exports",
    request_body = ExportBody,
    responses((status = 201, body = CreatedExport), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    JsonBody(body): JsonBody<ExportBody>,
) -> ApiResult<(StatusCode, Json<CreatedExport>)> {
    let (principal, policy) = caller.principal(Role::Reader)?;
    let dir = artifact_dir(&app)?;
    let batch = match &body.batch {
        Some(id) => Some(BatchId(parse_uuid("batch id", id)?)),
        None => None,
    };
    let request = ExportRequest {
        what: body.what,
        format: body.format,
        batch,
        as_of_seq: body.as_of_seq,
        principal: principal.to_string(),
        policy: policy.to_string(),
    };
    let context = CommandContext::actor(principal);
    let registered = opledger_supervise::create_export(app.engine(), dir, &Limits::default(), &context, request)
        .await
        .map_err(|error| match error {
            SuperviseError::Engine(engine) => ApiError::from(engine),
            other => refusal(other),
        })?;
    app.wake().bump();
    Ok((
        StatusCode::CREATED,
        Json(CreatedExport {
            job_token: registered.job_token,
            operation_id: registered.operation_id.to_string(),
            as_of_seq: registered.as_of_seq,
        }),
    ))
}

/// Where the export stands: status, phase, counts, heartbeat, artifact.
#[utoipa::path(get, path = "/api/v1/exports/{token}", tag = "exports",
    params(("token" = String, Path, description = "The job token `POST /api/v1/exports` answered")),
    responses((status = 200, body = ExportStatusView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 410, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn status<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    Path(text): Path<String>,
) -> ApiResult<Json<ExportStatus>> {
    let (principal, policy) = caller.principal(Role::Reader)?;
    let dir = artifact_dir(&app)?;
    let token = job_token(&text)?;
    let status = opledger_supervise::export_status(app.engine(), dir, token, principal, policy)
        .await
        .map_err(refusal)?;
    Ok(Json(status))
}

/// Stops the export: at once when it is queued; a running one has its
/// cancel recorded now (durable) and becomes `cancelled` once its
/// supervisor stopped the child and removed its files. 409 when it has
/// already ended.
#[utoipa::path(delete, path = "/api/v1/exports/{token}", tag = "exports",
    params(("token" = String, Path, description = "The job token")),
    responses((status = 200, body = CancelledExport), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 410, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    Path(text): Path<String>,
) -> ApiResult<Json<CancelledExport>> {
    let (principal, policy) = caller.principal(Role::Reader)?;
    let dir = artifact_dir(&app)?;
    let token = job_token(&text)?;
    let context = CommandContext::actor(principal);
    let status = opledger_supervise::cancel_export(app.engine(), dir, &context, token, principal, policy)
        .await
        .map_err(refusal)?;
    app.wake().bump();
    Ok(Json(CancelledExport { status }))
}

/// Registers a download attempt of the export's artifact, or answers the
/// one already pending for the job. Its `file` is streamed by one GET
/// within 45 s. 409 while the job has no file yet; 410 once the artifact
/// expired.
#[utoipa::path(post, path = "/api/v1/exports/{token}/downloads", tag = "exports",
    params(("token" = String, Path, description = "The job token")),
    responses((status = 200, body = AttemptView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 410, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn downloads<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    Path(text): Path<String>,
) -> ApiResult<Json<AttemptView>> {
    let (principal, policy) = caller.principal(Role::Reader)?;
    let dir = artifact_dir(&app)?;
    let token = job_token(&text)?;
    let job = servable_job(&app, dir, token, principal, policy).await?.0;
    let attempt = app.attempts().register(job, app.engine().now());
    Ok(Json(AttemptView::of(attempt, token)))
}

/// The job a token names and its artifact's path and record, when the
/// caller may have it now.
pub(super) async fn servable_job<S: Store>(
    app: &App<S>,
    dir: &ArtifactDir,
    token: &str,
    principal: &str,
    policy: &str,
) -> ApiResult<(OperationId, std::path::PathBuf, jobs::Artifact)> {
    let (path, artifact) = jobs::artifact_path(app.engine(), dir, token, principal, policy)
        .await
        .map_err(refusal)?;
    // The token verified above: the job it names is the artifact's.
    let job = token::named_job(token).ok_or_else(|| ApiError::malformed("not a job token"))?;
    Ok((job, path, artifact))
}
