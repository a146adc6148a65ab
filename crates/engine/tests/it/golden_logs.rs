//! Golden replay fixtures, kept forever (`tests/fixtures/logs/`, described
//! in its README): logs as stored, one event a line, each replayed into a
//! fresh database of every backend and compared with the projection digest
//! recorded beside it (`NAME.sha256`, [`Engine::projection_digest`]). A
//! change in what any fold, upcaster or decoder makes of an event some
//! release wrote fails here. Every event type at every schema version up
//! to the current one must appear in some fixture, so a new type or
//! version cannot ship without one; bad logs (`bad/`) fail with the error
//! named beside them (`NAME.error`).
//!
//! *How the chain is made:* fixture lines carry no chain hash. The loader
//! links each event as the store's append does — the domain's rule
//! (`opledger_domain::chain`) over the facts it inserts, the payload text
//! exactly as inserted — and inserts the rows verbatim with raw SQL, so an
//! old schema version stays stored at its version and replay reads it
//! through the upcasters. `replay --verify`'s chain walk then checks those
//! links like any other.
//!
//! `OPLEDGER_WRITE_GOLDEN_DIGESTS=1` records the digest of a fixture that
//! has none yet (never one that has); `OPLEDGER_WRITE_GOLDEN_LOG=NAME`
//! writes the scenario's log (`golden_logs/scenario.rs`) as a new fixture
//! `NAME.jsonl` (never over an existing file).

#[path = "golden_logs/scenario.rs"]
mod scenario;

use futures::TryStreamExt;
use opledger_domain::chain::{self, ChainHash, StoredFacts, GENESIS};
use opledger_domain::events::{current_version, Event};
use opledger_domain::{EventEnvelope, Timestamp};
use opledger_engine::{Engine, FixedClock, SequentialIds};
use opledger_store::{Store, StoreError};
use opledger_testkit::Harness;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One stored event: the columns of `media_operation_events` but the
/// chain hash, the payload as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredLine {
    pub seq: i64,
    pub stream_id: String,
    pub stream_version: i64,
    pub event_type: String,
    pub schema_version: u32,
    pub recorded_at: String,
    pub actor: String,
    pub correlation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causation_id: Option<String>,
    pub payload: serde_json::Value,
}

impl StoredLine {
    /// The line of an event as the log holds it.
    pub fn of(envelope: &EventEnvelope) -> StoredLine {
        StoredLine {
            seq: envelope.seq,
            stream_id: envelope.stream_id.as_str().to_string(),
            stream_version: envelope.stream_version,
            event_type: envelope.event.event_type().to_string(),
            schema_version: envelope.schema_version,
            recorded_at: envelope.recorded_at.to_rfc3339(),
            actor: envelope.actor.clone(),
            correlation_id: envelope.correlation_id.clone(),
            causation_id: envelope.causation_id.clone(),
            payload: serde_json::from_str(&envelope.event.payload_json()).expect("payloads are JSON"),
        }
    }
}

pub fn logs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/logs")
}

fn fixtures_in(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "jsonl"))
        .collect();
    found.sort();
    found
}

pub fn read_log(path: &Path) -> Vec<StoredLine> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(number, line)| {
            serde_json::from_str(line).unwrap_or_else(|error| panic!("{}:{}: {error}", path.display(), number + 1))
        })
        .collect()
}

