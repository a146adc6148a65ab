//! The total-queue check under faults, on SQLite and on PostgreSQL: one
//! requester process requests tasks while worker processes claim and
//! complete them, each recording every invoke and answer of request,
//! claim and complete in a history file of its own
//! (`tests/history_support`). Meanwhile the test SIGKILLs workers at random
//! (starting a fresh one in each's place) and pauses others (SIGSTOP) for
//! longer than their lease, so their claims expire, are recovered and are
//! taken by another worker before the paused one wakes and tries to
//! complete them. After a final drain the checker reads every history and
//! the log: nothing lost, nothing duplicated, nothing unexpected, and every
//! task a killed worker held ends succeeded through another worker (or
//! through its own completion, when that had landed before the kill).
//!
//! Size: 8 workers and 1,000 tasks per backend, so CI's share stays well
//! under five minutes; `OPLEDGER_SOAK=1` runs 32 workers and 10,000 tasks.
//! The run prints its counts (one JSON line per backend on stderr).
//!
//! **The child processes** are this test binary run again with
//! `OPLEDGER_HISTORY_CHILD` set (the pattern of `tests/crash.rs`),
//! selecting [`history_child`], which returns at once in a normal run.
//! A child opens its own store on the URL it is given and uses the engine
//! directly, so that every call is one recorded operation of the history.

mod history_support;

use futures::TryStreamExt;
use history_support::{check, read_histories, HistoryWriter, Record};
use opledger_domain::work::Completion;
use opledger_domain::{DomainError, EventEnvelope};
use opledger_engine::{ClaimRequest, CommandContext, Engine, EngineError, TaskRequest, TaskTarget};
use opledger_store::Store;
use opledger_store_postgres::{PostgresConfig, PostgresStore};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use opledger_testkit::Backend;
use serde_json::json;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "OPLEDGER_HISTORY_CHILD";
const CHILD_URL_ENV: &str = "OPLEDGER_HISTORY_URL";
const CHILD_DIR_ENV: &str = "OPLEDGER_HISTORY_DIR";
const CHILD_TEST: &str = "history_child";
const KINDS: [&str; 2] = ["metadata", "thumbnail"];
/// Short, so that a paused worker's claims expire within the run.
const LEASE_MS: i64 = 3_000;
/// Longer than the lease.
const PAUSE: Duration = Duration::from_millis(4_500);
const CLAIM_BATCH: usize = 8;

struct Size {
    workers: usize,
    tasks: usize,
    deadline: Duration,
}

fn size() -> Size {
    if std::env::var("OPLEDGER_SOAK").as_deref() == Ok("1") {
        Size {
            workers: 32,
            tasks: 10_000,
            deadline: Duration::from_secs(40 * 60),
        }
    } else {
        Size {
            workers: 8,
            tasks: 1_000,
            deadline: Duration::from_secs(150),
        }
    }
}

fn inputs_for(kind: &str) -> serde_json::Value {
    match kind {
        "metadata" => json!({}),
        "thumbnail" => json!({"max_side": 256, "format": "png"}),
        other => panic!("no inputs for {other}"),
    }
}

/// A small xorshift: the test needs varied timing, not good randomness.
struct Dice(u64);

impl Dice {
    fn new(seed: u64) -> Dice {
        Dice(seed | 1)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound.max(1)
    }
}

fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as u64)
        .unwrap_or(7);
    nanos ^ (u64::from(std::process::id()) << 32)
}

// ---------------------------------------------------------------- child --

/// Not a test on its own: the body of the processes the tests below start.
/// Without `OPLEDGER_HISTORY_CHILD` it returns at once.
#[test]
fn history_child() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    let url = std::env::var(CHILD_URL_ENV).expect("the child is given a database URL");
    let dir = PathBuf::from(std::env::var(CHILD_DIR_ENV).expect("the child is given a history folder"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async move {
        if let Some(path) = url.strip_prefix("sqlite:") {
            let store = SqliteStore::open(SqliteConfig::at(path)).await.expect("open the store");
            run_role(store, &role, &dir).await;
        } else {
            let mut config = PostgresConfig::from_url(&url).expect("a postgres URL");
            // 32 processes share the server's 100 connections.
            config.write_connections = 1;
            config.read_connections = 1;
            let store = PostgresStore::open(config).await.expect("open the store");
            run_role(store, &role, &dir).await;
        }
    });
}

