//! The backend under the engine, where PostgreSQL's own catalog shows the
//! effect: shadow rebuild and swap (names, indexes, foreign keys after the
//! swap), scratch schemas dropped after verify, verify's comparison of a
//! spoiled row. The work protocol's behaviour tests run on this backend from
//! the engine's own test files (`crates/engine/tests/work_*.rs`, through
//! `opledger_testkit::backend_tests!`). Each test skips like the conformance
//! suite when no server answers.

use opledger_domain::events::{Event, OperationCreated, OperationTarget};
use opledger_domain::kinds::legacy;
use opledger_domain::projections::{MEDIA_STATES_TABLE, MEDIA_TABLE, OPERATIONS_TABLE};
use opledger_domain::{NewEvent, OperationId, OperationStatus, StreamId, Timestamp};
use opledger_engine::{CommandContext, Engine, NewOperation, TaskRequest, TaskTarget};
use opledger_store::{ExpectedVersion, Store, StoreError, StreamAppend, WriteTx};
use opledger_store_conformance::Harness;
use opledger_store_postgres::PostgresStore;
use opledger_testkit::PostgresBackend;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use uuid::Uuid;

async fn harness() -> Option<PostgresBackend> {
    opledger_testkit::postgres::backend().await
}

async fn raw(harness: &PostgresBackend, sql: &str) {
    harness
        .execute_raw(sql)
        .await
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

async fn names_like(harness: &PostgresBackend, sql: &str) -> Vec<String> {
    let mut connection = harness.connect().await;
    let rows: Vec<(String,)> = sqlx::query_as(sql).fetch_all(&mut connection).await.unwrap();
    let _ = sqlx::Connection::close(connection).await;
    rows.into_iter().map(|(name,)| name).collect()
}

fn created(n: u128) -> StreamAppend {
    let operation_id = OperationId(Uuid::from_u128(0xfeed_0000 + n));
    StreamAppend {
        stream_id: StreamId::operation(operation_id),
        expected: ExpectedVersion::NoStream,
        events: vec![NewEvent {
            event: Event::OperationCreated(OperationCreated {
                operation_id,
                kind: "export".into(),
                target: OperationTarget::default(),
                revision: Some(format!("rev-{n}")),
                inputs: json!({}),
                status: OperationStatus::Queued,
                priority: 0,
                task_version: None,
                task: None,
            }),
            recorded_at: Timestamp::from_micros(1_800_000_000_000_000 + n as i64),
            actor: "older-binary".into(),
            correlation_id: "meanwhile".into(),
            causation_id: None,
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_shows_a_spoiled_live_row_and_an_extra_one() {
    let Some(harness) = harness().await else { return };
    let (engine, _) = Engine::open(harness.open().await).await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    let context = CommandContext::actor("test");
    let mut media = Vec::new();
    for n in 0..5 {
        media.push(
            engine
                .register_media(&context, &format!("/photos/{n}.jpg"), "image", None, Some(n))
                .await
                .unwrap(),
        );
    }
    assert!(engine.verify().await.unwrap().is_identical());
    raw(
        &harness,
        &format!("UPDATE media SET path = '/spoiled.jpg' WHERE id = '{}'", media[2]),
    )
    .await;
    let verify = engine.verify().await.unwrap();
    assert!(!verify.is_identical());
    assert_eq!(verify.diffs.len(), 1, "{}", verify.render());
    assert_eq!(verify.diffs[0].table.name, "media");
    assert_eq!(verify.diffs[0].rows.len(), 1);
    assert_eq!(verify.diffs[0].rows[0].key, media[2].to_string());
    assert!(verify.render().contains("/spoiled.jpg"), "{}", verify.render());
    let left = names_like(
        &harness,
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'opledger\\_scratch\\_%'",
    )
    .await;
    assert!(left.is_empty(), "verify leaves no scratch schema behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_projection_versions_are_rebuilt_through_shadows_while_a_writer_appends() {
    let Some(harness) = harness().await else { return };
    let store = harness.open().await;
    let (engine, _) = Engine::open(store.clone()).await.unwrap();
    engine
        .declare(&CommandContext::actor("test"), legacy::declarations())
        .await
        .unwrap();
    let context = CommandContext::actor("test");
    for n in 0..40 {
        let media_id = engine
            .register_media(
                &context,
                &format!("/photos/{n}.jpg"),
                "image",
                Some(format!("sha256:{n:064x}")),
                Some(n),
            )
            .await
            .unwrap();
        engine
            .request_task(
                &context,
                TaskRequest {
                    target: TaskTarget::Media(media_id),
                    kind: "metadata".into(),
                    inputs: json!({}),
                    priority: (n % 3) as i32,
                },
            )
            .await
            .unwrap();
        engine
            .create_operation(
                &context,
                NewOperation {
                    kind: "export".into(),
                    target: OperationTarget {
                        media_id: Some(media_id),
                        ..OperationTarget::default()
                    },
                    revision: Some(format!("rev-{n}")),
                    inputs: json!({"n": n}),
                    status: OperationStatus::Queued,
                    priority: 0,
                },
            )
            .await
            .unwrap();
    }
    // Pretend two projections (one of them the parent of a family) were
    // built by another version, and spoil their rows so only a real
    // rebuild can restore them.
    raw(
        &harness,
        "UPDATE projection_positions SET version = 0 WHERE name IN ('media_operations', 'media_registry')",
    )
    .await;
    raw(&harness, "UPDATE media_operations SET status = 'blocked', version = 99").await;
    raw(&harness, "UPDATE media SET path = '/spoiled'").await;
    drop(engine);

    // Another process keeps appending while the rebuild runs.
    let writer_store = harness.open().await;
    let stop = Arc::new(AtomicBool::new(false));
    let appended = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0u128;
            while n < 20 || (n < 300 && !stop.load(Ordering::SeqCst)) {
                let append = created(n);
                writer_store
                    .write(move |tx: &mut <PostgresStore as Store>::Tx| {
                        Box::pin(async move {
                            tx.append(vec![append]).await?;
                            Ok::<_, StoreError>(())
                        })
                    })
                    .await
                    .unwrap();
                n += 1;
                tokio::task::yield_now().await;
            }
            n
        })
    };
    let engine = Engine::new(harness.open().await).with_fold_chunk(7);
    let report = engine.startup().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    let appended_meanwhile = appended.await.unwrap();
    for name in ["media_operations", "media_registry", "processing_states"] {
        assert!(
            report.rebuilt.iter().any(|(rebuilt, _, to, _)| rebuilt == name
                && *to == opledger_domain::projections::spec_by_name(name).unwrap().version),
            "{name}: {report:?}"
        );
    }
    // Events appended after the swap: the next startup brings everything
    // to the head without changing versions.
    let report = engine.startup().await.unwrap();
    assert!(report.rebuilt.iter().all(|(_, from, to, _)| from == to), "{report:?}");
    assert_eq!(
        engine.store().count_rows(&OPERATIONS_TABLE).await.unwrap() as u128,
        40 + 40 + appended_meanwhile
    );
    assert_eq!(engine.store().count_rows(&MEDIA_TABLE).await.unwrap(), 40);
    assert_eq!(engine.store().count_rows(&MEDIA_STATES_TABLE).await.unwrap(), 40);
    let states = engine.store().projection_states().await.unwrap();
    assert_eq!(
        states.iter().map(|state| state.name.as_str()).collect::<Vec<_>>(),
        opledger_domain::projections::all_specs()
            .iter()
            .map(|spec| spec.name)
            .collect::<Vec<_>>()
    );
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());

    // Swapped-in tables, their constraints and indexes carry live names
    // only, so a second rebuild creates its shadows exactly like the first.
    let shadowy = "SELECT relname::text FROM pg_class WHERE relname LIKE '%\\_\\_shadow%' \
                   UNION ALL SELECT conname::text FROM pg_constraint WHERE conname LIKE '%\\_\\_shadow%'";
    assert_eq!(names_like(&harness, shadowy).await, Vec::<String>::new());
    let live_indexes = names_like(
        &harness,
        "SELECT indexname::text FROM pg_indexes WHERE tablename = 'media_processing_states' ORDER BY 1",
    )
    .await;
    assert_eq!(
        live_indexes,
        vec![
            "media_processing_states_claim_order",
            "media_processing_states_claimable",
            "media_processing_states_claimed",
            "media_processing_states_media_id_task_kind_key",
            "media_processing_states_pkey",
        ]
    );
    raw(
        &harness,
        "UPDATE projection_positions SET version = 0 WHERE name = 'media_registry'",
    )
    .await;
    let report = engine.startup().await.unwrap();
    // The registry's family: everything its tables reference or is
    // referenced by, and what folds read from them (all but batches).
    assert_eq!(report.rebuilt.len(), 6, "the registry's family: {report:?}");
    assert!(engine.verify().await.unwrap().is_identical());
    assert_eq!(names_like(&harness, shadowy).await, Vec::<String>::new());
    // The cascade still reaches the swapped-in children.
    let mut connection = harness.connect().await;
    let references: Vec<(String,)> = sqlx::query_as(
        "SELECT confrelid::regclass::text FROM pg_constraint WHERE contype = 'f' ORDER BY conrelid::regclass::text",
    )
    .fetch_all(&mut connection)
    .await
    .unwrap();
    let mut references: Vec<String> = references.into_iter().map(|(name,)| name).collect();
    references.sort();
    assert_eq!(
        references,
        vec![
            "batches",
            "media",
            "media",
            "media",
            "media_regions",
            "task_kinds",
            "task_kinds"
        ]
    );
}
