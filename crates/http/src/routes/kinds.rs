//! Task kinds: the declared kinds, one kind, and applying a declaration
//! document (admin) — what `opledger kinds` does, in the shapes its
//! `--json` prints.
//!
//! The body of `POST /api/v1/kinds` is JSON, `{"document": "<the TOML
//! declaration file's text>", "dry_run": false}`: one body shape for every
//! client, whose size the service's body limit bounds. It must not know the
//! declaration format or its rules: the engine parses, decides and refuses.

use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{Caller, DocumentBody};
use axum::extract::{Path, State};
use axum::Json;
use opledger_domain::projections::TaskKindRow;
use opledger_domain::{quoted, DomainError};
use opledger_engine::{parse_kinds, CommandContext, EngineError, KindStatus, KindsReport};
use opledger_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

/// The declared task kinds: what `opledger kinds list --json` prints.
#[derive(Debug, Serialize, ToSchema)]
pub struct KindList {
    /// Each kind's declaration (name, target, version, capability, inputs,
    /// needs, retry policy, ...) with `declared`, `declared_at` and
    /// `updated_at`; a kind only seen in tasks has name, target, version,
    /// capability and required.
    #[schema(value_type = Vec<Object>)]
    pub kinds: Vec<Value>,
}

/// One kind as `kinds list`/`kinds show --json` print it.
fn kind_json(row: &TaskKindRow) -> Value {
    let mut value = match &row.declaration {
        Some(declaration) => serde_json::to_value(declaration).unwrap_or(Value::Null),
        None => json!({
            "name": row.name,
            "target": row.target,
            "version": row.kind_version,
            "capability": row.capability,
            "required": row.required,
        }),
    };
    if let Value::Object(object) = &mut value {
        object.insert("declared".into(), json!(row.declared));
        object.insert("declared_at".into(), json!(row.declared_at.to_rfc3339()));
        object.insert("updated_at".into(), json!(row.updated_at.to_rfc3339()));
    }
    value
}

/// Every task kind, declared or seen in tasks.
#[utoipa::path(get, path = "/api/v1/kinds", tag = "read",
    responses((status = 200, body = KindList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list<S: Store>(State(app): State<App<S>>, caller: Caller) -> ApiResult<Json<KindList>> {
    caller.require(Role::Reader)?;
    let kinds = app.engine().task_kinds().await?;
    Ok(Json(KindList {
        kinds: kinds.iter().map(kind_json).collect(),
    }))
}

/// One declared kind: its declaration with `declared`, `declared_at` and
/// `updated_at`, as `opledger kinds show NAME --json` prints it.
#[utoipa::path(get, path = "/api/v1/kinds/{name}", tag = "read",
    params(("name" = String, Path, description = "The kind's name")),
    responses((status = 200, body = Object, description = "The kind's declaration"),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn show<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    caller.require(Role::Reader)?;
    if name.contains('\0') {
        return Err(ApiError::not_found(format!("no task kind {}", quoted(&name))));
    }
    // The engine refuses an undeclared name as invalid input (a command
    // naming it is wrong); here it names a resource that is not there.
    let row = app.engine().task_kind(&name).await.map_err(|error| match error {
        EngineError::Domain(DomainError::InvalidInput(message)) => ApiError::not_found(message),
        other => other.into(),
    })?;
    Ok(Json(kind_json(&row)))
}

/// A declaration document to apply.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Apply {
    /// The TOML declaration file's text (`[[kind]]` tables), as `opledger
    /// kinds apply FILE` reads it.
    pub document: String,
    /// Decide and report, and record nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// What applying did (or, dry, would do) to each kind: what `opledger
/// kinds apply --json` prints.
#[derive(Debug, Serialize, ToSchema)]
pub struct ApplyReport {
    pub kinds: Vec<KindOutcome>,
}

/// One kind of the document, decided.
#[derive(Debug, Serialize, ToSchema)]
pub struct KindOutcome {
    pub name: String,
    /// `declared`, `unchanged`, `changed` or `refused`.
    pub status: String,
    pub version: String,
    /// Capabilities whose result the new version made `stale` (or would).
    pub stale_items: usize,
    /// Waiting tasks the new version re-targeted in the same transaction
    /// (requested again at it, reason `version_changed`, or blocked where
    /// it cannot run their inputs).
    pub retargeted: usize,
    /// Why a refused kind was refused, with its line and column.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ApplyReport {
    fn of(report: &KindsReport) -> Self {
        ApplyReport {
            kinds: report
                .kinds
                .iter()
                .map(|kind| KindOutcome {
                    name: kind.name.clone(),
                    status: match kind.status {
                        KindStatus::Declared => "declared",
                        KindStatus::Unchanged => "unchanged",
                        KindStatus::Changed => "changed",
                        KindStatus::Refused => "refused",
                    }
                    .to_string(),
                    version: kind.version.clone(),
                    stale_items: kind.stale_items,
                    retargeted: kind.retargeted,
                    error: kind.error.clone(),
                })
                .collect(),
        }
    }
}

/// Applies a declaration document (admin). A refused kind refuses the
/// whole document: 422 with the report under `error.details`, and
/// nothing recorded.
#[utoipa::path(post, path = "/api/v1/kinds", tag = "admin", request_body = Apply,
    responses((status = 200, body = ApplyReport), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, body = ErrorBody, description = "The document or a kind in it is refused; a refused kind's report is under `error.details`")),
    security(("bearer" = [])))]
pub async fn apply<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    DocumentBody(body): DocumentBody<Apply>,
) -> ApiResult<Json<ApplyReport>> {
    caller.require(Role::Admin)?;
    if body.document.contains('\0') {
        return Err(ApiError::invalid("the document cannot contain a NUL character"));
    }
    let document = parse_kinds(&body.document)?;
    let report = app
        .engine()
        .apply_kinds(&CommandContext::actor(caller.name.clone()), &document, body.dry_run)
        .await?;
    let shaped = ApplyReport::of(&report);
    let refused = report.refused().count();
    if refused > 0 {
        return Err(
            ApiError::invalid(format!("{refused} task kind(s) refused; nothing was recorded"))
                .with_details(serde_json::to_value(&shaped).unwrap_or(Value::Null)),
        );
    }
    if report.applied {
        app.wake().bump();
    }
    Ok(Json(shaped))
}
