//! Power loss under the SQLite store. A child process appends in a loop
//! through the engine with every SQLite write going through the powerloss
//! VFS (`opledger_testkit::powerloss`): what SQLite has not synced lives
//! only in the child's memory, so a SIGKILL of the child drops exactly what
//! a power loss drops, and what was synced is on disk. The parent kills it
//! at random moments, 100 crash points over ten databases in turn, each
//! growing across its ten (each child continues where the last one's
//! surviving log ends), and after each kill
//! reopens the database on the plain unix VFS and checks
//!
//! - which acknowledged events are in the log, at the seq, stream and
//!   stream version they were acknowledged with, and which are lost;
//! - seq is exactly 1..=head, and each stream's versions are 1..=n;
//! - every projection is at the head, `PRAGMA integrity_check` is `ok`;
//! - replay equals the live projections and the hash chain holds (the
//!   engine's `verify`, what `opledger replay --verify` runs).
//!
//! With `synchronous=FULL` (the default) no acknowledged event may be lost.
//! With `synchronous=NORMAL` acknowledged events may be lost (the WAL is
//! synced only at checkpoints); the test measures how many per crash point
//! and prints it, and asserts only what SQLite promises there: what
//! survives is a prefix of what was acknowledged (no gaps), the database is
//! intact and replay agrees. docs/benchmarks.md ("Durability on power
//! loss") records the measured window.
//!
//! That the VFS really drops unsynced writes is proven on its own, in
//! `crates/testkit/src/powerloss_vfs_tests.rs`; here the NORMAL run losing
//! events at all is the check that the child's writes went through it.
//!
//! The child is this test binary run again with `OPLEDGER_POWERLOSS_CHILD`
//! set to the database path, selecting
//! [`power_loss_child_appends_through_the_powerloss_vfs_until_killed`],
//! which does nothing in a normal run; its workload is the crash test's
//! (`tests/it/crash_support/mod.rs`). `OPLEDGER_POWERLOSS_SEED` repeats a run's
//! kill times.

use crate::crash_support;

use crash_support::{append_until_killed, die, spawn_child, Report, XorShift};
use futures::TryStreamExt;
use opledger_domain::EventEnvelope;
use opledger_engine::Engine;
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore, Synchronous};
use opledger_testkit::powerloss;
use sqlx::Connection;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "OPLEDGER_POWERLOSS_CHILD";
const SYNCHRONOUS_ENV: &str = "OPLEDGER_POWERLOSS_SYNCHRONOUS";
const CHILD_TEST: &str = "power_loss::power_loss_child_appends_through_the_powerloss_vfs_until_killed";
const CRASH_POINTS: usize = 100;
/// The crash points are spread over this many databases in turn, each
/// growing across its share: the check after every kill replays the whole
/// log, so a log ten times longer costs ten times the checking, while a
/// power loss meets the same WAL and checkpoints either way.
const DATABASES: usize = 10;
/// Every this many crash points the child is killed at a random moment
/// after it starts, maybe while it opens the database; the others once it
/// appends.
const EARLY_KILL_EVERY: usize = 10;

// ---------------------------------------------------------------- child --

/// Not a test on its own: the body of the child process the tests below
/// start and kill. Without `OPLEDGER_POWERLOSS_CHILD` it returns at once.
#[test]
fn power_loss_child_appends_through_the_powerloss_vfs_until_killed() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    if let Err(error) = powerloss::install() {
        eprintln!("power loss child: {error}");
        std::process::exit(70);
    }
    if !powerloss::is_default() {
        eprintln!("power loss child: the powerloss VFS is not SQLite's default");
        std::process::exit(70);
    }
    let mut config = SqliteConfig::at(PathBuf::from(path));
    config.synchronous = match std::env::var(SYNCHRONOUS_ENV).as_deref() {
        Ok("normal") => Synchronous::Normal,
        _ => Synchronous::Full,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        // Every connection the store opens (sqlx's migrations and read
        // pool, the rusqlite writer) takes the default VFS.
        let store = SqliteStore::open(config)
            .await
            .unwrap_or_else(|error| die("opening the store", error.into()));
        let (engine, _) = Engine::open(store).await.unwrap_or_else(|error| die("startup", error));
        append_until_killed(engine).await;
    });
}

