//! A backend connection terminated mid-transaction (`pg_terminate_backend`,
//! as an operator or a failover would) surfaces as Unavailable, leaves
//! nothing of the transaction behind, and a retry succeeds exactly once: at
//! the store (a write's statement or its COMMIT meets the dead connection)
//! and through an engine command (a worker's fenced completion). A ledger
//! lock whose session is terminated says it is lost, and is free to others.
//! A server that stops answering (a relay in front of it cut) is reported
//! Unavailable within the URL's `connect_timeout`, reads and writes alike,
//! and the store works again once it answers.

use futures::TryStreamExt;
use opledger_domain::ids::MediaId;
use opledger_domain::kinds::legacy;
use opledger_domain::StreamId;
use opledger_store::{ErrorKind, ExpectedVersion, LedgerLock, Store, StoreError, StreamAppend, WriteTx};
use opledger_store_conformance::{registered, Harness};
use opledger_store_postgres::PostgresStore;
use sqlx::Connection;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
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

/// The pids of this database's backends waiting for the append lock.
async fn waiting_for_the_append_lock(harness: &opledger_testkit::PostgresBackend) -> Vec<i32> {
    let mut connection = harness.connect().await;
    let pids: Vec<(i32,)> = sqlx::query_as(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
    )
    .fetch_all(&mut connection)
    .await
    .unwrap();
    let _ = connection.close().await;
    pids.into_iter().map(|(pid,)| pid).collect()
}

/// Through the engine: a command whose connection is terminated inside its
/// transaction (here while it waits behind another writer for the append
/// lock, as in a failover or an operator's cleanup under load) fails with
/// Unavailable (exit 5 at the CLI), changes nothing, and the same command
/// retried applies exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_connection_is_terminated_is_unavailable_and_its_retry_applies_once() {
    use opledger_domain::events::Event;
    use opledger_domain::OperationStatus;
    use opledger_engine::{ClaimRequest, CommandContext, Completion, Engine, EngineError, TaskRequest, TaskTarget};
    use serde_json::json;

    let Some(harness) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let (engine, _) = Engine::open(harness.open().await).await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    let context = CommandContext::actor("test");
    let media = engine
        .register_media(&context, "/t/1.png", "image", Some("sha256:1".into()), None)
        .await
        .unwrap();
    let request = TaskRequest {
        target: TaskTarget::Media(media),
        kind: "metadata".into(),
        inputs: json!({}),
        priority: 0,
    };
    let operation = engine.request_task(&context, request).await.unwrap().operation_id;
    let claim = engine
        .claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec![],
                worker: "w".into(),
                lease_ms: 60_000,
                limit: 1,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap()
        .remove(0);
    let head = engine.store().head().await.unwrap();

    // Another writer holds the append lock, so the command's transaction
    // is open and waiting when its backend is terminated.
    let mut holder = harness.connect().await;
    sqlx::Executor::execute(
        &mut holder,
        format!(
            "BEGIN; SELECT pg_advisory_xact_lock({})",
            opledger_store_postgres::tx::APPEND_LOCK
        )
        .as_str(),
    )
    .await
    .unwrap();
    let completing = {
        let (engine, context, fence) = (engine.clone(), context.clone(), claim.fence());
        tokio::spawn(async move {
            engine
                .complete_task(&context, &fence, Completion::Output(json!({"width": 1})))
                .await
        })
    };
    let waiting = loop {
        let waiting = waiting_for_the_append_lock(&harness).await;
        if !waiting.is_empty() {
            break waiting;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(waiting.len(), 1, "only the command waits: {waiting:?}");
    let mut terminator = harness.connect().await;
    let (terminated,): (bool,) = sqlx::query_as("SELECT pg_terminate_backend($1)")
        .bind(waiting[0])
        .fetch_one(&mut terminator)
        .await
        .unwrap();
    assert!(terminated);
    let _ = terminator.close().await;
    sqlx::Executor::execute(&mut holder, "ROLLBACK").await.unwrap();
    let _ = holder.close().await;

    let error = completing.await.unwrap().expect_err("the command's connection is gone");
    assert!(
        error.is_store(ErrorKind::Unavailable),
        "a lost connection is Unavailable: {error:?}"
    );
    assert!(matches!(error, EngineError::Store(_)));
    assert_eq!(engine.store().head().await.unwrap(), head, "nothing was appended");
    let view = engine.task_by_operation(operation).await.unwrap().unwrap();
    assert_eq!(view.state.status, OperationStatus::Leased);
    assert_eq!(view.state.claim_token.as_deref(), Some(claim.claim_token.as_str()));

    // The worker retries its report: it applies once.
    let outcome = engine
        .complete_task(&context, &claim.fence(), Completion::Output(json!({"width": 1})))
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::Succeeded);
    let successes = engine
        .timeline(operation)
        .await
        .unwrap()
        .iter()
        .filter(|event| matches!(event.event, Event::OperationSucceeded(_)))
        .count();
    assert_eq!(successes, 1);
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

/// A ledger lock lives in its session: when the session ends under it (a
/// restart, a failover, an operator), the server releases it and another
/// process can take it. The holder must hear of it, or it goes on beside
/// the next holder (two ingests at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_lock_whose_session_ends_says_it_is_lost_and_is_free_to_others() {
    let Some(harness) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let store = harness.open().await;
    let other = harness.open().await;
    let lock = store
        .try_lock_ledger("ingest")
        .await
        .unwrap()
        .expect("the lock is free");
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    assert_eq!(lock.lost(), None, "a held lock is not lost");
    assert!(
        other.try_lock_ledger("ingest").await.unwrap().is_none(),
        "a held lock is not free to others"
    );
    let mut connection = harness.connect().await;
    let (terminated,): (i64,) = sqlx::query_as(
        "SELECT COUNT(pg_terminate_backend(l.pid)) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
         WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()",
    )
    .fetch_one(&mut connection)
    .await
    .unwrap();
    let _ = connection.close().await;
    assert_eq!(terminated, 1, "one session holds the lock");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while lock.lost().is_none() && std::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let lost = lock.lost().expect("the holder hears that its lock's session ended");
    assert!(lost.contains("session"), "{lost}");
    assert!(
        other.try_lock_ledger("ingest").await.unwrap().is_some(),
        "the server released the lost lock"
    );
}

