//! The processes of a history run, shared by the tests that record one
//! (`tests/it/history_checker.rs`, `tests/it/postgres_restart.rs`): the child
//! side (a requester and workers that use the engine directly, so that
//! every call is one recorded operation of the history) and the parent's
//! handling of them (spawning, signals, the engine it checks with, the
//! final drain and `replay --verify`).
//!
//! **The child processes** are the test binary run again with
//! `OPLEDGER_HISTORY_CHILD` set (the pattern of `tests/it/crash.rs`): the
//! test named as the child's entry calls [`child_main`] first, which runs
//! the role and answers true in a child, and answers false at once in a
//! normal run.
//!
//! **Storage trouble:** a call answered Unavailable (the server went away
//! under it) is recorded as `info` (unknown: it may have landed), its
//! error text marked [`UNAVAILABLE`], and tried again with a backoff that
//! doubles from 50 ms to 1 s: a request (by revision) and a media
//! registration (by request id) are safe to repeat; a completion repeated
//! after an unknown attempt is fenced by its claim token, so it lands at
//! most once.
//!
//! Each test binary that includes it uses a part of it, so what another
//! uses would be dead code in this one: hence the allowance, for this
//! module only.

use super::{HistoryWriter, Record};
use futures::TryStreamExt;
use opledger_domain::work::Completion;
use opledger_domain::{DomainError, EventEnvelope};
use opledger_engine::{
    ClaimRequest, CommandContext, Engine, EngineError, RequestId, TaskClaim, TaskRequest, TaskTarget,
};
use opledger_store::{ErrorKind, Store};
use opledger_store_postgres::{PostgresConfig, PostgresStore};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "OPLEDGER_HISTORY_CHILD";
const CHILD_URL_ENV: &str = "OPLEDGER_HISTORY_URL";
const CHILD_DIR_ENV: &str = "OPLEDGER_HISTORY_DIR";
/// The requester's pause between two rounds of 50 media items.
const CHILD_PAUSE_ENV: &str = "OPLEDGER_HISTORY_PAUSE_MS";
pub const KINDS: [&str; 2] = ["metadata", "thumbnail"];
/// Short, so that a paused worker's claims expire within the run.
pub const LEASE_MS: i64 = 3_000;
const CLAIM_BATCH: usize = 8;
/// How the error text of an Unavailable answer begins in a history.
pub const UNAVAILABLE: &str = "unavailable: ";
/// How long a child tries a call again while storage is unavailable.
const RETRY_FOR: Duration = Duration::from_secs(60);

fn inputs_for(kind: &str) -> serde_json::Value {
    match kind {
        "metadata" => json!({}),
        "thumbnail" => json!({"max_side": 256, "format": "png"}),
        other => panic!("no inputs for {other}"),
    }
}

/// A small xorshift: the tests need varied timing, not good randomness.
pub struct Dice(u64);

impl Dice {
    pub fn new(seed: u64) -> Dice {
        Dice(seed | 1)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound.max(1)
    }
}

pub fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as u64)
        .unwrap_or(7);
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// The error text a history records: an Unavailable answer marked so the
/// run can count them.
fn error_text(error: &EngineError) -> String {
    if error.is_store(ErrorKind::Unavailable) {
        format!("{UNAVAILABLE}{error}")
    } else {
        error.to_string()
    }
}

/// Doubles from 50 ms to 1 s while storage stays unavailable.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Backoff {
        Backoff(Duration::from_millis(50))
    }

    async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(1));
    }
}

// ---------------------------------------------------------------- child --