// --------------------------------------------------------------- parent --

/// One acknowledged event: its seq, stream and stream version.
type Ack = (i64, String, i64);

/// What the database holds after a kill, read on the plain unix VFS.
struct Found {
    /// `(seq, stream, stream version)` in seq order.
    log: Vec<Ack>,
    head: i64,
    projections_behind: Vec<String>,
    integrity: String,
    /// Replay equals live and the chain holds, or what differs.
    verified: Result<(), String>,
}

async fn inspect(db: &Path) -> Result<Found, String> {
    let store = SqliteStore::open(SqliteConfig::at(db))
        .await
        .map_err(|error| format!("the database does not open: {error}"))?;
    let head = store
        .head()
        .await
        .map_err(|error| format!("reading the head: {error}"))?;
    let events: Vec<EventEnvelope> = store
        .read_all(0, 1000)
        .try_collect()
        .await
        .map_err(|error| format!("the log does not read back: {error}"))?;
    let log = events
        .iter()
        .map(|event| (event.seq, event.stream_id.as_str().to_string(), event.stream_version))
        .collect();
    // Opening the store runs no catch-up: projections folded in the
    // append's transaction are at the head or the crash lost them too.
    let projections_behind = store
        .projection_states()
        .await
        .map_err(|error| format!("reading projection states: {error}"))?
        .into_iter()
        .filter(|state| state.position != head)
        .map(|state| format!("{} at {}", state.name, state.position))
        .collect();
    let mut connection = store
        .raw_connection()
        .await
        .map_err(|error| format!("opening a connection: {error}"))?;
    let integrity = sqlx::query_scalar::<_, String>("PRAGMA integrity_check")
        .fetch_all(&mut connection)
        .await
        .map_err(|error| format!("PRAGMA integrity_check: {error}"))?
        .join("; ");
    let _ = connection.close().await;
    let (engine, _) = Engine::open(store)
        .await
        .map_err(|error| format!("the engine does not start: {error}"))?;
    let report = engine.verify().await.map_err(|error| format!("verify: {error}"))?;
    let verified = if report.is_identical() {
        Ok(())
    } else {
        Err(report.render())
    };
    Ok(Found {
        log,
        head,
        projections_behind,
        integrity,
        verified,
    })
}

