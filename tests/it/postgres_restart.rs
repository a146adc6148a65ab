//! PostgreSQL restarted under load: while a requester and 8 worker
//! processes request, claim and complete tasks (recording every call in a
//! history, `tests/it/history_support`), the server is stopped and started
//! again three times (`pg_ctlcluster`: stopped in fast mode, restarted in
//! immediate mode as a crash would, stopped in fast mode). Calls in flight
//! are answered Unavailable and tried again with a backoff; calls made
//! while it is down wait for it in the store's pool (which reconnects, up
//! to the URL's `connect_timeout`). While it is down, a new process's `opledger
//! status` exits 5, and an HTTP client of a real `opledger serve` hears
//! 200 or 503, never anything else (the run prints the longest wait). Afterwards every worker
//! goes on working (none hangs), and after a final drain no advisory lock
//! is held on the database nor any transaction left open, the history
//! checker finds nothing lost, duplicated or unexpected, and `replay
//! --verify` passes. The run prints its counts (one JSON line on stderr).
//!
//! **One test in its own binary:** cargo runs test binaries one after
//! another, so no other PostgreSQL test of this workspace runs while this
//! one stops the server. The child processes are this test run again
//! (`history_support::processes::child_main` answers true in them).
//!
//! The server restarted is the local cluster that serves the test URL's
//! port (`pg_lsclusters`), and a guard starts it again when the test ends,
//! whether it passed or not. Without a server the test skips loudly, and
//! fails under `CI=true`, as the other PostgreSQL tests do.

use crate::history_support;

use history_support::processes::{
    declare, drain, open_engine, replay_verify, requester_pause, signal, spawn_child, try_count, whole_log, Spawned,
    LEASE_MS, UNAVAILABLE,
};
use history_support::{check, read_histories, Record};
use opledger_testkit::Backend;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TEST: &str =
    "postgres_restart::postgres_restarted_under_load_loses_duplicates_and_invents_no_task_and_no_worker_hangs";
const WORKERS: usize = 8;
const TASKS: usize = 600;
const BIN: &str = env!("CARGO_BIN_EXE_opledger");

/// How the server is taken down in each round.
#[derive(Debug, Clone, Copy)]
enum Round {
    /// Stopped (fast: sessions ended, a clean shutdown), probed while
    /// down, started.
    StopProbeStart,
    /// `restart` in immediate mode: no shutdown checkpoint, crash recovery
    /// from the WAL on the way up.
    CrashRestart,
}

const ROUNDS: [Round; 3] = [Round::StopProbeStart, Round::CrashRestart, Round::StopProbeStart];

/// The local cluster that serves a port, as `pg_lsclusters` names it.
struct Cluster {
    version: String,
    name: String,
    port: u16,
}

