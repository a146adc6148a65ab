//! The backend conformance suite: behavioural tests written once and run
//! against every backend. A backend's test file implements [`Harness`] and
//! invokes [`conformance_tests!`](crate::conformance_tests), which expands to
//! one `#[tokio::test]` per check below.

use crate::{
    ClaimQuery, ErrorKind, ExpectedVersion, Lease, RowTarget, ScratchTarget, Store, StoreError, StreamAppend, WriteTx,
};
use futures::TryStreamExt;
use opledger_domain::envelope::{NewEvent, StreamId};
use opledger_domain::events::{Event, MediaRegistered, MediaUpdated};
use opledger_domain::ids::MediaId;
use opledger_domain::ids::{OperationId, RegionId};
use opledger_domain::projections::{
    Cell, MediaRow, ProcessingStateRow, RegionRow, Row, RowChange, Stored, MEDIA_STATES_TABLE, REGION_STATES_TABLE,
};
use opledger_domain::status::OperationStatus;
use opledger_domain::tasks::{TargetType, CLAIMABLE_STATUSES};
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
            inserts_that_skip_a_seq_or_a_stream_version_are_refused_by_the_database,
            corrupt_row_is_a_corrupt_error_naming_its_seq,
            read_all_pages_through_the_whole_log,
            expected_version_is_checked_per_stream,
            concurrent_writes_on_one_store_succeed_or_fail_on_their_own,
            claimable_rows_come_by_priority_then_waiting_time_within_kinds_and_time,
            leases_round_trip_and_expired_claims_honour_extended_leases,
            rows_are_found_by_non_key_columns,
            processing_state_constraints_are_enforced_by_the_database,
            rows_written_from_a_known_stored_row_land_whole_even_when_the_store_lacks_it,
            concurrent_pieces_whose_rows_the_database_refuses_fail_alone_with_their_events,
            rows_loaded_from_several_tables_at_once_equal_rows_loaded_table_by_table,
            scratch_loads_see_every_row_written_before_them,
            a_scratch_write_the_database_refuses_is_reported_by_a_later_call_at_the_latest
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

/// A raw row of the log: seq, stream, version.
type RawRow<'a> = (i64, &'a str, i64);

