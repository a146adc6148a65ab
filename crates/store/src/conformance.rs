//! The backend conformance suite: behavioural tests written once and run
//! against every backend. A backend's test file implements [`Harness`] and
//! invokes [`conformance_tests!`](crate::conformance_tests), which expands to
//! one `#[tokio::test]` per check below.

use crate::{ErrorKind, ExpectedVersion, Store, StoreError, StreamAppend, WriteTx};
use futures::TryStreamExt;
use opledger_domain::envelope::{NewEvent, StreamId};
use opledger_domain::events::{Event, MediaRegistered, MediaUpdated};
use opledger_domain::ids::MediaId;
use opledger_domain::time::Timestamp;
use std::collections::BTreeMap;
use std::future::Future;
use uuid::Uuid;

/// How the suite reaches one fresh database of a backend.
pub trait Harness: Send + Sync + 'static {
    type Store: Store;

    /// Opens a store on this harness's database. Each call opens new
    /// connections (its own writer), as a second process would.
    fn open(&self) -> impl Future<Output = Self::Store> + Send;

    /// Runs one SQL statement directly, bypassing the store.
    fn execute_raw(&self, sql: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Expands to one test per conformance check for a harness constructor.
/// `$make` is an async expression producing a fresh harness.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            append_and_read_round_trip,
            appends_are_atomic_across_streams,
            concurrent_appends_at_the_same_expected_version_exactly_one_conflicts,
            seq_is_gap_free_and_ordered_after_eight_concurrent_appenders,
            update_and_delete_on_the_log_are_refused_by_the_database,
            corrupt_row_is_a_corrupt_error_naming_its_seq,
            read_all_pages_through_the_whole_log,
            expected_version_is_checked_per_stream,
            concurrent_writes_on_one_store_succeed_or_fail_on_their_own
        );
    };
    (@each $make:expr; $($name:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $make.await;
                $crate::conformance::$name(&harness).await;
            }
        )+
    };
}

fn at(micros: i64) -> Timestamp {
    Timestamp::from_micros(1_780_000_000_000_000 + micros)
}

/// A registration event for a media item, for tests that need valid events.
pub fn registered(media_id: MediaId, n: i64) -> NewEvent {
    NewEvent {
        event: Event::MediaRegistered(MediaRegistered {
            media_id,
            path: format!("/library/{n}.png"),
            media_kind: "image".into(),
            content_digest: Some(format!("sha256:{n:064x}")),
            byte_size: Some(n),
        }),
        recorded_at: at(n),
        actor: "conformance".into(),
        correlation_id: "conformance-run".into(),
        causation_id: Some(format!("command-{n}")),
    }
}

fn updated(media_id: MediaId, n: i64) -> NewEvent {
    NewEvent {
        event: Event::MediaUpdated(MediaUpdated {
            media_id,
            path: format!("/library/{n}.png"),
            content_digest: Some(format!("sha256:{n:064x}")),
            byte_size: Some(n),
        }),
        recorded_at: at(n),
        actor: "conformance".into(),
        correlation_id: "conformance-run".into(),
        causation_id: None,
    }
}

fn media(n: u128) -> MediaId {
    MediaId(Uuid::from_u128(n))
}

async fn append<S: Store>(store: &S, appends: Vec<StreamAppend>) -> Result<Vec<i64>, StoreError> {
    store
        .write(move |tx: &mut S::Tx| {
            Box::pin(async move {
                let envelopes = tx.append(appends).await?;
                Ok::<_, StoreError>(envelopes.iter().map(|envelope| envelope.seq).collect())
            })
        })
        .await
}

fn one(stream: &StreamId, expected: ExpectedVersion, events: Vec<NewEvent>) -> Vec<StreamAppend> {
    vec![StreamAppend {
        stream_id: stream.clone(),
        expected,
        events,
    }]
}

