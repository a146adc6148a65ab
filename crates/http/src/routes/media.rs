//! Media items: the paged listing (`media list`), one item with everything
//! about it (`media show`, by id or by path), its capabilities, its
//! thumbnail's file, and registering one (admin).
//!
//! It must not know where thumbnails come from beyond what the engine's
//! detail names (the thumbnail task's output path, untrusted: `files`
//! decides whether it may be served) nor any registry rule: the engine
//! refuses what is invalid.

use super::ops::OperationView;
use super::params::Query;
use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{parse_uuid, Caller, JsonBody, Params};
use crate::files::{file_headers, Refusal};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use opledger_domain::projections::CapabilityRow;
use opledger_domain::{quoted, BatchId, CapabilityStatus, MediaId, OperationId, Timestamp};
use opledger_engine::{
    BatchMembership, CapabilityItem, CommandContext, Listing, MediaDetail, MediaFilter, MediaItem, MediaRef,
    ReviewItem, THUMBNAIL_CAPABILITY,
};
use opledger_store::Store;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// One media item as listings show it.
#[derive(Debug, Serialize, ToSchema)]
pub struct MediaView {
    #[schema(value_type = String, format = Uuid)]
    pub media_id: MediaId,
    pub path: String,
    pub media_kind: String,
    pub content_digest: Option<String>,
    pub byte_size: Option<i64>,
    #[schema(value_type = String, format = DateTime)]
    pub registered_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

impl From<MediaItem> for MediaView {
    fn from(item: MediaItem) -> Self {
        MediaView {
            media_id: item.media_id,
            path: item.path,
            media_kind: item.media_kind,
            content_digest: item.content_digest,
            byte_size: item.byte_size,
            registered_at: item.registered_at,
            updated_at: item.updated_at,
        }
    }
}

/// One page of media items.
#[derive(Debug, Serialize, ToSchema)]
pub struct MediaPage {
    pub items: Vec<MediaView>,
    /// The cursor of the next page (`after=`); null when the listing ended.
    pub next: Option<String>,
}

/// One capability of an item, as the detail shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct CapabilitySummary {
    pub capability: String,
    #[schema(value_type = String)]
    pub status: CapabilityStatus,
    pub task_kind: String,
    #[schema(value_type = String, format = Uuid)]
    pub operation_id: OperationId,
    pub required: bool,
    pub produced_version: Option<String>,
    pub current_version: Option<String>,
    pub reason: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

impl From<CapabilityItem> for CapabilitySummary {
    fn from(item: CapabilityItem) -> Self {
        CapabilitySummary {
            capability: item.capability,
            status: item.status,
            task_kind: item.task_kind,
            operation_id: item.operation_id,
            required: item.required,
            produced_version: item.produced_version,
            current_version: item.current_version,
            reason: item.reason,
            updated_at: item.updated_at,
        }
    }
}

/// A batch the item's operations are in.
#[derive(Debug, Serialize, ToSchema)]
pub struct MembershipView {
    #[schema(value_type = String, format = Uuid)]
    pub batch_id: BatchId,
    pub name: String,
    pub status: String,
    #[schema(value_type = Vec<String>)]
    pub operation_ids: Vec<OperationId>,
}

impl From<BatchMembership> for MembershipView {
    fn from(batch: BatchMembership) -> Self {
        MembershipView {
            batch_id: batch.batch_id,
            name: batch.name,
            status: batch.status,
            operation_ids: batch.operation_ids,
        }
    }
}

/// An open review entry of the item's.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReviewSummary {
    pub entry_id: i64,
    #[schema(value_type = String, format = Uuid)]
    pub operation_id: OperationId,
    pub kind: String,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub media_id: Option<MediaId>,
    pub path: Option<String>,
    pub reason_code: String,
    #[schema(value_type = String)]
    pub operation_status: opledger_domain::OperationStatus,
    pub detail: Option<String>,
    #[schema(value_type = String)]
    pub state: opledger_domain::review::EntryState,
    #[schema(value_type = String, format = DateTime)]
    pub opened_at: Timestamp,
}