/// A text as an SQL string literal (both backends: quotes doubled).
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Inserts the lines verbatim, each linked into the chain by the domain's
/// rule, in one raw script. A row the database refuses (a seq gap) fails
/// the load with the database's error.
pub async fn load<H: Harness>(harness: &H, lines: &[StoredLine]) -> Result<(), StoreError> {
    let mut previous: ChainHash = GENESIS;
    let mut script = String::new();
    for line in lines {
        let payload = line.payload.to_string();
        let recorded_at =
            Timestamp::parse(&line.recorded_at).unwrap_or_else(|error| panic!("seq {}: recorded_at {error}", line.seq));
        let digest = chain::event_digest(&StoredFacts {
            seq: line.seq,
            stream_id: &line.stream_id,
            stream_version: line.stream_version,
            event_type: &line.event_type,
            schema_version: i64::from(line.schema_version),
            payload: &payload,
            recorded_at,
            actor: &line.actor,
            correlation_id: &line.correlation_id,
            causation_id: line.causation_id.as_deref(),
        });
        previous = chain::link(&previous, &digest);
        script.push_str(&format!(
            "INSERT INTO media_operation_events (seq, stream_id, stream_version, event_type, schema_version, \
             payload, recorded_at, actor, correlation_id, causation_id, chain_hash) \
             VALUES ({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {});\n",
            line.seq,
            literal(&line.stream_id),
            line.stream_version,
            literal(&line.event_type),
            line.schema_version,
            literal(&payload),
            literal(&recorded_at.to_rfc3339()),
            literal(&line.actor),
            literal(&line.correlation_id),
            line.causation_id.as_deref().map_or("NULL".to_string(), literal),
            literal(&previous.to_hex()),
        ));
    }
    harness.execute_raw(&script).await
}

/// An engine on a fresh store of the harness's database. Its clock and ids
/// are fixed: a replay reads neither, and nothing here appends.
async fn engine_on<H: Harness>(harness: &H) -> Engine<H::Store> {
    Engine::with_clock(
        harness.open().await,
        Arc::new(FixedClock::at(Timestamp::from_micros(1_780_000_000_000_000))),
        Arc::new(SequentialIds::default()),
    )
}

/// Loads a log into a fresh database, rebuilds every projection from it
/// (replay into the live tables) and answers the engine, or the first error
/// with its kind.
pub async fn replay_log<H: Harness>(harness: &H, lines: &[StoredLine]) -> Result<Engine<H::Store>, String> {
    let engine = engine_on(harness).await;
    load(harness, lines)
        .await
        .map_err(|error| format!("{:?}: {}", error.kind, error.message))?;
    engine.rebuild_projections().await.map_err(|error| match &error {
        opledger_engine::EngineError::Store(store) => format!("{:?}: {}", store.kind, store.message),
        other => format!("{other}"),
    })?;
    Ok(engine)
}

/// Replays every golden log, each into a fresh database `fresh` makes
/// (None: the backend is not here, and its skip was announced).
async fn golden_logs_replay_to_their_digests<H, F, Fut>(fresh: F)
where
    H: Harness,
    F: Fn() -> Fut,
    Fut: Future<Output = Option<H>>,
{
    let fixtures = fixtures_in(&logs_dir());
    assert!(fixtures.len() >= 3, "{fixtures:?}");
    for fixture in fixtures {
        let lines = read_log(&fixture);
        let Some(harness) = fresh().await else { return };
        let engine = replay_log(&harness, &lines)
            .await
            .unwrap_or_else(|error| panic!("{}: {error}", fixture.display()));
        let report = engine.verify().await.unwrap();
        assert!(report.is_identical(), "{}:\n{}", fixture.display(), report.render());
        assert_eq!(
            report.chain.map(|reached| reached.seq),
            Ok(lines.len() as i64),
            "{}: the chain reaches the last event",
            fixture.display()
        );
        let digest = engine.projection_digest().await.unwrap();
        let recorded_path = fixture.with_extension("sha256");
        let recorded = match std::fs::read_to_string(&recorded_path) {
            Ok(text) => text.trim().to_string(),
            Err(_) if std::env::var_os("OPLEDGER_WRITE_GOLDEN_DIGESTS").is_some() => {
                std::fs::write(&recorded_path, format!("{digest}\n")).unwrap();
                digest.clone()
            }
            Err(error) => panic!(
                "{} has no recorded digest ({error}); record it once with OPLEDGER_WRITE_GOLDEN_DIGESTS=1",
                fixture.display()
            ),
        };
        assert_eq!(
            digest,
            recorded,
            "{} folds to other projections than when its digest was recorded",
            fixture.display()
        );
    }
}

