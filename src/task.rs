//! `opledger task ...` and `opledger recover`: the work protocol for shell
//! and foreign-language workers, as thin calls into the engine.
//!
//! What the engine would refuse only after a step that writes (a claim runs
//! one recovery pass first) is checked here before that step, so a refused
//! command appends nothing.

mod answers;

use crate::cli::{ClaimArgs, CompleteArgs, RequestArgs, ShowArgs, TaskCommand, TokenArgs};
use crate::output;
use crate::{OutputClosed, UsageError};
use opledger_engine::{
    ClaimRequest, CommandContext, Completion, Engine, EngineError, Fence, Progress, TaskRequest, TaskTarget,
};
use opledger_store::Store;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

/// The actor of recovery's events.
const RECOVERY_ACTOR: &str = "recovery";

pub async fn run<S: Store>(engine: &Engine<S>, command: &TaskCommand, as_json: bool) -> anyhow::Result<()> {
    match command {
        TaskCommand::Request(args) => request(engine, args, as_json).await,
        TaskCommand::Claim(args) => claim(engine, args, as_json).await,
        TaskCommand::Heartbeat(args) => {
            let outcome = engine
                .heartbeat_once(
                    args.claim.retry.request_id.as_ref(),
                    &fence(&args.claim),
                    args.lease.map(|seconds| seconds * 1_000),
                )
                .await?;
            answers::heartbeat(&outcome, as_json);
            Ok(())
        }
        TaskCommand::Progress(args) => {
            let progress = Progress {
                phase: args.phase.clone(),
                processed: args.processed,
                total: args.total,
            };
            engine
                .report_progress(&context(&args.claim), &fence(&args.claim), progress.clone())
                .await?;
            answers::progress(&progress, as_json);
            Ok(())
        }
        TaskCommand::Complete(args) => complete(engine, args, as_json).await,
        TaskCommand::Fail(args) => {
            let outcome = engine
                .fail_task(&context(&args.claim), &fence(&args.claim), &args.error, args.terminal)
                .await?;
            answers::failed(&outcome, as_json);
            Ok(())
        }
        TaskCommand::Cancel(args) => {
            let reason = args.reason.as_deref().unwrap_or("");
            let outcome = engine
                .cancel_task(&args.retry.context("cli"), args.operation_id, reason)
                .await?;
            answers::cancelled(&outcome, as_json);
            Ok(())
        }
        TaskCommand::AckCancel(args) => {
            let outcome = engine.acknowledge_cancel(&context(args), &fence(args)).await?;
            answers::cancel_acknowledged(&outcome, as_json);
            Ok(())
        }
        TaskCommand::Release(args) => {
            let reason = args.reason.as_deref().unwrap_or("");
            let outcome = engine
                .release_task(&context(&args.claim), &fence(&args.claim), reason)
                .await?;
            answers::released(&outcome, as_json);
            Ok(())
        }
        TaskCommand::Show(args) => show(engine, args, as_json).await,
    }
}

/// What a claim records when it gives back claims whose answer could not
/// be written.
const UNDELIVERED: &str = "released: the claim's answer could not be written (its standard output was closed)";

/// `opledger recover`.
pub async fn recover<S: Store>(engine: &Engine<S>, as_json: bool) -> anyhow::Result<()> {
    let report = engine.recover(&CommandContext::actor(RECOVERY_ACTOR)).await?;
    answers::recovery(&report, as_json);
    Ok(())
}

fn fence(claim: &TokenArgs) -> Fence {
    Fence {
        claim_token: claim.token.clone(),
        revision: claim.revision.clone(),
    }
}

/// Reports are recorded as the worker's when it names itself.
fn context(claim: &TokenArgs) -> CommandContext {
    claim
        .retry
        .context(claim.worker.clone().unwrap_or_else(|| "cli".to_string()))
}

/// A JSON flag's value (`-` reads stdin), refused with the flag's name.
fn json_flag(flag: &str, text: &str) -> Result<Value, UsageError> {
    let text = if text == "-" {
        let mut buffer = String::new();
        std::io::stdin()
            .read_to_string(&mut buffer)
            .map_err(|error| UsageError(format!("{flag} -: cannot read stdin: {error}")))?;
        buffer
    } else {
        text.to_string()
    };
    serde_json::from_str(&text).map_err(|error| {
        UsageError(format!(
            "{flag} is not valid JSON ({error}): {}",
            opledger_domain::quoted(&text)
        ))
    })
}

async fn request<S: Store>(engine: &Engine<S>, args: &RequestArgs, as_json: bool) -> anyhow::Result<()> {
    let inputs = json_flag("--inputs", &args.inputs)?;
    let target = match (args.media, args.region) {
        (Some(media), None) => TaskTarget::Media(media),
        (None, Some(region)) => TaskTarget::Region(region),
        _ => return Err(UsageError("give exactly one of --media and --region".into()).into()),
    };
    let outcome = engine
        .request_task(
            &args.retry.context("cli"),
            TaskRequest {
                target,
                kind: args.kind.clone(),
                inputs,
                priority: args.priority,
            },
        )
        .await?;
    answers::requested(&outcome, target, &args.kind, as_json);
    Ok(())
}

