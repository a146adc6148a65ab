//! The OpenAPI 3.1 document of every route, for anyone: generated from the
//! route table and the handlers' annotations ([`crate::openapi`]).

use axum::Json;
use opledger_store::Store;

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI 3.1 document", content_type = "application/json", body = Object)))]
pub async fn openapi<S: Store>() -> Json<utoipa::openapi::OpenApi> {
    Json(crate::openapi())
}
