//! Startup: a projection stored at another version is rebuilt through a
//! shadow while writers keep appending, and a projection behind the log is
//! caught up, before any command runs.

use opledger_domain::events::{Event, OperationCreated, OperationTarget};
use opledger_domain::projections::{MEDIA_OPERATIONS, MEDIA_TABLE, OPERATIONS_TABLE};
use opledger_domain::{NewEvent, OperationId, OperationStatus, StreamId, Timestamp};
use opledger_engine::{CommandContext, Engine, NewOperation};
use opledger_store::{ExpectedVersion, Store, StoreError, StreamAppend, WriteTx};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use uuid::Uuid;

async fn raw(store: &SqliteStore, sql: &str) {
    let mut connection = store.raw_connection().await.unwrap();
    sqlx::Executor::execute(&mut connection, sql).await.unwrap();
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
                inputs: serde_json::json!({}),
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
async fn changed_projection_version_is_rebuilt_through_a_shadow_without_losing_events_appended_meanwhile() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("rebuild.db");
    let store = SqliteStore::open(SqliteConfig::at(&path)).await.unwrap();
    let (engine, _) = Engine::open(store.clone()).await.unwrap();
    let context = CommandContext::actor("test");
    for n in 0..40 {
        let media_id = engine
            .register_media(&context, &format!("/photos/{n}.jpg"), "image", None, Some(n))
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
                    inputs: serde_json::json!({"n": n}),
                    status: OperationStatus::Queued,
                    priority: 0,
                },
            )
            .await
            .unwrap();
    }
    // Pretend the stored media_operations was built by another version, and
    // spoil its rows so only a real rebuild can restore them.
    raw(
        &store,
        "UPDATE projection_positions SET version = 0 WHERE name = 'media_operations'",
    )
    .await;
    raw(&store, "UPDATE media_operations SET status = 'blocked', version = 99").await;
    drop(engine);

    // An older process keeps appending while the rebuild runs (it appends
    // without folding: its inline fold is not ours to run).
    let writer_store = SqliteStore::open(SqliteConfig::at(&path)).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let appended = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0u128;
            while n < 20 || (n < 300 && !stop.load(Ordering::SeqCst)) {
                let append = created(n);
                writer_store
                    .write(move |tx: &mut <SqliteStore as Store>::Tx| {
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

    let rebuilding = SqliteStore::open(SqliteConfig::at(&path)).await.unwrap();
    let engine = Engine::new(rebuilding).with_fold_chunk(7);
    let report = engine.startup().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    let appended_meanwhile = appended.await.unwrap();
    // media_operations changed version: rebuilt from 0 to its version. The events the
    // raw writer appended meanwhile leave the other projections behind; the
    // registry's family (its tables are referenced by processing states) is
    // rebuilt as a whole rather than caught up member by member.
    assert!(
        report
            .rebuilt
            .iter()
            .any(|(name, from, to, _)| name == "media_operations" && (*from, *to) == (0, MEDIA_OPERATIONS.version)),
        "{report:?}"
    );
    for (name, from, to, _) in &report.rebuilt {
        if name != "media_operations" {
            assert_eq!(from, to, "only media_operations changed version: {report:?}");
            assert!(
                [
                    "task_kinds",
                    "media_registry",
                    "processing_states",
                    "entity_capability_states",
                    "review_queue"
                ]
                .contains(&name.as_str()),
                "{report:?}"
            );
        }
    }

    // The events appended after the swap are not in any projection yet:
    // the next startup brings every projection to the head (a family by a
    // rebuild at the same version, a lone projection by catching up), and
    // no version changes any more.
    let report = engine.startup().await.unwrap();
    assert!(report.rebuilt.iter().all(|(_, from, to, _)| from == to), "{report:?}");
    let operations = engine.store().scan_table(&OPERATIONS_TABLE).await.unwrap();
    assert_eq!(operations.len() as u128, 40 + appended_meanwhile);
    assert_eq!(engine.store().count_rows(&MEDIA_TABLE).await.unwrap(), 40);
    let status = engine.status().await.unwrap();
    assert_eq!(
        status
            .operations_by_status
            .iter()
            .find(|(name, _)| name == "blocked")
            .unwrap()
            .1,
        0
    );
    for projection in &status.projections {
        assert_eq!(projection.lag, 0, "{projection:?}");
        let spec = opledger_domain::projections::spec_by_name(&projection.name).unwrap();
        assert_eq!(projection.version, spec.version);
    }
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());

    // The swapped-in tables keep their indexes under the live names, so a
    // second rebuild works too.
    raw(
        engine.store(),
        "UPDATE projection_positions SET version = 0 WHERE name = 'media_operations'",
    )
    .await;
    let report = engine.startup().await.unwrap();
    // media_operations and its family (the review queue reads it, and the
    // capability rows the queue reads tie it to the registry's).
    let rebuilt: Vec<&str> = report.rebuilt.iter().map(|entry| entry.0.as_str()).collect();
    assert_eq!(
        rebuilt,
        [
            "task_kinds",
            "media_registry",
            "media_operations",
            "processing_states",
            "entity_capability_states",
            "review_queue"
        ]
    );
    assert!(engine.verify().await.unwrap().is_identical());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projection_behind_the_log_is_caught_up_before_commands_run() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("catch-up.db");
    let store = SqliteStore::open(SqliteConfig::at(&path)).await.unwrap();
    // Events appended below the engine (as by an importer) leave every
    // projection behind the log.
    for n in 0..25 {
        let append = created(n);
        store
            .write(move |tx: &mut <SqliteStore as Store>::Tx| {
                Box::pin(async move {
                    tx.append(vec![append]).await?;
                    Ok::<_, StoreError>(())
                })
            })
            .await
            .unwrap();
    }
    let engine = Engine::new(store).with_fold_chunk(4);
    // Inline folding refuses to run on a projection that is not at the head.
    let refused = engine
        .register_media(&CommandContext::actor("test"), "/x.png", "image", None, None)
        .await
        .unwrap_err();
    assert!(refused.is_store(opledger_store::ErrorKind::Conflict), "{refused}");
    let report = engine.startup().await.unwrap();
    // A projection alone is caught up in place; a family whose tables
    // reference each other is rebuilt together through shadows, so a child
    // row never references a parent its family already deleted.
    assert_eq!(report.caught_up, vec![("batches".to_string(), 25)]);
    let rebuilt: Vec<&str> = report.rebuilt.iter().map(|entry| entry.0.as_str()).collect();
    assert_eq!(
        rebuilt,
        vec![
            "task_kinds",
            "media_registry",
            "media_operations",
            "processing_states",
            "entity_capability_states",
            "review_queue"
        ],
        "{report:?}"
    );
    assert_eq!(engine.store().count_rows(&OPERATIONS_TABLE).await.unwrap(), 25);
    engine
        .register_media(&CommandContext::actor("test"), "/x.png", "image", None, None)
        .await
        .unwrap();
    assert!(engine.verify().await.unwrap().is_identical());
}
