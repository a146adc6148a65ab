//! The support surface's reading commands: `describe` (one operation
//! explained), `timeline` (its history, `--follow` for what comes next) and
//! `status --watch`. Times are shown in the reader's local zone (the `TZ`
//! environment variable, as usual); the follow and watch loops end with
//! Ctrl-C, which is a normal end (exit 0).

use crate::cli::{DescribeArgs, StatusArgs, TimelineArgs};
use crate::output::{envelope_json, print_json, status as print_status, status_value, timeline_verbose};
use chrono::Local;
use futures::{Stream, StreamExt};
use opledger_domain::{EventEnvelope, Timestamp};
use opledger_engine::{Description, Engine, EngineError};
use opledger_explain::history::history_lines;
use opledger_explain::words::{clock_time, span};
use opledger_store::Store;
use serde_json::{json, Value};
use std::time::Duration;

/// How often `timeline --follow` reads the stream for new events.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);

pub async fn timeline<S: Store>(engine: &Engine<S>, args: &TimelineArgs, as_json: bool) -> anyhow::Result<()> {
    let operation_id = args.operation_id;
    let interrupt = if args.follow { Some(Interrupt::listen()?) } else { None };
    let events = engine.timeline(operation_id).await?;
    if args.follow && as_json {
        // One envelope a line, so a program can read them as they come.
        for event in &events {
            println!("{}", envelope_json(event));
        }
    } else if as_json {
        print_json(&Value::Array(events.iter().map(envelope_json).collect()));
    } else if args.verbose {
        timeline_verbose(&events);
    } else {
        print_lines(&history_lines(&events, None, &Local));
    }
    let Some(interrupt) = interrupt else {
        return Ok(());
    };
    let last = events.last().map_or(0, |event| event.stream_version);
    let mut previous = events.last().map(|event| event.recorded_at);
    let followed = engine.follow(operation_id, last, FOLLOW_INTERVAL);
    until_interrupted(interrupt, followed, |event: EventEnvelope| {
        if as_json {
            println!("{}", envelope_json(&event));
        } else if args.verbose {
            timeline_verbose(std::slice::from_ref(&event));
        } else {
            print_lines(&history_lines(std::slice::from_ref(&event), previous, &Local));
        }
        previous = Some(event.recorded_at);
    })
    .await
}

pub async fn status<S: Store>(engine: &Engine<S>, args: &StatusArgs, as_json: bool) -> anyhow::Result<()> {
    if !args.watch {
        print_status(&engine.status().await?, as_json);
        return Ok(());
    }
    let interrupt = Interrupt::listen()?;
    let mut first = true;
    until_interrupted(interrupt, engine.watch_status(args.interval), |report| {
        if as_json {
            println!("{}", status_value(&report));
            return;
        }
        if !first {
            println!();
        }
        first = false;
        let now = engine.now();
        println!("── {} (Ctrl-C to stop)", clock_time(now, now, &Local));
        print_status(&report, false);
    })
    .await
}

/// SIGINT (Ctrl-C), listened for from the moment it is made: a signal
/// that arrives while the first output is printed still ends the loop
/// normally instead of killing the process.
struct Interrupt {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Interrupt {
    fn listen() -> std::io::Result<Self> {
        Ok(Interrupt {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?,
        })
    }

