//! The lookups an ingest classifies its folder with answer exactly what a
//! read of every ingestion and every media item would, for the paths
//! asked: the latest ingestion per path by (creation time, id), and of
//! several media items at one path the last by id. On every backend.

use opledger_domain::events::OperationTarget;
use opledger_domain::projections::{MediaRow, OperationRow, Row, INGESTION_FILE, MEDIA_TABLE, OPERATIONS_TABLE};
use opledger_domain::DomainError;
use opledger_domain::{OperationStatus, Timestamp};
use opledger_engine::{
    CommandContext, Engine, EngineError, FileObservation, FixedClock, NewOperation, Registration, SequentialIds,
};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const T0: i64 = 1_700_000_000_000_000;

fn file(path: &str, byte_size: i64) -> FileObservation {
    FileObservation {
        path: path.to_string(),
        byte_size,
        modified_ns: byte_size * 1_000,
    }
}

/// Every ingestion, the latest per path: what the lookup must equal.
async fn latest_ingestions_read_in_full<S: Store>(engine: &Engine<S>) -> BTreeMap<String, OperationRow> {
    let mut latest: BTreeMap<String, OperationRow> = BTreeMap::new();
    for row in engine.store().scan_table(&OPERATIONS_TABLE).await.unwrap() {
        let Row::Operation(operation) = row else { continue };
        if operation.kind != INGESTION_FILE {
            continue;
        }
        let Some(path) = operation.path.clone() else { continue };
        let newer = latest.get(&path).is_none_or(|known| {
            (known.created_at, known.operation_id) < (operation.created_at, operation.operation_id)
        });
        if newer {
            latest.insert(path, operation);
        }
    }
    latest
}

/// Every media item by path, read in key order (the last one at a path stays).
async fn media_read_in_full<S: Store>(engine: &Engine<S>) -> BTreeMap<String, MediaRow> {
    let mut by_path = BTreeMap::new();
    for row in engine.store().scan_table(&MEDIA_TABLE).await.unwrap() {
        if let Row::Media(media) = row {
            by_path.insert(media.path.clone(), media);
        }
    }
    by_path
}

/// A ledger with several ingestions per path (finished, failed, taken
/// over, recorded missing; two begun in one command at one time; one
/// begun later under an earlier clock), another kind of operation naming a
/// path, and two media items at one path.
async fn lookups_by_path_equal_a_full_read_of_ingestions_and_media<B: Backend>(backend: &B) {
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(T0)));
    let engine = Engine::with_clock(backend.open().await, clock.clone(), Arc::new(SequentialIds::default()));
    engine.startup().await.unwrap();
    let context = CommandContext::actor("test");
    let worker = "ingest-test";

    for (round, outcome) in [Ok(json!({})), Err("unreadable".to_string()), Ok(json!({}))]
        .into_iter()
        .enumerate()
    {
        clock.advance_millis(1_000);
        let claims = engine
            .begin_ingestions(
                &context,
                worker,
                60_000,
                vec![file("/photos/a.png", round as i64)],
                Vec::new(),
            )
            .await
            .unwrap();
        engine
            .finish_ingestions(&context, vec![(claims[0].clone(), outcome)])
            .await
            .unwrap();
    }
    // Two ingestions of one path at one time: the later id is the latest.
    clock.advance_millis(1_000);
    engine
        .begin_ingestions(
            &context,
            worker,
            60_000,
            vec![file("/photos/b.png", 1), file("/photos/b.png", 2)],
            Vec::new(),
        )
        .await
        .unwrap();
    // Finished, then recorded missing.
    let claims = engine
        .begin_ingestions(&context, worker, 60_000, vec![file("/photos/c.png", 1)], Vec::new())
        .await
        .unwrap();
    engine
        .finish_ingestions(&context, vec![(claims[0].clone(), Ok(json!({})))])
        .await
        .unwrap();
    clock.advance_millis(1_000);
    engine
        .confirm_missing_files(&context, vec![file("/photos/c.png", 0)])
        .await
        .unwrap();
    // Begun later (a larger id) under an earlier clock: time never goes
    // backwards along the log, so it is recorded at the time of the one
    // begun before, and the larger id makes it the latest.
    clock.advance_millis(1_000);
    engine
        .begin_ingestions(&context, worker, 60_000, vec![file("/other/d.png", 1)], Vec::new())
        .await
        .unwrap();
    clock.advance_millis(-5_000);
    let claims = engine
        .begin_ingestions(&context, worker, 60_000, vec![file("/other/d.png", 2)], Vec::new())
        .await
        .unwrap();
    // Taken over, as by the next run after a crash.
    clock.advance_millis(10_000);
    engine
        .begin_ingestions(
            &context,
            "ingest-next",
            60_000,
            Vec::new(),
            vec![claims[0].operation_id],
        )
        .await
        .unwrap();
    // Not an ingestion, though it names a path that has one.
    engine
        .create_operation(
            &context,
            NewOperation {
                kind: "export".into(),
                target: OperationTarget {
                    media_id: None,
                    region_id: None,
                    path: Some("/photos/a.png".into()),
                },
                revision: None,
                inputs: json!({}),
                status: OperationStatus::Queued,
                priority: 0,
            },
        )
        .await
        .unwrap();
    for path in ["/photos/a.png", "/photos/dup.png", "/photos/dup.png", "/other/d.png"] {
        engine
            .register_media(&context, path, "image", Some("sha256:ab".into()), Some(1))
            .await
            .unwrap();
    }

    let ingestions = latest_ingestions_read_in_full(&engine).await;
    let media = media_read_in_full(&engine).await;
    assert_eq!(ingestions.len(), 4, "{ingestions:?}");
    assert_eq!(media.len(), 3, "{media:?}");
    let known: BTreeSet<String> = ingestions.keys().chain(media.keys()).cloned().collect();
    let mut asked: Vec<String> = known.iter().cloned().collect();
    asked.push("/photos/never-seen.png".into());
    for paths in [
        asked.clone(),
        vec!["/photos/b.png".to_string(), "/photos/dup.png".to_string()],
        Vec::new(),
    ] {
        let wanted = |path: &String| paths.contains(path);
        let expected: BTreeMap<String, OperationRow> = ingestions
            .iter()
            .filter(|(path, _)| wanted(path))
            .map(|(path, row)| (path.clone(), row.clone()))
            .collect();
        assert_eq!(engine.ingestions_by_path(&paths).await.unwrap(), expected, "{paths:?}");
        let expected: BTreeMap<String, MediaRow> = media
            .iter()
            .filter(|(path, _)| wanted(path))
            .map(|(path, row)| (path.clone(), row.clone()))
            .collect();
        assert_eq!(engine.media_by_path(&paths).await.unwrap(), expected, "{paths:?}");
    }
    // The cases the ledger was built for are the ones the answers show.
    let answers = engine.ingestions_by_path(&asked).await.unwrap();
    assert_eq!(answers["/photos/a.png"].status, OperationStatus::Succeeded);
    assert_eq!(answers["/photos/c.png"].status, OperationStatus::MissingConfirmed);
    assert_eq!(answers["/other/d.png"].worker.as_deref(), Some("ingest-next"));
    assert!(
        answers["/photos/b.png"].inputs.contains("\"byte_size\":2"),
        "{:?}",
        answers["/photos/b.png"]
    );

    // Every path an operation names, the export's included.
    let named: BTreeSet<String> = ingestions.keys().cloned().collect();
    assert_eq!(engine.operation_paths().await.unwrap(), named);
    // Media by id: every item, both at the shared path.
    let ids: Vec<_> = {
        let mut ids = Vec::new();
        for row in engine.store().scan_table(&MEDIA_TABLE).await.unwrap() {
            if let Row::Media(item) = row {
                ids.push(item.media_id);
            }
        }
        ids
    };
    assert_eq!(ids.len(), 4);
    let by_id = engine.media_by_id(&ids).await.unwrap();
    assert_eq!(by_id.keys().copied().collect::<Vec<_>>(), ids);
    assert!(engine.verify().await.unwrap().is_identical());
}

