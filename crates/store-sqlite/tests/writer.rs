//! The SQLite writer thread's own guarantees, beyond the shared conformance
//! suite: a write that fails fails its piece of work even when the work
//! ignores the error, and callers on any kind of runtime are served.

use opledger_domain::{OperationId, Timestamp};
use opledger_store::{ErrorKind, Lease, Store, StoreError, WriteTx};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use uuid::Uuid;

fn lease(token: &str, processed: i64) -> Lease {
    Lease {
        claim_token: token.into(),
        operation_id: OperationId(Uuid::from_u128(1)),
        worker: "worker".into(),
        heartbeat_at: Timestamp::from_micros(0),
        lease_expires_at: Timestamp::from_micros(1_000_000),
        phase: None,
        // Negative counters are refused by the table's CHECK.
        processed: Some(processed),
        total: None,
        progressed_at: None,
        progress_unrecorded: false,
    }
}

/// Puts a good lease, then a refused one whose error the work swallows.
async fn careless_write(store: &SqliteStore, token: &str) -> Result<(), StoreError> {
    let (good, bad) = (lease(token, 1), lease(&format!("{token}-bad"), -1));
    store
        .write(move |tx: &mut <SqliteStore as Store>::Tx| {
            Box::pin(async move {
                tx.put_lease(&good).await?;
                let refused = tx.put_lease(&bad).await;
                assert_eq!(refused.unwrap_err().kind, ErrorKind::Constraint);
                Ok::<_, StoreError>(())
            })
        })
        .await
}

async fn careful_write(store: &SqliteStore, token: &str) -> Result<(), StoreError> {
    let good = lease(token, 1);
    store
        .write(move |tx: &mut <SqliteStore as Store>::Tx| Box::pin(async move { tx.put_lease(&good).await }))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_fails_its_piece_even_when_the_work_ignores_it() {
    let folder = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteConfig::at(folder.path().join("writer.db")))
        .await
        .unwrap();
    // Alone in its transaction.
    let error = careless_write(&store, "alone").await.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Constraint, "{error}");
    assert_eq!(store.lease("alone").await.unwrap(), None, "nothing of the piece stays");

    // Grouped with others: only the careless pieces fail.
    let mut tasks = Vec::new();
    for n in 0..40 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let token = format!("token-{n}");
            let result = if n % 4 == 0 {
                careless_write(&store, &token).await
            } else {
                careful_write(&store, &token).await
            };
            (n, token, result)
        }));
    }
    for task in tasks {
        let (n, token, result) = task.await.unwrap();
        let stored = store.lease(&token).await.unwrap();
        if n % 4 == 0 {
            assert_eq!(result.unwrap_err().kind, ErrorKind::Constraint);
            assert_eq!(stored, None, "{token}");
        } else {
            result.unwrap();
            assert_eq!(stored, Some(lease(&token, 1)), "{token}");
        }
    }
}

/// The writer thread answers through channels that need no runtime of its
/// own, so a single-threaded caller is served as well.
#[tokio::test(flavor = "current_thread")]
async fn a_current_thread_runtime_is_served() {
    let folder = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteConfig::at(folder.path().join("writer.db")))
        .await
        .unwrap();
    for n in 0..20 {
        careful_write(&store, &format!("token-{n}")).await.unwrap();
    }
    assert_eq!(store.lease("token-19").await.unwrap(), Some(lease("token-19", 1)));
    let head = store
        .write(|tx: &mut <SqliteStore as Store>::Tx| Box::pin(async move { tx.head().await }))
        .await
        .unwrap();
    assert_eq!(head, 0);
}

/// Work used to run on a Tokio task; a piece that awaits a Tokio timer
/// still completes on the writer thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piece_may_await_a_tokio_timer() {
    let folder = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteConfig::at(folder.path().join("writer.db")))
        .await
        .unwrap();
    let good = lease("slow", 1);
    store
        .write(move |tx: &mut <SqliteStore as Store>::Tx| {
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                tx.put_lease(&good).await
            })
        })
        .await
        .unwrap();
    assert_eq!(store.lease("slow").await.unwrap(), Some(lease("slow", 1)));
}
