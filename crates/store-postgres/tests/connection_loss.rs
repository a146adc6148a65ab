//! A backend connection terminated mid-transaction (`pg_terminate_backend`,
//! as an operator or a failover would) surfaces as Unavailable, leaves
//! nothing of the transaction behind, and a retry succeeds exactly once.

use futures::TryStreamExt;
use opledger_domain::ids::MediaId;
use opledger_domain::StreamId;
use opledger_store::conformance::{registered, Harness};
use opledger_store::{ErrorKind, ExpectedVersion, Store, StoreError, StreamAppend, WriteTx};
use opledger_store_postgres::PostgresStore;
use sqlx::Connection;
use tokio::sync::oneshot;
use uuid::Uuid;

fn append_for(media_id: MediaId) -> Vec<StreamAppend> {
    vec![StreamAppend {
        stream_id: StreamId::media(media_id),
        expected: ExpectedVersion::NoStream,
        events: vec![registered(media_id, 1)],
    }]
}

/// Terminates every other backend of the database that is inside a
/// transaction; returns how many.
async fn terminate_open_transactions(harness: &opledger_testkit::PostgresBackend) -> i64 {
    let mut connection = harness.connect().await;
    let (terminated,): (i64,) = sqlx::query_as(
        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
           AND state IN ('idle in transaction', 'active') AND backend_type = 'client backend'",
    )
    .fetch_one(&mut connection)
    .await
    .unwrap();
    let _ = connection.close().await;
    terminated
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_backend_is_unavailable_and_a_retry_appends_exactly_once() {
    let Some(harness) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let store = harness.open().await;
    let media_id = MediaId(Uuid::from_u128(42));
    for statement_after_loss in [true, false] {
        let (appended, appended_seen) = oneshot::channel::<()>();
        let (terminated, terminated_seen) = oneshot::channel::<()>();
        let writer = store.clone();
        let write = tokio::spawn(async move {
            writer
                .write(move |tx: &mut <PostgresStore as Store>::Tx| {
                    Box::pin(async move {
                        tx.append(append_for(media_id)).await?;
                        let _ = appended.send(());
                        let _ = terminated_seen.await;
                        if statement_after_loss {
                            // The next statement meets the dead connection…
                            tx.read_events(0, 10).await?;
                        }
                        // …or the COMMIT does.
                        Ok::<_, StoreError>(())
                    })
                })
                .await
        });
        appended_seen.await.unwrap();
        assert_eq!(terminate_open_transactions(&harness).await, 1);
        terminated.send(()).unwrap();
        let error = write.await.unwrap().expect_err("the transaction's connection is gone");
        assert_eq!(error.kind, ErrorKind::Unavailable, "{error}");
        assert_eq!(
            store.head().await.unwrap(),
            0,
            "nothing of the lost transaction is visible"
        );
    }
    // The pool replaces the lost connections; the retry appends once.
    let seqs = store
        .write(move |tx: &mut <PostgresStore as Store>::Tx| {
            Box::pin(async move {
                let envelopes = tx.append(append_for(media_id)).await?;
                Ok::<_, StoreError>(envelopes.iter().map(|envelope| envelope.seq).collect::<Vec<_>>())
            })
        })
        .await
        .unwrap();
    assert_eq!(seqs, vec![1]);
    let all: Vec<_> = store.read_all(0, 10).try_collect().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(store.read_stream(&StreamId::media(media_id)).await.unwrap().len(), 1);
}