/// Raw rows of the log in one INSERT.
fn raw_insert(rows: &[RawRow]) -> String {
    let values: Vec<String> = rows
        .iter()
        .map(|(seq, stream, version)| {
            format!("({seq}, '{stream}', {version}, 'e', 1, '{{}}', '2026-01-01T00:00:00.000000Z', 'raw', 'c')")
        })
        .collect();
    format!(
        "INSERT INTO media_operation_events \
         (seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id) \
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

// ---- the work protocol's tables and queries ----------------------------

/// Many pieces at once, each appending an event and writing a processing
/// state; the database refuses the rows of some (a claimed status without a
/// claim). A backend may gather a piece's writes and send them later, even
/// after the piece's work returned: a refused piece must still get the
/// database's refusal as its own answer, and lose its event with its rows,
/// while the others keep theirs.
pub async fn concurrent_pieces_whose_rows_the_database_refuses_fail_alone_with_their_events<H: Harness>(harness: &H) {
    let store = harness.open().await;
    const PIECES: u128 = 40;
    let items: Vec<RowChange> = (0..PIECES)
        .map(|n| upsert(Row::Media(media_row(media(100 + n)))))
        .collect();
    write_rows(&store, items).await.unwrap();
    let refused = |n: u128| n % 4 == 1;
    let mut tasks = Vec::new();
    for n in 0..PIECES {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let item = media(100 + n);
            let append = one(
                &StreamId::media(item),
                ExpectedVersion::NoStream,
                vec![registered(item, n as i64)],
            );
            let mut row = state(
                1000 + n,
                TargetType::Media,
                item.0,
                "metadata",
                OperationStatus::Queued,
                0,
                0,
            );
            if refused(n) {
                row.status = OperationStatus::Leased;
            }
            let result = store
                .write(move |tx: &mut <H::Store as Store>::Tx| {
                    Box::pin(async move {
                        tx.append(append).await?;
                        tx.write_rows(&[upsert(Row::ProcessingState(row))]).await
                    })
                })
                .await;
            (n, result)
        }));
    }
    let mut kept = Vec::new();
    for task in tasks {
        let (n, result) = task.await.unwrap();
        match result {
            Err(error) if refused(n) => assert_eq!(error.kind, ErrorKind::Constraint, "piece {n}: {error}"),
            Ok(()) if !refused(n) => kept.push(n),
            other => panic!("piece {n}: unexpected {other:?}"),
        }
    }
    let all: Vec<_> = store.read_all(0, 100).try_collect().await.unwrap();
    let mut logged: Vec<StreamId> = all.iter().map(|envelope| envelope.stream_id.clone()).collect();
    logged.sort();
    let mut expected: Vec<StreamId> = kept.iter().map(|n| StreamId::media(media(100 + n))).collect();
    expected.sort();
    assert_eq!(logged, expected, "exactly the kept pieces' events are in the log");
    assert_eq!(
        all.iter().map(|envelope| envelope.seq).collect::<Vec<_>>(),
        (1..=kept.len() as i64).collect::<Vec<_>>(),
        "gap-free despite the refused pieces"
    );
    let targets: Vec<Cell> = (0..PIECES).map(|n| Cell::Uuid(media(100 + n).0)).collect();
    let found = store
        .write(move |tx: &mut <H::Store as Store>::Tx| {
            Box::pin(async move { tx.find_rows_in(&MEDIA_STATES_TABLE, "media_id", &targets).await })
        })
        .await
        .unwrap();
    let mut found = operation_ids(&found);
    found.sort_unstable();
    assert_eq!(
        found,
        kept.iter().map(|n| 1000 + n).collect::<Vec<_>>(),
        "exactly the kept pieces' rows are stored"
    );
}

fn media_row(media_id: MediaId) -> MediaRow {
    MediaRow {
        media_id,
        path: format!("/library/{media_id}.png"),
        media_kind: "image".into(),
        content_digest: Some("sha256:00".into()),
        byte_size: Some(1),
        registered_at: at(0),
        updated_at: at(0),
        version: 1,
    }
}

fn region_row(region_id: RegionId, media_id: MediaId) -> RegionRow {
    RegionRow {
        region_id,
        media_id,
        x: 0,
        y: 0,
        width: 10,
        height: 10,
        region_revision: 1,
        created_at: at(0),
    }
}

/// An unclaimed processing state of `kind` on a target.
fn state(
    operation: u128,
    target_type: TargetType,
    target: Uuid,
    kind: &str,
    status: OperationStatus,
    priority: i64,
    available_at: i64,
) -> ProcessingStateRow {
    ProcessingStateRow {
        operation_id: OperationId(Uuid::from_u128(operation)),
        target_type,
        target_id: target,
        task_kind: kind.into(),
        status,
        priority,
        requested_revision: format!("rev-{operation}"),
        inputs: "{}".into(),
        claimed_revision: None,
        completed_revision: None,
        output: None,
        claim_token: None,
        worker: None,
        claimed_at: None,
        lease_expires_at: None,
        attempt_count: 0,
        failure_count: 0,
        interruption_count: 0,
        available_at: at(available_at),
        cancel_requested: false,
        last_error: None,
        status_reason: None,
        updated_at: at(0),
        version: 1,
    }
}

/// The same state, held by `token` with a lease ending at `lease_ends`.
fn claimed(mut row: ProcessingStateRow, token: &str, lease_ends: i64) -> ProcessingStateRow {
    row.status = OperationStatus::Leased;
    row.claimed_revision = Some(row.requested_revision.clone());
    row.claim_token = Some(token.into());
    row.worker = Some("worker".into());
    row.claimed_at = Some(at(0));
    row.lease_expires_at = Some(at(lease_ends));
    row.attempt_count = 1;
    row
}

