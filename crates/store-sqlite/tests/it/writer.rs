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
        principal: None,
    }
}

/// A store in a folder of its own; the folder lives as long as the guard.
async fn fresh_store() -> (tempfile::TempDir, SqliteStore) {
    let folder = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteConfig::at(folder.path().join("writer.db")))
        .await
        .unwrap();
    (folder, store)
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
    let (_folder, store) = fresh_store().await;
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
    let (_folder, store) = fresh_store().await;
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
    let (_folder, store) = fresh_store().await;
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

/// Starts a piece that puts lease `token` (and then, when `fail` is set,
/// gives up with an error, keeping the write in the transaction: a lone
/// piece has no savepoint) and holds the writer until `go` fires. Returns
/// once the piece is running, with its answer to come.
async fn held_piece(
    store: &SqliteStore,
    token: &str,
    liveness: bool,
    fail: bool,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), StoreError>>,
) {
    let (started, running) = tokio::sync::oneshot::channel();
    let (go, held) = tokio::sync::oneshot::channel::<()>();
    let held_lease = lease(token, 1);
    let store = store.clone();
    let answer = tokio::spawn(async move {
        if liveness {
            store
                .write_liveness(move |tx: &mut <SqliteStore as Store>::Tx| {
                    Box::pin(held_work(tx, held_lease, started, held, fail))
                })
                .await
        } else {
            store
                .write(move |tx: &mut <SqliteStore as Store>::Tx| {
                    Box::pin(held_work(tx, held_lease, started, held, fail))
                })
                .await
        }
    });
    running.await.expect("the held piece runs");
    (go, answer)
}

async fn held_work(
    tx: &mut <SqliteStore as Store>::Tx,
    held_lease: Lease,
    started: tokio::sync::oneshot::Sender<()>,
    held: tokio::sync::oneshot::Receiver<()>,
    fail: bool,
) -> Result<(), StoreError> {
    tx.put_lease(&held_lease).await?;
    let _ = started.send(());
    let _ = held.await;
    if fail {
        return Err(StoreError::unavailable("the piece gave up"));
    }
    Ok(())
}

/// Sends a piece while another holds the writer, then lets that one
/// finish. The new piece reports whether a reader (another connection)
/// saw `held_token`'s lease when it ran: not yet committed means the two
/// share one transaction.
async fn piece_sent_meanwhile(
    store: &SqliteStore,
    go: tokio::sync::oneshot::Sender<()>,
    held_token: &str,
) -> Result<bool, StoreError> {
    let reader = store.clone();
    let held_token = held_token.to_string();
    let own = lease("sent-meanwhile", 1);
    let mut sent = Box::pin(store.write(move |tx: &mut <SqliteStore as Store>::Tx| {
        Box::pin(async move {
            let seen = reader.lease(&held_token).await?.is_some();
            tx.put_lease(&own).await?;
            Ok::<_, StoreError>(seen)
        })
    }));
    // The first poll queues the piece for the writer (the queue has room).
    assert!(futures::poll!(&mut sent).is_pending());
    go.send(()).unwrap();
    sent.await
}

/// A piece that arrives while a group runs joins that group's commit
/// instead of waiting for the next one (fewer commits when callers fall
/// into cohorts; see `LATE_JOIN_WINDOW` in the writer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piece_sent_while_a_group_runs_joins_that_groups_commit() {
    let (_folder, store) = fresh_store().await;
    let (go, held) = held_piece(&store, "held", false, false).await;
    let saw_held = piece_sent_meanwhile(&store, go, "held").await.unwrap();
    held.await.unwrap().unwrap();
    assert!(!saw_held, "the late piece ran inside the held piece's transaction");
    assert!(store.lease("held").await.unwrap().is_some());
    assert!(store.lease("sent-meanwhile").await.unwrap().is_some());
}

/// A group of liveness work commits without its fsync; durable work that
/// arrives meanwhile must wait for a durable commit of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_work_never_joins_a_liveness_group() {
    let (_folder, store) = fresh_store().await;
    let (go, held) = held_piece(&store, "liveness", true, false).await;
    let saw_held = piece_sent_meanwhile(&store, go, "liveness").await.unwrap();
    held.await.unwrap().unwrap();
    assert!(saw_held, "the durable piece ran after the liveness group committed");
}

/// A lone piece runs without a savepoint, so when it fails its writes are
/// still in the transaction until the rollback: a piece that arrives
/// meanwhile must not join (its commit would keep the failed piece's
/// writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_joins_a_lone_piece_that_failed() {
    let (_folder, store) = fresh_store().await;
    let (go, held) = held_piece(&store, "failed", false, true).await;
    let saw_failed = piece_sent_meanwhile(&store, go, "failed").await.unwrap();
    assert!(held.await.unwrap().is_err());
    assert!(!saw_failed);
    assert_eq!(
        store.lease("failed").await.unwrap(),
        None,
        "nothing of the failed piece stays"
    );
    assert!(store.lease("sent-meanwhile").await.unwrap().is_some());
}
