//! Hosts whose clocks disagree share one ledger. Found when this was tried
//! adversarially: a worker host whose clock was an hour ahead expired every
//! other worker's live leases on PostgreSQL (`recover`, or `task claim`,
//! from that host), a host an hour behind claimed nothing, and `recorded_at`
//! went backwards along seq. Now a write command decides and records at
//! the time its transaction gives it — the server's clock on PostgreSQL,
//! read under the append lock, never before the last event's time — so
//! these hold, and replay stays exact (the time is in the events).

use futures::TryStreamExt;
use opledger_domain::kinds::legacy;
use opledger_domain::projections::{Row, MEDIA_STATES_TABLE};
use opledger_domain::{EventEnvelope, MediaId, OperationStatus, Timestamp};
use opledger_engine::{
    ClaimRequest, Clock, CommandContext, Completion, Engine, FixedClock, SequentialIds, SkewedClock, SystemClock,
    TaskClaim, TaskRequest, TaskTarget, UuidV7Ids,
};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend, Harness};
use serde_json::json;
use std::sync::Arc;

const HOUR_MS: i64 = 3_600_000;

fn context(actor: &str) -> CommandContext {
    CommandContext::actor(actor)
}

fn claim_request(worker: &str, lease_ms: i64) -> ClaimRequest {
    ClaimRequest {
        kinds: Vec::new(),
        worker: worker.into(),
        lease_ms,
        limit: 100,
        principal: None,
        versions: Default::default(),
    }
}

/// Every event of the log, in seq order.
async fn log<S: Store>(engine: &Engine<S>) -> Vec<EventEnvelope> {
    engine.store().read_all(0, 1_000).try_collect().await.unwrap()
}

fn assert_time_never_goes_backwards(events: &[EventEnvelope]) {
    for pair in events.windows(2) {
        assert!(
            pair[1].recorded_at >= pair[0].recorded_at,
            "seq {} at {} is before seq {} at {}",
            pair[1].seq,
            pair[1].recorded_at,
            pair[0].seq,
            pair[0].recorded_at
        );
    }
}

async fn assert_replay_identical<S: Store>(engine: &Engine<S>) {
    let report = engine.verify().await.unwrap();
    assert!(report.is_identical(), "{}", report.render());
}

/// A registered item with the thumbnail and metadata tasks requested (two
/// task kinds), by `engine`.
async fn item_with_two_tasks<S: Store>(engine: &Engine<S>, path: &str) -> MediaId {
    let context = context("scheduler");
    let media = engine
        .register_media(
            &context,
            path,
            "image",
            Some(format!("sha256:{}", path.len())),
            Some(10),
        )
        .await
        .unwrap();
    for (kind, inputs) in [
        ("thumbnail", json!({"max_side": 256, "format": "png"})),
        ("metadata", json!({})),
    ] {
        engine
            .request_task(
                &context,
                TaskRequest {
                    target: TaskTarget::Media(media),
                    kind: kind.into(),
                    inputs,
                    priority: 0,
                },
            )
            .await
            .unwrap();
    }
    media
}

async fn states<S: Store>(engine: &Engine<S>) -> Vec<opledger_domain::projections::ProcessingStateRow> {
    engine
        .store()
        .scan_table(&MEDIA_STATES_TABLE)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|row| match row {
            Row::ProcessingState(state) => Some(state),
            _ => None,
        })
        .collect()
}

/// Engines of two hosts on one database: each its own store (its own
/// connections, as another process would), with its own clock.
async fn two_hosts<H: Harness>(
    harness: &H,
    first: Arc<dyn Clock>,
    second: Arc<dyn Clock>,
) -> (Engine<H::Store>, Engine<H::Store>) {
    let one = Engine::with_clock(harness.open().await, first, Arc::new(UuidV7Ids));
    one.startup().await.unwrap();
    one.declare(&context("admin"), legacy::declarations()).await.unwrap();
    let two = Engine::with_clock(harness.open().await, second, Arc::new(UuidV7Ids));
    two.startup().await.unwrap();
    (one, two)
}