async fn claim<S: Store>(engine: &Engine<S>, args: &ClaimArgs, as_json: bool) -> anyhow::Result<()> {
    // Checked before recovery runs, so a refused claim appends nothing.
    for kind in &args.kinds {
        engine.task_kind(kind).await?;
    }
    if args.worker.trim().is_empty() {
        return Err(UsageError("--worker needs a name".into()).into());
    }
    let versions = stated_versions(&args.kinds, &args.versions)?;
    opledger_domain::versions::check_stated_versions(&args.kinds, &versions)?;
    // Expired claims of dead workers are requeued before any worker claims.
    let recovered = engine.recover(&CommandContext::actor(RECOVERY_ACTOR)).await?;
    if recovered.interrupted > 0 {
        tracing::info!(
            interrupted = recovered.interrupted,
            requeued = recovered.requeued,
            "recovered expired claims before claiming"
        );
    }
    let claims = engine
        .claim_tasks(
            &args.retry.context(args.worker.clone()),
            ClaimRequest {
                kinds: args.kinds.clone(),
                worker: args.worker.clone(),
                lease_ms: args.lease * 1_000,
                limit: args.limit,
                principal: None,
                versions,
            },
        )
        .await?;
    answers::claims(&claims, args.limit > 1, as_json);
    if output::flush() {
        return Ok(());
    }
    // Nobody received the tokens: the claims go back to the queue now,
    // instead of staying leased to a caller that never saw them.
    let context = CommandContext::actor(args.worker.clone());
    for claim in &claims {
        let fence = Fence {
            claim_token: claim.claim_token.clone(),
            revision: Some(claim.revision.clone()),
        };
        engine.release_task(&context, &fence, UNDELIVERED).await?;
    }
    Err(OutputClosed.into())
}

/// The versions `--version` states, by kind: `KIND=VERSION`, or a bare
/// `VERSION` of the one `--kind` given.
fn stated_versions(kinds: &[String], given: &[String]) -> anyhow::Result<BTreeMap<String, BTreeSet<String>>> {
    let mut versions: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for text in given {
        // `KIND=VERSION` when what precedes `=` is a kind's name.
        let named = text
            .split_once('=')
            .filter(|(kind, _)| opledger_domain::kinds::check_name("task kind", kind).is_ok());
        if let Some((kind, _)) = named.filter(|(kind, _)| !kinds.iter().any(|named| named == kind)) {
            return Err(UsageError(format!(
                "--version {} is of kind {}, which no --kind names",
                opledger_domain::quoted(text),
                opledger_domain::quoted(kind)
            ))
            .into());
        }
        let (kind, version) = match (named, kinds) {
            (Some((kind, version)), _) => (kind.to_string(), version.to_string()),
            (None, [kind]) => (kind.clone(), text.clone()),
            (None, _) => {
                return Err(UsageError(format!(
                    "--version {} names no kind: with {} --kind, write KIND=VERSION with one of them",
                    opledger_domain::quoted(text),
                    if kinds.is_empty() { "no" } else { "several" }
                ))
                .into())
            }
        };
        versions.entry(kind).or_default().insert(version);
    }
    Ok(versions)
}

async fn complete<S: Store>(engine: &Engine<S>, args: &CompleteArgs, as_json: bool) -> anyhow::Result<()> {
    let completion = match (&args.output, &args.no_result) {
        (_, Some(reason)) => Completion::NoResult { reason: reason.clone() },
        (Some(text), None) => Completion::Output(json_flag("--output", text)?),
        (None, None) => Completion::Output(Value::Null),
    };
    let outcome = engine
        .complete_task(&context(&args.claim), &fence(&args.claim), completion)
        .await?;
    answers::completed(&outcome, as_json);
    Ok(())
}

async fn show<S: Store>(engine: &Engine<S>, args: &ShowArgs, as_json: bool) -> anyhow::Result<()> {
    let (view, described) = match (args.operation, args.media, args.region, &args.kind) {
        (Some(operation_id), None, None, None) => {
            (engine.task_by_operation(operation_id).await?, operation_id.to_string())
        }
        (None, Some(media), None, Some(kind)) => (
            engine.task_state(TaskTarget::Media(media), kind).await?,
            format!("{kind} on media {media}"),
        ),
        (None, None, Some(region), Some(kind)) => (
            engine.task_state(TaskTarget::Region(region), kind).await?,
            format!("{kind} on region {region}"),
        ),
        _ => {
            return Err(UsageError("give --operation ID, or --media ID or --region ID with --kind KIND".into()).into())
        }
    };
    let view = view.ok_or_else(|| EngineError::not_found("task", described))?;
    answers::task(&view, as_json);
    Ok(())
}
