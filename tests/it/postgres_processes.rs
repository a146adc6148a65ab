//! Many OS processes on one PostgreSQL database, each on a fresh
//! database of the server `OPLEDGER_TEST_POSTGRES_URL` names (a loud skip
//! without one, a failure under `CI=true`):
//!
//! - **Drain**: 4 processes × 4 workers each drain 2,000 tasks (10,000
//!   with `OPLEDGER_SOAK=1`); counted
//!   from the log, every task is claimed and completed exactly once, claims
//!   never overlap, and `opledger replay --verify` passes afterwards.
//! - **Crash**: a process that holds claims (its tasks never finish) while
//!   it appends batches of events is SIGKILLed mid-batch, round after round;
//!   every acknowledged event is in the log where it was acknowledged, no
//!   batch is half there, seq stays gap-free, the projections are at the
//!   head, recovery interrupts exactly the dead process's claims, `replay
//!   --verify` passes, and a final drain completes every task exactly once.
//!
//! **The worker processes** are this test binary run again with
//! `OPLEDGER_PG_CHILD` set (the pattern of `tests/it/crash.rs`), selecting
//! [`postgres_process_child`], which returns at once in a normal run. A
//! child opens its own `PostgresStore` on the URL it is given and runs the
//! real `opledger-worker` `WorkerPool` (4 workers, claims, heartbeats and
//! fenced completions through the engine) with a task that does no work:
//! what is under test is the protocol across processes, not a task. It
//! speaks to the parent in lines on stdout.

use futures::TryStreamExt;
use opledger_domain::events::{Event, MediaRegistered};
use opledger_domain::{EventEnvelope, MediaId, NewEvent, OperationId, StreamId, Timestamp};
use opledger_engine::{Clock, CommandContext, Engine, FixedClock, SystemClock, TaskRequest, TaskTarget, UuidV7Ids};
use opledger_store::{ExpectedVersion, Store, StreamAppend};
use opledger_store_postgres::{PostgresConfig, PostgresStore};
use opledger_testkit::{Backend, Harness, PostgresBackend};
use opledger_worker::{Job, Outcome, Task, TaskError, WorkerPool};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use uuid::Uuid;

const CHILD_ENV: &str = "OPLEDGER_PG_CHILD";
const CHILD_URL_ENV: &str = "OPLEDGER_PG_CHILD_URL";
const CHILD_TEST: &str = "postgres_processes::postgres_process_child";
const KINDS: [&str; 2] = ["metadata", "thumbnail"];

fn inputs_for(kind: &str) -> serde_json::Value {
    match kind {
        "metadata" => json!({}),
        "thumbnail" => json!({"max_side": 256, "format": "png"}),
        other => panic!("no inputs for {other}"),
    }
}

// ---------------------------------------------------------------- child --

/// Not a test on its own: the body of the worker processes the tests below
/// start. Without `OPLEDGER_PG_CHILD` it returns at once.
#[test]
fn postgres_process_child() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    let url = std::env::var(CHILD_URL_ENV).expect("the child is given a database URL");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        let config = PostgresConfig::from_url(&url).expect("a postgres URL");
        let store = PostgresStore::open(config).await.expect("open the store");
        let (engine, _) = Engine::open(store).await.expect("startup");
        // libtest has printed `test NAME ... ` without a newline; start afresh.
        say("\nready\n");
        match role.split_once(':') {
            Some(("drain", name)) => drain_child(engine, name).await,
            Some(("crash", name)) => crash_child(engine, name).await,
            _ => panic!("unknown child role {role}"),
        }
    });
}

/// Writes to the parent in one write, so lines of concurrent tasks never
/// interleave; if the parent is gone there is nobody to report to.
fn say(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_err() {
        std::process::exit(71);
    }
}

/// Completes whatever it is given at once.
struct NoOp(&'static str);

impl Task for NoOp {
    fn kind(&self) -> &'static str {
        self.0
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        Ok(Outcome::output(json!({"by": job.actor()})))
    }
}

