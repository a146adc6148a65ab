//! Liveness and readiness, for load balancers and orchestrators.

use crate::app::App;
use crate::error::{ApiError, ApiResult, ErrorBody};
use axum::extract::State;
use axum::Json;
use opledger_store::Store;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: &'static str,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, body = Health)))]
pub async fn healthz<S: Store>() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The store is reachable and startup recovery is done.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, body = Health), (status = 503, body = ErrorBody)))]
pub async fn readyz<S: Store>(State(app): State<App<S>>) -> ApiResult<Json<Health>> {
    if !app.is_ready() {
        return Err(ApiError::unavailable("startup recovery is still running"));
    }
    if app.is_stopping() {
        return Err(ApiError::unavailable("the service is shutting down"));
    }
    app.engine()
        .store()
        .head()
        .await
        .map_err(|error| ApiError::unavailable(error.to_string()))?;
    Ok(Json(Health { status: "ok" }))
}