pub async fn append_and_read_round_trip<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let media_id = media(1);
    let stream = StreamId::media(media_id);
    let events = vec![registered(media_id, 1), updated(media_id, 2)];
    let seqs = append(&store, one(&stream, ExpectedVersion::NoStream, events.clone()))
        .await
        .expect("append");
    assert_eq!(seqs, vec![1, 2]);

    let read = store.read_stream(&stream).await.expect("read stream");
    assert_eq!(read.len(), 2);
    for (index, (envelope, sent)) in read.iter().zip(&events).enumerate() {
        assert_eq!(envelope.seq, index as i64 + 1);
        assert_eq!(envelope.stream_version, index as i64 + 1);
        assert_eq!(envelope.stream_id, stream);
        assert_eq!(envelope.event, sent.event);
        assert_eq!(envelope.recorded_at, sent.recorded_at);
        assert_eq!(envelope.actor, sent.actor);
        assert_eq!(envelope.correlation_id, sent.correlation_id);
        assert_eq!(envelope.causation_id, sent.causation_id);
        assert_eq!(envelope.schema_version, sent.event.schema_version());
    }
    let all: Vec<_> = store.read_all(0, 10).try_collect().await.expect("read all");
    assert_eq!(all, read);
    assert_eq!(store.head().await.unwrap(), 2);
    assert!(store.read_stream(&StreamId::media(media(99))).await.unwrap().is_empty());
}

pub async fn appends_are_atomic_across_streams<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let first = StreamId::media(media(1));
    append(
        &store,
        one(&first, ExpectedVersion::NoStream, vec![registered(media(1), 1)]),
    )
    .await
    .unwrap();
    // The second stream's expectation fails, so the first stream's events
    // of the same call must not be appended either.
    let second = StreamId::media(media(2));
    let error = append(
        &store,
        vec![
            StreamAppend {
                stream_id: second.clone(),
                expected: ExpectedVersion::NoStream,
                events: vec![registered(media(2), 2)],
            },
            StreamAppend {
                stream_id: first.clone(),
                expected: ExpectedVersion::NoStream,
                events: vec![updated(media(1), 3)],
            },
        ],
    )
    .await
    .expect_err("the stale expectation must refuse the whole call");
    assert_eq!(error.kind, ErrorKind::Conflict, "{error}");
    assert!(store.read_stream(&second).await.unwrap().is_empty());
    assert_eq!(store.head().await.unwrap(), 1);
}

pub async fn concurrent_appends_at_the_same_expected_version_exactly_one_conflicts<H: Harness>(harness: &H) {
    for round in 0..10u128 {
        let left = harness.open().await;
        let right = harness.open().await;
        let stream = StreamId::media(media(1000 + round));
        // Both writers saw the stream at version 1 and append on top of it.
        append(
            &left,
            one(
                &stream,
                ExpectedVersion::NoStream,
                vec![registered(media(1000 + round), 1)],
            ),
        )
        .await
        .unwrap();
        let left_events = one(
            &stream,
            ExpectedVersion::Exactly(1),
            vec![updated(media(1000 + round), 2)],
        );
        let right_events = one(
            &stream,
            ExpectedVersion::Exactly(1),
            vec![updated(media(1000 + round), 3)],
        );
        let (left_result, right_result) = tokio::join!(
            tokio::spawn(async move { append(&left, left_events).await }),
            tokio::spawn(async move { append(&right, right_events).await })
        );
        let results = [left_result.unwrap(), right_result.unwrap()];
        let won = results.iter().filter(|result| result.is_ok()).count();
        let conflicts = results
            .iter()
            .filter(|result| matches!(result, Err(error) if error.kind == ErrorKind::Conflict))
            .count();
        assert_eq!((won, conflicts), (1, 1), "round {round}: {results:?}");
        let store = harness.open().await;
        assert_eq!(store.read_stream(&stream).await.unwrap().len(), 2);
    }
}

