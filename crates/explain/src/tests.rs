//! The explanations as a table: one situation per row, its facts and the
//! sentence a person reads; and the history of a small timeline, golden.

use super::history::history_lines;
use super::*;
use chrono::{FixedOffset, Utc};
use opledger_domain::envelope::{EventEnvelope, StreamId};
use opledger_domain::events::{
    Event, OperationClaimed, OperationCreated, OperationFailed, OperationProgressed, OperationReason,
    OperationRetryScheduled, OperationStarted, OperationSucceeded, OperationTarget, ReviewResolved,
};
use opledger_domain::ids::{MediaId, OperationId};
use opledger_domain::status::CapabilityStatus;
use opledger_domain::tasks::{RetryPolicy, TargetType};
use uuid::Uuid;

fn at(text: &str) -> Timestamp {
    Timestamp::parse(text).unwrap()
}

const NOW: &str = "2026-05-01T15:04:00Z";

fn operation(status: OperationStatus) -> OperationRow {
    OperationRow {
        operation_id: OperationId(Uuid::from_u128(1)),
        kind: "thumbnail".into(),
        media_id: Some(MediaId(Uuid::from_u128(2))),
        region_id: None,
        path: Some("/photos/beach.jpg".into()),
        revision: Some("sha256:3f2a9c1d55".into()),
        inputs: "{}".into(),
        status,
        stage: None,
        priority: 0,
        attempt_count: 0,
        interruption_count: 0,
        claim_token: None,
        worker: None,
        lease_expires_at: None,
        available_at: Some(at("2026-05-01T15:00:00Z")),
        cancel_requested: false,
        phase: None,
        processed: None,
        total: None,
        last_error: None,
        status_reason: None,
        blocked_on: None,
        created_at: at("2026-05-01T14:00:00Z"),
        updated_at: at("2026-05-01T15:00:00Z"),
        version: 3,
    }
}

fn state(operation: &OperationRow) -> ProcessingStateRow {
    ProcessingStateRow {
        operation_id: operation.operation_id,
        target_type: TargetType::Media,
        target_id: Uuid::from_u128(2),
        task_kind: operation.kind.clone(),
        status: operation.status,
        priority: 0,
        requested_revision: "sha256:3f2a9c1d55".into(),
        inputs: "{}".into(),
        task_version: Some("1".into()),
        claimed_revision: None,
        completed_revision: None,
        output: None,
        claim_token: operation.claim_token.clone(),
        worker: operation.worker.clone(),
        claimed_at: None,
        lease_expires_at: operation.lease_expires_at,
        attempt_count: operation.attempt_count,
        failure_count: 0,
        interruption_count: 0,
        available_at: operation.available_at.unwrap_or(at("2026-05-01T15:00:00Z")),
        cancel_requested: operation.cancel_requested,
        last_error: operation.last_error.clone(),
        status_reason: operation.status_reason.clone(),
        updated_at: operation.updated_at,
        version: operation.version,
    }
}

/// One situation: the rows and what the engine found beside them.
struct Situation {
    name: &'static str,
    operation: OperationRow,
    state: Option<ProcessingStateRow>,
    lease_ends: Option<Timestamp>,
    progress: Option<ProgressNote>,
    capability: Option<CapabilityRow>,
    queue: Option<QueuePosition>,
}

impl Situation {
    fn new(name: &'static str, operation: OperationRow) -> Self {
        let state = Some(state(&operation));
        Situation {
            name,
            operation,
            state,
            lease_ends: None,
            progress: None,
            capability: None,
            queue: None,
        }
    }

    fn sentence(&self) -> String {
        let policy = RetryPolicy::DEFAULT;
        let facts = Facts {
            operation: &self.operation,
            state: self.state.as_ref(),
            lease_ends: self.lease_ends,
            progress: self.progress.as_ref(),
            policy: self.state.as_ref().map(|_| &policy),
            capability: self.capability.as_ref(),
            queue: self.queue,
            since: at("2026-05-01T15:00:00Z"),
        };
        why(&facts).sentence(at(NOW), &Utc)
    }
}

fn with(mut operation: OperationRow, change: impl FnOnce(&mut OperationRow)) -> OperationRow {
    change(&mut operation);
    operation
}

