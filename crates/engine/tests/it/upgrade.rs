//! A ledger written before task kinds were declared opens with this build:
//! the committed fixture (`fixtures/ledger-before-declared-kinds.sqlite`,
//! written by the release before declarations: an ingest of five files, one
//! of them broken, and model tasks requested, completed and failed through
//! the CLI) gets the former built-in kinds declared once, its projections
//! rebuilt agree with a full replay, its work goes on, and it ends where a
//! fresh ledger given the same declarations ends.

use opledger_domain::kinds::legacy;
use opledger_domain::projections::{Row, MEDIA_STATES_TABLE};
use opledger_domain::{CapabilityStatus, OperationStatus};
use opledger_engine::{
    parse_kinds, ClaimRequest, CommandContext, Completion, Engine, FixedClock, KindStatus, UuidV7Ids,
};
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use std::path::Path;
use std::sync::Arc;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/ledger-before-declared-kinds.sqlite"
);

async fn open(path: &Path) -> (Engine<SqliteStore>, opledger_engine::StartupReport) {
    let store = SqliteStore::open(SqliteConfig::at(path)).await.unwrap();
    Engine::open(store).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_from_before_declarations_gets_the_former_kinds_declared_once_and_replays_exactly() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("ledger.db");
    std::fs::copy(FIXTURE, &path).unwrap();

    let (engine, report) = open(&path).await;
    assert_eq!(report.kinds_declared, 6, "{report:?}");
    let kinds = engine.task_kinds().await.unwrap();
    let declared: Vec<_> = kinds.iter().filter_map(|row| row.declaration.clone()).collect();
    let mut expected = legacy::declarations();
    expected.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(declared, expected, "version 1, the policies of then");
    let declarations = engine
        .store()
        .read_stream(&opledger_domain::StreamId::task_kinds())
        .await
        .unwrap();
    assert_eq!(declarations.len(), 6);
    assert!(declarations.iter().all(|event| event.actor == "system"));
    assert!(declarations.iter().all(|event| matches!(
        &event.event,
        opledger_domain::Event::TaskKindDeclared(declared) if declared.reason == "upgrade"
    )));
    // What the old build recorded reads the same: nothing became stale.
    let states = engine.store().scan_table(&MEDIA_STATES_TABLE).await.unwrap();
    assert_eq!(
        states.len(),
        18,
        "five files × three image tasks, and three model tasks"
    );
    let succeeded = states
        .iter()
        .filter(|row| matches!(row, Row::ProcessingState(state) if state.status == OperationStatus::Succeeded))
        .count();
    assert_eq!(succeeded, 13);
    assert_eq!(
        engine
            .maintain(&CommandContext::actor("system"))
            .await
            .unwrap()
            .stale_marked,
        0
    );
    assert!(engine.verify().await.unwrap().is_identical());

    // The example application's file changes nothing in it; the media
    // crate's file is a new version of its image kinds (one shared
    // reduced-size decode, images only) and declares the video and audio
    // kinds beside them: a dry run says so.
    let report = engine
        .apply_kinds(
            &CommandContext::actor("cli"),
            &parse_kinds(include_str!("../../../../examples/pipeline.toml")).unwrap(),
            false,
        )
        .await
        .unwrap();
    for kind in report.kinds.iter().filter(|kind| legacy::facts(&kind.name).is_some()) {
        assert_eq!(kind.status, KindStatus::Unchanged, "{}", kind.name);
    }
    let report = engine
        .apply_kinds(
            &CommandContext::actor("cli"),
            &parse_kinds(include_str!("../../../media/kinds.toml")).unwrap(),
            true,
        )
        .await
        .unwrap();
    for kind in &report.kinds {
        if legacy::facts(&kind.name).is_some() {
            assert_eq!(kind.status, KindStatus::Changed, "{}", kind.name);
            assert_eq!(kind.version, "3", "{}", kind.name);
        } else {
            assert_eq!(kind.status, KindStatus::Declared, "{}", kind.name);
            assert_eq!(kind.version, "1", "{}", kind.name);
        }
    }

    // Its queued work goes on under the declared kinds.
    let claims = engine
        .claim_tasks(
            &CommandContext::actor("py-1"),
            ClaimRequest {
                kinds: vec!["perceptual_hash".into()],
                worker: "py-1".into(),
                lease_ms: 30_000,
                limit: 10,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].path.as_deref(), Some("/elsewhere/a.jpg"));
    engine
        .complete_task(
            &CommandContext::actor("py-1"),
            &claims[0].fence(),
            Completion::Output(serde_json::json!({"dhash": "00ff"})),
        )
        .await
        .unwrap();
    let media = claims[0].media_id.unwrap();
    let hash = engine
        .capabilities(media)
        .await
        .unwrap()
        .into_iter()
        .find(|row| row.capability == "perceptual_hash")
        .unwrap();
    assert_eq!(hash.status, CapabilityStatus::Succeeded);
    drop(engine);

    // Opened again: declared already, nothing appended.
    let (engine, report) = open(&path).await;
    assert_eq!(report.kinds_declared, 0);
    let head = engine.store().head().await.unwrap();
    assert_eq!(engine.upgrade_kinds(&CommandContext::actor("system")).await.unwrap(), 0);
    assert_eq!(engine.store().head().await.unwrap(), head);
    assert!(engine.verify().await.unwrap().is_identical());
}

