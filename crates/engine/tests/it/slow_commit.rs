//! Slow commits, on real databases of each backend (`backend_tests!`): the
//! store is wrapped in `opledger_testkit::faults::FaultyStore` with every
//! write transaction held open for 400 ms after its work and before the
//! backend commits it (a slow disk, a stalled WAL flush), on the real
//! clock. Meanwhile:
//!
//! - a worker heartbeats one claim of a 2 s lease for 4 s while
//!   recovery runs every 100 ms: every heartbeat answers with a lease still
//!   live when the worker hears it, and recovery never interrupts the claim;
//!   the other claim, which no one heartbeats, is interrupted once its
//!   lease has run out (slow commits do not keep dead claims alive);
//! - a completion commits slowly while a reader samples the log head, the
//!   task's operation and processing state, its lease and the running
//!   counts: every sample taken between two equal reads of the head shows
//!   the ledger wholly before the completion or wholly after it, and while
//!   the commit is held the reader sees the state before it.
//!
//! Afterwards replay equals live, SQLite's `PRAGMA integrity_check` says
//! `ok`, and no lease is left that no claim holds.

use opledger_domain::kinds::legacy;
use opledger_domain::projections::{Row, MEDIA_STATES_TABLE, OPERATIONS_TABLE, REGION_STATES_TABLE};
use opledger_domain::{MediaId, OperationStatus, Timestamp};
use opledger_engine::{ClaimRequest, CommandContext, Completion, Engine, TaskClaim, TaskRequest, TaskTarget};
use opledger_store::Store;
use opledger_testkit::faults::FaultyStore;
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use sqlx::Connection;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const COMMIT_DELAY: Duration = Duration::from_millis(400);
/// Heartbeats come about every second at worst (a recovery's slow commit
/// to wait for, their own, the pause between them): half the lease.
const LEASE_MS: i64 = 2_000;

fn thumbnail(media: MediaId) -> TaskRequest {
    TaskRequest {
        target: TaskTarget::Media(media),
        kind: "thumbnail".into(),
        inputs: json!({"max_side": 256, "format": "png"}),
        priority: 0,
    }
}

/// What a reader sees of one task, between two reads of the head.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    head: i64,
    operation: OperationStatus,
    state: OperationStatus,
    leased: bool,
    succeeded_count: i64,
}

/// One sample, or None when the head moved while it was taken.
async fn sample<S: Store>(store: &S, engine: &Engine<S>, claim: &TaskClaim) -> Option<Sample> {
    let head = store.head().await.unwrap();
    let operation = store
        .scan_table(&OPERATIONS_TABLE)
        .await
        .unwrap()
        .into_iter()
        .find_map(|row| match row {
            Row::Operation(operation) if operation.operation_id == claim.operation_id => Some(operation.status),
            _ => None,
        })
        .expect("the task's operation row");
    let state = all_states(store)
        .await
        .into_iter()
        .find(|(operation_id, _, _)| *operation_id == claim.operation_id)
        .map(|(_, status, _)| status)
        .expect("the task's processing state");
    let leased = store.lease(&claim.claim_token).await.unwrap().is_some();
    let succeeded_count = engine
        .status()
        .await
        .unwrap()
        .operations_by_status
        .iter()
        .find(|(status, _)| status == "succeeded")
        .map_or(0, |(_, count)| *count);
    let again = store.head().await.unwrap();
    (again == head).then_some(Sample {
        head,
        operation,
        state,
        leased,
        succeeded_count,
    })
}

/// Every processing state: (operation, status, claim token).
async fn all_states<S: Store>(store: &S) -> Vec<(opledger_domain::OperationId, OperationStatus, Option<String>)> {
    let mut states = Vec::new();
    for table in [&MEDIA_STATES_TABLE, &REGION_STATES_TABLE] {
        for row in store.scan_table(table).await.unwrap() {
            if let Row::ProcessingState(state) = row {
                states.push((state.operation_id, state.status, state.claim_token.clone()));
            }
        }
    }
    states
}

/// The processing states whose claim is held (leased or running).
async fn held_states<S: Store>(store: &S) -> Vec<(opledger_domain::OperationId, OperationStatus, Option<String>)> {
    all_states(store)
        .await
        .into_iter()
        .filter(|(_, status, _)| matches!(status, OperationStatus::Leased | OperationStatus::Running))
        .collect()
}

