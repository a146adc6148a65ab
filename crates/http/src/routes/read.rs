//! The reader's summary of the ledger.

use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiResult, ErrorBody};
use crate::extract::Caller;
use axum::extract::State;
use axum::Json;
use opledger_store::Store;
use serde_json::Value;

/// Counts by status, capabilities by status, active batches, the review
/// queue's length and each projection's lag: what `opledger status
/// --json` prints.
#[utoipa::path(get, path = "/api/v1/status", tag = "read",
    responses((status = 200, body = Object), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn status<S: Store>(State(app): State<App<S>>, caller: Caller) -> ApiResult<Json<Value>> {
    caller.require(Role::Reader)?;
    let report = app.engine().status().await?;
    Ok(Json(status_json(&report)))
}

fn status_json(report: &opledger_engine::StatusReport) -> Value {
    serde_json::to_value(report).unwrap_or(Value::Null)
}
