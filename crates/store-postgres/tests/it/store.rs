//! Behaviour of this backend's write path that the shared suite cannot see:
//! gathered lease writes fail their work at commit, and a write whose
//! caller stops waiting still runs to its end.

use opledger_domain::ids::{MediaId, OperationId};
use opledger_domain::{StreamId, Timestamp};
use opledger_store::{ErrorKind, ExpectedVersion, Lease, Store, StoreError, StreamAppend, WriteTx};
use opledger_store_conformance::{registered, Harness};
use opledger_store_postgres::PostgresStore;
use std::time::Duration;
use uuid::Uuid;

fn append_for(n: u128) -> Vec<StreamAppend> {
    let media_id = MediaId(Uuid::from_u128(n));
    vec![StreamAppend {
        stream_id: StreamId::media(media_id),
        expected: ExpectedVersion::NoStream,
        events: vec![registered(media_id, n as i64)],
    }]
}

fn lease(token: &str, processed: i64) -> Lease {
    Lease {
        claim_token: token.into(),
        operation_id: OperationId(Uuid::from_u128(7)),
        worker: "worker".into(),
        heartbeat_at: Timestamp::from_micros(1_000_000),
        lease_expires_at: Timestamp::from_micros(2_000_000),
        phase: None,
        processed: Some(processed),
        total: None,
        progressed_at: None,
        progress_unrecorded: false,
        principal: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gathered_lease_write_the_database_refuses_fails_its_work_at_commit() {
    let Some(harness) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let store = harness.open().await;
    let error = store
        .write(|tx: &mut <PostgresStore as Store>::Tx| {
            Box::pin(async move {
                tx.append(append_for(1)).await?;
                // Gathered, not sent: refused only when the commit sends it.
                tx.put_lease(&lease("bad", -1)).await?;
                Ok::<_, StoreError>(())
            })
        })
        .await
        .expect_err("a negative count breaks the lease table's CHECK");
    assert_eq!(error.kind, ErrorKind::Constraint, "{error}");
    assert_eq!(store.head().await.unwrap(), 0, "the append went with it");
    assert_eq!(store.lease("bad").await.unwrap(), None);

    // Put, delete and put again within one work: the last write wins, and
    // reads inside the work see the gathered writes.
    store
        .write(|tx: &mut <PostgresStore as Store>::Tx| {
            Box::pin(async move {
                tx.put_lease(&lease("a", 1)).await?;
                tx.put_lease(&lease("b", 1)).await?;
                tx.delete_lease("a").await?;
                tx.put_lease(&lease("b", 2)).await?;
                assert_eq!(tx.lease("a").await?, None);
                assert_eq!(tx.lease("b").await?, Some(lease("b", 2)));
                tx.put_lease(&lease("a", 3)).await?;
                Ok::<_, StoreError>(())
            })
        })
        .await
        .unwrap();
    assert_eq!(store.lease("a").await.unwrap(), Some(lease("a", 3)));
    assert_eq!(store.lease("b").await.unwrap(), Some(lease("b", 2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_caller_stops_waiting_still_commits() {
    let Some(harness) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let store = harness.open().await;
    let write = store.write(|tx: &mut <PostgresStore as Store>::Tx| {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            tx.append(append_for(1)).await?;
            Ok::<_, StoreError>(())
        })
    });
    assert!(tokio::time::timeout(Duration::from_millis(20), write).await.is_err());
    for _ in 0..50 {
        if store.head().await.unwrap() == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the abandoned write never committed");
}