/// In a child process (`OPLEDGER_HISTORY_CHILD` set), runs its role to the
/// end and answers true; otherwise answers false at once. Call it first in
/// the test a child is started as, outside any runtime.
pub fn child_main() -> bool {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return false;
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
    true
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
/// time, spread over the run; waits out storage trouble.
async fn requester<S: Store>(engine: Engine<S>, tasks: usize, dir: &Path) {
    let pause = std::env::var(CHILD_PAUSE_ENV)
        .ok()
        .and_then(|pause| pause.parse().ok())
        .map_or(Duration::from_millis(20), Duration::from_millis);
    let mut history = HistoryWriter::create(dir, "requester");
    let context = CommandContext::actor("requester");
    let media = tasks / KINDS.len();
    let started = Instant::now();
    for chunk in (0..media).collect::<Vec<_>>().chunks(50) {
        let mut requests = Vec::new();
        let mut invokes = Vec::new();
        for &index in chunk {
            // A request id makes a repeated registration answer the first.
            let once = context
                .clone()
                .with_request_id(RequestId::new(format!("register-{index}")).expect("a request id"));
            let mut backoff = Backoff::new();
            let media_id = loop {
                match engine
                    .register_media(
                        &once,
                        &format!("/history/{index}.png"),
                        "image",
                        Some(format!("sha256:{index:064x}")),
                        Some(1),
                    )
                    .await
                {
                    Ok(media_id) => break media_id,
                    Err(error) if error.is_store(ErrorKind::Unavailable) && started.elapsed() < RETRY_FOR => {
                        let mut info = Record::new("register", "info");
                        info.error = Some(error_text(&error));
                        history.record(info);
                        backoff.wait().await;
                    }
                    Err(error) => panic!("register media: {error}"),
                }
            };
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
        // A request of the revision already requested answers the same
        // operation and appends nothing: safe to repeat.
        let mut backoff = Backoff::new();
        let answers = loop {
            match engine.request_tasks(&context, requests.clone()).await {
                Ok(answers) => break answers,
                Err(error) if error.is_store(ErrorKind::Unavailable) && started.elapsed() < RETRY_FOR => {
                    let mut info = Record::new("request", "info");
                    info.error = Some(error_text(&error));
                    history.record(info);
                    backoff.wait().await;
                }
                Err(error) => panic!("the requester's requests were refused: {error}"),
            }
        };
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
        tokio::time::sleep(pause).await;
    }
    say("requested\n");
}

fn is_fencing_conflict(error: &EngineError) -> bool {
    matches!(error, EngineError::Domain(DomainError::Conflict(_)))
}

/// Claims, "works" for 5–25 milliseconds, completes; runs recovery about
/// every second, as a worker host's periodic recovery does. With `drain`
/// it stops when a claim comes back empty and nothing is left to recover.
pub async fn worker<S: Store>(engine: Engine<S>, name: &str, dir: &Path, drain: bool) {
    let mut history = HistoryWriter::create(dir, name);
    let context = CommandContext::actor(name);
    let mut dice = Dice::new(seed());
    let mut next_recovery = Instant::now();
    let mut backoff = Backoff::new();
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
                    principal: None,
                    versions: Default::default(),
                },
            )
            .await;
        let claims = match claimed {
            Ok(claims) => claims,
            Err(error) => {
                let mut info = Record::new("claim", "info");
                info.error = Some(error_text(&error));
                history.record(info);
                if error.is_store(ErrorKind::Unavailable) {
                    backoff.wait().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        backoff = Backoff::new();
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
        // The work: long enough beside the claim's and the completion's
        // transactions that a worker killed or paused at a random moment
        // most likely holds a claim (a fast machine finished the tasks
        // between faults, and the faults hit nothing).
        tokio::time::sleep(Duration::from_millis(5 + dice.below(20))).await;
        complete(&engine, &context, name, &claims, &mut history).await;
    }
}

/// Completes `claims` in one call, again while the answer is Unavailable.
/// After an attempt whose answer never came, a refusal of a later one is
/// unknown too (the first may have landed), not a definite `fail`.
async fn complete<S: Store>(
    engine: &Engine<S>,
    context: &CommandContext,
    name: &str,
    claims: &[TaskClaim],
    history: &mut HistoryWriter,
) {
    let started = Instant::now();
    let mut backoff = Backoff::new();
    let mut unknown_before = false;
    loop {
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
        let answers = engine.complete_tasks(context, completions).await;
        let unavailable = matches!(&answers, Err(error) if error.is_store(ErrorKind::Unavailable));
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
                    Err(error) if is_fencing_conflict(error) && !unknown_before => Record::new("complete", "fail"),
                    Err(_) => Record::new("complete", "info"),
                };
                record.op = Some(claim.operation_id.to_string());
                record.token = Some(claim.claim_token.clone());
                record.error = answer.err().map(|error| error_text(&error));
                record
            })
            .collect();
        history.record_all(records);
        if !unavailable || started.elapsed() >= RETRY_FOR {
            return;
        }
        unknown_before = true;
        backoff.wait().await;
    }
}

