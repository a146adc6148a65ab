//! Given a held claim as loaded, when recovery suspects it, then it is
//! left, skipped, given back or interrupted as the rules say.

use super::*;
use crate::ids::OperationId;
use crate::status::OperationStatus;
use crate::tasks::TargetType;
use uuid::Uuid;

fn at(text: &str) -> Timestamp {
    Timestamp::parse(text).unwrap()
}

const NOW: &str = "2026-05-01T15:10:00Z";

/// A task worker `w1` holds with claim `c1`, its lease granted to 15:05.
fn held() -> ProcessingStateRow {
    ProcessingStateRow {
        operation_id: OperationId(Uuid::from_u128(7)),
        target_type: TargetType::Media,
        target_id: Uuid::from_u128(1),
        task_kind: "thumbnail".into(),
        status: OperationStatus::Running,
        priority: 0,
        requested_revision: "sha256:r1".into(),
        inputs: "{}".into(),
        task_version: Some("1".into()),
        claimed_revision: Some("sha256:r1".into()),
        completed_revision: None,
        output: None,
        claim_token: Some("c1".into()),
        worker: Some("w1".into()),
        claimed_at: Some(at("2026-05-01T15:00:00Z")),
        lease_expires_at: Some(at("2026-05-01T15:05:00Z")),
        attempt_count: 1,
        failure_count: 0,
        interruption_count: 0,
        available_at: at("2026-05-01T15:00:00Z"),
        cancel_requested: false,
        last_error: None,
        status_reason: None,
        updated_at: at("2026-05-01T15:00:00Z"),
        version: 3,
    }
}

fn decide(state: Option<&ProcessingStateRow>, suspicion: Suspicion) -> Recovery {
    decide_recovery(state, "c1", suspicion, &RetryPolicy::DEFAULT, at(NOW)).unwrap()
}

fn types(recovery: &Recovery) -> Vec<&'static str> {
    recovery.events.iter().map(Event::event_type).collect()
}

#[test]
fn a_claim_whose_lease_ended_is_interrupted_and_requeued_with_when_it_ended() {
    let recovery = decide(Some(&held()), Suspicion::LeaseEnded { extended_to: None });
    assert_eq!(recovery.recovered, Recovered::Requeued);
    assert_eq!(types(&recovery), ["operation_interrupted", "operation_requeued"]);
    let Event::OperationInterrupted(interrupted) = &recovery.events[0] else {
        panic!("an interruption first");
    };
    assert!(
        interrupted.reason.starts_with("lease expired at 2026-05-01T15:05:00"),
        "{}",
        interrupted.reason
    );
}

#[test]
fn a_lease_a_heartbeat_extended_past_now_is_skipped() {
    let extended_to = Some(at("2026-05-01T15:20:00Z"));
    let recovery = decide(Some(&held()), Suspicion::LeaseEnded { extended_to });
    assert_eq!(recovery.recovered, Recovered::Skipped);
    assert!(recovery.events.is_empty());
}

#[test]
fn a_claim_that_finished_or_was_taken_again_since_the_read_is_skipped() {
    let mut taken = held();
    taken.claim_token = Some("c2".into());
    for state in [None, Some(&taken)] {
        let recovery = decide(state, Suspicion::LeaseEnded { extended_to: None });
        assert_eq!(recovery.recovered, Recovered::Skipped);
        assert!(recovery.events.is_empty());
    }
}

#[test]
fn a_claim_of_a_worker_not_among_the_gone_is_left_uncounted() {
    let suspicion = Suspicion::WorkerGone {
        gone: false,
        cause: "worker w1 stopped".into(),
        ran: None,
    };
    let recovery = decide(Some(&held()), suspicion);
    assert_eq!(recovery.recovered, Recovered::Left);
    assert!(recovery.events.is_empty());
}

#[test]
fn a_gone_worker_s_claim_it_had_not_started_is_given_back_without_an_interruption() {
    let suspicion = Suspicion::WorkerGone {
        gone: true,
        cause: "worker w1 stopped".into(),
        ran: Some(false),
    };
    let recovery = decide(Some(&held()), suspicion);
    assert_eq!(recovery.recovered, Recovered::Released);
    assert_eq!(types(&recovery), ["operation_released"]);
}

#[test]
fn a_gone_worker_s_claim_it_was_running_is_interrupted_with_the_cause() {
    let suspicion = Suspicion::WorkerGone {
        gone: true,
        cause: "worker w1 stopped".into(),
        ran: Some(true),
    };
    let recovery = decide(Some(&held()), suspicion);
    assert_eq!(recovery.recovered, Recovered::Requeued);
    let Event::OperationInterrupted(interrupted) = &recovery.events[0] else {
        panic!("an interruption first");
    };
    assert!(interrupted
        .reason
        .starts_with("worker w1 stopped, while it ran this task"));
}

#[test]
fn an_interrupted_task_whose_cancel_was_asked_ends_cancelled() {
    let mut asked = held();
    asked.cancel_requested = true;
    let recovery = decide(Some(&asked), Suspicion::LeaseEnded { extended_to: None });
    assert_eq!(recovery.recovered, Recovered::Cancelled);
    assert_eq!(types(&recovery), ["operation_interrupted", "operation_cancelled"]);
}
