//! Projection rows: found by non-key columns, refused by the tables'
//! constraints, loaded several tables at once exactly as one by one, and
//! written from a known stored row.

use crate::fixtures::{
    at, claimed, declare_kinds, media, media_row, operation_ids, region_row, state, upsert, write_rows,
};
use crate::Harness;
use opledger_domain::ids::{MediaId, OperationId, RegionId};
use opledger_domain::projections::{
    Cell, ProcessingStateRow, Row, RowChange, Stored, TableSpec, MEDIA_STATES_TABLE, REGION_STATES_TABLE,
};
use opledger_domain::status::OperationStatus;
use opledger_domain::tasks::TargetType;
use opledger_domain::time::Timestamp;
use opledger_store::{ErrorKind, RowTarget, Store, StoreError, WriteTx};
use uuid::Uuid;

pub async fn rows_are_found_by_non_key_columns<H: Harness>(harness: &H) {
    let store = harness.open().await;
    declare_kinds(&store).await;
    let (first, second, third) = (media(1), media(2), media(3));
    let row = |operation, target: MediaId, kind| {
        Row::ProcessingState(state(
            operation,
            TargetType::Media,
            target.0,
            kind,
            OperationStatus::Queued,
            0,
            0,
        ))
    };
    write_rows(
        &store,
        vec![
            upsert(Row::Media(media_row(first))),
            upsert(Row::Media(media_row(second))),
            upsert(Row::Media(media_row(third))),
            upsert(row(1, first, "metadata")),
            upsert(row(2, first, "thumbnail")),
            upsert(row(3, second, "metadata")),
            upsert(row(4, third, "metadata")),
        ],
    )
    .await
    .unwrap();
    let found = store
        .find_rows(
            &MEDIA_STATES_TABLE,
            &[
                ("media_id", Cell::Uuid(first.0)),
                ("task_kind", Cell::Text("thumbnail".into())),
            ],
            10,
        )
        .await
        .unwrap();
    assert_eq!(operation_ids(&found), vec![2]);
    let targets = vec![Cell::Uuid(first.0), Cell::Uuid(third.0)];
    let found = store
        .write(move |tx: &mut <H::Store as Store>::Tx| {
            Box::pin(async move { tx.find_rows_in(&MEDIA_STATES_TABLE, "media_id", &targets).await })
        })
        .await
        .unwrap();
    assert_eq!(operation_ids(&found), vec![1, 2, 4]);
    let targets = [Cell::Uuid(first.0), Cell::Uuid(third.0)];
    let read = store
        .find_rows_in(&MEDIA_STATES_TABLE, "media_id", &targets)
        .await
        .unwrap();
    assert_eq!(
        read, found,
        "a read connection's batched lookup finds what the writer's does"
    );
    let unknown_in = store.find_rows_in(&MEDIA_STATES_TABLE, "no_such_column", &[]).await;
    assert_eq!(unknown_in.unwrap_err().kind, ErrorKind::Constraint);
    let unknown = store
        .find_rows(&MEDIA_STATES_TABLE, &[("no_such_column", Cell::Null)], 1)
        .await;
    assert_eq!(unknown.unwrap_err().kind, ErrorKind::Constraint);
}