impl From<ReviewItem> for ReviewSummary {
    fn from(item: ReviewItem) -> Self {
        ReviewSummary {
            entry_id: item.entry_id,
            operation_id: item.operation_id,
            kind: item.kind,
            media_id: item.media_id,
            path: item.path,
            reason_code: item.reason_code,
            operation_status: item.operation_status,
            detail: item.detail,
            state: item.state,
            opened_at: item.opened_at,
        }
    }
}

/// Everything about one media item: what `opledger media show --json`
/// prints.
#[derive(Debug, Serialize, ToSchema)]
pub struct MediaDetailView {
    pub media: MediaView,
    /// Other items registered at the same path.
    #[schema(value_type = Vec<String>)]
    pub others_at_path: Vec<MediaId>,
    pub capabilities: Vec<CapabilitySummary>,
    /// Its operations, newest first.
    pub operations: Vec<OperationView>,
    pub batches: Vec<MembershipView>,
    /// Its open review entries, oldest first.
    pub review: Vec<ReviewSummary>,
    /// The file the current thumbnail task wrote, if it wrote one.
    pub thumbnail: Option<String>,
}

impl From<MediaDetail> for MediaDetailView {
    fn from(detail: MediaDetail) -> Self {
        MediaDetailView {
            media: detail.media.into(),
            others_at_path: detail.others_at_path,
            capabilities: detail.capabilities.into_iter().map(Into::into).collect(),
            operations: detail.operations.into_iter().map(Into::into).collect(),
            batches: detail.batches.into_iter().map(Into::into).collect(),
            review: detail.review.into_iter().map(Into::into).collect(),
            thumbnail: detail.thumbnail,
        }
    }
}

/// One capability state, every column: what `opledger capabilities
/// --json` prints for each.
#[derive(Debug, Serialize, ToSchema)]
pub struct CapabilityView {
    pub capability: String,
    pub task_kind: String,
    #[schema(value_type = String)]
    pub status: CapabilityStatus,
    pub required: bool,
    #[schema(value_type = String, format = Uuid)]
    pub operation_id: OperationId,
    pub requested_version: Option<String>,
    pub produced_version: Option<String>,
    pub current_version: Option<String>,
    pub produced_revision: Option<String>,
    pub reason: Option<String>,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

impl CapabilityView {
    fn of(row: &CapabilityRow) -> Self {
        CapabilityView {
            capability: row.capability.clone(),
            task_kind: row.task_kind.clone(),
            status: row.status,
            required: row.required,
            operation_id: row.operation_id,
            requested_version: row.requested_version.clone(),
            produced_version: row.produced_version.clone(),
            current_version: row.current_version.clone(),
            produced_revision: row.produced_revision.clone(),
            reason: row.reason.clone(),
            updated_at: row.updated_at,
        }
    }
}

/// A media item's capabilities.
#[derive(Debug, Serialize, ToSchema)]
pub struct Capabilities {
    #[schema(value_type = String, format = Uuid)]
    pub media_id: MediaId,
    pub capabilities: Vec<CapabilityView>,
}

/// The filters of the media listing (documentation: the handler reads
/// them through [`Query`]).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MediaParams {
    /// Only items of this media kind (e.g. `image`).
    pub kind: Option<String>,
    /// Only items whose capability of this name ...
    pub capability: Option<String>,
    /// ... is in one of these statuses (repeat for several; needs `capability`).
    #[param(style = Form, explode)]
    pub capability_status: Option<Vec<String>>,
    /// Only items whose path starts with this text (exact case).
    pub path_prefix: Option<String>,
    /// Rows on the page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` cursor of the page before.
    pub after: Option<String>,
}

const MEDIA_KEYS: [&str; 6] = [
    "kind",
    "capability",
    "capability_status",
    "path_prefix",
    "limit",
    "after",
];