/// Registers media item `id` in a transaction of its own.
async fn append_one(store: &PostgresStore, id: u128) -> Result<(), StoreError> {
    store
        .write(move |tx: &mut <PostgresStore as Store>::Tx| {
            Box::pin(async move {
                tx.append(append_for(MediaId(Uuid::from_u128(id)))).await?;
                Ok::<_, StoreError>(())
            })
        })
        .await
}

/// A TCP relay to the test's server that can be cut, as when the server
/// goes down: new connections are refused (its port closes) and open ones
/// are closed.
struct Relay {
    port: u16,
    accepting: JoinHandle<()>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    /// A relay on `listen` (0: any free port) to the server at `host:port`.
    async fn to(host: String, port: u16, listen: u16) -> Relay {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", listen)).await.unwrap();
        let relay_port = listener.local_addr().unwrap().port();
        let links = Arc::new(Mutex::new(Vec::new()));
        let accepting = {
            let links = links.clone();
            tokio::spawn(async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let Ok(mut server) = tokio::net::TcpStream::connect((host.as_str(), port)).await else {
                        continue;
                    };
                    let link = tokio::spawn(async move {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    });
                    links.lock().unwrap().push(link);
                }
            })
        };
        Relay {
            port: relay_port,
            accepting,
            links,
        }
    }

    async fn cut(&self) {
        self.accepting.abort();
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
        // The listener is dropped with its task: wait until the port refuses.
        let deadline = Instant::now() + Duration::from_secs(5);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_ok() {
            assert!(Instant::now() < deadline, "the relay's port still accepts");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_is_unavailable_within_the_connect_timeout_not_the_pools_wait() {
    let Some(harness) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let mut config = harness.config();
    let (host, port) = (config.options.get_host().to_string(), config.options.get_port());
    let relay = Relay::to(host.clone(), port, 0).await;
    config.options = config.options.clone().host("127.0.0.1").port(relay.port);
    config.connect_timeout = Duration::from_secs(1);
    let store = PostgresStore::open(config.clone())
        .await
        .expect("the store opens through the relay");
    append_one(&store, 7).await.unwrap();
    assert_eq!(store.head().await.unwrap(), 1);

    relay.cut().await;
    // Each call twice: the first may meet a pooled connection the cut
    // closed, the second must open a new one and cannot.
    for round in 0..2 {
        let started = Instant::now();
        let read = store.head().await.expect_err("the server is gone");
        assert_eq!(read.kind, ErrorKind::Unavailable, "{read}");
        let appended = append_one(&store, 8 + round).await.expect_err("the server is gone");
        assert_eq!(appended.kind, ErrorKind::Unavailable, "{appended}");
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "round {round}: a read and a write answered Unavailable within the 1 s connect timeout each \
             (plus slack), not the pool's own wait: {:?}",
            started.elapsed()
        );
    }

    // The server answers again (the relay back on its port): the same
    // store works, and none of the refused writes was recorded.
    let _back = Relay::to(host, port, relay.port).await;
    assert_eq!(store.head().await.unwrap(), 1, "no refused write was recorded");
    append_one(&store, 20).await.unwrap();
    assert_eq!(store.head().await.unwrap(), 2);
}