fn upsert(row: Row) -> RowChange {
    RowChange::upsert(row)
}

/// Writes rows in one transaction (no events: the store persists whatever
/// rows it is given; the folds are tested elsewhere).
async fn write_rows<S: Store>(store: &S, rows: Vec<RowChange>) -> Result<(), StoreError> {
    store
        .write(move |tx: &mut S::Tx| Box::pin(async move { tx.write_rows(&rows).await }))
        .await
}

fn operation_ids(rows: &[Row]) -> Vec<u128> {
    rows.iter()
        .map(|row| match row {
            Row::ProcessingState(state) => state.operation_id.0.as_u128(),
            other => panic!("not a processing state: {other:?}"),
        })
        .collect()
}

pub async fn claimable_rows_come_by_priority_then_waiting_time_within_kinds_and_time<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let (item, other) = (media(1), media(2));
    let region = RegionId(Uuid::from_u128(77));
    let media_state = |operation, target: MediaId, kind, status, priority, available_at| {
        upsert(Row::ProcessingState(state(
            operation,
            TargetType::Media,
            target.0,
            kind,
            status,
            priority,
            available_at,
        )))
    };
    use OperationStatus::{Queued, RetryWaiting, Succeeded};
    write_rows(
        &store,
        vec![
            upsert(Row::Media(media_row(item))),
            upsert(Row::Media(media_row(other))),
            upsert(Row::Region(region_row(region, item))),
            media_state(1, item, "metadata", Queued, 0, 30),
            media_state(2, item, "thumbnail", Queued, 5, 50),
            media_state(3, other, "metadata", RetryWaiting, 0, 10),
            // Due later than `now`: not offered.
            media_state(4, other, "thumbnail", Queued, 9, 500),
            // Not claimable whatever its time.
            media_state(5, item, "perceptual_hash", Succeeded, 9, 0),
            upsert(Row::ProcessingState(state(
                6,
                TargetType::Region,
                region.0,
                "crop_embedding",
                Queued,
                5,
                20,
            ))),
        ],
    )
    .await
    .unwrap();
    let claimable = |kinds: Vec<&str>, limit: usize| {
        let store = store.clone();
        let query = ClaimQuery {
            kinds: kinds.into_iter().map(String::from).collect(),
            statuses: CLAIMABLE_STATUSES,
            now: at(100),
            limit,
        };
        async move {
            store
                .write(move |tx: &mut <H::Store as Store>::Tx| Box::pin(async move { tx.claimable(&query).await }))
                .await
                .unwrap()
        }
    };
    // Priority first (5, 5, 0, 0), then the longest waiting, across both tables.
    assert_eq!(operation_ids(&claimable(vec![], 10).await), vec![6, 2, 3, 1]);
    assert_eq!(operation_ids(&claimable(vec!["metadata"], 10).await), vec![3, 1]);
    assert_eq!(
        operation_ids(&claimable(vec!["thumbnail", "crop_embedding"], 10).await),
        vec![6, 2]
    );
    assert_eq!(operation_ids(&claimable(vec![], 2).await), vec![6, 2]);
    assert!(claimable(vec!["auto_tagging"], 10).await.is_empty());
}

