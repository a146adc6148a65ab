//! Replay's reading ahead: the rebuild from empty takes its chunks from a
//! task that reads the log ahead of the fold. These guard the chunking
//! edges (a log ending exactly on a chunk boundary, or just past one) and
//! that a corrupt event read ahead still stops the replay with the error
//! naming its seq. Every backend, through `backend_tests!`.

use opledger_engine::{CommandContext, Engine, EngineError};
use opledger_store::{ErrorKind, Store};
use opledger_testkit::{backend_tests, Backend};

/// Events per fold chunk in these tests: small, so a short log spans
/// several chunks.
const CHUNK: usize = 7;

/// Registers `count` media items, one event each.
async fn register_media<S: Store>(engine: &Engine<S>, count: u64) {
    let context = CommandContext::actor("test");
    for item in 0..count {
        engine
            .register_media(&context, &format!("/replay/{item:08}.jpg"), "image", None, None)
            .await
            .unwrap();
    }
}

/// A log of exactly `events` media registrations (one event each).
async fn engine_with_events<B: Backend>(backend: &B, events: u64) -> Engine<B::Store> {
    let (engine, _) = Engine::open(backend.open().await).await.unwrap();
    let engine = engine.with_fold_chunk(CHUNK);
    register_media(&engine, events).await;
    assert_eq!(engine.store().head().await.unwrap(), events as i64);
    engine
}

async fn replay_reading_ahead_folds_every_event_whether_or_not_the_log_ends_on_a_chunk<B: Backend>(backend: &B) {
    // 21 events end on the third chunk's boundary (the reader's last chunk
    // is empty); one more leaves an event in a fourth.
    let engine = engine_with_events(backend, 3 * CHUNK as u64).await;
    for round in 0..2 {
        if round == 1 {
            register_media(&engine, 1).await;
        }
        let head = engine.store().head().await.unwrap();
        assert_eq!(head, 3 * CHUNK as i64 + round);
        let stats = engine.replay().await.unwrap();
        assert_eq!(stats.events, head as u64);
        assert_eq!(stats.position, head);
        let report = engine.verify().await.unwrap();
        assert!(report.is_identical(), "{}", report.render());
        assert_eq!(report.events, head as u64);
    }
}

async fn replay_reading_ahead_stops_at_a_corrupt_event_with_an_error_naming_its_seq<B: Backend>(backend: &B) {
    let engine = engine_with_events(backend, 2 * CHUNK as u64 + 3).await;
    let corrupt_seq = engine.store().head().await.unwrap() + 1;
    backend
        .execute_raw(&format!(
            "INSERT INTO media_operation_events \
             (seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id, chain_hash) \
             VALUES ({corrupt_seq}, 'media-corrupt', 1, 'no_such_event', 1, '{{}}', '2026-01-01T00:00:00.000000Z', 'mallory', 'c', '0000000000000000000000000000000000000000000000000000000000000000')"
        ))
        .await
        .expect("raw insert of an unknown event type");
    match engine.replay().await {
        Err(EngineError::Store(error)) => {
            assert_eq!(error.kind, ErrorKind::Corrupt, "{error}");
            assert_eq!(error.seq, Some(corrupt_seq), "{error}");
        }
        other => panic!("a replay over a corrupt event must fail as corrupt, got {other:?}"),
    }
}

backend_tests!(
    replay_reading_ahead_folds_every_event_whether_or_not_the_log_ends_on_a_chunk,
    replay_reading_ahead_stops_at_a_corrupt_event_with_an_error_naming_its_seq,
);