/// Media items by path (bytewise), a page at a time: what `opledger media
/// list --json` prints.
#[utoipa::path(get, path = "/api/v1/media", tag = "read", params(MediaParams),
    responses((status = 200, body = MediaPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    params: Params<Vec<(String, String)>>,
) -> ApiResult<Json<MediaPage>> {
    caller.require(Role::Reader)?;
    let query = Query::of(params, &MEDIA_KEYS)?;
    let statuses: Vec<&str> = CapabilityStatus::ALL.iter().map(|status| status.as_str()).collect();
    let filter = MediaFilter {
        kind: query.one("kind")?,
        path_prefix: query.one("path_prefix")?,
        capability: query.one("capability")?,
        capability_statuses: query.vocabulary("capability_status", &statuses)?,
    };
    let page = app.engine().list_media(&filter, &query.page(Listing::Media)?).await?;
    Ok(Json(MediaPage {
        items: page.items.into_iter().map(MediaView::from).collect(),
        next: page.next,
    }))
}

/// A media item with its capabilities, operations, batches, open review
/// entries and thumbnail: what `opledger media show ID --json` prints.
#[utoipa::path(get, path = "/api/v1/media/{id}", tag = "read",
    params(("id" = String, Path, description = "The media item's id", format = Uuid)),
    responses((status = 200, body = MediaDetailView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<MediaDetailView>> {
    caller.require(Role::Reader)?;
    let media_id = MediaId(parse_uuid("media id", &id)?);
    let detail = app.engine().media_detail(&MediaRef::Id(media_id)).await?;
    Ok(Json(detail.into()))
}

/// Where to look a media item up.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ByPath {
    /// The path it was registered at (the latest registered there, when
    /// several were; the others are under `others_at_path`).
    pub path: String,
}

/// The media item registered at a path: what `opledger media show --path
/// PATH --json` prints.
#[utoipa::path(get, path = "/api/v1/media/by-path", tag = "read", params(ByPath),
    responses((status = 200, body = MediaDetailView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn by_path<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    params: Params<Vec<(String, String)>>,
) -> ApiResult<Json<MediaDetailView>> {
    caller.require(Role::Reader)?;
    let path = Query::of(params, &["path"])?
        .one("path")?
        .ok_or_else(|| ApiError::malformed("path is required: the path the item was registered at"))?;
    let detail = app.engine().media_detail(&MediaRef::Path(path)).await?;
    Ok(Json(detail.into()))
}

/// A media item's capability states, every column: what `opledger
/// capabilities ID --json` prints.
#[utoipa::path(get, path = "/api/v1/media/{id}/capabilities", tag = "read",
    params(("id" = String, Path, description = "The media item's id", format = Uuid)),
    responses((status = 200, body = Capabilities), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn capabilities<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Capabilities>> {
    caller.require(Role::Reader)?;
    let media_id = MediaId(parse_uuid("media id", &id)?);
    let rows = app.engine().capabilities(media_id).await?;
    Ok(Json(Capabilities {
        media_id,
        capabilities: rows.iter().map(CapabilityView::of).collect(),
    }))
}

/// The current revision's thumbnail file, with its content type decided
/// from its bytes and the revision as its `ETag` (`If-None-Match` with it
/// answers 304). 404 when the item has no succeeded thumbnail, or its
/// recorded file is gone, outside the ledger's output directories, not a
/// regular file or over the size limit; 415 when the file is no raster
/// image (PNG, JPEG, WebP, GIF, AVIF). A refusal is logged with the
/// operation that recorded the path.
#[utoipa::path(get, path = "/api/v1/media/{id}/thumbnail", tag = "read",
    params(("id" = String, Path, description = "The media item's id", format = Uuid)),
    responses(
        (status = 200, description = "The thumbnail's bytes, streamed", content_type = "image/png",
            headers(("ETag" = String, description = "The revision the thumbnail is of"),
                ("X-Content-Type-Options" = String, description = "`nosniff`"),
                ("Content-Security-Policy" = String, description = "`default-src 'none'; sandbox`"),
                ("Cross-Origin-Resource-Policy" = String, description = "`same-origin`"))),
        (status = 304, description = "The thumbnail is the one the client holds"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 415, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn thumbnail<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    caller.require(Role::Reader)?;
    let media_id = MediaId(parse_uuid("media id", &id)?);
    let engine = app.engine();
    let no_thumbnail = || ApiError::not_found(format!("media {media_id} has no thumbnail"));
    let capability = engine
        .capabilities(media_id)
        .await?
        .into_iter()
        .find(|row| row.capability == THUMBNAIL_CAPABILITY && row.status == CapabilityStatus::Succeeded)
        .ok_or_else(no_thumbnail)?;
    let detail = engine.media_detail(&MediaRef::Id(media_id)).await?;
    let path = detail.thumbnail.ok_or_else(no_thumbnail)?;
    let revision = capability.produced_revision.unwrap_or_default();
    let etag = format!("\"{}\"", revision.replace(['"', '\\'], ""));
    let etag_value =
        HeaderValue::from_str(&etag).map_err(|_| ApiError::internal("a revision is not a header value"))?;
    let outputs = app.config().outputs.clone();
    let opened = tokio::task::spawn_blocking(move || outputs.open_image(&path))
        .await
        .map_err(|_| ApiError::internal("opening a thumbnail failed; it is logged"))?;
    let image = opened.map_err(|refusal| {
        tracing::warn!(media = %media_id, operation = %capability.operation_id, %refusal,
            "a recorded thumbnail path was refused");
        match refusal {
            Refusal::NotRaster => ApiError::unsupported_media(format!(
                "the thumbnail file of media {media_id} is not a PNG, JPEG, WebP, GIF or AVIF image"
            )),
            _ => ApiError::not_found(format!("media {media_id} has no thumbnail the service may serve")),
        }
    })?;
    if matches_etag(&headers, &etag) {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag_value)]).into_response());
    }
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(image.content_type())),
            (header::CONTENT_LENGTH, HeaderValue::from(image.len())),
            (header::ETAG, etag_value),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        file_headers(),
        image.into_body(),
    )
        .into_response())
}