async fn a_slow_commit_is_never_half_visible_and_leases_and_heartbeats_keep_their_time<B: Backend>(backend: &B) {
    let store = FaultyStore::new(backend.open().await);
    let engine = Engine::new(store.clone());
    engine.startup().await.unwrap();
    let context = CommandContext::actor("test");
    engine
        .declare(&CommandContext::actor("deploy"), legacy::declarations())
        .await
        .unwrap();
    for path in ["/photos/a.png", "/photos/b.png"] {
        let media = engine
            .register_media(&context, path, "image", Some(format!("sha256:{path}")), Some(10))
            .await
            .unwrap();
        engine.request_task(&context, thumbnail(media)).await.unwrap();
    }
    let claims = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec!["thumbnail".into()],
                worker: "w1".into(),
                lease_ms: LEASE_MS,
                limit: 2,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap();
    assert_eq!(claims.len(), 2);
    let (kept, abandoned) = (claims[0].clone(), claims[1].clone());

    // From here on every commit is slow.
    store.slow_commits(Some(COMMIT_DELAY));
    let stop = Arc::new(AtomicBool::new(false));
    let recoverer = {
        let (engine, stop) = (engine.clone(), stop.clone());
        tokio::spawn(async move {
            let system = CommandContext::actor("system");
            let mut interrupted = 0;
            while !stop.load(Ordering::SeqCst) {
                interrupted += engine.recover(&system).await.unwrap().interrupted;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            interrupted
        })
    };
    let fence = kept.fence();
    let started = Instant::now();
    let mut heartbeats = 0;
    while started.elapsed() < Duration::from_millis(4_000) {
        let asked = Instant::now();
        let beat = engine.heartbeat(&fence, None).await.unwrap();
        assert!(
            asked.elapsed() >= COMMIT_DELAY,
            "the heartbeat was answered before its slow commit"
        );
        let now = engine.read_time().await.unwrap();
        assert!(
            beat.lease_expires_at > now,
            "heartbeat {heartbeats} answered a lease already over: ends {:?}, now {now:?}",
            beat.lease_expires_at
        );
        heartbeats += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let interrupted = recoverer.await.unwrap();
    assert!(heartbeats >= 3, "only {heartbeats} heartbeats in 4 s");
    assert_eq!(interrupted, 1, "recovery interrupts the abandoned claim, and only it");
    let held: Vec<String> = held_states(&store)
        .await
        .into_iter()
        .filter_map(|(_, _, token)| token)
        .collect();
    assert_eq!(held, vec![kept.claim_token.clone()], "the heartbeated claim is held");
    assert!(
        store.lease(&abandoned.claim_token).await.unwrap().is_none(),
        "the abandoned claim's lease is gone"
    );

    // A completion commits slowly while a reader samples.
    let before = sample(&store, &engine, &kept).await.expect("no writer runs now");
    let completing = {
        let (engine, fence) = (engine.clone(), fence.clone());
        tokio::spawn(async move {
            engine
                .complete_task(
                    &CommandContext::actor("w1"),
                    &fence,
                    Completion::Output(json!({"path": "/thumbs/a.png"})),
                )
                .await
        })
    };
    let asked = Instant::now();
    let (mut samples, mut before_while_held, mut after) = (0, 0, 0);
    while !completing.is_finished() {
        if let Some(seen) = sample(&store, &engine, &kept).await {
            samples += 1;
            if seen == before {
                if asked.elapsed() >= COMMIT_DELAY / 2 && !completing.is_finished() {
                    before_while_held += 1;
                }
            } else {
                assert_eq!(
                    (seen.operation, seen.state, seen.leased),
                    (OperationStatus::Succeeded, OperationStatus::Succeeded, false),
                    "half of the completion was visible: {seen:?} (before: {before:?})"
                );
                assert_eq!(seen.succeeded_count, before.succeeded_count + 1, "{seen:?}");
                assert!(seen.head > before.head, "{seen:?}");
                after += 1;
            }
        }
    }
    let done = completing.await.unwrap().unwrap();
    assert_eq!(done.status, OperationStatus::Succeeded);
    assert!(
        asked.elapsed() >= COMMIT_DELAY,
        "the completion was answered before its slow commit"
    );
    assert!(
        before_while_held > 0,
        "no sample saw the ledger while the commit was held ({samples} samples)"
    );
    store.clear();
    let after_commit = sample(&store, &engine, &kept).await.expect("no writer runs now");
    assert_eq!(
        (after_commit.operation, after_commit.state, after_commit.leased),
        (OperationStatus::Succeeded, OperationStatus::Succeeded, false)
    );
    println!(
        "{heartbeats} slow heartbeats kept a {LEASE_MS} ms lease; {samples} samples during a slow completion: \
         {before_while_held} before it while its commit was held, {after} after it, none half"
    );

    // The ledger is whole.
    let report = engine.verify().await.unwrap();
    assert!(report.is_identical(), "{}", report.render());
    if backend.name() == "sqlite" {
        let mut connection = sqlx::SqliteConnection::connect(&backend.url()).await.unwrap();
        let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&mut connection)
            .await
            .unwrap();
        assert_eq!(integrity, "ok");
    }
    let mut leased: Vec<String> = store
        .expired_claims(Timestamp::MAX, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|lease| lease.claim_token)
        .collect();
    leased.sort();
    let mut held: Vec<String> = held_states(&store)
        .await
        .into_iter()
        .filter_map(|(_, _, token)| token)
        .collect();
    held.sort();
    assert_eq!(leased, held, "leases and held claims differ");
}

backend_tests!(a_slow_commit_is_never_half_visible_and_leases_and_heartbeats_keep_their_time);
