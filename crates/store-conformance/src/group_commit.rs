//! Group commit: many pieces of work at once on one store, each succeeding
//! or failing on its own however a backend groups them.

use crate::fixtures::{declare_kinds, media, media_row, one, operation_ids, registered, state, upsert, write_rows};
use crate::Harness;
use futures::TryStreamExt;
use opledger_domain::envelope::StreamId;
use opledger_domain::projections::{Cell, Row, RowChange, MEDIA_STATES_TABLE};
use opledger_domain::status::OperationStatus;
use opledger_domain::tasks::TargetType;
use opledger_store::{ErrorKind, ExpectedVersion, RowTarget, Store, StoreError, WriteTx};

pub async fn concurrent_writes_on_one_store_succeed_or_fail_on_their_own<H: Harness>(harness: &H) {
    // Many pieces of work at once on one store: a backend may group them into
    // one transaction, but a piece that fails (after appending) or panics
    // must leave nothing behind and must not take the others with it.
    let store = harness.open().await;
    declare_kinds(&store).await;
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

/// Many pieces at once, each appending an event and writing a processing
/// state; the database refuses the rows of some (a claimed status without a
/// claim). A backend may gather a piece's writes and send them later, even
/// after the piece's work returned: a refused piece must still get the
/// database's refusal as its own answer, and lose its event with its rows,
/// while the others keep theirs.
pub async fn concurrent_pieces_whose_rows_the_database_refuses_fail_alone_with_their_events<H: Harness>(harness: &H) {
    let store = harness.open().await;
    declare_kinds(&store).await;
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