pub async fn processing_state_constraints_are_enforced_by_the_database<H: Harness>(harness: &H) {
    let store = harness.open().await;
    declare_kinds(&store).await;
    let (item, ghost) = (media(1), media(2));
    let region = RegionId(Uuid::from_u128(5));
    write_rows(
        &store,
        vec![
            upsert(Row::Media(media_row(item))),
            upsert(Row::Region(region_row(region, item))),
        ],
    )
    .await
    .unwrap();
    let base = state(1, TargetType::Media, item.0, "metadata", OperationStatus::Queued, 0, 0);
    let refused = [
        // A target that does not exist (the foreign key).
        ("a missing media item", {
            let mut row = base.clone();
            row.target_id = ghost.0;
            row
        }),
        // A claimed status without a claim.
        ("a leased row without a token", {
            let mut row = base.clone();
            row.status = OperationStatus::Leased;
            row
        }),
        // A claim on an unclaimed status.
        ("a queued row with a token", {
            let mut row = claimed(base.clone(), "token", 10);
            row.status = OperationStatus::Queued;
            row
        }),
        // A kind that runs on regions, in the media table (the foreign key
        // to the kind's (name, target)).
        ("a region kind on a media item", {
            let mut row = base.clone();
            row.task_kind = "crop_embedding".into();
            row
        }),
        // A kind nobody declared (the same foreign key).
        ("an undeclared kind", {
            let mut row = base.clone();
            row.task_kind = "transcode".into();
            row
        }),
    ];
    for (what, row) in refused {
        let error = write_rows(&store, vec![upsert(Row::ProcessingState(row))])
            .await
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Constraint, "{what}: {error}");
    }
    // One state per (target, kind).
    write_rows(&store, vec![upsert(Row::ProcessingState(base.clone()))])
        .await
        .unwrap();
    let mut twin = base.clone();
    twin.operation_id = OperationId(Uuid::from_u128(2));
    let error = write_rows(&store, vec![upsert(Row::ProcessingState(twin))])
        .await
        .unwrap_err();
    // A unique key taken is a Conflict, as on the log: two writers raced to
    // create the same thing, and the loser may read again and retry.
    assert_eq!(error.kind, ErrorKind::Conflict, "{error}");
    // The status vocabulary is the database's too, not only the typed row's.
    harness
        .execute_raw(&format!(
            "UPDATE media_processing_states SET status = 'done' WHERE operation_id = '{}'",
            base.operation_id
        ))
        .await
        .expect_err("a status outside the vocabulary is refused");
    // Removing the item removes its states, its regions and theirs.
    let region_state = state(
        3,
        TargetType::Region,
        region.0,
        "crop_embedding",
        OperationStatus::Queued,
        0,
        0,
    );
    write_rows(&store, vec![upsert(Row::ProcessingState(region_state))])
        .await
        .unwrap();
    write_rows(&store, vec![RowChange::delete(Row::Media(media_row(item)).key())])
        .await
        .unwrap();
    for table in [&MEDIA_STATES_TABLE, &REGION_STATES_TABLE] {
        assert_eq!(store.count_rows(table).await.unwrap(), 0, "{} cascaded", table.name);
    }
}