    async fn received(&mut self) -> std::io::Result<()> {
        #[cfg(unix)]
        {
            self.signal.recv().await;
            Ok(())
        }
        #[cfg(not(unix))]
        {
            tokio::signal::ctrl_c().await
        }
    }
}

/// Runs `each` on every item of `items` until the stream fails (an error)
/// or the process gets SIGINT (a normal end).
async fn until_interrupted<T>(
    mut interrupt: Interrupt,
    items: impl Stream<Item = Result<T, EngineError>>,
    mut each: impl FnMut(T),
) -> anyhow::Result<()> {
    let mut items = std::pin::pin!(items);
    loop {
        tokio::select! {
            signal = interrupt.received() => {
                signal?;
                return Ok(());
            }
            item = items.next() => match item {
                Some(item) => each(item?),
                None => return Ok(()),
            },
        }
    }
}

fn print_lines(lines: &[String]) {
    for line in lines {
        println!("{line}");
    }
}

pub async fn describe<S: Store>(engine: &Engine<S>, args: &DescribeArgs, as_json: bool) -> anyhow::Result<()> {
    let operation_id = args.operation_id;
    let description = engine.describe(operation_id).await?;
    let sentence = description.why.sentence(description.described_at, &Local);
    if as_json {
        print_json(&describe_json(&description, &sentence));
        return Ok(());
    }
    for line in header(&description) {
        println!("{line}");
    }
    println!();
    println!("why: {sentence}");
    println!();
    if args.verbose {
        timeline_verbose(&description.timeline);
    } else {
        print_lines(&history_lines(&description.timeline, None, &Local));
    }
    Ok(())
}

fn time_json(at: Option<Timestamp>) -> Value {
    at.map_or(Value::Null, |at| Value::String(at.to_rfc3339()))
}

fn describe_json(description: &Description, sentence: &str) -> Value {
    let operation = &description.operation;
    let state = description.task.as_ref().map(|task| &task.state);
    let policy = description.policy.as_ref();
    let claim = operation.worker.as_ref().map(|worker| {
        json!({
            "worker": worker,
            "lease_expires_at": time_json(description.lease_ends()),
            "heartbeat_at": time_json(description.task.as_ref().and_then(|task| task.heartbeat_at())),
        })
    });
    json!({
        "operation_id": operation.operation_id,
        "kind": operation.kind,
        "media_id": operation.media_id,
        "region_id": operation.region_id,
        "path": description.path,
        "status": operation.status,
        "stage": operation.stage,
        "priority": operation.priority,
        "status_reason": operation.status_reason,
        "blocked_on": operation.blocked_on,
        "cancel_requested": operation.cancel_requested,
        "attempts": {
            "claims": operation.attempt_count,
            "failures": state.map(|state| state.failure_count),
            "max_attempts": policy.map(|policy| policy.max_attempts),
            "interruptions": state.map_or(operation.interruption_count, |state| state.interruption_count),
            "max_interruptions": policy.map(|policy| policy.max_interruptions),
        },
        "claim": claim,
        "requested_revision": state.map(|state| state.requested_revision.clone()).or_else(|| operation.revision.clone()),
        "completed_revision": state.and_then(|state| state.completed_revision.clone()),
        // The output of `completed_revision`, as the HTTP route answers it.
        "output": state
            .and_then(|state| state.output.as_deref())
            .and_then(|output| serde_json::from_str::<Value>(output).ok()),
        "available_at": time_json(state.map(|state| state.available_at).or(operation.available_at)),
        "last_error": operation.last_error,
        "queue": description.queue,
        "why": description.why,
        "sentence": sentence,
        "described_at": description.described_at.to_rfc3339(),
        "timeline": description.timeline.iter().map(envelope_json).collect::<Vec<_>>(),
    })
}

/// The header lines of `describe`: what the operation is, where it stands,
/// its budgets, its claim and its revisions.
fn header(description: &Description) -> Vec<String> {
    let operation = &description.operation;
    let now = description.described_at;
    let state = description.task.as_ref().map(|task| &task.state);
    let policy = description.policy.as_ref();
    let mut lines = Vec::new();
    let target = match (operation.region_id, operation.media_id) {
        (Some(region), _) => format!(" on region {region}"),
        (None, Some(media)) => format!(" on media {media}"),
        (None, None) => String::new(),
    };
    lines.push(format!("{} {}{target}", operation.kind, operation.operation_id));
    let field = |name: &str, value: String| format!("  {:<12}{value}", format!("{name}:"));
    if let Some(path) = &description.path {
        lines.push(field("path", path.clone()));
    }
    let mut status = operation.status.to_string();
    if let Some(stage) = operation.stage {
        status.push_str(&format!(", stage {stage}"));
    }
    if operation.priority != 0 {
        status.push_str(&format!(", priority {}", operation.priority));
    }
    lines.push(field("status", status));
    let budget = |used: i64, max: Option<u32>| match max {
        Some(max) => format!("{used} of {max}"),
        None => used.to_string(),
    };
    let failures = state.map_or_else(
        || "-".to_string(),
        |state| budget(state.failure_count, policy.map(|policy| policy.max_attempts)),
    );
    let interruptions = budget(
        state.map_or(operation.interruption_count, |state| state.interruption_count),
        policy.map(|policy| policy.max_interruptions),
    );
    lines.push(field(
        "attempts",
        format!(
            "{} claimed; failed {failures}; interrupted {interruptions}",
            operation.attempt_count
        ),
    ));
    let claim = match &operation.worker {
        Some(worker) => {
            let lease = description.lease_ends().map_or_else(String::new, |ends| {
                let left = opledger_explain::words::millis_between(now, ends);
                let when = if left >= 0 {
                    format!("in {}", span(left))
                } else {
                    format!("{} ago", span(left))
                };
                format!(", lease ends {} ({when})", clock_time(ends, now, &Local))
            });
            let cancel = if operation.cancel_requested {
                ", cancel requested"
            } else {
                ""
            };
            format!("worker {worker}{lease}{cancel}")
        }
        None => "none".to_string(),
    };
    lines.push(field("claim", claim));
    let requested = state
        .map(|state| state.requested_revision.clone())
        .or_else(|| operation.revision.clone());
    if let Some(requested) = requested {
        let completed = state
            .and_then(|state| state.completed_revision.clone())
            .unwrap_or_else(|| "none".to_string());
        lines.push(field("requested", requested));
        lines.push(field("completed", completed));
    }
    if let Some(error) = &operation.last_error {
        lines.push(field("last error", opledger_explain::words::quote(error, 200)));
    }
    lines
}
