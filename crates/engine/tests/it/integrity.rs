//! The log's hash chain on every backend: `verify` walks it and names the
//! first seq where it breaks, so an event and the projection row it folded
//! into, changed together behind opledger's back (which replay alone
//! cannot see), are found; events appended by many concurrent commands
//! (several in one group commit, writers taking turns on PostgreSQL's lock)
//! chain in seq order; a log written before the chain existed is linked
//! when the ledger is next opened for writing, to exactly the hashes the
//! appends would have written; and the last check is recorded for `status`.

use futures::TryStreamExt;
use opledger_domain::chain::BreakReason;
use opledger_domain::Timestamp;
use opledger_engine::{CommandContext, Engine, FixedClock, UuidV7Ids};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use std::sync::Arc;

/// SQL that lets the test change a stored event (the log refuses it):
/// what someone with the database's credentials could do.
fn unlocked_update<B: Backend>(backend: &B, update: &str) -> String {
    match backend.name() {
        "sqlite" => format!(
            "DROP TRIGGER media_operation_events_no_update; {update}; \
             CREATE TRIGGER media_operation_events_no_update BEFORE UPDATE ON media_operation_events \
             WHEN NOT (OLD.chain_hash IS NULL AND NEW.chain_hash IS NOT NULL) \
             BEGIN SELECT RAISE(ABORT, 'media_operation_events is append-only: UPDATE refused'); END"
        ),
        _ => format!(
            "ALTER TABLE media_operation_events DISABLE TRIGGER USER; \
             ALTER TABLE media_operation_events DROP CONSTRAINT media_operation_events_chained; {update}; \
             ALTER TABLE media_operation_events ADD CONSTRAINT media_operation_events_chained \
             CHECK (chain_hash IS NOT NULL) NOT VALID; \
             ALTER TABLE media_operation_events ENABLE TRIGGER USER"
        ),
    }
}

/// An engine at a fixed time; each its own ids, as separate processes.
async fn engine_of<B: Backend>(backend: &B) -> Engine<B::Store> {
    let clock = Arc::new(FixedClock::at(Timestamp::parse("2026-06-01T12:00:00.000000Z").unwrap()));
    let engine = Engine::with_clock(backend.open().await, clock, Arc::new(UuidV7Ids));
    engine.startup().await.unwrap();
    engine
}

async fn register<S: Store>(engine: &Engine<S>, paths: &[&str]) {
    let context = CommandContext::actor("test");
    for path in paths {
        engine
            .register_media(&context, path, "image", None, None)
            .await
            .unwrap();
    }
}

async fn an_event_changed_with_its_projection_row_breaks_the_chain_at_its_seq<B: Backend>(backend: &B) {
    let engine = engine_of(backend).await;
    register(&engine, &["/photos/0.png", "/photos/1.png", "/photos/2.png"]).await;
    let clean = engine.verify().await.unwrap();
    assert!(clean.is_identical(), "{}", clean.render());
    let head = engine.store().head().await.unwrap();
    assert_eq!(clean.chain.as_ref().unwrap().seq, head);

    let events: Vec<_> = engine.store().read_all(0, 100).try_collect().await.unwrap();
    let tampered = events
        .iter()
        .find(|event| event.event_type() == "media_registered" && event.event.payload_json().contains("/photos/1.png"))
        .expect("the registration of /photos/1.png")
        .seq;
    // The event and the row it folded into, changed alike: replay agrees
    // with the live tables, as it did before the chain existed.
    backend
        .execute_raw(&unlocked_update(
            backend,
            &format!(
                "UPDATE media_operation_events SET payload = replace(payload, '/photos/1.png', '/elsewhere.png') \
                 WHERE seq = {tampered}"
            ),
        ))
        .await
        .unwrap();
    backend
        .execute_raw("UPDATE media SET path = '/elsewhere.png' WHERE path = '/photos/1.png'")
        .await
        .unwrap();

    let report = engine.verify().await.unwrap();
    assert!(
        report.diffs.is_empty(),
        "replay agrees with the changed rows: {}",
        report.render()
    );
    let broken = report.chain.clone().unwrap_err();
    assert_eq!(broken.seq, tampered, "{broken}");
    assert!(matches!(broken.reason, BreakReason::Mismatch { .. }), "{broken:?}");
    assert!(!report.is_identical());
    assert!(
        report.render().contains(&format!("breaks at seq {tampered}")),
        "{}",
        report.render()
    );

    // The check is recorded for `status`, with where it broke.
    let recorded = engine.record_verification(&report).await.unwrap();
    let status = engine.status().await.unwrap();
    assert_eq!(status.integrity, Some(recorded.clone()));
    assert_eq!(recorded.broken_at, Some(tampered));
    assert!(!recorded.intact);
    assert_eq!(
        recorded.verified_at,
        Timestamp::parse("2026-06-01T12:00:00.000000Z").unwrap()
    );

    // The ledger goes on: new events chain on, and the break stays named.
    register(&engine, &["/photos/3.png"]).await;
    assert_eq!(engine.verify().await.unwrap().chain.unwrap_err().seq, tampered);
}

