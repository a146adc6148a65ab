//! Crash safety of the SQLite event log: a child process appends in
//! a loop through the engine, reporting every acknowledged event; the parent
//! kills it with SIGKILL at random moments, many rounds on the same growing
//! database, and after each kill checks that
//!
//! - every acknowledged event is in the log, at the seq, stream and stream
//!   version it was acknowledged with;
//! - seq is exactly 1..=head, and each stream's versions are 1..=n;
//! - every projection is at the head without any catch-up (they are folded
//!   in the append's transaction, so a crash cannot leave them behind);
//! - `opledger replay --verify` exits 0.
//!
//! The child is this test binary run again with `OPLEDGER_CRASH_CHILD` set
//! to the database path, selecting [`crash_child_appends_until_killed`],
//! which does nothing in a normal run. Five tasks write concurrently in the
//! child, so the group-commit path (several commands per transaction, each in
//! its own savepoint) is what gets killed most of the time (the workload and
//! the child's plumbing: `tests/it/crash_support/mod.rs`, shared with
//! `tests/it/power_loss.rs`).

use crate::common;
use crate::crash_support;

use common::{binary, run, runtime, temp_db};
use crash_support::{append_until_killed, die, spawn_child, Report, XorShift};
use futures::TryStreamExt;
use opledger_domain::EventEnvelope;
use opledger_engine::Engine;
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "OPLEDGER_CRASH_CHILD";
const CHILD_TEST: &str = "crash::crash_child_appends_until_killed";
const ROUNDS: usize = 28;

// ---------------------------------------------------------------- child --

/// Not a test on its own: the body of the child process that
/// [`acknowledged_events_survive_sigkill_and_the_log_stays_gap_free`] starts
/// and kills. Without `OPLEDGER_CRASH_CHILD` it returns at once.
#[test]
fn crash_child_appends_until_killed() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(child(PathBuf::from(path)));
}

async fn child(path: PathBuf) {
    let store = SqliteStore::open(SqliteConfig::at(&path))
        .await
        .unwrap_or_else(|error| die("opening the store", error.into()));
    let (engine, _) = Engine::open(store).await.unwrap_or_else(|error| die("startup", error));
    append_until_killed(engine).await;
}

// --------------------------------------------------------------- parent --

/// What the child acknowledged: seq → (stream, stream version).
type Acks = BTreeMap<i64, (String, i64)>;

/// Checks the database after a kill; returns the head.
async fn check_after_crash(db: &Path, acks: &Acks, context: &str) -> i64 {
    let store = SqliteStore::open(SqliteConfig::at(db))
        .await
        .unwrap_or_else(|error| panic!("{context}: the database does not open after a kill: {error}"));
    let head = store.head().await.expect("read the head");
    let events: Vec<EventEnvelope> = store
        .read_all(0, 1000)
        .try_collect()
        .await
        .unwrap_or_else(|error| panic!("{context}: the log does not read back: {error}"));

    for (index, event) in events.iter().enumerate() {
        assert_eq!(
            event.seq,
            index as i64 + 1,
            "{context}: seq is not gap-free: position {index} holds seq {}",
            event.seq
        );
    }
    assert_eq!(
        events.len() as i64,
        head,
        "{context}: head {head} but {} events read",
        events.len()
    );

    let mut versions: BTreeMap<&str, i64> = BTreeMap::new();
    for event in &events {
        let version = versions.entry(event.stream_id.as_str()).or_insert(0);
        *version += 1;
        assert_eq!(
            event.stream_version, *version,
            "{context}: stream {} jumps to version {} at seq {}",
            event.stream_id, event.stream_version, event.seq
        );
    }

    for (seq, (stream, version)) in acks {
        let Some(event) = events.get((*seq - 1) as usize) else {
            panic!("{context}: acknowledged seq {seq} ({stream} v{version}) is missing; the log ends at {head}");
        };
        assert_eq!(
            (event.stream_id.as_str(), event.stream_version),
            (stream.as_str(), *version),
            "{context}: seq {seq} was acknowledged as {stream} v{version} but the log holds another event there"
        );
    }

    // Opening the store runs no catch-up; the projections must already be at
    // the head because they are folded in the same transaction.
    for state in store.projection_states().await.expect("projection states") {
        assert_eq!(
            state.position, head,
            "{context}: projection {} is at seq {} after the kill, the log at {head}",
            state.name, state.position
        );
    }
    head
}