fn claimed(status: OperationStatus) -> OperationRow {
    with(operation(status), |row| {
        row.claim_token = Some("token".into());
        row.worker = Some("py-1".into());
        row.lease_expires_at = Some(at("2026-05-01T15:03:50Z"));
        row.attempt_count = 1;
    })
}

fn situations() -> Vec<Situation> {
    use OperationStatus as O;
    let mut table = Vec::new();
    table.push(Situation::new("pending", operation(O::Pending)));
    let mut next = Situation::new("queued, first", operation(O::Queued));
    next.queue = Some(QueuePosition {
        ahead: 0,
        higher_priority: 0,
        at_least: false,
    });
    table.push(next);
    let mut behind = Situation::new("queued, behind", operation(O::Queued));
    behind.queue = Some(QueuePosition {
        ahead: 3,
        higher_priority: 3,
        at_least: false,
    });
    table.push(behind);
    let mut mixed = Situation::new("queued, behind some of each", operation(O::Queued));
    mixed.queue = Some(QueuePosition {
        ahead: 5,
        higher_priority: 2,
        at_least: false,
    });
    table.push(mixed);
    let mut many = Situation::new("queued, behind many", operation(O::Queued));
    many.queue = Some(QueuePosition {
        ahead: 10_000,
        higher_priority: 0,
        at_least: true,
    });
    table.push(many);
    table.push(Situation::new(
        "queued, not yet due",
        with(operation(O::Queued), |row| {
            row.available_at = Some(at("2026-05-01T16:00:00Z"))
        }),
    ));
    let waiting = with(operation(O::RetryWaiting), |row| {
        row.available_at = Some(at("2026-05-01T15:04:12Z"));
        row.last_error = Some("decoder crashed".into());
        row.attempt_count = 2;
    });
    let mut retry = Situation::new("retry waiting", waiting.clone());
    if let Some(state) = retry.state.as_mut() {
        state.failure_count = 2;
    }
    table.push(retry);
    let mut due = Situation::new(
        "retry due",
        with(waiting, |row| row.available_at = Some(at("2026-05-01T15:03:00Z"))),
    );
    if let Some(state) = due.state.as_mut() {
        state.failure_count = 1;
    }
    due.queue = Some(QueuePosition {
        ahead: 1,
        higher_priority: 0,
        at_least: false,
    });
    table.push(due);
    let need = |status| {
        with(operation(O::Blocked), move |row| {
            row.blocked_on = Some(BlockedOn {
                capability: "metadata".into(),
                status,
            })
        })
    };
    table.push(Situation::new(
        "blocked by a need whose work ended",
        need(Some(CapabilityStatus::FailedTerminal)),
    ));
    table.push(Situation::new(
        "blocked by a need in progress",
        need(Some(CapabilityStatus::Queued)),
    ));
    table.push(Situation::new(
        "blocked by a person",
        with(operation(O::Blocked), |row| {
            row.status_reason = Some("waiting for the licence".into())
        }),
    ));
    let mut running = Situation::new("running", claimed(O::Running));
    running.lease_ends = Some(at("2026-05-01T15:04:12Z"));
    table.push(running);
    let mut progressing = Situation::new("running with progress", claimed(O::Running));
    progressing.lease_ends = Some(at("2026-05-01T15:05:00Z"));
    progressing.progress = Some(ProgressNote {
        phase: "resizing".into(),
        processed: Some(10),
        total: Some(40),
    });
    table.push(progressing);
    table.push(Situation::new("leased, lease ended", claimed(O::Leased)));
    let mut cancel = Situation::new(
        "cancel requested",
        with(claimed(O::Running), |row| row.cancel_requested = true),
    );
    cancel.lease_ends = Some(at("2026-05-01T15:04:30Z"));
    table.push(cancel);
    let mut succeeded = Situation::new("succeeded", operation(O::Succeeded));
    if let Some(state) = succeeded.state.as_mut() {
        state.completed_revision = Some("sha256:3f2a9c1d55".into());
        state.output = Some(r#"{"path":"/thumbs/beach.png"}"#.into());
    }
    table.push(succeeded);
    let mut stale = Situation::new("succeeded, stale", operation(O::Succeeded));
    stale.capability = Some(CapabilityRow {
        operation_id: OperationId(Uuid::from_u128(1)),
        media_id: MediaId(Uuid::from_u128(2)),
        capability: "thumbnail".into(),
        task_kind: "thumbnail".into(),
        status: CapabilityStatus::Stale,
        required: true,
        requested_version: Some("1".into()),
        claimed_version: None,
        produced_version: Some("1".into()),
        current_version: Some("2".into()),
        produced_revision: None,
        reason: None,
        updated_at: at(NOW),
        version: 5,
    });
    table.push(stale);
    let reason = |status, text: &str| with(operation(status), |row| row.status_reason = Some(text.into()));
    table.push(Situation::new("no result", reason(O::NoResult, "no lyrics found")));
    table.push(Situation::new(
        "missing",
        reason(O::MissingConfirmed, "the file is gone from disk"),
    ));
    table.push(Situation::new(
        "not applicable",
        reason(O::NotApplicable, "caption does not apply to video items"),
    ));
    let mut retryable = Situation::new(
        "failed, retry not scheduled",
        with(operation(O::FailedRetryable), |row| {
            row.last_error = Some("timeout".into())
        }),
    );
    if let Some(state) = retryable.state.as_mut() {
        state.failure_count = 1;
    }
    table.push(retryable);
    table.push(Situation::new(
        "failed for good",
        with(operation(O::FailedTerminal), |row| {
            row.last_error = Some("not an image: bad\nmagic".into())
        }),
    ));
    table.push(Situation::new(
        "dead-lettered",
        reason(O::DeadLettered, "decoder crashed (attempt 5 of 5: no attempts left)"),
    ));
    table.push(Situation::new("cancelled", reason(O::Cancelled, "batch cancelled")));
    table.push(Situation::new(
        "interrupted",
        reason(O::Interrupted, "lease expired at 2026-05-01T14:59:00Z"),
    ));
    table.push(Situation::new(
        "skipped",
        reason(O::Skipped, "unchanged since the last run"),
    ));
    let mut ingestion = Situation::new(
        "a file ingestion at a stage",
        with(claimed(O::Running), |row| {
            row.kind = INGESTION_FILE.into();
            row.stage = Some(IngestionStage::Hashing);
            row.worker = Some("ingest-0190ab12cd34ef5601234567890abcde".into());
            row.lease_expires_at = Some(at("2026-05-01T15:04:05Z"));
        }),
    );
    ingestion.state = None;
    table.push(ingestion);
    table
}

#[test]
fn every_situation_reads_as_one_sentence() {
    let rendered: Vec<String> = situations()
        .iter()
        .map(|situation| format!("{:<36} {}", situation.name, situation.sentence()))
        .collect();
    insta::assert_snapshot!(rendered.join("\n"));
}

#[test]
fn every_operation_status_has_its_own_sentence() {
    let covered: std::collections::BTreeSet<OperationStatus> = situations()
        .iter()
        .map(|situation| situation.operation.status)
        .collect();
    let missing: Vec<_> = OperationStatus::ALL
        .iter()
        .filter(|status| !covered.contains(status))
        .collect();
    assert!(missing.is_empty(), "statuses without a situation: {missing:?}");
}

#[test]
fn the_briefest_sentences_read_as_support_staff_say_them() {
    let sentences: std::collections::BTreeMap<&str, String> = situations()
        .iter()
        .map(|situation| (situation.name, situation.sentence()))
        .collect();
    assert_eq!(
        sentences["retry waiting"],
        "waiting for a retry at 15:04:12 (attempt 2 of 5 failed: decoder crashed)"
    );
    assert!(sentences["blocked by a need whose work ended"]
        .starts_with("blocked: needs capability metadata (failed_terminal)"));
    assert_eq!(
        sentences["queued, behind"],
        "queued behind 3 claimable thumbnail tasks of higher priority"
    );
    assert_eq!(sentences["queued, first"], "next in line");
    assert_eq!(sentences["running"], "running on worker py-1, lease ends in 12 s");
    assert!(sentences["cancel requested"].starts_with("cancel requested, waiting for the worker to acknowledge"));
}

#[test]
fn a_lease_that_ended_says_recovery_interrupts_it() {
    let situation = Situation::new("leased", claimed(OperationStatus::Leased));
    assert_eq!(
        situation.sentence(),
        "running on worker py-1, lease ended 10 s ago: recovery interrupts it"
    );
}

fn envelope(version: i64, recorded_at: &str, actor: &str, event: Event) -> EventEnvelope {
    EventEnvelope {
        seq: 10 + version,
        stream_id: StreamId::operation(OperationId(Uuid::from_u128(1))),
        stream_version: version,
        schema_version: 1,
        recorded_at: at(recorded_at),
        actor: actor.into(),
        correlation_id: "correlation".into(),
        causation_id: None,
        event,
    }
}

fn timeline() -> Vec<EventEnvelope> {
    let operation_id = OperationId(Uuid::from_u128(1));
    let reason = |text: &str| OperationReason {
        operation_id,
        reason: text.into(),
    };
    vec![
        envelope(
            1,
            "2026-04-30T23:59:58.500Z",
            "cli",
            Event::OperationCreated(OperationCreated {
                operation_id,
                kind: "thumbnail".into(),
                target: OperationTarget {
                    media_id: Some(MediaId(Uuid::from_u128(0x0190_ab12_0000_7000_8000_0000_0000_0002))),
                    region_id: None,
                    path: None,
                },
                revision: Some("sha256:3f2a9c1d55aa".into()),
                inputs: serde_json::json!({"max_side": 256}),
                status: OperationStatus::Queued,
                priority: 5,
                task_version: Some("1".into()),
                task: None,
            }),
        ),
        envelope(
            2,
            "2026-05-01T00:00:01Z",
            "py-1",
            Event::OperationClaimed(OperationClaimed {
                operation_id,
                claim_token: "secret-claim-token".into(),
                worker: "py-1".into(),
                revision: Some("sha256:3f2a9c1d55aa".into()),
                lease_expires_at: at("2026-05-01T00:01:01Z"),
            }),
        ),
        envelope(
            3,
            "2026-05-01T00:00:01.250Z",
            "py-1",
            Event::OperationStarted(OperationStarted {
                operation_id,
                claim_token: "secret-claim-token".into(),
            }),
        ),
        envelope(
            4,
            "2026-05-01T00:00:03Z",
            "py-1",
            Event::OperationProgressed(OperationProgressed {
                operation_id,
                phase: "resizing".into(),
                processed: 10,
                total: Some(40),
            }),
        ),
        envelope(
            5,
            "2026-05-01T00:00:09Z",
            "py-1",
            Event::OperationFailed(OperationFailed {
                operation_id,
                claim_token: Some("secret-claim-token".into()),
                error: "decoder crashed\n  at line 3".into(),
                retryable: true,
            }),
        ),
        envelope(
            6,
            "2026-05-01T00:00:09Z",
            "py-1",
            Event::OperationRetryScheduled(OperationRetryScheduled {
                operation_id,
                available_at: at("2026-05-01T00:00:11.300Z"),
                backoff_ms: 2_000,
                jitter_ms: 300,
            }),
        ),
        envelope(
            7,
            "2026-05-01T00:04:12Z",
            "ingest-0190ab12cd34ef5601234567890abcde",
            Event::OperationSucceeded(OperationSucceeded {
                operation_id,
                claim_token: Some("secret-claim-token".into()),
                output: serde_json::json!({"path": "/thumbs/beach.png", "width": 256}),
            }),
        ),
        envelope(
            8,
            "2026-05-01T09:30:00Z",
            "alice",
            Event::ReviewResolved(ReviewResolved {
                operation_id,
                entry_id: 17,
                action: "acknowledge".into(),
                reason: "seen".into(),
                revision: None,
            }),
        ),
        envelope(
            9,
            "2026-05-01T09:30:00Z",
            "alice",
            Event::OperationCancelled(reason("")),
        ),
    ]
}

#[test]
fn a_timeline_reads_as_a_history_in_the_readers_zone() {
    let lines = history_lines(&timeline(), None, &Utc);
    assert!(
        lines.iter().all(|line| !line.contains("secret-claim-token")),
        "claim tokens stay out of the history"
    );
    insta::assert_snapshot!(lines.join("\n"));
}

#[test]
fn a_history_that_goes_on_shows_its_first_step_and_no_date_on_the_same_day() {
    let events = timeline();
    let lines = history_lines(&events[2..3], Some(events[1].recorded_at), &Utc);
    assert_eq!(lines, ["  00:00:01       +0.3 s  py-1              started"]);
    // Two hours east the whole history is on one day.
    let east = FixedOffset::east_opt(2 * 3_600).unwrap();
    let lines = history_lines(&events, None, &east);
    assert_eq!(lines.iter().filter(|line| !line.starts_with(' ')).count(), 1);
    assert_eq!(lines[0], "2026-05-01 (+02:00)");
}