/// Says which claim it holds, then never finishes (its pool keeps the
/// lease alive with heartbeats until the process dies).
struct Hold(&'static str);

impl Task for Hold {
    fn kind(&self) -> &'static str {
        self.0
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        say(&format!("held {} {}\n", job.operation_id(), job.claim().claim_token));
        std::future::pending::<()>().await;
        unreachable!("a held task never finishes")
    }
}

async fn drain_child(engine: Engine<PostgresStore>, name: &str) {
    let mut builder = WorkerPool::builder(engine, name).workers(4);
    for kind in KINDS {
        builder = builder.task(NoOp(kind));
    }
    let pool = builder.build().expect("a worker pool");
    let report = pool.run_until_idle().await.expect("the pool runs");
    say(&format!(
        "report {} {} {} {} {}\n",
        report.claimed, report.completed, report.failed, report.lost, report.unreported
    ));
}

async fn crash_child(engine: Engine<PostgresStore>, name: &str) {
    let mut builder = WorkerPool::builder(engine.clone(), name)
        .workers(4)
        .lease(Duration::from_secs(30));
    for kind in KINDS {
        builder = builder.task(Hold(kind));
    }
    let pool = builder.build().expect("a worker pool");
    let holder = tokio::spawn(async move { pool.run_until(std::future::pending()).await });
    let appender = tokio::spawn(append_batches(engine, name.to_string()));
    let _ = holder.await;
    let _ = appender.await;
}

/// Appends batches of media registrations, each batch one atomic append of
/// `BATCH` streams, and reports every acknowledged event. Says `appending`
/// before each batch, so the parent can kill it while one is in flight.
async fn append_batches(engine: Engine<PostgresStore>, name: String) {
    for batch in 0u64.. {
        let correlation = format!("{name}-batch-{batch}");
        let appends: Vec<StreamAppend> = (0..BATCH)
            .map(|item| {
                let media_id = MediaId(Uuid::now_v7());
                StreamAppend {
                    stream_id: StreamId::media(media_id),
                    expected: ExpectedVersion::NoStream,
                    events: vec![NewEvent {
                        event: Event::MediaRegistered(MediaRegistered {
                            media_id,
                            path: format!("/crash/{name}/{batch}/{item}.jpg"),
                            media_kind: "image".into(),
                            content_digest: None,
                            byte_size: Some(item as i64),
                        }),
                        recorded_at: engine.clock().now(),
                        actor: name.clone(),
                        correlation_id: correlation.clone(),
                        causation_id: None,
                    }],
                }
            })
            .collect();
        say("appending\n");
        let envelopes = engine.append(appends).await.unwrap_or_else(|error| {
            eprintln!("crash child: append failed: {error}");
            std::process::exit(70)
        });
        let mut lines = String::new();
        for envelope in &envelopes {
            lines.push_str(&format!(
                "ack {} {} {}\n",
                envelope.seq, envelope.stream_id, envelope.stream_version
            ));
        }
        say(&lines);
    }
}

/// Streams per appended batch.
const BATCH: usize = 20;

// --------------------------------------------------------------- parent --

