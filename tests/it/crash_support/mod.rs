//! What the crash tests share: the child's workload, appending in a loop
//! through the engine and reporting every acknowledged event on standard
//! output, and the parent's side of it, starting that child (this test
//! binary run again with an environment variable that selects the child's
//! test), reading its reports and choosing kill times.
//!
//! `tests/it/crash.rs` kills the child with SIGKILL (a process crash);
//! `tests/it/power_loss.rs` does the same with the child's SQLite writes going
//! through the powerloss VFS, so the kill is a power loss.
//!
//! Each test binary includes this module and uses a part of it, so the
//! helpers another binary uses would be dead code in this one: hence the
//! allowance below, for this module only.

use opledger_domain::decide::OperationCommand;
use opledger_domain::events::{Event, MediaRegistered, MediaUpdated, OperationTarget};
use opledger_domain::{Cause, EventEnvelope, MediaId, NewEvent, OperationId, OperationStatus, StreamId};
use opledger_engine::{CommandContext, Engine, EngineError, NewOperation};
use opledger_store::{ExpectedVersion, Store, StreamAppend};
use opledger_store_sqlite::SqliteStore;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;
use uuid::Uuid;

/// Tasks appending media events with `Engine::append`, besides the one
/// running operation lifecycles.
pub const APPENDERS: usize = 4;

// ---------------------------------------------------------------- child --

/// The child's workload once its engine is open: [`APPENDERS`] tasks
/// appending media events and one running operations through their
/// lifecycle, all at once (so the group-commit path, several commands per
/// transaction each in its own savepoint, is what gets killed most of the
/// time), until the process is killed. Says `ready` first.
pub async fn append_until_killed(engine: Engine<SqliteStore>) {
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
pub fn say(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_err() {
        std::process::exit(71);
    }
}

/// A command the child cannot recover from: say why and stop, so the parent
/// sees the child die before it was killed.
pub fn die(what: &str, error: EngineError) -> ! {
    eprintln!("crash child: {what} failed: {error}");
    std::process::exit(70);
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
                    media_kind: None,
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
pub struct XorShift(pub u64);

impl XorShift {
    /// Seeded from the variable `env` when it holds a number, else from the
    /// time; the seed is odd (xorshift never leaves zero).
    pub fn seeded(env: &str) -> (Self, u64) {
        let seed = std::env::var(env)
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|since| since.as_nanos() as u64)
                    .unwrap_or(1)
            })
            | 1;
        (XorShift(seed), seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

/// A line of the child's.
pub enum Report {
    Ready,
    /// An acknowledged event, and when the parent read its line.
    Ack {
        seq: i64,
        stream: String,
        version: i64,
        at: Instant,
    },
}

fn parse_line(line: &str) -> Option<Report> {
    if line == "ready" {
        return Some(Report::Ready);
    }
    let mut fields = line.strip_prefix("ack ")?.split(' ');
    let seq = fields.next()?.parse().ok()?;
    let stream = fields.next()?.to_string();
    let version = fields.next()?.parse().ok()?;
    Some(Report::Ack {
        seq,
        stream,
        version,
        at: Instant::now(),
    })
}

/// Starts the child: this test binary running only `test` (exactly), with
/// `env` set. Returns the child, its reports as it makes them, and its
/// standard error once it has ended.
pub fn spawn_child(
    test: &str,
    env: &[(&str, &OsStr)],
) -> (Child, mpsc::Receiver<Report>, std::thread::JoinHandle<String>) {
    let mut child = Command::new(std::env::current_exe().expect("the test binary's path"))
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .envs(env.iter().copied())
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