backend_tests!(lookups_by_path_equal_a_full_read_of_ingestions_and_media);

fn registration(claim: &opledger_engine::IngestionClaim) -> Registration {
    Registration {
        claim: claim.clone(),
        content_digest: format!("sha256:{}", "ab".repeat(32)),
        byte_size: 1,
        media_kind: "image".into(),
        parsed: json!({}),
        observed: None,
        blocked: Default::default(),
    }
}

/// The ingest's registration never makes a second media item for a path:
/// two registrations of one path in one command are refused whole, with
/// nothing appended, and two processes registering one path at once (each
/// having read that no item exists) end with one item, the later one
/// either refused inside its write or updating the first's item.
async fn registering_ingested_files_never_makes_a_second_media_item_for_one_path<B: Backend>(backend: &B) {
    let context = CommandContext::actor("test");
    let (first, _) = Engine::open(backend.open().await).await.unwrap();
    let (second, _) = Engine::open(backend.open().await).await.unwrap();

    let claims = first
        .begin_ingestions(
            &context,
            "ingest-a",
            60_000,
            vec![file("/photos/twice.png", 1), file("/photos/twice.png", 2)],
            Vec::new(),
        )
        .await
        .unwrap();
    let head = first.store().head().await.unwrap();
    let refused = first
        .register_ingestions(&context, claims.iter().map(registration).collect(), &[])
        .await
        .expect_err("two new items for one path in one registration");
    assert!(
        matches!(&refused, EngineError::Domain(DomainError::Conflict(message)) if message.contains("/photos/twice.png")),
        "{refused}"
    );
    assert_eq!(first.store().head().await.unwrap(), head, "nothing appended");

    for round in 0..8 {
        let path = format!("/photos/race-{round}.png");
        let mine = first
            .begin_ingestions(&context, "ingest-a", 60_000, vec![file(&path, 1)], Vec::new())
            .await
            .unwrap();
        let theirs = second
            .begin_ingestions(&context, "ingest-b", 60_000, vec![file(&path, 1)], Vec::new())
            .await
            .unwrap();
        let (a, b) = tokio::join!(
            first.register_ingestions(&context, vec![registration(&mine[0])], &[]),
            second.register_ingestions(&context, vec![registration(&theirs[0])], &[]),
        );
        for outcome in [a, b] {
            if let Err(error) = outcome {
                assert!(
                    matches!(&error, EngineError::Domain(DomainError::Conflict(message)) if message.contains("already as")),
                    "only a second item is refused: {error}"
                );
            }
        }
        let items = first.media_by_path(std::slice::from_ref(&path)).await.unwrap();
        assert_eq!(items.len(), 1);
        let all = first
            .store()
            .scan_table(&MEDIA_TABLE)
            .await
            .unwrap()
            .into_iter()
            .filter(|row| matches!(row, Row::Media(item) if item.path == path))
            .count();
        assert_eq!(all, 1, "round {round}: one media item at {path}");
    }
    assert!(first.verify().await.unwrap().is_identical());
}

backend_tests!(
    worker_threads = 2;
    registering_ingested_files_never_makes_a_second_media_item_for_one_path
);
