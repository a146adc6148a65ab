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
use opledger_store::{ClaimQuery, Lease, Store, StoreError, WriteTx};
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
