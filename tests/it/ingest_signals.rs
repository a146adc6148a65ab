//! `opledger ingest` stopped by real signals in a real process: SIGINT and
//! SIGTERM stop it with their exit codes, release what it held and let the
//! next run resume at once; after SIGKILL the next run knows the dead run's
//! claims by its name and releases them without waiting for their leases,
//! counting an interruption only for the claim its flight record shows
//! running. `replay --verify` after each.

use crate::common;
use crate::ingest_support;

use common::{describe, opledger};
use ingest_support::{count, engine, events, held_claims, ingest, log, verify};
use opledger_domain::projections::{Row, OPERATIONS_TABLE};
use opledger_domain::Event;
use opledger_media::{generate_samples_with, SampleOptions};
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use opledger_worker::FlightRecord;
use serde_json::Value;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// An ingest of 200 files with one image worker, running in the background.
fn start(dir: &Path) -> Child {
    generate_samples_with(&dir.join("photos"), &SampleOptions::new(200, 7)).unwrap();
    opledger(dir)
        .args(["--json", "ingest", "photos", "--workers", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the child has completed `tasks` image tasks and holds task
/// claims (read on a connection of its own).
async fn wait_for_work(child: &mut Child, database: &Path, tasks: usize) {
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the ingest finished ({status}) before it could be stopped; give it more files");
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no task completed in time"
        );
        if !database.exists() {
            continue;
        }
        let Ok(store) = SqliteStore::open(SqliteConfig::at(database)).await else {
            continue;
        };
        let done = log(&store)
            .await
            .iter()
            .filter(|event| matches!(event.event, Event::OperationSucceeded(_)))
            .count();
        if done >= tasks && held_claims(&store).await > 0 {
            return;
        }
    }
}

fn signal(child: &Child, name: &str) {
    let sent = std::process::Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// Waits for the child's end (at most a minute): exit code, stdout, stderr.
fn finish(mut child: Child) -> (Option<i32>, String, String) {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the stopped ingest did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (child.wait().unwrap().code(), stdout, stderr)
}

/// Ingestions still held by a claim.
async fn held_ingestions(engine: &opledger_engine::Engine<SqliteStore>) -> usize {
    engine
        .store()
        .scan_table(&OPERATIONS_TABLE)
        .await
        .unwrap()
        .into_iter()
        .filter(|row| matches!(row, Row::Operation(operation) if operation.kind == "ingestion.file" && operation.claim_token.is_some()))
        .count()
}

/// The reasons of every interruption in the log.
async fn interruptions(engine: &opledger_engine::Engine<SqliteStore>) -> Vec<String> {
    events(engine)
        .await
        .iter()
        .filter_map(|event| match &event.event {
            Event::OperationInterrupted(interrupted) => Some(interrupted.reason.clone()),
            _ => None,
        })
        .collect()
}

/// The reasons of every release in the log.
async fn releases(engine: &opledger_engine::Engine<SqliteStore>) -> Vec<String> {
    events(engine)
        .await
        .iter()
        .filter_map(|event| match &event.event {
            Event::OperationReleased(released) => Some(released.reason.clone()),
            _ => None,
        })
        .collect()
}

/// The flight records ingest runs left beside their thumbnails.
fn flight_records(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir.join("thumbnails"))
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            let name = path.file_name().unwrap().to_string_lossy();
            name.starts_with(".ingest-") && name.ends_with(".running")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_stops_the_ingest_with_exit_130_releases_what_it_held_and_the_next_run_resumes_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = start(dir.path());
    wait_for_work(&mut child, &dir.path().join("opledger.db"), 30).await;
    signal(&child, "INT");
    let (code, stdout, stderr) = finish(child);
    assert_eq!(code, Some(130), "{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap_or_else(|error| panic!("{error}: {stdout}"));
    assert_eq!(summary["interrupted"]["by"].as_str(), Some("SIGINT"), "{summary}");
    let left = summary["interrupted"]["files_left"].as_u64().unwrap();
    assert!(left > 0, "{summary}");
    assert!(
        stderr.contains(&format!("ingest stopped by SIGINT: {left} files left unsettled")),
        "{stderr}"
    );
    // Nothing is left claimed: no task waits for a lease to expire.
    let engine = engine(dir.path()).await;
    assert_eq!(held_claims(engine.store()).await, 0);
    assert_eq!(held_ingestions(&engine).await, 0);
    assert!(flight_records(dir.path()).is_empty(), "the run left no flight record");

    let resumed = ingest(dir.path(), &[]);
    assert_eq!(count(&resumed, "resumed"), left, "{resumed}");
    assert_eq!(
        count(&resumed, "changed"),
        0,
        "resumed files are not changed ones: {resumed}"
    );
    assert_eq!(count(&resumed, "new"), 0, "{resumed}");
    assert_eq!(count(&resumed, "unchanged") + left, 200, "{resumed}");
    assert!(resumed["interrupted"].is_null(), "{resumed}");
    let reasons = interruptions(&engine).await;
    assert!(
        reasons.iter().all(|reason| !reason.contains("lease expired")),
        "nothing waited for a lease: {reasons:?}"
    );
    drop(engine);
    verify(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_interrupts_running_tasks_at_once_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = start(dir.path());
    wait_for_work(&mut child, &dir.path().join("opledger.db"), 10).await;
    signal(&child, "TERM");
    signal(&child, "TERM");
    let (code, stdout, stderr) = finish(child);
    assert_eq!(code, Some(143), "{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap_or_else(|error| panic!("{error}: {stdout}"));
    assert_eq!(summary["interrupted"]["by"].as_str(), Some("SIGTERM"), "{summary}");
    assert!(summary["interrupted"]["tasks_interrupted"].is_u64(), "{summary}");
    let engine = engine(dir.path()).await;
    assert_eq!(held_claims(engine.store()).await, 0);
    assert_eq!(held_ingestions(&engine).await, 0);
    let reasons = interruptions(&engine).await;
    assert!(
        reasons
            .iter()
            .all(|reason| reason.contains("the ingest was stopped (SIGTERM)")),
        "{reasons:?}"
    );
    let resumed = ingest(dir.path(), &[]);
    assert_eq!(count(&resumed, "changed") + count(&resumed, "new"), 0, "{resumed}");
    assert_eq!(count(&resumed, "failed"), 0, "{resumed}");
    drop(engine);
    verify(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_the_next_ingest_releases_the_dead_runs_claims_without_waiting_for_their_leases() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = start(dir.path());
    let database = dir.path().join("opledger.db");
    wait_for_work(&mut child, &database, 30).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let engine = engine(dir.path()).await;
    let held = held_claims(engine.store()).await;
    assert!(held > 0, "the killed run held task claims");
    let records = flight_records(dir.path());
    assert_eq!(records.len(), 1, "the killed run left its flight record: {records:?}");
    let running = FlightRecord::read(&records[0]).unwrap();
    assert!(
        running.len() <= 1,
        "one image thread runs one claim at most: {running:?}"
    );
    let record_name = records[0].file_name().unwrap().to_str().unwrap().to_string();
    let dead_run = record_name
        .trim_start_matches('.')
        .trim_end_matches(".running")
        .to_string();

    let output = opledger(dir.path())
        .args(["--json", "ingest", "photos", "--workers", "2"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let resumed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(count(&resumed, "resumed") > 0, "{resumed}");
    assert_eq!(count(&resumed, "changed") + count(&resumed, "new"), 0, "{resumed}");
    let reasons = interruptions(&engine).await;
    let interrupted = reasons
        .iter()
        .filter(|reason| reason.contains("ended without releasing it, while it ran") && reason.contains(&dead_run))
        .count();
    let given_back = releases(&engine)
        .await
        .iter()
        .filter(|reason| reason.contains("ended without releasing it, before it started"))
        .count();
    assert_eq!(
        (interrupted, given_back),
        (running.len(), held - running.len()),
        "every claim of the dead run released at once, only the running one counted: {reasons:?}"
    );
    assert!(
        flight_records(dir.path()).is_empty(),
        "the dead run's record is read once and removed"
    );
    assert!(
        reasons.iter().all(|reason| !reason.contains("lease expired")),
        "nothing waited for a lease: {reasons:?}"
    );
    assert_eq!(held_claims(engine.store()).await, 0);
    drop(engine);
    verify(dir.path());
}