impl Cluster {
    /// The cluster on this machine listening on `port`, if any.
    fn serving(port: u16) -> Option<Cluster> {
        let output = Command::new("pg_lsclusters").arg("--no-header").output().ok()?;
        String::from_utf8_lossy(&output.stdout).lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 3 && fields[2] == port.to_string()).then(|| Cluster {
                version: fields[0].to_string(),
                name: fields[1].to_string(),
                port,
            })
        })
    }

    fn ctl(&self, args: &[&str]) {
        let output = Command::new("pg_ctlcluster")
            .arg("--skip-systemctl-redirect")
            .args(args)
            .args([self.version.as_str(), self.name.as_str()])
            .output()
            .expect("run pg_ctlcluster");
        assert!(
            output.status.success(),
            "pg_ctlcluster {args:?} {} {} failed: {}",
            self.version,
            self.name,
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn stop(&self) {
        self.ctl(&["--mode", "fast", "stop"]);
    }

    fn start(&self) {
        self.ctl(&["start"]);
        self.wait_ready(Duration::from_secs(30));
    }

    fn crash_restart(&self) {
        self.ctl(&["--mode", "immediate", "restart"]);
        self.wait_ready(Duration::from_secs(30));
    }

    fn ready(&self) -> bool {
        Command::new("pg_isready")
            .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
            .status()
            .is_ok_and(|status| status.success())
    }

    fn wait_ready(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.ready() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

/// Starts the server again when the test ends, passed or failed: the
/// PostgreSQL tests after this binary need it.
struct ServerComesBack(Arc<Cluster>);

impl Drop for ServerComesBack {
    fn drop(&mut self) {
        let cluster = &self.0;
        if cluster.ready() {
            return;
        }
        let _ = Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", &cluster.version, &cluster.name, "start"])
            .status();
        if !cluster.wait_ready(Duration::from_secs(30)) {
            let _ = writeln!(
                std::io::stderr(),
                "PostgreSQL cluster {} {} did not come back; start it by hand",
                cluster.version,
                cluster.name
            );
        }
    }
}

/// The HTTP side: a real `opledger serve` on the same database and a
/// client thread asking it for the status back to back, counting answers
/// by status code.
struct Http {
    serve: std::process::Child,
    base: String,
    token: String,
    answers: Arc<Mutex<BTreeMap<String, usize>>>,
    /// The longest any answer took, in milliseconds.
    slowest_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    client: Option<std::thread::JoinHandle<()>>,
}

/// One GET over a plain socket: the status line's code, or what went wrong.
fn get(base: &str, path: &str, token: &str) -> String {
    let address = base.trim_start_matches("http://");
    let Ok(mut stream) = std::net::TcpStream::connect(address) else {
        return "no connection".into();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(45)));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return "request not sent".into();
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .map_or_else(|| "no answer".to_string(), str::to_string)
}

impl Http {
    fn start(dir: &Path, url: &str) -> Http {
        let tokens = dir.join("tokens.toml");
        let output = run(Command::new(BIN)
            .args(["token", "new", "--role", "reader", "--name", "restart", "--tokens-file"])
            .arg(&tokens));
        assert_eq!(output.status.code(), Some(0), "token new: {}", describe(&output));
        let token = String::from_utf8_lossy(&output.stdout).trim().to_string();
        let mut serve = Command::new(BIN)
            .args(["serve", "--bind", "127.0.0.1:0", "--tokens"])
            .arg(&tokens)
            .args(["--database-url", url])
            .env_remove("OPLEDGER_DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("serve.log")).expect("serve's log"),
            ))
            .spawn()
            .expect("opledger serve starts");
        let mut lines = BufReader::new(serve.stdout.take().expect("serve's stdout")).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        let base = first
            .strip_prefix("opledger serving on ")
            .unwrap_or_else(|| panic!("serve's first line names its address, not {first:?}"))
            .to_string();
        std::thread::spawn(move || lines.for_each(drop));
        let until = Instant::now() + Duration::from_secs(30);
        while get(&base, "/readyz", &token) != "200" {
            assert!(Instant::now() < until, "serve was not ready within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        let answers = Arc::new(Mutex::new(BTreeMap::new()));
        let slowest_ms = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let client = {
            let (base, token, answers, slowest, stop) = (
                base.clone(),
                token.clone(),
                answers.clone(),
                slowest_ms.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let asked = Instant::now();
                    let code = get(&base, "/api/v1/status", &token);
                    slowest.fetch_max(asked.elapsed().as_millis() as u64, Ordering::SeqCst);
                    *answers.lock().unwrap().entry(code).or_default() += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        Http {
            serve,
            base,
            token,
            answers,
            slowest_ms,
            stop,
            client: Some(client),
        }
    }

    /// Stops the client; the answers it heard by status code.
    fn finish(&mut self) -> BTreeMap<String, usize> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(client) = self.client.take() {
            client.join().expect("the HTTP client thread");
        }
        self.answers.lock().unwrap().clone()
    }
}

impl Drop for Http {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.serve.kill();
        let _ = self.serve.wait();
    }
}

fn run(command: &mut Command) -> Output {
    command
        .env_remove("OPLEDGER_DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run opledger")
}

fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Each process's `claim` answers so far: a worker that goes on working
/// keeps adding them (an empty claim is one too).
fn claim_answers(dir: &Path) -> BTreeMap<String, usize> {
    let mut answers = BTreeMap::new();
    for record in read_histories(dir) {
        if record.f == "claim" && record.t == "ok" {
            *answers.entry(record.process).or_default() += 1;
        }
    }
    answers
}

fn unavailable(record: &Record) -> bool {
    record
        .error
        .as_deref()
        .is_some_and(|error| error.starts_with(UNAVAILABLE))
}

#[test]
fn postgres_restarted_under_load_loses_duplicates_and_invents_no_task_and_no_worker_hangs() {
    if history_support::processes::child_main() {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(restarted_under_load());
}

/// The parent's side. Blocking calls (the server's control, the CLI, the
/// HTTP client) run on the thread that blocks on this future, never on
/// the runtime's workers, which serve the parent's own store.
async fn restarted_under_load() {
    let Some(backend) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let url = backend.url();
    let port = opledger_store_postgres::PostgresConfig::from_url(&url)
        .expect("a postgres URL")
        .options
        .get_port();
    let Some(cluster) = Cluster::serving(port) else {
        let message = format!("no local PostgreSQL cluster serves port {port} (pg_lsclusters): it cannot be restarted");
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}, and CI=true");
        let _ = writeln!(std::io::stderr(), "\nSKIPPED: {message}");
        return;
    };
    let cluster = Arc::new(cluster);
    let _comes_back = ServerComesBack(cluster.clone());
    let folder = tempfile::tempdir().expect("a history folder");
    let dir = folder.path();
    let started = Instant::now();

    let engine = open_engine(&url).await;
    declare(&engine).await;
    let mut http = Http::start(dir, &url);
    let mut children: Vec<Spawned> = Vec::new();
    children.push(spawn_child(
        TEST,
        &format!("requester:{TASKS}"),
        &url,
        dir,
        &[requester_pause(Duration::from_millis(400))],
    ));
    for index in 0..WORKERS {
        children.push(spawn_child(TEST, &format!("worker:w{index}"), &url, dir, &[]));
    }
    for child in &children {
        child.wait_ready(Duration::from_secs(30));
    }

    // The rounds, while the requester is still requesting.
    let (mut restarts, mut cli_exit_5) = (0usize, 0usize);
    for round in ROUNDS {
        std::thread::sleep(Duration::from_millis(700));
        match round {
            Round::StopProbeStart => {
                cluster.stop();
                let output = run(Command::new(BIN).args(["status", "--database-url", &url]));
                assert_eq!(
                    output.status.code(),
                    Some(5),
                    "`opledger status` with the server down: {}",
                    describe(&output)
                );
                assert!(
                    String::from_utf8_lossy(&output.stderr).contains("connecting to"),
                    "`opledger status` names the connection it could not make: {}",
                    describe(&output)
                );
                cli_exit_5 += 1;
                std::thread::sleep(Duration::from_millis(500));
                cluster.start();
            }
            Round::CrashRestart => cluster.crash_restart(),
        }
        restarts += 1;
    }
    let back_at = claim_answers(dir);

    // Every task ends succeeded, and every worker goes on working.
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut requested = false;
    loop {
        requested |= children[0].lines.try_iter().any(|line| line == "requested");
        if requested && try_count(&engine, "succeeded").await.ok() == Some(TASKS as i64) {
            break;
        }
        if Instant::now() >= deadline {
            let report = match &engine {
                history_support::processes::EngineAt::Postgres(engine) => engine.status().await,
                history_support::processes::EngineAt::Sqlite(_) => unreachable!("a PostgreSQL run"),
            };
            panic!(
                "the tasks did not all succeed within 45 s of the last restart (requested: {requested}); \
                 operations by status: {:?}; the children's errors are in {}",
                report.map(|report| report.operations_by_status),
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let until = Instant::now() + Duration::from_secs(10);
    let hung: Vec<String> = loop {
        let now = claim_answers(dir);
        let hung: Vec<String> = (0..WORKERS)
            .map(|index| format!("w{index}"))
            .filter(|name| now.get(name) <= back_at.get(name))
            .collect();
        if hung.is_empty() || Instant::now() >= until {
            break hung;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let answers = http.finish();
    assert_eq!(
        get(&http.base, "/api/v1/status", &http.token),
        "200",
        "serve answers again after the restarts"
    );

    // Stop the workers the hard way and drain whatever they still held.
    let mut killed = BTreeSet::new();
    for child in &mut children {
        if child.name.starts_with('w') {
            signal(&child.child, "-KILL");
            killed.insert(child.name.clone());
        }
        let _ = child.child.wait();
    }
    std::thread::sleep(Duration::from_millis(LEASE_MS as u64 + 500));
    drain(&engine, dir).await;

    // Nothing the restarts interrupted is left holding the database: no
    // advisory lock (the append lock, a ledger lock) and no transaction
    // left open.
    let mut connection = backend.connect().await;
    let locks_left: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
         WHERE l.locktype = 'advisory' AND d.datname = current_database()",
    )
    .fetch_one(&mut connection)
    .await
    .expect("read pg_locks");
    let open_transactions: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(&mut connection)
    .await
    .expect("read pg_stat_activity");
    let _ = sqlx::Connection::close(connection).await;

    let records = read_histories(dir);
    let log = whole_log(&engine).await;
    let verdict = check(&records, &log, &killed);
    let seen_by_children = records.iter().filter(|record| unavailable(record)).count();
    let mut unavailable_by_call: BTreeMap<&str, usize> = BTreeMap::new();
    for record in records.iter().filter(|record| unavailable(record)) {
        *unavailable_by_call.entry(record.f.as_str()).or_default() += 1;
    }
    let http_503 = answers.get("503").copied().unwrap_or(0);
    let mut summary = verdict.summary();
    summary["tasks"] = json!(TASKS);
    summary["workers"] = json!(WORKERS);
    summary["restarts"] = json!(restarts);
    summary["unavailable_seen_by_children"] = json!(seen_by_children);
    summary["unavailable_by_call"] = json!(unavailable_by_call);
    summary["cli_exit_5"] = json!(cli_exit_5);
    summary["http_answers"] = json!(answers);
    summary["http_slowest_ms"] = json!(http.slowest_ms.load(Ordering::SeqCst));
    summary["unavailable_seen"] = json!(seen_by_children + cli_exit_5 + http_503);
    summary["hung_workers"] = json!(hung);
    summary["advisory_locks_left"] = json!(locks_left);
    summary["open_transactions_left"] = json!(open_transactions);
    summary["seconds"] = json!(started.elapsed().as_secs());
    // Straight to stderr: libtest captures eprintln! of passing tests.
    let _ = writeln!(std::io::stderr(), "postgres restart check: {summary}");

    assert!(verdict.is_clean(), "the history check failed: {verdict:#?}");
    assert_eq!(verdict.requested, TASKS, "every request was acknowledged");
    assert_eq!(verdict.succeeded_in_log, TASKS, "one success per task");
    assert!(hung.is_empty(), "workers {hung:?} did no work after the last restart");
    assert_eq!(locks_left, 0, "advisory locks are held on the database after the run");
    assert_eq!(open_transactions, 0, "transactions are left open after the run");
    assert!(
        seen_by_children > 0,
        "no call of the requester or the workers was answered Unavailable: the restarts hit nothing"
    );
    let unexpected: Vec<&String> = answers.keys().filter(|code| *code != "200" && *code != "503").collect();
    assert!(
        unexpected.is_empty(),
        "the HTTP client heard {unexpected:?} besides 200 and 503: {answers:?}"
    );
    replay_verify(&url, "postgres");
}