/// A child process and the lines it says, read on a thread of their own.
struct Spawned {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

fn spawn_child(role: &str, url: &str) -> Spawned {
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env(CHILD_URL_ENV, url)
        .env_remove("OPLEDGER_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a child process");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    Spawned { child, lines, stderr }
}

fn replay_verify(url: &str, context: &str) {
    let output = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["replay", "--verify", "--database-url", url])
        .env_remove("OPLEDGER_DATABASE_URL")
        .output()
        .expect("run opledger replay --verify");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{context}: replay --verify failed\n--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Registers `media` items and requests both kinds on each: `2 × media`
/// queued tasks. Returns the operations.
async fn queue_tasks(engine: &Engine<PostgresStore>, media: usize) -> BTreeSet<OperationId> {
    let context = CommandContext::actor("setup");
    engine
        .declare(&context, opledger_domain::kinds::legacy::declarations())
        .await
        .expect("declare the kinds");
    let mut operations = BTreeSet::new();
    let mut requests = Vec::new();
    for index in 0..media {
        let media_id = engine
            .register_media(
                &context,
                &format!("/queue/{index}.png"),
                "image",
                Some(format!("sha256:{index:064x}")),
                Some(1),
            )
            .await
            .expect("register media");
        for kind in KINDS {
            requests.push(TaskRequest {
                target: TaskTarget::Media(media_id),
                kind: kind.to_string(),
                inputs: inputs_for(kind),
                priority: 0,
            });
        }
    }
    for batch in requests.chunks(500) {
        for outcome in engine
            .request_tasks(&context, batch.to_vec())
            .await
            .expect("request tasks")
        {
            let outcome = outcome.expect("a valid request");
            assert!(outcome.created);
            operations.insert(outcome.operation_id);
        }
    }
    assert_eq!(operations.len(), media * KINDS.len());
    operations
}

async fn whole_log(store: &PostgresStore) -> Vec<EventEnvelope> {
    store.read_all(0, 5_000).try_collect().await.expect("read the log")
}

/// Per operation, from the log: claims never overlap, and each success or
/// interruption ends the claim that was open. Returns (successes per
/// operation, claims still open).
fn claims_from_log(events: &[EventEnvelope]) -> (BTreeMap<OperationId, usize>, BTreeMap<OperationId, String>) {
    let mut open: BTreeMap<OperationId, String> = BTreeMap::new();
    let mut succeeded: BTreeMap<OperationId, usize> = BTreeMap::new();
    for envelope in events {
        match &envelope.event {
            Event::OperationClaimed(claimed) => {
                let previous = open.insert(claimed.operation_id, claimed.claim_token.clone());
                assert!(
                    previous.is_none(),
                    "two claims of {} overlap (seq {})",
                    claimed.operation_id,
                    envelope.seq
                );
            }
            Event::OperationSucceeded(done) => {
                let holder = open
                    .remove(&done.operation_id)
                    .unwrap_or_else(|| panic!("a success without a claim at seq {}", envelope.seq));
                assert_eq!(done.claim_token.as_deref(), Some(holder.as_str()));
                *succeeded.entry(done.operation_id).or_default() += 1;
            }
            Event::OperationInterrupted(interrupted) => {
                assert!(
                    open.remove(&interrupted.operation_id).is_some(),
                    "an interruption without a claim at seq {}",
                    envelope.seq
                );
            }
            Event::OperationFailed(_)
            | Event::OperationSuperseded(_)
            | Event::OperationCancelled(_)
            | Event::OperationFoundNothing(_) => {
                panic!("unexpected {} at seq {}", envelope.event_type(), envelope.seq)
            }
            _ => {}
        }
    }
    (succeeded, open)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

#[test]
fn four_processes_with_four_workers_each_drain_thousands_of_tasks_exactly_once() {
    const PROCESSES: usize = 4;
    let media_count = opledger_testkit::load_size(1_000, 5_000);
    let runtime = runtime();
    let Some(backend): Option<PostgresBackend> = runtime.block_on(opledger_testkit::postgres::backend()) else {
        return;
    };
    let url = backend.url();
    let operations = runtime.block_on(async {
        let (engine, _) = Engine::open(backend.open().await).await.expect("startup");
        queue_tasks(&engine, media_count).await
    });

    let children: Vec<Spawned> = (0..PROCESSES)
        .map(|index| spawn_child(&format!("drain:process-{index}"), &url))
        .collect();
    let mut reported = Vec::new();
    for (index, mut spawned) in children.into_iter().enumerate() {
        let status = spawned.child.wait().expect("reap a worker process");
        // Every line, up to the end of the child's stdout.
        let lines: Vec<String> = spawned.lines.iter().collect();
        let stderr = spawned.stderr.join().unwrap_or_default();
        assert!(status.success(), "process {index} failed ({status}):\n{stderr}");
        let report = lines
            .iter()
            .find_map(|line| line.strip_prefix("report "))
            .unwrap_or_else(|| panic!("process {index} reported nothing: {lines:?}\n{stderr}"));
        let numbers: Vec<u64> = report.split(' ').map(|n| n.parse().unwrap()).collect();
        let [claimed, completed, failed, lost, unreported] = numbers[..] else {
            panic!("process {index}: a malformed report {report}");
        };
        assert_eq!(
            (failed, lost, unreported),
            (0, 0, 0),
            "process {index}: every claim it took it completed: {report}"
        );
        assert_eq!(claimed, completed, "process {index}: {report}");
        reported.push(completed);
    }
    assert_eq!(
        reported.iter().sum::<u64>(),
        operations.len() as u64,
        "completions by process: {reported:?}"
    );

    runtime.block_on(async {
        let store = backend.open().await;
        let events = whole_log(&store).await;
        let (succeeded, open) = claims_from_log(&events);
        assert!(open.is_empty(), "claims left open: {open:?}");
        assert_eq!(
            succeeded.keys().copied().collect::<BTreeSet<_>>(),
            operations,
            "every task succeeded"
        );
        assert!(
            succeeded.values().all(|count| *count == 1),
            "every task completed exactly once"
        );
        let claims = events
            .iter()
            .filter(|event| matches!(event.event, Event::OperationClaimed(_)))
            .count();
        assert_eq!(claims, operations.len(), "every task claimed exactly once");
    });
    replay_verify(&url, "after the drain");
    eprintln!("completions by process: {reported:?}");
}

#[test]
fn a_killed_worker_and_appender_lose_nothing_acknowledged_and_recovery_and_replay_hold() {
    const ROUNDS: usize = 3;
    const MEDIA: usize = 100;
    let runtime = runtime();
    let Some(backend): Option<PostgresBackend> = runtime.block_on(opledger_testkit::postgres::backend()) else {
        return;
    };
    let url = backend.url();
    let operations = runtime.block_on(async {
        let (engine, _) = Engine::open(backend.open().await).await.expect("startup");
        queue_tasks(&engine, MEDIA).await
    });
    let mut acks: BTreeMap<i64, (String, i64)> = BTreeMap::new();
    let mut interrupted_total = 0u64;

    for round in 1..=ROUNDS {
        let context = format!("round {round}");
        let mut spawned = spawn_child(&format!("crash:crasher-{round}"), &url);
        // Kill once the process holds all four claims, has had batches
        // acknowledged, and has just started another batch.
        let mut held: BTreeMap<OperationId, String> = BTreeMap::new();
        let acks_before = acks.len();
        let mut ready = false;
        let record = |line: &str, held: &mut BTreeMap<OperationId, String>, acks: &mut BTreeMap<i64, (String, i64)>| {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts[..] {
                ["held", operation, token] => {
                    let operation = OperationId(operation.parse().expect("an operation id"));
                    held.insert(operation, token.to_string());
                }
                ["ack", seq, stream, version] => {
                    let seq: i64 = seq.parse().unwrap();
                    let earlier = acks.insert(seq, (stream.to_string(), version.parse().unwrap()));
                    assert!(earlier.is_none(), "{context}: seq {seq} acknowledged twice");
                }
                _ => {}
            }
        };
        loop {
            let Ok(line) = spawned.lines.recv() else {
                let status = spawned.child.wait().expect("reap the child");
                panic!(
                    "{context}: the child stopped by itself ({status}):\n{}",
                    spawned.stderr.join().unwrap_or_default()
                );
            };
            ready |= line == "ready";
            if line == "appending" && held.len() == 4 && acks.len() - acks_before >= 3 * BATCH {
                break;
            }
            record(&line, &mut held, &mut acks);
        }
        assert!(ready);
        spawned.child.kill().expect("SIGKILL the child");
        let status = spawned.child.wait().expect("reap the child");
        for line in spawned.lines.iter() {
            record(&line, &mut held, &mut acks);
        }
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                status.signal(),
                Some(9),
                "{context}: the child ended by itself ({status})"
            );
        }

        runtime.block_on(async {
            let store = backend.open().await;
            let head = store.head().await.unwrap();
            let events = whole_log(&store).await;
            for (index, event) in events.iter().enumerate() {
                assert_eq!(event.seq, index as i64 + 1, "{context}: seq is not gap-free");
            }
            assert_eq!(events.len() as i64, head);
            for (seq, (stream, version)) in &acks {
                let event = events
                    .get((*seq - 1) as usize)
                    .unwrap_or_else(|| panic!("{context}: acknowledged seq {seq} is missing; head {head}"));
                assert_eq!(
                    (event.stream_id.as_str(), event.stream_version),
                    (stream.as_str(), *version),
                    "{context}: seq {seq} holds another event than the one acknowledged"
                );
            }
            // A batch is one transaction: all of it is in the log or none.
            let mut per_batch: BTreeMap<&str, usize> = BTreeMap::new();
            for event in &events {
                if event.correlation_id.contains("-batch-") {
                    *per_batch.entry(event.correlation_id.as_str()).or_default() += 1;
                }
            }
            for (batch, count) in &per_batch {
                assert_eq!(*count, BATCH, "{context}: batch {batch} is partly in the log");
            }
            // Folded in the same transactions: no catch-up needed.
            for state in store.projection_states().await.unwrap() {
                assert_eq!(state.position, head, "{context}: {} is behind", state.name);
            }

            // The dead process's claims are open in the log; recovery, once
            // their leases are past (a clock an hour ahead), interrupts
            // exactly those and requeues them.
            let (_, open) = claims_from_log(&events);
            assert_eq!(open, held, "{context}: the open claims are the ones the process held");
            // An hour past both this host's clock and the log's last time:
            // an earlier round's recovery, an hour ahead, dated the log
            // forward, and a command's time never goes back along it.
            let last = events
                .iter()
                .map(|event| event.recorded_at.as_micros())
                .max()
                .unwrap_or(0);
            let later = Timestamp::from_micros(SystemClock.now().as_micros().max(last) + 3_600_000_000);
            let recovering = Engine::with_clock(store.clone(), Arc::new(FixedClock::at(later)), Arc::new(UuidV7Ids));
            let report = recovering.recover(&CommandContext::actor("recovery")).await.unwrap();
            assert_eq!(
                (report.interrupted, report.requeued),
                (held.len() as u64, held.len() as u64),
                "{context}: {report:?}"
            );
            interrupted_total += report.interrupted;
            for (operation, token) in &held {
                let view = recovering.task_by_operation(*operation).await.unwrap().unwrap();
                assert_ne!(view.state.claim_token.as_deref(), Some(token.as_str()));
                assert!(view.state.interruption_count >= 1);
            }
        });
        replay_verify(&url, &context);
        eprintln!(
            "{context}: killed holding {} claims, {} events acknowledged so far",
            held.len(),
            acks.len()
        );
    }

    // A fresh pool (with the clock past every requeue) finishes the work:
    // every task exactly once, the interrupted ones included.
    runtime.block_on(async {
        let store = backend.open().await;
        let later = Timestamp::from_micros(SystemClock.now().as_micros() + 7_200_000_000);
        let engine = Engine::with_clock(store.clone(), Arc::new(FixedClock::at(later)), Arc::new(UuidV7Ids));
        let mut builder = WorkerPool::builder(engine, "finisher").workers(4);
        for kind in KINDS {
            builder = builder.task(NoOp(kind));
        }
        let report = builder.build().unwrap().run_until_idle().await.unwrap();
        assert_eq!(report.completed, operations.len() as u64, "{report:?}");
        let (succeeded, open) = claims_from_log(&whole_log(&store).await);
        assert!(open.is_empty());
        assert_eq!(succeeded.keys().copied().collect::<BTreeSet<_>>(), operations);
        assert!(succeeded.values().all(|count| *count == 1));
    });
    assert_eq!(interrupted_total, (ROUNDS * 4) as u64);
    replay_verify(&url, "after the final drain");
}
