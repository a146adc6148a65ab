//! Replay verification (admin): the log replayed into scratch tables and
//! compared with the live projections, as `opledger replay --verify --json`
//! prints it. It must not know how replay works: the engine replays.

use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiResult, ErrorBody};
use crate::extract::Caller;
use axum::extract::State;
use axum::Json;
use opledger_domain::projections::Cell;
use opledger_engine::VerifyReport;
use opledger_store::Store;
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// The verification's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct Verification {
    /// The replay equals the live projections.
    pub identical: bool,
    /// The log position both were compared at.
    pub position: i64,
    /// Events folded by the replay.
    pub events: u64,
    pub differences: Vec<TableDifference>,
}

/// How one table differs.
#[derive(Debug, Serialize, ToSchema)]
pub struct TableDifference {
    pub table: String,
    pub live_rows: i64,
    pub replayed_rows: i64,
    pub rows: Vec<RowDifference>,
}

/// One row that differs: its columns live and replayed (null: absent).
#[derive(Debug, Serialize, ToSchema)]
pub struct RowDifference {
    pub key: String,
    #[schema(value_type = Option<Object>)]
    pub live: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub replayed: Option<Value>,
}

impl Verification {
    fn of(report: &VerifyReport) -> Self {
        Verification {
            identical: report.is_identical(),
            position: report.position,
            events: report.events,
            differences: report
                .diffs
                .iter()
                .map(|diff| {
                    let columns: Vec<&str> = diff.table.column_names().collect();
                    let render = |cells: &Option<Vec<Cell>>| {
                        cells.as_ref().map(|cells| {
                            Value::Object(
                                columns
                                    .iter()
                                    .zip(cells)
                                    .map(|(column, cell)| (column.to_string(), cell.to_json()))
                                    .collect::<Map<_, _>>(),
                            )
                        })
                    };
                    TableDifference {
                        table: diff.table.name.to_string(),
                        live_rows: diff.live_rows,
                        replayed_rows: diff.replayed_rows,
                        rows: diff
                            .rows
                            .iter()
                            .map(|row| RowDifference {
                                key: row.key.clone(),
                                live: render(&row.live),
                                replayed: render(&row.replayed),
                            })
                            .collect(),
                    }
                })
                .collect(),
        }
    }
}

/// Replays the log into scratch tables and compares them with the live
/// projections, and walks the log's hash chain (admin); the live tables are
/// untouched, and the check is recorded for `status` (`integrity`).
#[utoipa::path(post, path = "/api/v1/verify", tag = "admin",
    responses((status = 200, body = Verification), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn verify<S: Store>(State(app): State<App<S>>, caller: Caller) -> ApiResult<Json<Verification>> {
    caller.require(Role::Admin)?;
    let report = app.engine().verify().await?;
    app.engine().record_verification(&report).await?;
    Ok(Json(Verification::of(&report)))
}