/// Whether `If-None-Match` names `etag` (or is `*`).
fn matches_etag(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == etag || tag == "*")
}

/// A media item to register: what `opledger media add` takes.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewMedia {
    /// Where the file is.
    pub path: String,
    /// What kind of media it is (default `image`).
    #[serde(default = "image")]
    #[schema(default = "image")]
    pub kind: String,
    /// The content digest: `sha256:` and 64 lowercase hex digits.
    pub digest: Option<String>,
    /// The size in bytes.
    pub size: Option<i64>,
    /// Register the path even when a media item already has it.
    #[serde(default)]
    pub allow_duplicate_path: bool,
}

fn image() -> String {
    "image".to_string()
}

/// The new item's id.
#[derive(Debug, Serialize, ToSchema)]
pub struct Registered {
    #[schema(value_type = String, format = Uuid)]
    pub media_id: MediaId,
}

/// Registers a media item (admin). A path some item already has is
/// refused (409) unless `allow_duplicate_path`.
#[utoipa::path(post, path = "/api/v1/media", tag = "admin", request_body = NewMedia,
    responses((status = 201, body = Registered), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn register<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    JsonBody(new): JsonBody<NewMedia>,
) -> ApiResult<(StatusCode, Json<Registered>)> {
    caller.require(Role::Admin)?;
    super::params::plain_text("path", &new.path)?;
    super::params::plain_text("kind", &new.kind)?;
    if let Some(digest) = &new.digest {
        opledger_domain::digest::check(digest).map_err(ApiError::invalid)?;
    }
    let engine = app.engine();
    if !new.allow_duplicate_path {
        if let Some(existing) = engine
            .media_by_path(std::slice::from_ref(&new.path))
            .await?
            .get(&new.path)
        {
            return Err(ApiError::conflict(format!(
                "{} is already registered as media {} (set allow_duplicate_path to register it again)",
                quoted(&new.path),
                existing.media_id
            )));
        }
    }
    let media_id = engine
        .register_media(
            &CommandContext::actor(caller.name.clone()),
            &new.path,
            &new.kind,
            new.digest.clone(),
            new.size,
        )
        .await?;
    app.wake().bump();
    Ok((StatusCode::CREATED, Json(Registered { media_id })))
}