async fn run_role<S: Store>(store: S, role: &str, dir: &Path) {
    let (engine, _) = Engine::open(store).await.expect("startup");
    // libtest has printed `test NAME ... ` without a newline; start afresh.
    say("\nready\n");
    match role.split_once(':') {
        Some(("requester", tasks)) => requester(engine, tasks.parse().expect("a task count"), dir).await,
        Some(("worker", name)) => worker(engine, name, dir, false).await,
        _ => panic!("unknown child role {role}"),
    }
}

/// Writes to the parent in one write; if the parent is gone there is
/// nobody to report to.
fn say(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_err() {
        std::process::exit(71);
    }
}

/// Registers media items and requests both kinds on each, 50 items at a
/// time, spread over the run.
async fn requester<S: Store>(engine: Engine<S>, tasks: usize, dir: &Path) {
    let mut history = HistoryWriter::create(dir, "requester");
    let context = CommandContext::actor("requester");
    let media = tasks / KINDS.len();
    for chunk in (0..media).collect::<Vec<_>>().chunks(50) {
        let mut requests = Vec::new();
        let mut invokes = Vec::new();
        for &index in chunk {
            let media_id = engine
                .register_media(
                    &context,
                    &format!("/history/{index}.png"),
                    "image",
                    Some(format!("sha256:{index:064x}")),
                    Some(1),
                )
                .await
                .expect("register media");
            for kind in KINDS {
                let mut invoke = Record::new("request", "invoke");
                invoke.target = Some(media_id.to_string());
                invoke.kind = Some(kind.to_string());
                invokes.push(invoke);
                requests.push(TaskRequest {
                    target: TaskTarget::Media(media_id),
                    kind: kind.to_string(),
                    inputs: inputs_for(kind),
                    priority: 0,
                });
            }
        }
        history.record_all(invokes);
        let answers = engine
            .request_tasks(&context, requests.clone())
            .await
            .expect("the requester is never faulted");
        let mut oks = Vec::new();
        for (request, answer) in requests.iter().zip(answers) {
            let answer = answer.expect("a valid request");
            let mut ok = Record::new("request", "ok");
            let TaskTarget::Media(media_id) = request.target else {
                unreachable!("the requester requests media tasks only")
            };
            ok.target = Some(media_id.to_string());
            ok.kind = Some(request.kind.clone());
            ok.op = Some(answer.operation_id.to_string());
            ok.revision = Some(answer.requested_revision.clone());
            oks.push(ok);
        }
        history.record_all(oks);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    say("requested\n");
}

fn is_fencing_conflict(error: &EngineError) -> bool {
    matches!(error, EngineError::Domain(DomainError::Conflict(_)))
}

/// Claims, "works" for a few milliseconds, completes; runs recovery about
/// every second, as a worker host's periodic recovery does. With `drain`
/// it stops when a claim comes back empty and nothing is left to recover.
async fn worker<S: Store>(engine: Engine<S>, name: &str, dir: &Path, drain: bool) {
    let mut history = HistoryWriter::create(dir, name);
    let context = CommandContext::actor(name);
    let mut dice = Dice::new(seed());
    let mut next_recovery = Instant::now();
    loop {
        if Instant::now() >= next_recovery {
            let _ = engine.recover(&context).await;
            next_recovery = Instant::now() + Duration::from_millis(700 + dice.below(600));
        }
        history.record(Record::new("claim", "invoke"));
        let claimed = engine
            .claim_tasks(
                &context,
                ClaimRequest {
                    kinds: Vec::new(),
                    worker: name.to_string(),
                    lease_ms: LEASE_MS,
                    limit: CLAIM_BATCH,
                },
            )
            .await;
        let claims = match claimed {
            Ok(claims) => claims,
            Err(error) => {
                let mut info = Record::new("claim", "info");
                info.error = Some(error.to_string());
                history.record(info);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if claims.is_empty() {
            history.record(Record::new("claim", "ok"));
            if drain {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
            continue;
        }
        history.record_all(
            claims
                .iter()
                .map(|claim| {
                    let mut ok = Record::new("claim", "ok");
                    ok.op = Some(claim.operation_id.to_string());
                    ok.token = Some(claim.claim_token.clone());
                    ok.revision = Some(claim.revision.clone());
                    ok
                })
                .collect(),
        );
        tokio::time::sleep(Duration::from_millis(dice.below(10))).await;
        history.record_all(
            claims
                .iter()
                .map(|claim| {
                    let mut invoke = Record::new("complete", "invoke");
                    invoke.op = Some(claim.operation_id.to_string());
                    invoke.token = Some(claim.claim_token.clone());
                    invoke
                })
                .collect(),
        );
        let completions = claims
            .iter()
            .map(|claim| (claim.fence(), Completion::Output(json!({"by": name}))))
            .collect();
        let answers = engine.complete_tasks(&context, completions).await;
        let records = claims
            .iter()
            .enumerate()
            .map(|(index, claim)| {
                let answer = match &answers {
                    Ok(answers) => answers[index].as_ref().map(|_| ()).map_err(Clone::clone),
                    Err(error) => Err(error.clone()),
                };
                let mut record = match &answer {
                    Ok(()) => Record::new("complete", "ok"),
                    Err(error) if is_fencing_conflict(error) => Record::new("complete", "fail"),
                    Err(_) => Record::new("complete", "info"),
                };
                record.op = Some(claim.operation_id.to_string());
                record.token = Some(claim.claim_token.clone());
                record.error = answer.err().map(|error| error.to_string());
                record
            })
            .collect();
        history.record_all(records);
    }
}

// --------------------------------------------------------------- parent --

struct Spawned {
    name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
    paused_until: Option<Instant>,
}

fn spawn_child(role: &str, url: &str, dir: &Path) -> Spawned {
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env(CHILD_URL_ENV, url)
        .env(CHILD_DIR_ENV, dir)
        .env_remove("OPLEDGER_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(
            std::fs::File::create(dir.join(format!("stderr-{}.txt", role.replace(':', "-"))))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .spawn()
        .expect("spawn a child process");
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    Spawned {
        name: role
            .split_once(':')
            .map(|(_, name)| name.to_string())
            .unwrap_or_default(),
        child,
        lines,
        paused_until: None,
    }
}

fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} failed");
}

async fn open_engine(url: &str) -> EngineAt {
    if let Some(path) = url.strip_prefix("sqlite:") {
        let store = SqliteStore::open(SqliteConfig::at(path)).await.expect("open the store");
        EngineAt::Sqlite(Engine::open(store).await.expect("startup").0)
    } else {
        let mut config = PostgresConfig::from_url(url).expect("a postgres URL");
        config.write_connections = 2;
        config.read_connections = 2;
        let store = PostgresStore::open(config).await.expect("open the store");
        EngineAt::Postgres(Engine::open(store).await.expect("startup").0)
    }
}

enum EngineAt {
    Sqlite(Engine<SqliteStore>),
    Postgres(Engine<PostgresStore>),
}

macro_rules! with_engine {
    ($at:expr, $engine:ident => $body:expr) => {
        match $at {
            EngineAt::Sqlite($engine) => $body,
            EngineAt::Postgres($engine) => $body,
        }
    };
}

async fn declare(engine: &EngineAt) {
    // Kills and pauses interrupt tasks again and again; the run is about
    // the protocol, not the quarantine of items that keep killing workers.
    let mut kinds = opledger_domain::kinds::legacy::declarations();
    for kind in &mut kinds {
        kind.retry.max_interruptions = 1_000;
    }
    let context = CommandContext::actor("setup");
    with_engine!(engine, engine => engine.declare(&context, kinds.clone()).await.expect("declare the kinds"));
}

async fn count(engine: &EngineAt, status: &str) -> i64 {
    let report = with_engine!(engine, engine => engine.status().await.expect("status"));
    report
        .operations_by_status
        .iter()
        .find(|(name, _)| name == status)
        .map(|(_, count)| *count)
        .unwrap_or(0)
}

async fn whole_log(engine: &EngineAt) -> Vec<EventEnvelope> {
    with_engine!(engine, engine => engine.store().read_all(0, 5_000).try_collect().await.expect("read the log"))
}

fn replay_verify(url: &str, backend: &str) {
    let output = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args(["replay", "--verify", "--database-url", url])
        .env_remove("OPLEDGER_DATABASE_URL")
        .output()
        .expect("run opledger replay --verify");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{backend}: replay --verify failed\n--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

async fn run_history(backend: &str, url: &str) {
    let size = size();
    let folder = tempfile::tempdir().expect("a history folder");
    let dir = folder.path();
    let engine = open_engine(url).await;
    declare(&engine).await;

    let mut dice = Dice::new(seed());
    let mut requester = spawn_child(&format!("requester:{}", size.tasks), url, dir);
    let mut workers: Vec<Spawned> = (0..size.workers)
        .map(|index| spawn_child(&format!("worker:w{index}"), url, dir))
        .collect();
    let mut next_name = size.workers;
    let mut killed: BTreeSet<String> = BTreeSet::new();
    let (mut kills, mut pauses) = (0usize, 0usize);
    let started = Instant::now();
    let mut requested = false;

    loop {
        tokio::time::sleep(Duration::from_millis(300 + dice.below(300))).await;
        requested |= requester.lines.try_iter().any(|line| line == "requested");
        if let Ok(Some(status)) = requester.child.try_wait() {
            assert!(
                requested,
                "{backend}: the requester ended with {status} before it was done"
            );
        }
        let now = Instant::now();
        for worker in &mut workers {
            if worker.paused_until.is_some_and(|until| until <= now) {
                signal(&worker.child, "-CONT");
                worker.paused_until = None;
            }
        }
        if requested && count(&engine, "succeeded").await == size.tasks as i64 {
            break;
        }
        if started.elapsed() >= size.deadline {
            let report = with_engine!(&engine, engine => engine.status().await.expect("status"));
            panic!(
                "{backend}: the run did not finish within {:?} (requested: {requested}); operations by status: {:?}; \
                 workers' errors are in {}",
                size.deadline,
                report.operations_by_status,
                dir.display()
            );
        }
        // One fault a round: kill a worker (a fresh one takes its place),
        // or pause one for longer than its lease.
        let victim = dice.below(workers.len() as u64) as usize;
        if workers[victim].paused_until.is_some() {
            continue;
        }
        if dice.below(5) < 3 {
            let mut dead = workers.swap_remove(victim);
            dead.child.kill().expect("SIGKILL a worker");
            let _ = dead.child.wait();
            killed.insert(dead.name.clone());
            kills += 1;
            workers.push(spawn_child(&format!("worker:w{next_name}"), url, dir));
            next_name += 1;
        } else {
            signal(&workers[victim].child, "-STOP");
            workers[victim].paused_until = Some(Instant::now() + PAUSE);
            pauses += 1;
        }
    }
    let _ = requester.child.wait();
    // Everything is done: stop every worker the hard way, so their last
    // claims (if any) are a killed worker's, then drain what is left.
    for worker in &mut workers {
        if worker.paused_until.is_some() {
            signal(&worker.child, "-CONT");
        }
        worker.child.kill().expect("SIGKILL a worker");
        let _ = worker.child.wait();
        killed.insert(worker.name.clone());
    }
    tokio::time::sleep(Duration::from_millis(LEASE_MS as u64 + 500)).await;
    with_engine!(&engine, engine => worker(engine.clone(), "drain", dir, true).await);

    let log = whole_log(&engine).await;
    let interruptions = log
        .iter()
        .filter(|envelope| matches!(envelope.event, opledger_domain::events::Event::OperationInterrupted(_)))
        .count();
    let verdict = check(&read_histories(dir), &log, &killed);
    let mut summary = verdict.summary();
    summary["backend"] = json!(backend);
    summary["workers"] = json!(size.workers);
    summary["kills"] = json!(kills);
    summary["pauses"] = json!(pauses);
    summary["interruptions"] = json!(interruptions);
    summary["seconds"] = json!(started.elapsed().as_secs());
    // Straight to stderr: libtest captures eprintln! of passing tests.
    let _ = writeln!(std::io::stderr(), "history check: {summary}");

    assert!(verdict.is_clean(), "{backend}: the history check failed: {verdict:#?}");
    assert_eq!(
        verdict.requested, size.tasks,
        "{backend}: every request was acknowledged"
    );
    assert_eq!(verdict.succeeded_in_log, size.tasks, "{backend}: one success per task");
    assert!(kills > 0 && pauses > 0, "{backend}: the run injected no faults");
    assert!(
        interruptions > 0,
        "{backend}: no claim was ever interrupted: the faults hit nothing"
    );
    replay_verify(url, backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_paused_workers_lose_duplicate_and_invent_no_task_on_sqlite() {
    let backend = opledger_testkit::sqlite::backend().await;
    run_history("sqlite", &backend.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_paused_workers_lose_duplicate_and_invent_no_task_on_postgres() {
    let Some(backend) = opledger_testkit::postgres::backend().await else {
        return;
    };
    // A worker paused inside a write transaction holds the append lock;
    // the server ends its session after a second (the default is 10 s, so
    // that a loaded host's slow client is not cut off), and the others go on.
    let base = backend.url();
    let joint = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{joint}options=-c%20idle_in_transaction_session_timeout%3D1000");
    run_history("postgres", &url).await;
}