/// The upgraded ledger's log, replayed into a fresh ledger that declared
/// the kinds first, gives the same processing states and capabilities:
/// the upgrade changes no meaning, only adds the declarations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_ledger_and_a_fresh_one_given_its_events_after_declarations_agree() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("ledger.db");
    std::fs::copy(FIXTURE, &path).unwrap();
    let (upgraded, _) = open(&path).await;
    let events = upgraded.store().read_all(0, 10_000);
    let events: Vec<_> = futures::TryStreamExt::try_collect(events).await.unwrap();

    let fresh_path = folder.path().join("fresh.db");
    // Declared just before the old build's first event: time never goes
    // backwards along a log, so declarations made now would lift every
    // old event after them to now.
    let before = events[0].recorded_at.plus_millis(-1_000);
    let fresh = Engine::with_clock(
        SqliteStore::open(SqliteConfig::at(&fresh_path)).await.unwrap(),
        Arc::new(FixedClock::at(before)),
        Arc::new(UuidV7Ids),
    );
    fresh.startup().await.unwrap();
    fresh
        .declare(&CommandContext::actor("system"), legacy::declarations())
        .await
        .unwrap();
    // The old build's events, as they are, after the declarations.
    for envelope in events
        .iter()
        .filter(|envelope| envelope.stream_id != opledger_domain::StreamId::task_kinds())
    {
        let expected = if envelope.stream_version == 1 {
            opledger_store::ExpectedVersion::NoStream
        } else {
            opledger_store::ExpectedVersion::Exactly(envelope.stream_version - 1)
        };
        fresh
            .append(vec![opledger_store::StreamAppend {
                stream_id: envelope.stream_id.clone(),
                expected,
                events: vec![opledger_domain::NewEvent {
                    event: envelope.event.clone(),
                    recorded_at: envelope.recorded_at,
                    actor: envelope.actor.clone(),
                    correlation_id: envelope.correlation_id.clone(),
                    causation_id: envelope.causation_id.clone(),
                }],
            }])
            .await
            .unwrap();
    }
    let rows = |engine: &Engine<SqliteStore>| {
        let store = engine.store().clone();
        async move {
            let mut states = store.scan_table(&MEDIA_STATES_TABLE).await.unwrap();
            states.sort_by_key(Row::key);
            let mut capabilities = store
                .scan_table(&opledger_domain::projections::CAPABILITY_STATES_TABLE)
                .await
                .unwrap();
            capabilities.sort_by_key(Row::key);
            (states, capabilities)
        }
    };
    assert_eq!(rows(&upgraded).await, rows(&fresh).await);
    assert!(fresh.verify().await.unwrap().is_identical());
}
