//! The work protocol's queries: claimable rows in claim order, lease rows,
//! and expired claims.

use crate::fixtures::{
    at, claimed, declare_kinds, media, media_row, operation_ids, region_row, state, upsert, write_rows,
};
use crate::Harness;
use opledger_domain::ids::{MediaId, OperationId, RegionId};
use opledger_domain::projections::Row;
use opledger_domain::status::OperationStatus;
use opledger_domain::tasks::{TargetType, CLAIMABLE_STATUSES};
use opledger_store::{AheadQuery, ClaimQuery, Lease, Store, StoreError, WriteTx};
use uuid::Uuid;

pub async fn claimable_rows_come_by_priority_then_waiting_time_within_kinds_and_time<H: Harness>(harness: &H) {
    let store = harness.open().await;
    declare_kinds(&store).await;
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
            versions: Default::default(),
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

pub async fn a_claim_that_states_versions_is_offered_only_tasks_requested_at_them<H: Harness>(harness: &H) {
    let store = harness.open().await;
    declare_kinds(&store).await;
    // One item per task: a kind has one task per item.
    let at_version = |operation: u128, priority, available_at, version: Option<&str>| {
        let mut row = state(
            operation,
            TargetType::Media,
            media(operation).0,
            "metadata",
            OperationStatus::Queued,
            priority,
            available_at,
        );
        row.task_version = version.map(String::from);
        upsert(Row::ProcessingState(row))
    };
    let mut rows: Vec<_> = (1..=5).map(|n| upsert(Row::Media(media_row(media(n))))).collect();
    rows.extend([
        at_version(1, 0, 10, Some("1")),
        at_version(2, 5, 20, Some("2")),
        at_version(3, 0, 5, Some("2")),
        at_version(4, 9, 30, None),
        at_version(5, 0, 1, Some("10")),
    ]);
    write_rows(&store, rows).await.unwrap();
    let claimable = |versions: &[&str], limit: usize| {
        let store = store.clone();
        let mut query = ClaimQuery {
            kinds: vec!["metadata".into()],
            versions: Default::default(),
            statuses: CLAIMABLE_STATUSES,
            now: at(100),
            limit,
        };
        if !versions.is_empty() {
            query
                .versions
                .insert("metadata".into(), versions.iter().map(ToString::to_string).collect());
        }
        async move {
            store
                .write(move |tx: &mut <H::Store as Store>::Tx| Box::pin(async move { tx.claimable(&query).await }))
                .await
                .unwrap()
        }
    };
    // Only the stated versions, each in claim order, merged in claim order.
    assert_eq!(operation_ids(&claimable(&["2"], 10).await), vec![2, 3]);
    assert_eq!(operation_ids(&claimable(&["1", "10"], 10).await), vec![5, 1]);
    assert_eq!(operation_ids(&claimable(&["2", "1"], 2).await), vec![2, 3]);
    assert!(claimable(&["3"], 10).await.is_empty());
    // Stating none takes every version, unknown ones included, in claim order.
    assert_eq!(operation_ids(&claimable(&[], 10).await), vec![4, 2, 5, 3, 1]);
    assert_eq!(operation_ids(&claimable(&[], 3).await), vec![4, 2, 5]);
}

pub async fn leases_round_trip_and_expired_claims_honour_extended_leases<H: Harness>(harness: &H) {
    let store = harness.open().await;
    declare_kinds(&store).await;
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
        // The principal that took the claim, where one did, reads back as written.
        principal: (operation != 1).then(|| format!("principal-{operation}")),
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

pub async fn claimable_tasks_ahead_are_those_a_claim_of_the_kind_takes_first<H: Harness>(harness: &H) {
    let store = harness.open().await;
    declare_kinds(&store).await;
    use OperationStatus::{Queued, RetryWaiting, Succeeded};
    // One item per task: a kind has one state per item.
    let specs: [(u128, &str, OperationStatus, i64, i64); 7] = [
        (1, "metadata", Queued, 0, 30),
        (2, "metadata", Queued, 5, 50),
        (3, "metadata", RetryWaiting, 0, 10),
        // Due later than `now`: not claimable yet, so not ahead.
        (4, "metadata", Queued, 9, 500),
        // Not claimable whatever its priority.
        (5, "metadata", Succeeded, 9, 0),
        // Another kind: its own queue.
        (6, "thumbnail", Queued, 9, 0),
        // The same priority and time as 1: the operation id decides.
        (7, "metadata", Queued, 0, 30),
    ];
    let mut rows = Vec::new();
    for (operation, kind, status, priority, available_at) in specs {
        let item = media(operation);
        rows.push(upsert(Row::Media(media_row(item))));
        rows.push(upsert(Row::ProcessingState(state(
            operation,
            TargetType::Media,
            item.0,
            kind,
            status,
            priority,
            available_at,
        ))));
    }
    let region = RegionId(Uuid::from_u128(77));
    rows.push(upsert(Row::Region(region_row(region, media(1)))));
    rows.push(upsert(Row::ProcessingState(state(
        8,
        TargetType::Region,
        region.0,
        "crop_embedding",
        Queued,
        9,
        0,
    ))));
    write_rows(&store, rows).await.unwrap();
    let ahead = |target: TargetType, operation: u128, kind: &str, priority: i64, available_at: i64, limit: usize| {
        let query = AheadQuery {
            target,
            kind: kind.into(),
            task_version: Some("1".into()),
            priority,
            available_at: at(available_at),
            operation_id: OperationId(Uuid::from_u128(operation)),
            statuses: CLAIMABLE_STATUSES,
            now: at(100),
            limit,
        };
        let store = store.clone();
        async move {
            let counted = store.claimable_ahead(&query).await.unwrap();
            (counted.ahead, counted.higher_priority)
        }
    };
    // 7 waits behind 2 (higher priority), 3 (waiting longer) and 1 (same
    // time, smaller id).
    assert_eq!(ahead(TargetType::Media, 7, "metadata", 0, 30, 100).await, (3, 1));
    assert_eq!(ahead(TargetType::Media, 1, "metadata", 0, 30, 100).await, (2, 1));
    assert_eq!(ahead(TargetType::Media, 2, "metadata", 5, 50, 100).await, (0, 0));
    assert_eq!(ahead(TargetType::Media, 6, "thumbnail", 9, 0, 100).await, (0, 0));
    // The count stops at its bound.
    assert_eq!(ahead(TargetType::Media, 7, "metadata", 0, 30, 2).await.0, 2);
    assert_eq!(ahead(TargetType::Media, 7, "metadata", 0, 30, 0).await, (0, 0));
    // Region kinds are counted in the region table.
    assert_eq!(ahead(TargetType::Region, 9, "crop_embedding", 0, 0, 100).await, (1, 1));
    // What a claim of the kind takes first is exactly what was counted.
    let claimed = store
        .write(move |tx: &mut <H::Store as Store>::Tx| {
            Box::pin(async move {
                tx.claimable(&ClaimQuery {
                    kinds: vec!["metadata".into()],
                    versions: Default::default(),
                    statuses: CLAIMABLE_STATUSES,
                    now: at(100),
                    limit: 4,
                })
                .await
            })
        })
        .await
        .unwrap();
    assert_eq!(operation_ids(&claimed), vec![2, 3, 1, 7]);
}

pub async fn claim_queues_count_each_kinds_claimable_tasks_and_their_oldest_time<H: Harness>(harness: &H) {
    let store = harness.open().await;
    declare_kinds(&store).await;
    use OperationStatus::{Queued, RetryWaiting, Succeeded};
    let specs: [(u128, &str, OperationStatus, i64); 6] = [
        (1, "metadata", Queued, 30),
        (2, "metadata", RetryWaiting, 10),
        // Due later than `now`: not claimable yet.
        (3, "metadata", Queued, 500),
        // Not claimable.
        (4, "metadata", Succeeded, 0),
        (5, "thumbnail", Succeeded, 0),
        (6, "thumbnail", Queued, 60),
    ];
    let mut rows = Vec::new();
    for (operation, kind, status, available_at) in specs {
        let item = media(operation);
        rows.push(upsert(Row::Media(media_row(item))));
        rows.push(upsert(Row::ProcessingState(state(
            operation,
            TargetType::Media,
            item.0,
            kind,
            status,
            0,
            available_at,
        ))));
    }
    let region = RegionId(Uuid::from_u128(77));
    rows.push(upsert(Row::Region(region_row(region, media(1)))));
    rows.push(upsert(Row::ProcessingState(state(
        8,
        TargetType::Region,
        region.0,
        "crop_embedding",
        Queued,
        0,
        20,
    ))));
    write_rows(&store, rows).await.unwrap();
    let queues = store.claim_queues(CLAIMABLE_STATUSES, at(100)).await.unwrap();
    let seen: Vec<(&str, u64, _)> = queues
        .iter()
        .map(|queue| (queue.kind.as_str(), queue.claimable, queue.oldest_available_at))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("crop_embedding", 1, at(20)),
            ("metadata", 2, at(10)),
            ("thumbnail", 1, at(60)),
        ]
    );
    assert!(store.claim_queues(CLAIMABLE_STATUSES, at(5)).await.unwrap().is_empty());
    assert!(store.claim_queues(&[], at(100)).await.unwrap().is_empty());
}