fn replay_verify(db: &Path, context: &str) {
    let output = run(binary().args(["replay", "--verify", "--database-url"]).arg(db));
    assert_eq!(
        output.status.code(),
        Some(0),
        "{context}: replay --verify failed after a kill\n--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn acknowledged_events_survive_sigkill_and_the_log_stays_gap_free() {
    let (mut random, seed) = XorShift::seeded("OPLEDGER_CRASH_SEED");
    let (_dir, db) = temp_db();
    let runtime = runtime();
    let started = Instant::now();
    let mut acks = Acks::new();
    let mut rounds_with_acks = 0;
    let mut head = 0;

    for round in 1..=ROUNDS {
        let context = format!("round {round} (OPLEDGER_CRASH_SEED={seed})");
        let (mut child, reports, stderr) = spawn_child(CHILD_TEST, &[(CHILD_ENV, db.as_os_str())]);
        let mut round_acks = 0usize;
        let mut record = |report: Report, acks: &mut Acks| {
            if let Report::Ack {
                seq, stream, version, ..
            } = report
            {
                if let Some(earlier) = acks.insert(seq, (stream.clone(), version)) {
                    panic!("{context}: seq {seq} acknowledged twice: {earlier:?} and ({stream}, {version})");
                }
                round_acks += 1;
            }
        };
        // Every fourth round is killed early, maybe while it opens the
        // database or starts up; the others once appending is under way.
        let delay = if round % 4 == 0 {
            Duration::from_millis(random.between(0, 60))
        } else {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match reports.recv_timeout(Duration::from_millis(50)) {
                    Ok(Report::Ready) => break,
                    Ok(report) => record(report, &mut acks),
                    Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                    Err(_) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!(
                            "{context}: the child never became ready:\n{}",
                            stderr.join().unwrap_or_default()
                        );
                    }
                }
            }
            Duration::from_millis(random.between(50, 400))
        };
        std::thread::sleep(delay);
        if let Some(status) = child.try_wait().expect("poll the child") {
            panic!(
                "{context}: the child stopped by itself ({status}) before the kill:\n{}",
                stderr.join().unwrap_or_default()
            );
        }
        child.kill().expect("SIGKILL the child");
        let status = child.wait().expect("reap the child");
        // The reader thread ends at EOF; the channel then yields every line.
        for report in reports.iter() {
            record(report, &mut acks);
        }
        let stderr = stderr.join().unwrap_or_default();
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                status.signal(),
                Some(9),
                "{context}: the child ended by itself ({status}), not by the SIGKILL:\n{stderr}"
            );
        }
        if round_acks > 0 {
            rounds_with_acks += 1;
        }

        head = runtime.block_on(check_after_crash(&db, &acks, &context));
        replay_verify(&db, &context);
        eprintln!(
            "{context}: killed after {} ms, {round_acks} events acknowledged, log at seq {head}",
            delay.as_millis()
        );
    }

    let late_rounds = ROUNDS - ROUNDS / 4;
    assert!(
        rounds_with_acks >= late_rounds / 2,
        "only {rounds_with_acks} of {ROUNDS} rounds acknowledged anything; the kills did not land during appends"
    );
    assert!(head >= acks.len() as i64);
    eprintln!(
        "{ROUNDS} rounds, {} acknowledged events, log at seq {head}, {:.1} s (seed {seed})",
        acks.len(),
        started.elapsed().as_secs_f64()
    );
}
