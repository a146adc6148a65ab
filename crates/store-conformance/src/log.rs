//! The event log: appends and reads round-trip, expectations refuse whole
//! calls, `seq` stays gap-free under concurrent appenders, and the database
//! itself refuses what the log must never hold.

use crate::fixtures::{append, media, one, registered, updated};
use crate::Harness;
use futures::TryStreamExt;
use opledger_domain::envelope::StreamId;
use opledger_store::{ErrorKind, ExpectedVersion, Store, StreamAppend};
use std::collections::BTreeMap;

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

/// A raw row of the log: seq, stream, version.
type RawRow<'a> = (i64, &'a str, i64);

/// Raw rows of the log in one INSERT.
fn raw_insert(rows: &[RawRow]) -> String {
    let values: Vec<String> = rows
        .iter()
        .map(|(seq, stream, version)| {
            format!("({seq}, '{stream}', {version}, 'e', 1, '{{}}', '2026-01-01T00:00:00.000000Z', 'raw', 'c', '0000000000000000000000000000000000000000000000000000000000000000')")
        })
        .collect();
    format!(
        "INSERT INTO media_operation_events \
         (seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id, chain_hash) \
         VALUES {}",
        values.join(", ")
    )
}

/// The database itself (not only the store's code) refuses an insert that
/// is not the next seq and, per stream, the next version in seq order,
/// whether it comes one row or many rows to a statement; a refused
/// statement leaves none of its rows.
pub async fn inserts_that_skip_a_seq_or_a_stream_version_are_refused_by_the_database<H: Harness>(harness: &H) {
    let store = harness.open().await;
    harness
        .execute_raw(&raw_insert(&[(1, "s-a", 1), (2, "s-a", 2)]))
        .await
        .expect("the next seqs and versions are accepted");
    let refused: [(&str, &[RawRow]); 6] = [
        ("a seq gap", &[(4, "s-b", 1)]),
        ("a seq gap inside a statement", &[(3, "s-b", 1), (5, "s-c", 1)]),
        ("a stream version gap", &[(3, "s-a", 4)]),
        ("a new stream not at version 1", &[(3, "s-b", 2)]),
        ("versions out of seq order", &[(3, "s-b", 2), (4, "s-b", 1)]),
        ("a good row with a bad one", &[(3, "s-b", 1), (4, "s-a", 2)]),
    ];
    for (what, rows) in refused {
        let result = harness.execute_raw(&raw_insert(rows)).await;
        assert!(result.is_err(), "{what} must be refused");
        assert_eq!(store.head().await.unwrap(), 2, "{what}: nothing of the statement stays");
    }
    harness
        .execute_raw(&raw_insert(&[(3, "s-b", 1), (4, "s-a", 3), (5, "s-b", 2)]))
        .await
        .expect("interleaved streams, each at its next version, are accepted");
    assert_eq!(store.head().await.unwrap(), 5);
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
             (seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id, chain_hash) \
             VALUES (2, 'media-x', 1, 'no_such_event', 1, '{}', '2026-01-01T00:00:00.000000Z', 'mallory', 'c', '0000000000000000000000000000000000000000000000000000000000000000')",
        )
        .await
        .expect("raw insert of an unknown event type");
    harness
        .execute_raw(
            "INSERT INTO media_operation_events \
             (seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id, chain_hash) \
             VALUES (3, 'media-y', 1, 'media_registered', 1, '{\"media_id\": 7}', '2026-01-01T00:00:00.000000Z', 'mallory', 'c', '0000000000000000000000000000000000000000000000000000000000000000')",
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

pub async fn a_stream_read_after_a_version_returns_only_what_follows_it_in_order<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let stream = StreamId::media(media(1));
    let other = StreamId::media(media(2));
    append(
        &store,
        one(&stream, ExpectedVersion::NoStream, vec![registered(media(1), 1)]),
    )
    .await
    .unwrap();
    // Another stream's events between this one's: never part of its read.
    append(
        &store,
        one(&other, ExpectedVersion::NoStream, vec![registered(media(2), 2)]),
    )
    .await
    .unwrap();
    for n in 2..=5 {
        append(
            &store,
            one(&stream, ExpectedVersion::Exactly(n - 1), vec![updated(media(1), n)]),
        )
        .await
        .unwrap();
    }
    let versions = |events: Vec<opledger_domain::EventEnvelope>| {
        events
            .iter()
            .map(|envelope| (envelope.stream_id.clone(), envelope.stream_version))
            .collect::<Vec<_>>()
    };
    let expect =
        |range: std::ops::RangeInclusive<i64>| range.map(|version| (stream.clone(), version)).collect::<Vec<_>>();
    assert_eq!(
        versions(store.read_stream_after(&stream, 0, 100).await.unwrap()),
        expect(1..=5)
    );
    assert_eq!(
        versions(store.read_stream_after(&stream, 3, 100).await.unwrap()),
        expect(4..=5)
    );
    assert_eq!(
        versions(store.read_stream_after(&stream, 1, 2).await.unwrap()),
        expect(2..=3)
    );
    assert!(store.read_stream_after(&stream, 5, 100).await.unwrap().is_empty());
    assert!(store
        .read_stream_after(&StreamId::media(media(99)), 0, 100)
        .await
        .unwrap()
        .is_empty());
    // The read after a version is the whole read's tail, envelope for envelope.
    let whole = store.read_stream(&stream).await.unwrap();
    assert_eq!(store.read_stream_after(&stream, 2, 100).await.unwrap(), whole[2..]);
}
