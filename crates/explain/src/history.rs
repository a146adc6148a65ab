//! An operation's timeline as a history a person reads: one line per
//! event with its local time, the time since the step before, a short actor
//! name and what happened, its payload summarized on the line (claim tokens
//! left out: they are a worker's secret handle, not history). A date line
//! opens the history and every new day. The full envelopes are the JSON
//! form; this is the plain one.

use super::words::{clock_time, millis_between, quote, short_actor, short_id, span, summarize, QUOTE_CHARS};
use chrono::TimeZone;
use opledger_domain::envelope::EventEnvelope;
use opledger_domain::events::{Event, OperationTarget};
use opledger_domain::time::Timestamp;
use std::fmt::Display;

/// The actor column's width; longer names push the text right.
const ACTOR_WIDTH: usize = 16;

/// The history lines of `events` (in stream order). `previous`: the time
/// of the event printed before them, when a history goes on (a follow), so
/// the first line still shows its step and a date line only when the day
/// changed.
pub fn history_lines<Tz: TimeZone>(events: &[EventEnvelope], previous: Option<Timestamp>, zone: &Tz) -> Vec<String>
where
    Tz::Offset: Display,
{
    let mut lines = Vec::with_capacity(events.len() + 1);
    let mut before = previous;
    for event in events {
        let local = event.recorded_at.to_datetime().with_timezone(zone);
        let new_day =
            before.is_none_or(|before| before.to_datetime().with_timezone(zone).date_naive() != local.date_naive());
        if new_day {
            lines.push(format!("{} ({})", local.format("%Y-%m-%d"), local.offset()));
        }
        let step = before
            .map(|before| format!("+{}", span(millis_between(before, event.recorded_at))))
            .unwrap_or_default();
        let line = format!(
            "  {}  {step:>11}  {:<width$}  {}",
            local.format("%H:%M:%S"),
            short_actor(&event.actor),
            what(event, zone),
            width = ACTOR_WIDTH
        );
        lines.push(line.trim_end().to_string());
        before = Some(event.recorded_at);
    }
    lines
}

fn target(target: &OperationTarget) -> String {
    match (target.region_id, target.media_id, &target.path) {
        (Some(region), _, _) => format!(" on region {}", short_id(&region.to_string())),
        (None, Some(media), _) => format!(" on media {}", short_id(&media.to_string())),
        (None, None, Some(path)) => format!(" for {}", quote(path, QUOTE_CHARS)),
        (None, None, None) => String::new(),
    }
}

/// `verb` alone, or `verb: reason` when the reason says something.
fn with_reason(verb: &str, reason: &str) -> String {
    if reason.trim().is_empty() {
        verb.to_string()
    } else {
        format!("{verb}: {}", quote(reason, QUOTE_CHARS))
    }
}

/// What one event did, on one line.
pub fn what<Tz: TimeZone>(envelope: &EventEnvelope, zone: &Tz) -> String
where
    Tz::Offset: Display,
{
    let time = |at: Timestamp| clock_time(at, envelope.recorded_at, zone);
    match &envelope.event {
        Event::OperationCreated(created) => {
            let mut text = format!("created: {}{}", created.kind, target(&created.target));
            if let Some(revision) = &created.revision {
                text.push_str(&format!(", revision {}", short_id(revision)));
            }
            if let Some(version) = &created.task_version {
                text.push_str(&format!(", version {version}"));
            }
            if created.priority != 0 {
                text.push_str(&format!(", priority {}", created.priority));
            }
            text.push_str(&format!(", {}", created.status));
            text
        }
        Event::OperationQueued(reason) => with_reason("queued", &reason.reason),
        Event::OperationBlocked(blocked) => with_reason("blocked", &blocked.reason),
        Event::OperationUnblocked(reason) => with_reason("unblocked", &reason.reason),
        Event::OperationClaimed(claimed) => {
            let mut text = format!(
                "claimed by {}: lease until {}",
                short_actor(&claimed.worker),
                time(claimed.lease_expires_at)
            );
            if let Some(revision) = &claimed.revision {
                text.push_str(&format!(", revision {}", short_id(revision)));
            }
            text
        }
        Event::OperationStarted(_) => "started".to_string(),
        Event::OperationProgressed(progress) => match progress.total {
            Some(total) => format!("progress: {} {}/{total}", progress.phase, progress.processed),
            None => format!("progress: {} {}", progress.phase, progress.processed),
        },
        Event::OperationStageChanged(stage) => format!("stage {}", stage.stage),
        Event::OperationSucceeded(succeeded) => match &succeeded.output {
            serde_json::Value::Null => "succeeded".to_string(),
            output => format!("succeeded: {}", summarize(output, 80)),
        },
        Event::OperationFoundNothing(reason) => with_reason("no result", &reason.reason),
        Event::OperationMissingConfirmed(reason) => with_reason("missing", &reason.reason),
        Event::OperationNotApplicable(reason) => with_reason("not applicable", &reason.reason),
        Event::OperationSkipped(reason) => with_reason("skipped", &reason.reason),
        Event::OperationFailed(failed) if failed.retryable => with_reason("failed", &failed.error),
        Event::OperationFailed(failed) => with_reason("failed for good", &failed.error),
        Event::OperationRetryScheduled(retry) => format!(
            "retry at {} (backoff {} + jitter {})",
            time(retry.available_at),
            span(retry.backoff_ms),
            span(retry.jitter_ms)
        ),
        Event::OperationDeadLettered(reason) => with_reason("dead-lettered", &reason.reason),
        Event::OperationInterrupted(interrupted) => with_reason("interrupted", &interrupted.reason),
        Event::OperationRequeued(reason) => with_reason("requeued", &reason.reason),
        Event::OperationCancelRequested(reason) => with_reason("cancel requested", &reason.reason),
        Event::OperationCancelled(reason) => with_reason("cancelled", &reason.reason),
        Event::OperationReopened(reason) => with_reason("reopened", &reason.reason),
        Event::OperationRevisionRequested(requested) => {
            let then = if requested.requeue {
                "queued again"
            } else {
                "the queued or running work takes it"
            };
            format!("revision {} requested, {then}", short_id(&requested.revision))
        }
        Event::OperationSuperseded(superseded) => format!(
            "superseded: {} recorded against revision {}; revision {} is requested",
            superseded.outcome,
            short_id(&superseded.claimed_revision),
            short_id(&superseded.requested_revision)
        ),
        Event::TaskVersionChanged(changed) => format!(
            "kind version {} → {}",
            changed.previous_version.as_deref().unwrap_or("?"),
            changed.current_version
        ),
        Event::ReviewResolved(resolved) => {
            let revision = resolved
                .revision
                .as_deref()
                .map(|revision| format!(" at revision {}", short_id(revision)))
                .unwrap_or_default();
            with_reason(
                &format!(
                    "review entry {} resolved: {}{revision}",
                    resolved.entry_id, resolved.action
                ),
                &resolved.reason,
            )
        }
        other => {
            let payload: serde_json::Value =
                serde_json::from_str(&other.payload_json()).unwrap_or(serde_json::Value::Null);
            format!("{}: {}", other.event_type(), summarize(&payload, 80))
        }
    }
}