async fn recorded_at_never_goes_backwards_along_seq<B: Backend>(backend: &B) {
    // Two hosts with fixed clocks an hour apart take turns on one ledger.
    let t0 = Timestamp::from_micros(1_780_000_000_000_000);
    let ahead = Arc::new(FixedClock::at(t0.plus_millis(HOUR_MS)));
    let behind = Arc::new(FixedClock::at(t0));
    let one = Engine::with_clock(backend.open().await, ahead.clone(), Arc::new(SequentialIds::default()));
    one.startup().await.unwrap();
    one.declare(&context("admin"), legacy::declarations()).await.unwrap();
    let two = Engine::with_clock(
        backend.open().await,
        behind.clone(),
        Arc::new(SequentialIds::starting_at(1_000_000)),
    );
    two.startup().await.unwrap();

    item_with_two_tasks(&one, "/photos/a.png").await;
    // The host behind requests, claims and completes after the host ahead
    // wrote: its events are recorded at the log's present, not before it,
    // and what it decides by time (what is due, a lease's end) is decided
    // at that time too.
    item_with_two_tasks(&two, "/photos/b.png").await;
    let claims = two
        .claim_tasks(&context("w-behind"), claim_request("w-behind", 60_000))
        .await
        .unwrap();
    assert_eq!(claims.len(), 4, "every task is due at the log's present");
    for claim in &claims {
        assert_eq!(claim.lease_expires_at, t0.plus_millis(HOUR_MS + 60_000));
    }
    two.complete_task(&context("w-behind"), &claims[0].fence(), Completion::Output(json!({})))
        .await
        .unwrap();
    // Its clock moves on but stays behind; the host ahead goes on.
    behind.advance_millis(1_000);
    one.complete_task(&context("w-behind"), &claims[1].fence(), Completion::Output(json!({})))
        .await
        .unwrap();
    two.fail_task(&context("w-behind"), &claims[2].fence(), "flaky", false)
        .await
        .unwrap();

    let events = log(&one).await;
    assert!(events.len() > 10);
    assert_time_never_goes_backwards(&events);
    assert!(
        events.iter().any(|event| event.actor == "w-behind"),
        "the host behind wrote"
    );
    assert!(events
        .iter()
        .filter(|event| event.actor == "w-behind")
        .all(|event| event.recorded_at >= t0.plus_millis(HOUR_MS)));
    assert_replay_identical(&one).await;
    assert_replay_identical(&two).await;
}

backend_tests!(recorded_at_never_goes_backwards_along_seq);