pub async fn seq_is_gap_free_and_ordered_after_eight_concurrent_appenders<H: Harness>(harness: &H) {
    const APPENDERS: u128 = 8;
    const BATCHES: i64 = 40;
    let mut tasks = Vec::new();
    for appender in 0..APPENDERS {
        let store = harness.open().await;
        tasks.push(tokio::spawn(async move {
            let media_id = media(5000 + appender);
            let stream = StreamId::media(media_id);
            let mut acknowledged = Vec::new();
            for batch in 0..BATCHES {
                let events = if batch == 0 {
                    vec![registered(media_id, 0), updated(media_id, 1)]
                } else {
                    vec![updated(media_id, batch * 2), updated(media_id, batch * 2 + 1)]
                };
                let seqs = append(&store, one(&stream, ExpectedVersion::Any, events))
                    .await
                    .expect("append under concurrency");
                acknowledged.extend(seqs);
            }
            acknowledged
        }));
    }
    let mut acknowledged = Vec::new();
    for task in tasks {
        acknowledged.extend(task.await.unwrap());
    }
    acknowledged.sort_unstable();
    let total = APPENDERS as i64 * BATCHES * 2;
    assert_eq!(
        acknowledged,
        (1..=total).collect::<Vec<_>>(),
        "every acknowledged seq, no gaps"
    );

    let store = harness.open().await;
    let all: Vec<_> = store.read_all(0, 64).try_collect().await.unwrap();
    let seqs: Vec<i64> = all.iter().map(|envelope| envelope.seq).collect();
    assert_eq!(seqs, (1..=total).collect::<Vec<_>>());
    let mut versions: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for envelope in &all {
        versions
            .entry(envelope.stream_id.to_string())
            .or_default()
            .push(envelope.stream_version);
    }
    for (stream, versions) in versions {
        assert_eq!(
            versions,
            (1..=BATCHES * 2).collect::<Vec<_>>(),
            "{stream} contiguous in seq order"
        );
    }
}

pub async fn update_and_delete_on_the_log_are_refused_by_the_database<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let stream = StreamId::media(media(1));
    append(
        &store,
        one(&stream, ExpectedVersion::NoStream, vec![registered(media(1), 1)]),
    )
    .await
    .unwrap();
    let update = harness
        .execute_raw("UPDATE media_operation_events SET actor = 'mallory' WHERE seq = 1")
        .await;
    assert!(update.is_err(), "UPDATE on the log must be refused");
    let delete = harness
        .execute_raw("DELETE FROM media_operation_events WHERE seq = 1")
        .await;
    assert!(delete.is_err(), "DELETE on the log must be refused");
    let read = store.read_stream(&stream).await.unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].actor, "conformance");
}

pub async fn corrupt_row_is_a_corrupt_error_naming_its_seq<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let stream = StreamId::media(media(1));
    append(
        &store,
        one(&stream, ExpectedVersion::NoStream, vec![registered(media(1), 1)]),
    )
    .await
    .unwrap();
    harness
        .execute_raw(
            "INSERT INTO media_operation_events \
             (seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id) \
             VALUES (2, 'media-x', 1, 'no_such_event', 1, '{}', '2026-01-01T00:00:00.000000Z', 'mallory', 'c')",
        )
        .await
        .expect("raw insert of an unknown event type");
    harness
        .execute_raw(
            "INSERT INTO media_operation_events \
             (seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id) \
             VALUES (3, 'media-y', 1, 'media_registered', 1, '{\"media_id\": 7}', '2026-01-01T00:00:00.000000Z', 'mallory', 'c')",
        )
        .await
        .expect("raw insert of a malformed payload");

    let error = store
        .read_all(0, 10)
        .try_collect::<Vec<_>>()
        .await
        .expect_err("an unknown event type must not decode");
    assert_eq!(error.kind, ErrorKind::Corrupt, "{error}");
    assert_eq!(error.seq, Some(2));
    assert!(error.message.contains('2'), "{error}");

    let error = store
        .read_all(2, 10)
        .try_collect::<Vec<_>>()
        .await
        .expect_err("a malformed payload must not decode");
    assert_eq!(error.kind, ErrorKind::Corrupt);
    assert_eq!(error.seq, Some(3));

    let error = store
        .read_stream(&StreamId::from_stored("media-y".into()))
        .await
        .expect_err("read_stream decodes too");
    assert_eq!(error.seq, Some(3));
}

