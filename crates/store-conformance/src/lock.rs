//! The ledger's named locks: one holder at a time across stores (as across
//! processes), a waiter served when the holder lets go, names apart.

use crate::Harness;
use opledger_store::{ErrorKind, LedgerLock, Store};
use std::time::Duration;

/// Two stores on one ledger (two processes) contend for one lock: the
/// second is told it is held, a waiter gets it once the first handle is
/// dropped, and another name is another lock.
pub async fn a_ledger_lock_has_one_holder_across_stores_until_it_is_dropped<H: Harness>(harness: &H) {
    let first = harness.open().await;
    let second = harness.open().await;
    let held = first
        .try_lock_ledger("ingest")
        .await
        .unwrap()
        .expect("a free lock is taken");
    assert!(!held.describe().is_empty());
    assert!(
        second.try_lock_ledger("ingest").await.unwrap().is_none(),
        "a second store of the ledger is told the lock is held"
    );
    let other = second
        .try_lock_ledger("other")
        .await
        .unwrap()
        .expect("another name is another lock");
    drop(other);

    let waiter = tokio::spawn({
        let second = second.clone();
        async move { second.lock_ledger("ingest").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter waits while the lock is held");
    drop(held);
    let taken = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the lock once it is let go")
        .unwrap()
        .unwrap();
    assert!(
        first.try_lock_ledger("ingest").await.unwrap().is_none(),
        "now the waiter holds it"
    );
    drop(taken);
    // A server sees a dropped session end a moment later.
    let started = std::time::Instant::now();
    while first.try_lock_ledger("ingest").await.unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(5), "free again once dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A lock name that is not a short lowercase word is refused before
/// anything is locked.
pub async fn a_ledger_lock_name_that_is_not_a_short_word_is_refused<H: Harness>(harness: &H) {
    let store = harness.open().await;
    for name in ["", "../escape", "Ingest", "a b"] {
        let refused = store.try_lock_ledger(name).await.err().expect("refused");
        assert_eq!(refused.kind, ErrorKind::Constraint, "{name:?}: {refused}");
    }
}