/// Claims of the host with the right clock, on every task of two kinds.
async fn claim_everything<S: Store>(engine: &Engine<S>, worker: &str, lease_ms: i64) -> Vec<TaskClaim> {
    let claims = engine
        .claim_tasks(&context(worker), claim_request(worker, lease_ms))
        .await
        .unwrap();
    let kinds: std::collections::BTreeSet<&str> = claims.iter().map(|claim| claim.task_kind.as_str()).collect();
    assert_eq!(kinds.len(), 2, "two task kinds claimed: {kinds:?}");
    claims
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_an_hour_ahead_does_not_expire_other_workers_live_leases_on_postgres() {
    let Some(backend) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let (honest, ahead) = two_hosts(
        &backend,
        Arc::new(SystemClock),
        Arc::new(SkewedClock::by_millis(HOUR_MS)),
    )
    .await;
    item_with_two_tasks(&honest, "/photos/a.png").await;
    item_with_two_tasks(&honest, "/photos/b.png").await;
    let claims = claim_everything(&honest, "w-honest", 60_000).await;
    assert_eq!(claims.len(), 4);

    // Recovery from the host ahead: by its clock every lease ended
    // 59 minutes ago; by the server's, none has.
    let report = ahead.recover(&context("recover-ahead")).await.unwrap();
    assert_eq!(report.interrupted, 0, "{report:?}");
    // Nor does its claim take anything, or reach past a live lease.
    let taken = ahead
        .claim_tasks(&context("w-ahead"), claim_request("w-ahead", 60_000))
        .await
        .unwrap();
    assert!(taken.is_empty(), "{taken:?}");
    // A heartbeat from the host ahead extends a lease from the server's
    // time, not an hour past it.
    item_with_two_tasks(&ahead, "/photos/c.png").await;
    let mine = ahead
        .claim_tasks(&context("w-ahead"), claim_request("w-ahead", 60_000))
        .await
        .unwrap();
    assert_eq!(mine.len(), 2, "what the host ahead requested is due at once");
    let server_now = honest.read_time().await.unwrap();
    for claim in &mine {
        let ahead_of_server = claim.lease_expires_at.as_micros() - server_now.as_micros();
        assert!(
            ahead_of_server <= 60_000_000,
            "the lease ends {ahead_of_server} µs after the server's now"
        );
    }
    let beat = ahead.heartbeat(&mine[0].fence(), None).await.unwrap();
    assert!(beat.lease_expires_at.as_micros() - server_now.as_micros() < 120_000_000);

    // The honest worker's claims all still hold: each completes.
    for claim in &claims {
        honest
            .complete_task(&context("w-honest"), &claim.fence(), Completion::Output(json!({})))
            .await
            .unwrap();
    }
    let succeeded = states(&honest)
        .await
        .iter()
        .filter(|state| state.status == OperationStatus::Succeeded)
        .count();
    assert_eq!(succeeded, 4);
    assert_time_never_goes_backwards(&log(&honest).await);
    assert_replay_identical(&honest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_an_hour_behind_still_claims_on_postgres() {
    let Some(backend) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let (honest, behind) = two_hosts(
        &backend,
        Arc::new(SystemClock),
        Arc::new(SkewedClock::by_millis(-HOUR_MS)),
    )
    .await;
    item_with_two_tasks(&honest, "/photos/a.png").await;
    // By its clock the tasks become due in an hour; by the server's they
    // are due now.
    let claims = claim_everything(&behind, "w-behind", 60_000).await;
    assert_eq!(claims.len(), 2);
    let server_now = honest.read_time().await.unwrap();
    for claim in &claims {
        // Its lease runs from the server's time, not an hour before it:
        // alive, and recovery from a host with the right clock leaves it.
        assert!(
            claim.lease_expires_at > server_now,
            "{} ≤ {server_now}",
            claim.lease_expires_at
        );
    }
    let beat = behind.heartbeat(&claims[0].fence(), None).await.unwrap();
    assert!(beat.lease_expires_at > server_now);
    let report = honest.recover(&context("recover-honest")).await.unwrap();
    assert_eq!(report.interrupted, 0, "{report:?}");
    // A retry the host behind schedules is due by the server's clock.
    behind
        .fail_task(&context("w-behind"), &claims[0].fence(), "flaky", false)
        .await
        .unwrap();
    behind
        .complete_task(&context("w-behind"), &claims[1].fence(), Completion::Output(json!({})))
        .await
        .unwrap();
    let waiting: Vec<_> = states(&honest)
        .await
        .into_iter()
        .filter(|state| state.status == OperationStatus::RetryWaiting)
        .collect();
    assert_eq!(waiting.len(), 1);
    let due = waiting[0].available_at;
    assert!(
        due > server_now && due.as_micros() - server_now.as_micros() < 60_000_000,
        "due at {due}, the server's now {server_now}"
    );
    let events = log(&honest).await;
    assert_time_never_goes_backwards(&events);
    assert!(events
        .iter()
        .filter(|event| event.actor == "w-behind")
        .all(|event| event.recorded_at >= server_now.plus_millis(-60_000)));
    assert_replay_identical(&honest).await;
}