/// Replays every bad log, each into a fresh database: each fails with the
/// error named beside it (its kind and the start of its message).
async fn bad_logs_fail_with_their_named_errors<H, F, Fut>(fresh: F)
where
    H: Harness,
    F: Fn() -> Fut,
    Fut: Future<Output = Option<H>>,
{
    let fixtures = fixtures_in(&logs_dir().join("bad"));
    assert!(fixtures.len() >= 3, "{fixtures:?}");
    for fixture in fixtures {
        let lines = read_log(&fixture);
        let named = std::fs::read_to_string(fixture.with_extension("error"))
            .unwrap_or_else(|error| panic!("{} needs the error it fails with: {error}", fixture.display()));
        let named = named.trim();
        let Some(harness) = fresh().await else { return };
        // `Kind: words`: the error's kind, and words its message holds
        // (the database's own message differs by backend around them).
        let (kind, words) = named.split_once(": ").unwrap_or((named, ""));
        match replay_log(&harness, &lines).await {
            Ok(_) => panic!("{} replayed; it must fail with {named}", fixture.display()),
            Err(error) => assert!(
                error.starts_with(&format!("{kind}: ")) && error.contains(words),
                "{} failed with {error}, not {named}",
                fixture.display()
            ),
        }
    }
}

/// One test per backend, named `NAME::sqlite` and `NAME::postgres` as
/// `backend_tests!` names them; each fixture needs an empty log, so each
/// gets a database of its own rather than the one the macro hands out.
macro_rules! on_fresh_databases {
    ($($name:ident => $body:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$body(|| async { Some(opledger_testkit::sqlite::backend().await) }).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$body(opledger_testkit::postgres::backend).await;
                }
            }
        )+
    };
}

on_fresh_databases!(
    every_golden_log_replays_to_its_projection_digest => golden_logs_replay_to_their_digests,
    every_bad_log_fails_with_its_named_error => bad_logs_fail_with_their_named_errors,
);

#[test]
fn every_event_type_at_every_schema_version_has_a_golden_log() {
    let mut covered: BTreeSet<(String, u32)> = BTreeSet::new();
    for fixture in fixtures_in(&logs_dir()) {
        for line in read_log(&fixture) {
            covered.insert((line.event_type, line.schema_version));
        }
    }
    let mut missing = Vec::new();
    for (event_type, newest) in Event::CATALOGUE {
        for version in 1..=*newest {
            if !covered.contains(&(event_type.to_string(), version)) {
                missing.push(format!("{event_type} v{version}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "no golden log in tests/fixtures/logs/ holds {}: add one (its README says how)",
        missing.join(", ")
    );
    // And no fixture holds a type or version this build does not know:
    // such a log belongs in bad/.
    for (event_type, version) in &covered {
        let newest = current_version(event_type).unwrap_or_else(|| panic!("{event_type} is not a known event type"));
        assert!(
            *version <= newest,
            "{event_type} v{version} is newer than this build's v{newest}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scenario_covers_the_catalogue_and_its_log_replays_through_the_loader() {
    let source = opledger_testkit::sqlite::backend().await;
    let engine = scenario::run(&source).await;
    let events: Vec<EventEnvelope> = engine.store().read_all(0, 1_000).try_collect().await.unwrap();
    let written: BTreeSet<(&str, u32)> = events
        .iter()
        .map(|event| (event.event.event_type(), event.schema_version))
        .collect();
    let missing: Vec<&str> = Event::CATALOGUE
        .iter()
        .filter(|(event_type, version)| !written.contains(&(*event_type, *version)))
        .map(|(event_type, _)| *event_type)
        .collect();
    assert!(missing.is_empty(), "the scenario writes no {missing:?}");
    let lines: Vec<StoredLine> = events.iter().map(StoredLine::of).collect();
    // The log as a fixture holds it replays to what the engine folded inline.
    let copy = opledger_testkit::sqlite::backend().await;
    let replayed = replay_log(&copy, &lines).await.unwrap();
    assert_eq!(
        replayed.projection_digest().await.unwrap(),
        engine.projection_digest().await.unwrap()
    );
    if let Some(name) = std::env::var_os("OPLEDGER_WRITE_GOLDEN_LOG") {
        let path = logs_dir().join(Path::new(&name).with_extension("jsonl"));
        assert!(
            !path.exists(),
            "{} exists: golden logs are never rewritten",
            path.display()
        );
        let text: String = lines
            .iter()
            .map(|line| serde_json::to_string(line).unwrap() + "\n")
            .collect();
        std::fs::write(&path, text).unwrap();
    }
}