pub async fn leases_round_trip_and_expired_claims_honour_extended_leases<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let item = media(1);
    let held = |operation, kind, token, lease_ends| {
        Row::ProcessingState(claimed(
            state(
                operation,
                TargetType::Media,
                item.0,
                kind,
                OperationStatus::Queued,
                0,
                0,
            ),
            token,
            lease_ends,
        ))
    };
    write_rows(
        &store,
        vec![
            upsert(Row::Media(media_row(item))),
            upsert(held(1, "metadata", "token-a", 50)),
            upsert(held(2, "thumbnail", "token-b", 50)),
            upsert(held(3, "perceptual_hash", "token-c", 500)),
        ],
    )
    .await
    .unwrap();
    let lease = |token: &str, operation: u128, ends: i64| Lease {
        claim_token: token.into(),
        operation_id: OperationId(Uuid::from_u128(operation)),
        worker: "worker".into(),
        heartbeat_at: at(10),
        lease_expires_at: at(ends),
        phase: Some("reading".into()),
        processed: Some(3),
        total: None,
        progressed_at: Some(at(10)),
        progress_unrecorded: true,
    };
    // token-b's heartbeat extended its lease past `now`; token-a's did not.
    let leases = vec![
        lease("token-a", 1, 50),
        lease("token-b", 2, 300),
        lease("token-c", 3, 500),
    ];
    let written = leases.clone();
    store
        .write(move |tx: &mut <H::Store as Store>::Tx| {
            Box::pin(async move {
                for lease in &written {
                    tx.put_lease(lease).await?;
                }
                // Read back inside the same transaction.
                let found = tx.lease("token-b").await?;
                assert_eq!(found.as_ref(), Some(&written[1]));
                let mut many = tx
                    .leases(&["token-c".to_string(), "nobody".to_string(), "token-a".to_string()])
                    .await?;
                many.sort_by(|left, right| left.claim_token.cmp(&right.claim_token));
                assert_eq!(many, vec![written[0].clone(), written[2].clone()]);
                Ok::<_, StoreError>(())
            })
        })
        .await
        .unwrap();
    assert_eq!(store.lease("token-a").await.unwrap(), Some(leases[0].clone()));
    assert_eq!(store.lease("nobody").await.unwrap(), None);

    let expired = store.expired_claims(at(100), 10).await.unwrap();
    let tokens: Vec<&str> = expired.iter().map(|claim| claim.claim_token.as_str()).collect();
    assert_eq!(tokens, vec!["token-a"], "only the claim whose extended lease ended");
    assert_eq!(expired[0].lease_expires_at, at(50));
    assert_eq!(expired[0].operation_id, OperationId(Uuid::from_u128(1)));
    assert_eq!(store.expired_claims(at(1_000), 10).await.unwrap().len(), 3);
    assert_eq!(
        store.expired_claims(at(1_000), 2).await.unwrap().len(),
        2,
        "the limit holds"
    );

    store
        .write(move |tx: &mut <H::Store as Store>::Tx| Box::pin(async move { tx.delete_lease("token-a").await }))
        .await
        .unwrap();
    assert_eq!(store.lease("token-a").await.unwrap(), None);
}

pub async fn rows_are_found_by_non_key_columns<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let (first, second, third) = (media(1), media(2), media(3));
    let row = |operation, target: MediaId, kind| {
        Row::ProcessingState(state(
            operation,
            TargetType::Media,
            target.0,
            kind,
            OperationStatus::Queued,
            0,
            0,
        ))
    };
    write_rows(
        &store,
        vec![
            upsert(Row::Media(media_row(first))),
            upsert(Row::Media(media_row(second))),
            upsert(Row::Media(media_row(third))),
            upsert(row(1, first, "metadata")),
            upsert(row(2, first, "thumbnail")),
            upsert(row(3, second, "metadata")),
            upsert(row(4, third, "metadata")),
        ],
    )
    .await
    .unwrap();
    let found = store
        .find_rows(
            &MEDIA_STATES_TABLE,
            &[
                ("media_id", Cell::Uuid(first.0)),
                ("task_kind", Cell::Text("thumbnail".into())),
            ],
            10,
        )
        .await
        .unwrap();
    assert_eq!(operation_ids(&found), vec![2]);
    let targets = vec![Cell::Uuid(first.0), Cell::Uuid(third.0)];
    let found = store
        .write(move |tx: &mut <H::Store as Store>::Tx| {
            Box::pin(async move { tx.find_rows_in(&MEDIA_STATES_TABLE, "media_id", &targets).await })
        })
        .await
        .unwrap();
    assert_eq!(operation_ids(&found), vec![1, 2, 4]);
    let unknown = store
        .find_rows(&MEDIA_STATES_TABLE, &[("no_such_column", Cell::Null)], 1)
        .await;
    assert_eq!(unknown.unwrap_err().kind, ErrorKind::Constraint);
}

