//! The log's hash chain: every append links each event to its true
//! predecessor by seq (whether its piece shared a group commit or its
//! writer waited for another process's), the database refuses an event
//! without a link, and the record of the last integrity check round-trips.

use crate::fixtures::{append, at, media, one, registered, updated};
use crate::Harness;
use opledger_domain::chain::{self, ChainHash, ChainPoint, GENESIS};
use opledger_domain::envelope::StreamId;
use opledger_store::{ExpectedVersion, Store, StoreError, Verification, WriteTx};

/// The whole log's chain entries, read in pages of `page`.
async fn whole_chain<S: Store>(store: &S, page: usize) -> Vec<chain::ChainEntry> {
    let mut entries = Vec::new();
    loop {
        let after = entries.last().map_or(0, |entry: &chain::ChainEntry| entry.seq);
        let read = store.read_chain(after, page).await.unwrap();
        if read.is_empty() {
            return entries;
        }
        entries.extend(read);
    }
}

pub async fn concurrent_appends_in_one_store_and_across_stores_chain_in_seq_order<H: Harness>(harness: &H) {
    const SHARED: u128 = 6;
    const SEPARATE: u128 = 2;
    const BATCHES: i64 = 15;
    let shared = harness.open().await;
    let mut tasks = Vec::new();
    for appender in 0..SHARED + SEPARATE {
        // Six appenders share one store (their pieces meet in group
        // commits); two have stores of their own, as other processes.
        let store = if appender < SHARED {
            shared.clone()
        } else {
            harness.open().await
        };
        tasks.push(tokio::spawn(async move {
            let media_id = media(7000 + appender);
            let stream = StreamId::media(media_id);
            for batch in 0..BATCHES {
                let events = if batch == 0 {
                    vec![registered(media_id, 0)]
                } else {
                    vec![updated(media_id, batch), updated(media_id, batch + 100)]
                };
                append(&store, one(&stream, ExpectedVersion::Any, events))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let total = ((SHARED + SEPARATE) as i64) * (1 + (BATCHES - 1) * 2);
    let reader = harness.open().await;
    let entries = whole_chain(&reader, 17).await;
    assert_eq!(entries.len() as i64, total);
    assert_eq!(
        entries[0].stored,
        Some(chain::link(&GENESIS, &entries[0].digest)),
        "the first event links to the genesis hash"
    );
    let reached = chain::check(ChainPoint::START, entries.clone()).expect("an intact chain");
    assert_eq!(reached.seq, total);
    assert_eq!(Some(reached.hash), entries.last().unwrap().stored);
    // A read that starts inside the log reads the same entries.
    assert_eq!(reader.read_chain(10, 5).await.unwrap(), entries[10..15].to_vec());
}

pub async fn an_event_without_a_chain_hash_is_refused_by_the_database<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let stream = StreamId::media(media(1));
    append(
        &store,
        one(&stream, ExpectedVersion::NoStream, vec![registered(media(1), 1)]),
    )
    .await
    .unwrap();
    let refused = harness
        .execute_raw(
            "INSERT INTO media_operation_events \
             (seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id) \
             VALUES (2, 'media-x', 1, 'media_removed', 1, '{}', '2026-01-01T00:00:00.000000Z', 'raw', 'c')",
        )
        .await;
    assert!(refused.is_err(), "an event without its link must be refused");
    assert_eq!(store.head().await.unwrap(), 1);
    // And the link cannot be rewritten once stored.
    let rewritten = harness
        .execute_raw(&format!(
            "UPDATE media_operation_events SET chain_hash = '{}' WHERE seq = 1",
            "0".repeat(64)
        ))
        .await;
    assert!(rewritten.is_err(), "a stored link must not change");
}

async fn record<S: Store>(store: &S, verification: Verification) {
    store
        .write::<_, StoreError, _>(move |tx: &mut S::Tx| {
            Box::pin(async move { tx.record_verification(&verification).await })
        })
        .await
        .unwrap();
}

pub async fn the_last_integrity_check_is_recorded_and_replaced_by_the_next<H: Harness>(harness: &H) {
    let store = harness.open().await;
    assert_eq!(store.last_verification().await.unwrap(), None);
    let first = Verification {
        verified_at: at(1),
        position: 12,
        head_hash: Some(ChainHash([7; 32])),
        broken_at: None,
        differing_tables: 0,
    };
    record(&store, first.clone()).await;
    assert_eq!(store.last_verification().await.unwrap(), Some(first));
    let second = Verification {
        verified_at: at(2),
        position: 15,
        head_hash: None,
        broken_at: Some(4),
        differing_tables: 2,
    };
    record(&store, second.clone()).await;
    assert_eq!(harness.open().await.last_verification().await.unwrap(), Some(second));
}
