//! `/metrics`: the service's metrics in Prometheus text format (see
//! [`crate::metrics`] for what is measured where).

use crate::app::App;
use crate::error::{ApiResult, ErrorBody};
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use opledger_store::Store;

/// Prometheus text format (version 0.0.4); anyone may read it.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format.", content_type = "text/plain", body = String),
        (status = 503, body = ErrorBody)))]
pub async fn metrics<S: Store>(State(app): State<App<S>>) -> ApiResult<impl IntoResponse> {
    let text = app.metrics().render(app.engine()).await?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    ))
}