pub async fn processing_state_constraints_are_enforced_by_the_database<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let (item, ghost) = (media(1), media(2));
    let region = RegionId(Uuid::from_u128(5));
    write_rows(
        &store,
        vec![
            upsert(Row::Media(media_row(item))),
            upsert(Row::Region(region_row(region, item))),
        ],
    )
    .await
    .unwrap();
    let base = state(1, TargetType::Media, item.0, "metadata", OperationStatus::Queued, 0, 0);
    let refused = [
        // A target that does not exist (the foreign key).
        ("a missing media item", {
            let mut row = base.clone();
            row.target_id = ghost.0;
            row
        }),
        // A claimed status without a claim.
        ("a leased row without a token", {
            let mut row = base.clone();
            row.status = OperationStatus::Leased;
            row
        }),
        // A claim on an unclaimed status.
        ("a queued row with a token", {
            let mut row = claimed(base.clone(), "token", 10);
            row.status = OperationStatus::Queued;
            row
        }),
        // A kind that runs on regions, in the media table.
        ("a region kind on a media item", {
            let mut row = base.clone();
            row.task_kind = "crop_embedding".into();
            row
        }),
    ];
    for (what, row) in refused {
        let error = write_rows(&store, vec![upsert(Row::ProcessingState(row))])
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Constraint, "{what}: {error}");
    }
    // One state per (target, kind).
    write_rows(&store, vec![upsert(Row::ProcessingState(base.clone()))])
        .await
        .unwrap();
    let mut twin = base.clone();
    twin.operation_id = OperationId(Uuid::from_u128(2));
    let error = write_rows(&store, vec![upsert(Row::ProcessingState(twin))])
        .await
        .unwrap_err();
    // A unique key taken is a Conflict, as on the log: two writers raced to
    // create the same thing, and the loser may read again and retry.
    assert_eq!(error.kind, ErrorKind::Conflict, "{error}");
    // The status vocabulary is the database's too, not only the typed row's.
    harness
        .execute_raw(&format!(
            "UPDATE media_processing_states SET status = 'done' WHERE operation_id = '{}'",
            base.operation_id
        ))
        .await
        .expect_err("a status outside the vocabulary is refused");
    // Removing the item removes its states, its regions and theirs.
    let region_state = state(
        3,
        TargetType::Region,
        region.0,
        "crop_embedding",
        OperationStatus::Queued,
        0,
        0,
    );
    write_rows(&store, vec![upsert(Row::ProcessingState(region_state))])
        .await
        .unwrap();
    write_rows(&store, vec![RowChange::delete(Row::Media(media_row(item)).key())])
        .await
        .unwrap();
    for table in [&MEDIA_STATES_TABLE, &REGION_STATES_TABLE] {
        assert_eq!(store.count_rows(table).await.unwrap(), 0, "{} cascaded", table.name);
    }
}

