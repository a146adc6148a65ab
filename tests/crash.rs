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
//! its own savepoint) is what gets killed most of the time.

mod common;

use common::{binary, run, runtime, temp_db};
use futures::TryStreamExt;
use opledger_domain::decide::OperationCommand;
use opledger_domain::events::{Event, MediaRegistered, MediaUpdated, OperationTarget};
use opledger_domain::{Cause, EventEnvelope, MediaId, NewEvent, OperationId, OperationStatus, StreamId};
use opledger_engine::{CommandContext, Engine, EngineError, NewOperation};
use opledger_store::{ExpectedVersion, Store, StreamAppend};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use uuid::Uuid;

const CHILD_ENV: &str = "OPLEDGER_CRASH_CHILD";
const CHILD_TEST: &str = "crash_child_appends_until_killed";
const ROUNDS: usize = 28;
/// Tasks appending media events with `Engine::append`, besides the one
/// running operation lifecycles.
const APPENDERS: usize = 4;

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

/// Writes one line per acknowledged event, `ack SEQ STREAM VERSION`, in one
/// write so lines of concurrent tasks never interleave.
fn report(envelopes: &[EventEnvelope]) {
    let mut lines = String::new();
    for envelope in envelopes {
        lines.push_str(&format!(
            "ack {} {} {}\n",
            envelope.seq, envelope.stream_id, envelope.stream_version
        ));
    }
    say(&lines);
}

/// Writes to the parent; if it is gone there is nobody to report to.
fn say(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_err() {
        std::process::exit(71);
    }
}

/// A command the child cannot recover from: say why and stop, so the parent
/// sees the child die before it was killed.
fn die(what: &str, error: EngineError) -> ! {
    eprintln!("crash child: {what} failed: {error}");
    std::process::exit(70);
}

async fn child(path: PathBuf) {
    let store = SqliteStore::open(SqliteConfig::at(&path))
        .await
        .unwrap_or_else(|error| die("opening the store", error.into()));
    let (engine, _) = Engine::open(store).await.unwrap_or_else(|error| die("startup", error));
    // libtest has printed `test NAME ... ` without a newline; start afresh.
    say("\nready\n");
    let mut tasks = Vec::new();
    for appender in 0..APPENDERS {
        tasks.push(tokio::spawn(append_media(engine.clone(), appender)));
    }
    tasks.push(tokio::spawn(run_lifecycles(engine)));
    for task in tasks {
        task.await.expect("child tasks loop until the process is killed");
    }
}

fn new_event(engine: &Engine<SqliteStore>, actor: &str, event: Event) -> NewEvent {
    NewEvent {
        event,
        recorded_at: engine.clock().now(),
        actor: actor.to_string(),
        correlation_id: Uuid::now_v7().to_string(),
        causation_id: None,
    }
}

/// Appends media registrations through the low-level `Engine::append`,
/// which returns the stored envelopes: one event, two events on one stream,
/// or two streams in one atomic append.
async fn append_media(engine: Engine<SqliteStore>, appender: usize) {
    let actor = format!("appender-{appender}");
    for round in 0u64.. {
        let registered = |media_id: MediaId| {
            Event::MediaRegistered(MediaRegistered {
                media_id,
                path: format!("/crash/{appender}/{round}/{media_id}.jpg"),
                media_kind: "image".into(),
                content_digest: None,
                byte_size: Some(round as i64),
            })
        };
        let first = MediaId(Uuid::now_v7());
        let mut appends = vec![StreamAppend {
            stream_id: StreamId::media(first),
            expected: ExpectedVersion::NoStream,
            events: vec![new_event(&engine, &actor, registered(first))],
        }];
        match round % 3 {
            1 => appends[0].events.push(new_event(
                &engine,
                &actor,
                Event::MediaUpdated(MediaUpdated {
                    media_id: first,
                    path: format!("/crash/{appender}/{round}/moved.jpg"),
                    content_digest: Some(format!("sha256:{round:064x}")),
                    byte_size: Some(round as i64 + 1),
                }),
            )),
            2 => {
                let second = MediaId(Uuid::now_v7());
                appends.push(StreamAppend {
                    stream_id: StreamId::media(second),
                    expected: ExpectedVersion::NoStream,
                    events: vec![new_event(&engine, &actor, registered(second))],
                });
            }
            _ => {}
        }
        match engine.append(appends).await {
            Ok(envelopes) => report(&envelopes),
            Err(error) => die("appending media", error),
        }
    }
}

/// The typed commands return ids or claim tokens, not envelopes; the stream
/// they wrote is this task's alone, so its last event is the one the
/// command appended.
async fn last_of(engine: &Engine<SqliteStore>, stream_id: &StreamId) -> EventEnvelope {
    let mut events = engine
        .store()
        .read_stream(stream_id)
        .await
        .unwrap_or_else(|error| die("reading back a stream", error.into()));
    events.pop().expect("the command just appended to this stream")
}