pub async fn read_all_pages_through_the_whole_log<H: Harness>(harness: &H) {
    let store = harness.open().await;
    for n in 0..25u128 {
        let stream = StreamId::media(media(n));
        append(
            &store,
            one(&stream, ExpectedVersion::NoStream, vec![registered(media(n), n as i64)]),
        )
        .await
        .unwrap();
    }
    for page_size in [1, 7, 25, 1000] {
        let all: Vec<_> = store.read_all(0, page_size).try_collect().await.unwrap();
        assert_eq!(all.len(), 25, "page size {page_size}");
        let tail: Vec<_> = store.read_all(20, page_size).try_collect().await.unwrap();
        assert_eq!(
            tail.iter().map(|envelope| envelope.seq).collect::<Vec<_>>(),
            vec![21, 22, 23, 24, 25]
        );
    }
}

pub async fn expected_version_is_checked_per_stream<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let stream = StreamId::media(media(1));
    append(
        &store,
        one(&stream, ExpectedVersion::Exactly(0), vec![registered(media(1), 1)]),
    )
    .await
    .unwrap();
    for wrong in [
        ExpectedVersion::NoStream,
        ExpectedVersion::Exactly(0),
        ExpectedVersion::Exactly(2),
    ] {
        let error = append(&store, one(&stream, wrong, vec![updated(media(1), 2)]))
            .await
            .expect_err("a wrong expectation");
        assert_eq!(error.kind, ErrorKind::Conflict, "{wrong:?}: {error}");
    }
    append(
        &store,
        one(&stream, ExpectedVersion::Exactly(1), vec![updated(media(1), 2)]),
    )
    .await
    .unwrap();
    append(&store, one(&stream, ExpectedVersion::Any, vec![updated(media(1), 3)]))
        .await
        .unwrap();
    let versions: Vec<i64> = store
        .read_stream(&stream)
        .await
        .unwrap()
        .iter()
        .map(|envelope| envelope.stream_version)
        .collect();
    assert_eq!(versions, vec![1, 2, 3]);
}

pub async fn concurrent_writes_on_one_store_succeed_or_fail_on_their_own<H: Harness>(harness: &H) {
    // Many pieces of work at once on one store: a backend may group them into
    // one transaction, but a piece that fails (after appending) or panics
    // must leave nothing behind and must not take the others with it.
    let store = harness.open().await;
    let mut tasks = Vec::new();
    for n in 0..60u128 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let append = one(
                &StreamId::media(media(9000 + n)),
                ExpectedVersion::NoStream,
                vec![registered(media(9000 + n), n as i64)],
            );
            let result = store
                .write(move |tx: &mut <H::Store as Store>::Tx| {
                    Box::pin(async move {
                        let envelopes = tx.append(append).await?;
                        match n % 5 {
                            1 => Err(StoreError::conflict("refused after appending")),
                            3 if n % 15 == 3 => panic!("work {n} panics after appending"),
                            _ => Ok(envelopes[0].stream_id.clone()),
                        }
                    })
                })
                .await;
            (n, result)
        }));
    }
    let mut kept = Vec::new();
    for task in tasks {
        let (n, result) = task.await.unwrap();
        match (n % 5, n % 15, result) {
            (1, _, Err(error)) => assert_eq!(error.kind, ErrorKind::Conflict, "{error}"),
            (3, 3, Err(error)) => assert_eq!(error.kind, ErrorKind::Unavailable, "{error}"),
            (_, _, Ok(stream)) => kept.push(stream),
            (_, _, other) => panic!("work {n}: unexpected {other:?}"),
        }
    }
    let all: Vec<_> = store.read_all(0, 100).try_collect().await.unwrap();
    assert_eq!(all.len(), kept.len(), "exactly the successful pieces are in the log");
    assert_eq!(
        all.iter().map(|envelope| envelope.seq).collect::<Vec<_>>(),
        (1..=kept.len() as i64).collect::<Vec<_>>(),
        "gap-free despite the rolled-back pieces"
    );
    for stream in kept {
        assert!(all.iter().any(|envelope| envelope.stream_id == stream), "{stream} lost");
    }
}