/// A change that says what the store held lets a store write only the
/// changed columns; the row read back must be the whole new row all the
/// same, an unchanged row must stay, and a change whose stored row turns out
/// to be missing must still land.
/// A backend may load a fold's rows of several tables in one statement
/// (PostgreSQL decodes them from JSON there): every column type must come
/// back exactly as it does table by table — times to the microsecond,
/// unicode and JSON text, NULLs, booleans, large integers.
pub async fn rows_loaded_from_several_tables_at_once_equal_rows_loaded_table_by_table<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let (first, second) = (media(1), media(2));
    let mut unusual = media_row(second);
    unusual.path = "/library/ünïcödé \"quoted\" \\ back\tslash 写真.png".into();
    unusual.content_digest = None;
    unusual.byte_size = Some(i64::MAX - 1);
    unusual.registered_at = Timestamp::from_micros(1_780_000_000_123_457);
    let region = RegionId(Uuid::from_u128(7));
    let mut held = claimed(
        state(
            3,
            TargetType::Media,
            first.0,
            "metadata",
            OperationStatus::Queued,
            -5,
            1,
        ),
        "token-α",
        999_999,
    );
    held.inputs = r#"{"b": [1, 2.5, "x"], "a": {"nested": null}}"#.into();
    held.cancel_requested = true;
    held.last_error = Some("line one\nline two".into());
    let plain = state(
        4,
        TargetType::Media,
        second.0,
        "thumbnail",
        OperationStatus::Queued,
        0,
        0,
    );
    let rows = vec![
        Row::Media(media_row(first)),
        Row::Media(unusual),
        Row::Region(region_row(region, first)),
        Row::ProcessingState(held),
        Row::ProcessingState(plain),
    ];
    write_rows(&store, rows.iter().cloned().map(upsert).collect())
        .await
        .unwrap();
    let mut requests: Vec<(&'static opledger_domain::projections::TableSpec, Vec<String>)> = Vec::new();
    for row in &rows {
        let key = row.key();
        let table = row.table();
        match requests.iter_mut().find(|(known, _)| known.name == table.name) {
            Some((_, keys)) => keys.push(key.key.to_string()),
            None => requests.push((table, vec![key.key.to_string()])),
        }
    }
    // A key that names no row is simply missing from the answer.
    requests[0].1.push(media(99).to_string());
    let (at_once, one_by_one) = store
        .write(move |tx: &mut <H::Store as Store>::Tx| {
            Box::pin(async move {
                let at_once = tx.load_rows_of_tables(&requests).await?;
                let mut one_by_one = Vec::new();
                for (table, keys) in &requests {
                    one_by_one.extend(tx.load_rows(table, keys).await?);
                }
                Ok::<_, StoreError>((at_once, one_by_one))
            })
        })
        .await
        .unwrap();
    let sorted = |mut rows: Vec<Row>| {
        rows.sort_by_key(|row| (row.table().name, row.key().key));
        rows
    };
    assert_eq!(sorted(one_by_one), sorted(rows.clone()), "table by table");
    assert_eq!(sorted(at_once), sorted(rows), "at once");
}

pub async fn rows_written_from_a_known_stored_row_land_whole_even_when_the_store_lacks_it<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let item = media(1);
    let queued = state(1, TargetType::Media, item.0, "metadata", OperationStatus::Queued, 0, 0);
    write_rows(
        &store,
        vec![
            upsert(Row::Media(media_row(item))),
            upsert(Row::ProcessingState(queued.clone())),
        ],
    )
    .await
    .unwrap();
    let mut running = queued.clone();
    running.status = OperationStatus::Running;
    running.claim_token = Some("token-a".into());
    running.worker = Some("worker-a".into());
    running.claimed_at = Some(at(5));
    running.lease_expires_at = Some(at(30_000_000));
    running.claimed_revision = Some(running.requested_revision.clone());
    running.attempt_count = 1;
    running.version = 2;
    let changed = |before: &ProcessingStateRow, after: &ProcessingStateRow| RowChange {
        key: Row::ProcessingState(after.clone()).key(),
        before: Stored::Present(Box::new(Row::ProcessingState(before.clone()))),
        after: Some(std::sync::Arc::new(Row::ProcessingState(after.clone()))),
    };
    write_rows(&store, vec![changed(&queued, &running)]).await.unwrap();
    let read = |store: &H::Store| {
        let store = store.clone();
        async move {
            store
                .find_rows(&MEDIA_STATES_TABLE, &[("media_id", Cell::Uuid(item.0))], 10)
                .await
                .unwrap()
        }
    };
    assert_eq!(read(&store).await, vec![Row::ProcessingState(running.clone())]);
    // Nothing changed: the row stays as it is.
    write_rows(&store, vec![changed(&running, &running)]).await.unwrap();
    assert_eq!(read(&store).await, vec![Row::ProcessingState(running.clone())]);
    // The change claims the store holds a row it does not: it lands whole.
    let mut other = state(2, TargetType::Media, item.0, "thumbnail", OperationStatus::Queued, 0, 0);
    let claimed_before = other.clone();
    other.priority = 5;
    write_rows(&store, vec![changed(&claimed_before, &other)])
        .await
        .unwrap();
    let mut expected = vec![Row::ProcessingState(running), Row::ProcessingState(other)];
    let mut found = read(&store).await;
    let by_kind = |row: &Row| match row {
        Row::ProcessingState(state) => state.task_kind.clone(),
        other => panic!("not a processing state: {other:?}"),
    };
    found.sort_by_key(by_kind);
    expected.sort_by_key(by_kind);
    assert_eq!(found, expected);
}