async fn an_intact_check_is_recorded_with_the_chain_hash_it_reached<B: Backend>(backend: &B) {
    let engine = engine_of(backend).await;
    assert_eq!(engine.status().await.unwrap().integrity, None);
    register(&engine, &["/a.png", "/b.png"]).await;
    let report = engine.verify().await.unwrap();
    let recorded = engine.record_verification(&report).await.unwrap();
    assert!(recorded.intact);
    assert_eq!(recorded.position, engine.store().head().await.unwrap());
    assert_eq!(recorded.head_hash, Some(report.chain.unwrap().hash.to_hex()));
    // A second check replaces the first.
    register(&engine, &["/c.png"]).await;
    let again = engine
        .record_verification(&engine.verify().await.unwrap())
        .await
        .unwrap();
    assert_eq!(engine.status().await.unwrap().integrity, Some(again.clone()));
    assert_eq!(again.position, recorded.position + 1);
}

async fn concurrent_commands_chain_each_event_to_its_predecessor_by_seq<B: Backend>(backend: &B) {
    let engine = Arc::new(engine_of(backend).await);
    // Commands in flight together: the SQLite writer groups them into one
    // commit, PostgreSQL's writer groups them and its lock orders the rest.
    let mut running = Vec::new();
    for client in 0..8 {
        let engine = Arc::clone(&engine);
        running.push(tokio::spawn(async move {
            let context = CommandContext::actor("test");
            for index in 0..12 {
                engine
                    .register_media(&context, &format!("/c{client}/{index}.png"), "image", None, None)
                    .await
                    .unwrap();
            }
        }));
    }
    // And a second store on the same database, as another process would write.
    let other = engine_of(backend).await;
    register(&other, &["/other/0.png", "/other/1.png", "/other/2.png"]).await;
    for client in running {
        client.await.unwrap();
    }
    let report = engine.verify().await.unwrap();
    assert!(report.is_identical(), "{}", report.render());
    assert_eq!(report.chain.unwrap().seq, 8 * 12 + 3);
}

async fn a_log_written_before_the_chain_is_linked_when_next_opened_for_writing<B: Backend>(backend: &B) {
    let engine = engine_of(backend).await;
    register(&engine, &["/old/0.png", "/old/1.png", "/old/2.png"]).await;
    let appended = engine.verify().await.unwrap().chain.unwrap();
    // The log as migration 0004 finds a ledger written before it: no links.
    backend
        .execute_raw(&unlocked_update(
            backend,
            "UPDATE media_operation_events SET chain_hash = NULL",
        ))
        .await
        .unwrap();
    let unlinked = engine.verify().await.unwrap().chain.unwrap_err();
    assert_eq!((unlinked.seq, unlinked.reason), (1, BreakReason::Missing));

    // Opening for writing links it, to the very hashes the appends wrote.
    let reopened = engine_of(backend).await;
    let linked = reopened.verify().await.unwrap();
    assert!(linked.is_identical(), "{}", linked.render());
    assert_eq!(linked.chain.unwrap(), appended);
    register(&reopened, &["/new.png"]).await;
    assert!(reopened.verify().await.unwrap().is_identical());
}

async fn a_row_without_a_link_after_linked_ones_is_not_filled_but_named<B: Backend>(backend: &B) {
    let engine = engine_of(backend).await;
    register(&engine, &["/0.png", "/1.png", "/2.png"]).await;
    backend
        .execute_raw(&unlocked_update(
            backend,
            "UPDATE media_operation_events SET chain_hash = NULL WHERE seq = 2",
        ))
        .await
        .unwrap();
    // Opening for writing fills only a log that was never linked.
    let reopened = engine_of(backend).await;
    let broken = reopened.verify().await.unwrap().chain.unwrap_err();
    assert_eq!((broken.seq, broken.reason), (2, BreakReason::Missing));
}

backend_tests!(
    an_event_changed_with_its_projection_row_breaks_the_chain_at_its_seq,
    an_intact_check_is_recorded_with_the_chain_hash_it_reached,
    a_log_written_before_the_chain_is_linked_when_next_opened_for_writing,
    a_row_without_a_link_after_linked_ones_is_not_filled_but_named,
);
backend_tests!(worker_threads = 4; concurrent_commands_chain_each_event_to_its_predecessor_by_seq);