/// Runs operations through their lifecycle with the typed commands, three
/// paths in turn: straight success; a retryable failure, retry and success;
/// and interruption, requeue and a terminal failure.
async fn run_lifecycles(engine: Engine<SqliteStore>) {
    let context = CommandContext::actor("crash-worker");
    let command = |operation_id: OperationId, command: OperationCommand| {
        let engine = engine.clone();
        let context = context.clone();
        async move {
            match engine.operation_command(&context, operation_id, command).await {
                Ok(envelope) => report(&[envelope]),
                Err(error) => die("an operation command", error),
            }
        }
    };
    let claim = |operation_id: OperationId| {
        let engine = engine.clone();
        let context = context.clone();
        async move {
            let token = engine
                .claim_operation(&context, operation_id, "crash-worker", 60_000)
                .await
                .unwrap_or_else(|error| die("claiming", error));
            report(&[last_of(&engine, &StreamId::operation(operation_id)).await]);
            token
        }
    };
    for round in 0u64.. {
        let media_id = engine
            .register_media(
                &context,
                &format!("/crash/lifecycle/{round}.jpg"),
                "image",
                None,
                Some(1),
            )
            .await
            .unwrap_or_else(|error| die("registering media", error));
        report(&[last_of(&engine, &StreamId::media(media_id)).await]);
        let path = round % 3;
        let operation_id = engine
            .create_operation(
                &context,
                NewOperation {
                    kind: "export".into(),
                    target: OperationTarget {
                        media_id: Some(media_id),
                        region_id: None,
                        path: None,
                    },
                    revision: Some(format!("rev-{round}")),
                    inputs: serde_json::json!({"size": 256, "round": round}),
                    status: if path == 2 {
                        OperationStatus::Pending
                    } else {
                        OperationStatus::Queued
                    },
                    priority: (round % 5) as i32,
                },
            )
            .await
            .unwrap_or_else(|error| die("creating an operation", error));
        report(&[last_of(&engine, &StreamId::operation(operation_id)).await]);
        match path {
            0 => {
                let token = claim(operation_id).await;
                command(
                    operation_id,
                    OperationCommand::Start {
                        claim_token: token.clone(),
                    },
                )
                .await;
                command(
                    operation_id,
                    OperationCommand::Progress {
                        claim_token: token.clone(),
                        phase: "writing".into(),
                        processed: 1,
                        total: Some(2),
                    },
                )
                .await;
                command(
                    operation_id,
                    OperationCommand::Succeed {
                        claim_token: token,
                        output: serde_json::json!({"thumbnail": format!("{round}.webp")}),
                    },
                )
                .await;
            }
            1 => {
                let token = claim(operation_id).await;
                command(
                    operation_id,
                    OperationCommand::Fail {
                        claim_token: token,
                        error: "decoder hiccup".into(),
                        retryable: true,
                    },
                )
                .await;
                command(
                    operation_id,
                    OperationCommand::ScheduleRetry {
                        available_at: engine.clock().now(),
                        backoff_ms: 100,
                        jitter_ms: 7,
                    },
                )
                .await;
                let token = claim(operation_id).await;
                command(
                    operation_id,
                    OperationCommand::Succeed {
                        claim_token: token,
                        output: serde_json::json!({"thumbnail": format!("{round}.webp"), "attempt": 2}),
                    },
                )
                .await;
            }
            _ => {
                command(
                    operation_id,
                    OperationCommand::Transition {
                        cause: Cause::Enqueue,
                        reason: "inputs ready".into(),
                    },
                )
                .await;
                let token = claim(operation_id).await;
                command(operation_id, OperationCommand::Start { claim_token: token }).await;
                command(
                    operation_id,
                    OperationCommand::Interrupt {
                        reason: "lease expired".into(),
                    },
                )
                .await;
                command(
                    operation_id,
                    OperationCommand::Transition {
                        cause: Cause::Requeue,
                        reason: "recovery".into(),
                    },
                )
                .await;
                let token = claim(operation_id).await;
                command(
                    operation_id,
                    OperationCommand::Fail {
                        claim_token: token,
                        error: "corrupt file".into(),
                        retryable: false,
                    },
                )
                .await;
            }
        }
    }
}

// --------------------------------------------------------------- parent --

/// xorshift64*: enough randomness for kill times, reproducible from a seed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

/// What the child acknowledged: seq → (stream, stream version).
type Acks = BTreeMap<i64, (String, i64)>;

enum Report {
    Ready,
    Ack(i64, String, i64),
}

fn parse_line(line: &str) -> Option<Report> {
    if line == "ready" {
        return Some(Report::Ready);
    }
    let mut fields = line.strip_prefix("ack ")?.split(' ');
    let seq = fields.next()?.parse().ok()?;
    let stream = fields.next()?.to_string();
    let version = fields.next()?.parse().ok()?;
    Some(Report::Ack(seq, stream, version))
}

fn spawn_child(db: &Path) -> (Child, mpsc::Receiver<Report>, std::thread::JoinHandle<String>) {
    let mut child = Command::new(std::env::current_exe().expect("the test binary's path"))
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, db)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the child");
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                // A line cut short by the kill was never fully reported.
                Ok(_) if !line.ends_with('\n') => return,
                Ok(_) => {
                    if let Some(report) = parse_line(line.trim_end()) {
                        if sender.send(report).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    let mut stderr = child.stderr.take().expect("piped stderr");
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    (child, receiver, stderr)
}

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
    let seed = std::env::var("OPLEDGER_CRASH_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|since| since.as_nanos() as u64)
                .unwrap_or(1)
        })
        | 1;
    let mut random = XorShift(seed);
    let (_dir, db) = temp_db();
    let runtime = runtime();
    let started = Instant::now();
    let mut acks = Acks::new();
    let mut rounds_with_acks = 0;
    let mut head = 0;

    for round in 1..=ROUNDS {
        let context = format!("round {round} (OPLEDGER_CRASH_SEED={seed})");
        let (mut child, reports, stderr) = spawn_child(&db);
        let mut round_acks = 0usize;
        let mut record = |report: Report, acks: &mut Acks| {
            if let Report::Ack(seq, stream, version) = report {
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