// --------------------------------------------------------------- parent --

pub struct Spawned {
    pub name: String,
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub paused_until: Option<Instant>,
}

impl Spawned {
    /// Waits until the child has opened its store and says so.
    pub fn wait_ready(&self, limit: Duration) {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line == "ready" => return,
                Ok(_) => {}
                Err(_) => panic!("child {} was not ready within {limit:?}", self.name),
            }
        }
    }
}

/// A child outlives no test: one that failed leaves none running.
impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts this test binary again as a child running `role`, through the
/// test named `entry` (which calls [`child_main`] first).
pub fn spawn_child(entry: &str, role: &str, url: &str, dir: &Path, envs: &[(&str, String)]) -> Spawned {
    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    command
        .args([entry, "--exact", "--nocapture", "--test-threads=1"])
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
        );
    for (key, value) in envs {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("spawn a child process");
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

/// The environment that sets the requester's pause between rounds.
pub fn requester_pause(pause: Duration) -> (&'static str, String) {
    (CHILD_PAUSE_ENV, pause.as_millis().to_string())
}

pub fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} failed");
}

pub async fn open_engine(url: &str) -> EngineAt {
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

pub enum EngineAt {
    Sqlite(Engine<SqliteStore>),
    Postgres(Engine<PostgresStore>),
}

macro_rules! with_engine {
    ($at:expr, $engine:ident => $body:expr) => {
        match $at {
            $crate::history_support::processes::EngineAt::Sqlite($engine) => $body,
            $crate::history_support::processes::EngineAt::Postgres($engine) => $body,
        }
    };
}
// Not every binary that includes this module names the macro itself.
#[allow(unused_imports)]
pub(crate) use with_engine;

pub async fn declare(engine: &EngineAt) {
    // Kills and pauses interrupt tasks again and again; the run is about
    // the protocol, not the quarantine of items that keep killing workers.
    let mut kinds = opledger_domain::kinds::legacy::declarations();
    for kind in &mut kinds {
        kind.retry.max_interruptions = 1_000;
    }
    let context = CommandContext::actor("setup");
    with_engine!(engine, engine => engine.declare(&context, kinds.clone()).await.expect("declare the kinds"));
}

/// Operations at `status`; an error while the server is away.
pub async fn try_count(engine: &EngineAt, status: &str) -> Result<i64, EngineError> {
    let report = with_engine!(engine, engine => engine.status().await?);
    Ok(report
        .operations_by_status
        .iter()
        .find(|(name, _)| name == status)
        .map(|(_, count)| *count)
        .unwrap_or(0))
}

pub async fn count(engine: &EngineAt, status: &str) -> i64 {
    try_count(engine, status).await.expect("status")
}

pub async fn whole_log(engine: &EngineAt) -> Vec<EventEnvelope> {
    with_engine!(engine, engine => engine.store().read_all(0, 5_000).try_collect().await.expect("read the log"))
}

/// Runs a last worker until no claim is left (after the lease of any claim
/// a stopped worker held has run out).
pub async fn drain(engine: &EngineAt, dir: &Path) {
    with_engine!(engine, engine => worker(engine.clone(), "drain", dir, true).await);
}

pub fn replay_verify(url: &str, backend: &str) {
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