/// Waits until this process holds none of the database's files open. The
/// next child must be the first to open the database, so that SQLite
/// rebuilds the wal-index from the WAL on disk after its kill: a
/// connection of the parent's still open would keep the killed child's
/// wal-index alive, pointing at frames the kill dropped (see
/// `opledger_testkit::powerloss`). The store's writer thread and pooled
/// connections close their files shortly after the last handle is dropped.
fn wait_until_closed(db: &Path) {
    let names: Vec<PathBuf> = ["", "-wal", "-shm", "-journal"]
        .iter()
        .map(|suffix| {
            let mut name = db.as_os_str().to_os_string();
            name.push(suffix);
            PathBuf::from(name)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open: Vec<PathBuf> = std::fs::read_dir("/proc/self/fd")
            .expect("list this process's open files")
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| names.contains(target))
            .collect();
        if open.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the parent still holds {open:?} open 10 s after its check"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What the crash points of one `synchronous` level found.
#[derive(Default)]
struct Tally {
    points: usize,
    acknowledged: usize,
    lost: usize,
    /// Acknowledged events lost at each crash point.
    lost_per_point: Vec<usize>,
    /// The longest time between a lost event's acknowledgement and the kill.
    oldest_lost: Duration,
    gaps: usize,
    integrity_ok: usize,
    verified: usize,
    /// The longest log a check read.
    longest: i64,
    /// Every broken promise, with its crash point; empty when all held.
    problems: Vec<String>,
}

impl Tally {
    fn summary(&self, level: &str, seed: u64, elapsed: Duration) -> String {
        let max = self.lost_per_point.iter().copied().max().unwrap_or(0);
        let mean = self.lost as f64 / self.points.max(1) as f64;
        let with_loss = self.lost_per_point.iter().filter(|lost| **lost > 0).count();
        format!(
            "power loss, synchronous={level}: {} crash points, {} acknowledged, {} lost \
             (at most {max} at one crash point, {mean:.1} on average, at {with_loss} of the points; \
             the oldest lost was acknowledged {} ms before the kill), {} seq gaps, \
             integrity ok at {}/{}, replay == live at {}/{}; {DATABASES} databases, logs up to {} events, {:.1} s \
             (OPLEDGER_POWERLOSS_SEED={seed})",
            self.points,
            self.acknowledged,
            self.lost,
            self.oldest_lost.as_millis(),
            self.gaps,
            self.integrity_ok,
            self.points,
            self.verified,
            self.points,
            self.longest,
            elapsed.as_secs_f64()
        )
    }
}

/// Runs the crash points of one `synchronous` level on fresh databases;
/// each child is killed up to `longest_ms` after it is ready.
fn crash_points(level: &str, longest_ms: u64) -> (Tally, String) {
    assert!(
        !powerloss::is_default(),
        "the parent reads the disk on the plain VFS; only its children use powerloss"
    );
    let (mut random, seed) = XorShift::seeded("OPLEDGER_POWERLOSS_SEED");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let mut db = PathBuf::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let started = Instant::now();
    // The events acknowledged at earlier crash points that survived them
    // (the parent's own opening made them durable for good): seq → ack.
    let mut kept: BTreeMap<i64, Ack> = BTreeMap::new();
    let mut tally = Tally::default();

    for point in 1..=CRASH_POINTS {
        if (point - 1) % (CRASH_POINTS / DATABASES) == 0 {
            db = dir.path().join(format!("ledger-{point}.db"));
            kept.clear();
        }
        let context = format!("synchronous={level}, crash point {point} (OPLEDGER_POWERLOSS_SEED={seed})");
        let env: [(&str, &OsStr); 2] = [(CHILD_ENV, db.as_os_str()), (SYNCHRONOUS_ENV, OsStr::new(level))];
        let spawned = Instant::now();
        let (mut child, reports, stderr) = spawn_child(CHILD_TEST, &env);
        let mut acks: Vec<(Ack, Instant)> = Vec::new();
        let record = |report: Report, acks: &mut Vec<(Ack, Instant)>| {
            if let Report::Ack {
                seq,
                stream,
                version,
                at,
            } = report
            {
                acks.push(((seq, stream, version), at));
            }
        };
        let delay = if point % EARLY_KILL_EVERY == 0 {
            Duration::from_millis(random.between(0, 80))
        } else {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match reports.recv_timeout(Duration::from_millis(20)) {
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
            Duration::from_millis(random.between(10, longest_ms))
        };
        std::thread::sleep(delay);
        if let Some(status) = child.try_wait().expect("poll the child") {
            panic!(
                "{context}: the child stopped by itself ({status}) before the kill:\n{}",
                stderr.join().unwrap_or_default()
            );
        }
        let killed_at = Instant::now();
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

        let lived = killed_at.duration_since(spawned);
        let checking = Instant::now();
        let found = runtime
            .block_on(inspect(&db))
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        wait_until_closed(&db);
        let checked = checking.elapsed();
        tally.points += 1;
        tally.acknowledged += acks.len();
        tally.longest = tally.longest.max(found.head);

        let gaps = found
            .log
            .iter()
            .enumerate()
            .filter(|(index, (seq, _, _))| *seq != *index as i64 + 1)
            .count();
        if gaps > 0 || found.log.len() as i64 != found.head {
            tally.gaps += gaps.max(1);
            tally.problems.push(format!(
                "{context}: seq is not 1..={} ({gaps} out of place)",
                found.head
            ));
        }
        let mut versions: BTreeMap<&str, i64> = BTreeMap::new();
        for (seq, stream, version) in &found.log {
            let next = versions.entry(stream.as_str()).or_insert(0);
            *next += 1;
            if *version != *next {
                tally.problems.push(format!(
                    "{context}: stream {stream} jumps to version {version} at seq {seq}"
                ));
            }
        }
        if !found.projections_behind.is_empty() {
            tally.problems.push(format!(
                "{context}: projections not at the head {}: {:?}",
                found.head, found.projections_behind
            ));
        }
        if found.integrity == "ok" {
            tally.integrity_ok += 1;
        } else {
            tally
                .problems
                .push(format!("{context}: PRAGMA integrity_check: {}", found.integrity));
        }
        match &found.verified {
            Ok(()) => tally.verified += 1,
            Err(differences) => tally
                .problems
                .push(format!("{context}: replay differs from live:\n{differences}")),
        }

        let at = |seq: i64| found.log.get(usize::try_from(seq - 1).ok()?);
        for (seq, ack) in &kept {
            if at(*seq) != Some(ack) {
                tally.problems.push(format!(
                    "{context}: seq {seq}, acknowledged as {} v{} and found after an earlier crash point, is now {:?}",
                    ack.1,
                    ack.2,
                    at(*seq)
                ));
            }
        }
        let mut lost = 0;
        for ((seq, stream, version), acknowledged_at) in acks {
            if seq > found.head {
                // Lost: the seq is free again for the next child.
                lost += 1;
                tally.oldest_lost = tally.oldest_lost.max(killed_at.duration_since(acknowledged_at));
                continue;
            }
            let ack = (seq, stream, version);
            if at(seq) != Some(&ack) {
                tally.problems.push(format!(
                    "{context}: seq {seq} was acknowledged as {} v{} but the log holds {:?} (what survives is not a prefix of what was acknowledged)",
                    ack.1,
                    ack.2,
                    at(seq)
                ));
            }
            kept.insert(seq, ack);
        }
        tally.lost += lost;
        tally.lost_per_point.push(lost);
        eprintln!(
            "{context}: killed {} ms after it started ({} ms after ready or start), {lost} acknowledged events lost, \
             log at seq {}, checked in {} ms",
            lived.as_millis(),
            delay.as_millis(),
            found.head,
            checked.as_millis()
        );
    }
    let summary = tally.summary(level, seed, started.elapsed());
    (tally, summary)
}

/// Fails with the first few broken promises, if any.
fn assert_no_problems(tally: &Tally, summary: &str) {
    assert!(
        tally.problems.is_empty(),
        "{summary}\n{} problems, the first:\n{}",
        tally.problems.len(),
        tally.problems.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn with_synchronous_full_no_acknowledged_event_is_lost_to_a_power_loss() {
    let (tally, summary) = crash_points("full", 150);
    eprintln!("{summary}");
    assert_no_problems(&tally, &summary);
    assert_eq!(tally.lost, 0, "{summary}");
    assert!(
        tally.lost_per_point.len() == CRASH_POINTS && tally.acknowledged > CRASH_POINTS,
        "the kills did not land while the child appended: {summary}"
    );
}

#[test]
fn with_synchronous_normal_a_power_loss_loses_only_a_suffix_of_acknowledged_events_and_the_ledger_stays_intact() {
    // Children live longer than at FULL: a child killed before a whole
    // checkpoint cycle has passed could lose no more than it wrote, and
    // the measured window would be the child's life, not SQLite's.
    let (tally, summary) = crash_points("normal", 300);
    eprintln!("{summary}");
    assert_no_problems(&tally, &summary);
    // Not a promise of the product's but of the test's: at NORMAL the WAL
    // is synced only at checkpoints, so a hundred power losses drop
    // acknowledged events unless the child's writes bypassed the VFS.
    assert!(
        tally.lost > 0,
        "no acknowledged event was lost at NORMAL: did the child write through the powerloss VFS? {summary}"
    );
}
