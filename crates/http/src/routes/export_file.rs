//! An export's file, streamed by the service itself: the one GET that
//! takes a download attempt reads the artifact in 64 KiB chunks into the
//! response body (no sendfile shortcut, which would skip the `started`
//! record), asks before every chunk whether the job may still be served,
//! and records the attempt `started` once its first chunk has been handed
//! to the connection — when the body is polled for the next one — or
//! `failed`, logged, when streaming breaks off. HEAD answers the same
//! headers and never takes the attempt. It must not know SQL, the backend,
//! or the artifact directory's layout beyond the path it is given.

use super::exports::{artifact_dir, job_token, servable_job};
use super::params::Query;
use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{Caller, Params};
use crate::files::file_headers;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use opledger_domain::OperationId;
use opledger_store::Store;
use opledger_supervise::attempts::{AttemptState, Refused};
use opledger_supervise::jobs::{self, Artifact};
use tokio::io::AsyncReadExt;

/// The size of each read and of each chunk handed to the connection.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Streams the artifact of a download attempt (`?attempt=ID`, from `POST
/// …/downloads`). Exactly one GET takes a pending attempt: a second one is
/// 409, an attempt not taken within 45 s is 410. HEAD answers the headers
/// and leaves the attempt pending. Responses carry `Content-Length`,
/// `Last-Modified` and `X-Accel-Buffering: no` (a proxy passes the chunks
/// on as they come).
#[utoipa::path(get, path = "/api/v1/exports/{token}/file", tag = "exports",
    params(("token" = String, Path, description = "The job token"),
        ("attempt" = u64, Query, description = "The download attempt's id")),
    responses(
        (status = 200, description = "The artifact's bytes (`text/csv` or `application/json`)",
            content_type = "application/octet-stream",
            headers(("Last-Modified" = String, description = "When the artifact was written"),
                ("X-Accel-Buffering" = String, description = "`no`"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 410, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn file<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    method: Method,
    Path(text): Path<String>,
    params: Params<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let (principal, policy) = caller.principal(Role::Reader)?;
    let dir = artifact_dir(&app)?;
    let token = job_token(&text)?;
    let attempt_id = Query::of(params, &["attempt"])?
        .parsed::<u64>("attempt", "a download attempt's id")?
        .ok_or_else(|| ApiError::malformed("attempt is missing: POST /api/v1/exports/{token}/downloads first"))?;
    let (job, path, artifact) = servable_job(&app, dir, token, principal, policy).await?;
    let gone = |error: std::io::Error| {
        ApiError::gone(format!(
            "the artifact of export {job} cannot be read ({})",
            error.kind()
        ))
    };
    let file = tokio::fs::File::open(&path).await.map_err(gone)?;
    let metadata = file.metadata().await.map_err(gone)?;
    if metadata.len() != artifact.size {
        tracing::error!(%job, on_disk = metadata.len(), recorded = artifact.size, "an artifact's size differs from its record");
        return Err(ApiError::internal(format!(
            "the artifact of export {job} is not the file its job recorded; it is logged"
        )));
    }
    let headers = headers(&artifact, &metadata)?;
    let now = app.engine().now();
    if method == Method::HEAD {
        let attempt = app
            .attempts()
            .get(attempt_id, now)
            .filter(|attempt| attempt.job == job)
            .ok_or_else(|| unknown(attempt_id, job))?;
        return match attempt.state {
            AttemptState::Pending => Ok((headers, file_headers(), Body::empty()).into_response()),
            state => Err(refused(attempt_id, Refused::Taken(state))),
        };
    }
    app.attempts()
        .take(job, attempt_id, now)
        .map_err(|refusal| refused(attempt_id, refusal))?;
    let sending = Sending {
        app: app.clone(),
        file,
        job,
        attempt: attempt_id,
        artifact,
        left: metadata.len(),
        handed: false,
        started: false,
        done: false,
    };
    let stream = futures::stream::unfold(sending, |mut sending| async move {
        sending.next().await.map(|chunk| (chunk, sending))
    });
    Ok((headers, file_headers(), Body::from_stream(stream)).into_response())
}

fn unknown(attempt_id: u64, job: OperationId) -> ApiError {
    ApiError::not_found(format!("export {job} has no download attempt {attempt_id}"))
}

fn refused(attempt_id: u64, refusal: Refused) -> ApiError {
    match refusal {
        Refused::Unknown => ApiError::not_found(format!("no download attempt {attempt_id} of this export")),
        Refused::Expired => ApiError::gone(format!(
            "download attempt {attempt_id} was not taken within 45 s and expired: register another"
        )),
        Refused::Taken(state) => ApiError::conflict(format!(
            "download attempt {attempt_id} is {} already: one GET streams it; register another",
            serde_json::to_value(state)
                .ok()
                .and_then(|value| value.as_str().map(str::to_string))
                .unwrap_or_default()
        )),
    }
}

/// The response's headers: type by format, length, when it was written,
/// and no buffering by a proxy in front.
fn headers(artifact: &Artifact, metadata: &std::fs::Metadata) -> ApiResult<[(header::HeaderName, HeaderValue); 6]> {
    let content_type = if artifact.file.ends_with(".csv") {
        "text/csv; charset=utf-8"
    } else {
        "application/json"
    };
    let modified = metadata
        .modified()
        .map(chrono::DateTime::<chrono::Utc>::from)
        .map_err(|_| ApiError::internal("the artifact's modification time cannot be read"))?;
    let value = |text: String| {
        HeaderValue::from_str(&text).map_err(|_| ApiError::internal("an artifact's name is not a header value"))
    };
    Ok([
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_LENGTH, HeaderValue::from(metadata.len())),
        (
            header::LAST_MODIFIED,
            value(modified.format("%a, %d %b %Y %H:%M:%S GMT").to_string())?,
        ),
        (
            header::HeaderName::from_static("x-accel-buffering"),
            HeaderValue::from_static("no"),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        (
            header::CONTENT_DISPOSITION,
            value(format!("attachment; filename=\"export-{}\"", artifact.file))?,
        ),
    ])
}

/// One attempt's file on its way out.
struct Sending<S: Store> {
    app: App<S>,
    file: tokio::fs::File,
    job: OperationId,
    attempt: u64,
    artifact: Artifact,
    /// Bytes not yet handed out.
    left: u64,
    /// A chunk has been handed out.
    handed: bool,
    /// `started` is recorded.
    started: bool,
    /// The stream ended, whole or broken off (and recorded so).
    done: bool,
}

impl<S: Store> Sending<S> {
    /// The next chunk; None once the file is out or streaming broke off.
    async fn next(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.done {
            return None;
        }
        if self.handed {
            // Polled for more: the connection has taken the chunk before.
            self.record_started();
        }
        if self.left == 0 {
            self.done = true;
            self.record_started();
            return None;
        }
        if let Err(error) = jobs::still_servable(self.app.engine(), self.job, &self.artifact).await {
            return Some(Err(self.fail(error.to_string())));
        }
        let want = usize::try_from(self.left).unwrap_or(usize::MAX).min(CHUNK_BYTES);
        let mut chunk = vec![0u8; want];
        let mut filled = 0;
        while filled < want {
            match self.file.read(&mut chunk[filled..]).await {
                Ok(0) => return Some(Err(self.fail("the artifact file ended before its recorded size".into()))),
                Ok(read) => filled += read,
                Err(error) => return Some(Err(self.fail(format!("reading the artifact: {error}")))),
            }
        }
        self.left -= want as u64;
        self.handed = true;
        Some(Ok(Bytes::from(chunk)))
    }

    fn record_started(&mut self) {
        if !self.started {
            self.started = true;
            self.app.attempts().started(self.attempt);
        }
    }

    /// Logs why streaming broke off and records the attempt `failed`.
    fn fail(&mut self, reason: String) -> std::io::Error {
        tracing::warn!(job = %self.job, attempt = self.attempt, %reason, "an export download broke off");
        self.app.attempts().failed(self.attempt);
        self.done = true;
        std::io::Error::other(reason)
    }
}

impl<S: Store> Drop for Sending<S> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.left == 0 {
            // Every byte was handed out; the end was just not asked for.
            self.record_started();
        } else {
            // The connection went away with bytes still to send.
            let _ = self.fail(format!("the connection closed with {} bytes unsent", self.left));
        }
    }
}