/// A backend may load a fold's rows of several tables in one statement
/// (PostgreSQL decodes them from JSON there): every column type must come
/// back exactly as it does table by table — times to the microsecond,
/// unicode and JSON text, NULLs, booleans, large integers.
pub async fn rows_loaded_from_several_tables_at_once_equal_rows_loaded_table_by_table<H: Harness>(harness: &H) {
    let store = harness.open().await;
    declare_kinds(&store).await;
    let (first, second) = (media(1), media(2));
    let mut unusual = media_row(second);
    unusual.path = "/library/ünïcödé \"quoted\" \\ back\tslash 写真.png".into();
    unusual.content_digest = None;
    unusual.byte_size = Some(i64::MAX - 1);
    unusual.registered_at = Timestamp::from_micros(1_780_000_000_123_457);
    let region = RegionId(Uuid::from_u128(7));
    let mut held = claimed(
        state(
            3,
            TargetType::Media,
            first.0,
            "metadata",
            OperationStatus::Queued,
            -5,
            1,
        ),
        "token-α",
        999_999,
    );
    held.inputs = r#"{"b": [1, 2.5, "x"], "a": {"nested": null}}"#.into();
    held.cancel_requested = true;
    held.last_error = Some("line one\nline two".into());
    let plain = state(
        4,
        TargetType::Media,
        second.0,
        "thumbnail",
        OperationStatus::Queued,
        0,
        0,
    );
    let rows = vec![
        Row::Media(media_row(first)),
        Row::Media(unusual),
        Row::Region(region_row(region, first)),
        Row::ProcessingState(held),
        Row::ProcessingState(plain),
    ];
    write_rows(&store, rows.iter().cloned().map(upsert).collect())
        .await
        .unwrap();
    let mut requests: Vec<(&'static TableSpec, Vec<String>)> = Vec::new();
    for row in &rows {
        let key = row.key();
        let table = row.table();
        match requests.iter_mut().find(|(known, _)| known.name == table.name) {
            Some((_, keys)) => keys.push(key.key.to_string()),
            None => requests.push((table, vec![key.key.to_string()])),
        }
    }
    // A key that names no row is simply missing from the answer.
    requests[0].1.push(media(99).to_string());
    let (at_once, one_by_one) = store
        .write(move |tx: &mut <H::Store as Store>::Tx| {
            Box::pin(async move {
                let at_once = tx.load_rows_of_tables(&requests).await?;
                let mut one_by_one = Vec::new();
                for (table, keys) in &requests {
                    one_by_one.extend(tx.load_rows(table, keys).await?);
                }
                Ok::<_, StoreError>((at_once, one_by_one))
            })
        })
        .await
        .unwrap();
    let sorted = |mut rows: Vec<Row>| {
        rows.sort_by_key(|row| (row.table().name, row.key().key));
        rows
    };
    assert_eq!(sorted(one_by_one), sorted(rows.clone()), "table by table");
    assert_eq!(sorted(at_once), sorted(rows), "at once");
}

/// A change that says what the store held lets a store write only the
/// changed columns; the row read back must be the whole new row all the
/// same, an unchanged row must stay, and a change whose stored row turns out
/// to be missing must still land.
pub async fn rows_written_from_a_known_stored_row_land_whole_even_when_the_store_lacks_it<H: Harness>(harness: &H) {
    let store = harness.open().await;
    declare_kinds(&store).await;
    let item = media(1);
    let queued = state(1, TargetType::Media, item.0, "metadata", OperationStatus::Queued, 0, 0);
    write_rows(
        &store,
        vec![
            upsert(Row::Media(media_row(item))),
            upsert(Row::ProcessingState(queued.clone())),
        ],
    )
    .await
    .unwrap();
    let mut running = queued.clone();
    running.status = OperationStatus::Running;
    running.claim_token = Some("token-a".into());
    running.worker = Some("worker-a".into());
    running.claimed_at = Some(at(5));
    running.lease_expires_at = Some(at(30_000_000));
    running.claimed_revision = Some(running.requested_revision.clone());
    running.attempt_count = 1;
    running.version = 2;
    let changed = |before: &ProcessingStateRow, after: &ProcessingStateRow| RowChange {
        key: Row::ProcessingState(after.clone()).key(),
        before: Stored::Present(Box::new(Row::ProcessingState(before.clone()))),
        after: Some(std::sync::Arc::new(Row::ProcessingState(after.clone()))),
    };
    write_rows(&store, vec![changed(&queued, &running)]).await.unwrap();
    let read = |store: &H::Store| {
        let store = store.clone();
        async move {
            store
                .find_rows(&MEDIA_STATES_TABLE, &[("media_id", Cell::Uuid(item.0))], 10)
                .await
                .unwrap()
        }
    };
    assert_eq!(read(&store).await, vec![Row::ProcessingState(running.clone())]);
    // Nothing changed: the row stays as it is.
    write_rows(&store, vec![changed(&running, &running)]).await.unwrap();
    assert_eq!(read(&store).await, vec![Row::ProcessingState(running.clone())]);
    // The change claims the store holds a row it does not: it lands whole.
    let mut other = state(2, TargetType::Media, item.0, "thumbnail", OperationStatus::Queued, 0, 0);
    let claimed_before = other.clone();
    other.priority = 5;
    write_rows(&store, vec![changed(&claimed_before, &other)])
        .await
        .unwrap();
    let mut expected = vec![Row::ProcessingState(running), Row::ProcessingState(other)];
    let mut found = read(&store).await;
    let by_kind = |row: &Row| match row {
        Row::ProcessingState(state) => state.task_kind.clone(),
        other => panic!("not a processing state: {other:?}"),
    };
    found.sort_by_key(by_kind);
    expected.sort_by_key(by_kind);
    assert_eq!(found, expected);
}