/// A scratch copy may write behind (`ScratchTarget::commit_chunk`), but a
/// load must still see every row written before it, deletions too, with
/// commits in between or not: replay reloads rows it dropped from its cache.
pub async fn scratch_loads_see_every_row_written_before_them<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let mut scratch = store.open_scratch().await.expect("open scratch");
    let items: Vec<MediaId> = (1..=50).map(media).collect();
    let key = |item: &MediaId| Row::Media(media_row(*item)).key().key.to_string();
    for round in 0..20 {
        // Each round rewrites every row with a new path, then deletes one.
        let changes: Vec<RowChange> = items
            .iter()
            .map(|item| {
                let mut row = media_row(*item);
                row.path = format!("/round-{round}/{}", item.0);
                upsert(Row::Media(row))
            })
            .collect();
        scratch.write_rows(&changes).await.expect("write");
        let gone = items[round];
        scratch
            .write_rows(&[RowChange::delete(Row::Media(media_row(gone)).key())])
            .await
            .expect("delete");
        if round % 2 == 0 {
            scratch.commit_chunk().await.expect("commit");
        }
        let keys: Vec<String> = items.iter().map(key).collect();
        let loaded = scratch
            .load_rows(&opledger_domain::projections::MEDIA_TABLE, &keys)
            .await
            .expect("load");
        assert_eq!(loaded.len(), items.len() - 1, "round {round}");
        for row in loaded {
            let Row::Media(row) = row else {
                panic!("not a media row: {row:?}")
            };
            assert_ne!(row.media_id, gone, "round {round}: a deleted row came back");
            assert!(
                row.path.starts_with(&format!("/round-{round}/")),
                "round {round}: {}",
                row.path
            );
        }
    }
    scratch.flush().await.expect("flush");
    scratch.discard().await.expect("discard");
}

/// A write the scratch copy's database refuses fails the replay: if
/// `write_rows` returned before writing, the failure is the answer of the
/// next call, and `flush` never reports success after it.
pub async fn a_scratch_write_the_database_refuses_is_reported_by_a_later_call_at_the_latest<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let mut scratch = store.open_scratch().await.expect("open scratch");
    let item = media(1);
    scratch
        .write_rows(&[upsert(Row::Media(media_row(item)))])
        .await
        .expect("write the media item");
    // A claimed status without a claim: the CHECK constraint refuses it.
    let mut refused = state(1, TargetType::Media, item.0, "metadata", OperationStatus::Queued, 0, 0);
    refused.status = OperationStatus::Leased;
    let written = scratch.write_rows(&[upsert(Row::ProcessingState(refused))]).await;
    let error = match written {
        Err(error) => error,
        Ok(()) => {
            // Written behind: the next call answers with the failure.
            let next = scratch.commit_chunk().await;
            let then = scratch.flush().await;
            match (next, then) {
                (Err(error), _) | (Ok(()), Err(error)) => error,
                (Ok(()), Ok(())) => panic!("a refused scratch write was never reported"),
            }
        }
    };
    assert_eq!(error.kind, ErrorKind::Constraint, "{error}");
    let _ = scratch.discard().await;
}
