//! Many claims' outcomes in one call and one transaction: what a worker
//! that ran a batch of claims sends, so a busy worker pays one request's
//! and one command's fixed cost per batch instead of per task. Each report
//! is fenced, checked against the token's task kinds and answered on its
//! own, in order; a fenced-out one is its item's `conflict` and the rest
//! still apply. It must not know SQL or the backend.

use super::claims::{completion, context, fenced, FenceFields};
use super::work::{item_error, TaskOutcomeAnswer, MAX_BATCH};
use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{Caller, IdempotencyKey, JsonBody};
use axum::extract::State;
use axum::Json;
use opledger_engine::{ClaimOutcome, Completion, OutcomeReport};
use opledger_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// How one claim in a batch of reports ended.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReportKind {
    Complete,
    Fail,
    NoResult,
    Release,
    AckCancel,
}

/// One report of a batch.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportBody {
    pub claim_token: String,
    pub outcome: ReportKind,
    #[serde(default)]
    pub revision: Option<String>,
    #[serde(default)]
    pub worker: Option<String>,
    /// `complete`: the output.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    /// `no_result` and `release`: why.
    #[serde(default)]
    pub reason: Option<String>,
    /// `fail`: the error.
    #[serde(default)]
    pub error: Option<String>,
    /// `fail`: final now, no retry.
    #[serde(default)]
    pub terminal: bool,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportsBody {
    pub reports: Vec<ReportBody>,
}

/// One report's answer or its error (`conflict` when fenced out).
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ReportItem {
    Recorded(TaskOutcomeAnswer),
    Refused(ErrorBody),
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReportItems {
    pub items: Vec<ReportItem>,
}

/// The engine's report for one item of a batch.
async fn outcome_report<S: Store>(app: &App<S>, caller: &Caller, report: ReportBody) -> ApiResult<OutcomeReport> {
    let fields = FenceFields {
        revision: report.revision,
        worker: report.worker,
    };
    let fence = fenced(app, caller, &report.claim_token, &fields).await?;
    let limit = app.config().max_text_bytes;
    let outcome = match report.outcome {
        ReportKind::Complete => ClaimOutcome::Complete(completion(report.output, None, limit)?),
        ReportKind::NoResult => ClaimOutcome::Complete(Completion::NoResult {
            reason: report.reason.unwrap_or_default(),
        }),
        ReportKind::Fail => ClaimOutcome::Fail {
            error: report
                .error
                .ok_or_else(|| ApiError::invalid("a fail report needs an error"))?,
            terminal: report.terminal,
        },
        ReportKind::Release => ClaimOutcome::Release {
            reason: report.reason.unwrap_or_default(),
        },
        ReportKind::AckCancel => ClaimOutcome::AcknowledgeCancel,
    };
    Ok(OutcomeReport {
        context: context(caller, &fields, &IdempotencyKey(None)),
        fence,
        outcome,
    })
}

/// Records many claims' outcomes in one transaction (a worker that ran a
/// batch of claims): each is fenced and answered on its own, in order; a
/// fenced-out one is its item's `conflict` and the rest still apply.
#[utoipa::path(post, path = "/api/v1/reports", tag = "work",
    request_body = ReportsBody,
    responses((status = 200, body = ReportItems), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn report_many<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    key: IdempotencyKey,
    JsonBody(body): JsonBody<ReportsBody>,
) -> ApiResult<Json<ReportItems>> {
    caller.require(Role::Worker)?;
    key.refuse("POST /api/v1/reports")?;
    if body.reports.len() > MAX_BATCH {
        return Err(ApiError::invalid(format!(
            "one call carries at most {MAX_BATCH} reports, not {}",
            body.reports.len()
        )));
    }
    let mut checked = Vec::with_capacity(body.reports.len());
    for report in body.reports {
        checked.push(outcome_report(&app, &caller, report).await);
    }
    let valid: Vec<OutcomeReport> = checked.iter().filter_map(|item| item.as_ref().ok().cloned()).collect();
    let mut answers = if valid.is_empty() {
        Vec::new()
    } else {
        app.engine().report_outcomes(valid).await?
    }
    .into_iter();
    let mut recorded = false;
    let items = checked
        .into_iter()
        .map(|item| match item {
            Err(error) => ReportItem::Refused(item_error(error)),
            Ok(_) => match answers.next() {
                Some(Ok(outcome)) => {
                    recorded = true;
                    ReportItem::Recorded(outcome.into())
                }
                Some(Err(error)) => ReportItem::Refused(item_error(error.into())),
                None => ReportItem::Refused(item_error(ApiError::internal("the engine answered fewer reports"))),
            },
        })
        .collect();
    if recorded {
        app.wake().bump();
    }
    Ok(Json(ReportItems { items }))
}
