//! Supervised execution through the real binary: `opledger supervise`
//! processes running export children, real signals (SIGTERM, SIGKILL) and
//! real files. The children are slowed down or made stubborn by the test
//! knobs of `opledger_supervise::export::child` (set on the supervisor,
//! inherited by its children), so every test runs in seconds; the children
//! append `start`/`end` lines to a run log, so runs and overlaps are
//! counted from the children themselves.

mod common;

use common::{assert_exit, binary, declare_pipeline, describe, json, run, temp_db};
use opledger_domain::events::OperationTarget;
use opledger_domain::OperationStatus;
use opledger_engine::{CommandContext, Engine, NewOperation, TaskRequest, TaskTarget};
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use opledger_testkit::Backend;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A ledger file, its artifact directory and the run log its children write.
struct Ledger {
    _dir: tempfile::TempDir,
    db: PathBuf,
    artifacts: PathBuf,
    run_log: PathBuf,
}

fn runtime() -> tokio::runtime::Runtime {
    common::runtime()
}

async fn engine(db: &Path) -> Engine<SqliteStore> {
    let store = SqliteStore::open(SqliteConfig::from_url(db.to_str().unwrap()).unwrap())
        .await
        .expect("the ledger opens");
    Engine::open(store).await.expect("startup").0
}

impl Ledger {
    /// A ledger with `operations` plain operations, and `media` items with
    /// their `metadata` and `thumbnail` tasks requested.
    fn new(operations: usize, media: usize) -> Ledger {
        let (dir, db) = temp_db();
        declare_pipeline(db.to_str().unwrap());
        let artifacts = dir.path().join("artifacts");
        let run_log = dir.path().join("runs.log");
        let ledger = Ledger {
            _dir: dir,
            db,
            artifacts,
            run_log,
        };
        ledger.add_operations(operations);
        runtime().block_on(async {
            let engine = engine(&ledger.db).await;
            let context = CommandContext::actor("test");
            for n in 0..media {
                let media_id = engine
                    .register_media(
                        &context,
                        &format!("/photos/{n}.png"),
                        "image",
                        Some(common::digest(n as u64 + 1)),
                        Some(1),
                    )
                    .await
                    .unwrap();
                let requests = ["metadata", "thumbnail"]
                    .iter()
                    .map(|kind| TaskRequest {
                        target: TaskTarget::Media(media_id),
                        kind: kind.to_string(),
                        inputs: json!({}),
                        priority: 0,
                    })
                    .collect();
                for answer in engine.request_tasks(&context, requests).await.unwrap() {
                    answer.unwrap();
                }
            }
        });
        ledger
    }

    /// Appends `count` plain operations.
    fn add_operations(&self, count: usize) {
        runtime().block_on(async {
            let engine = engine(&self.db).await;
            let context = CommandContext::actor("test");
            for n in 0..count {
                engine
                    .create_operation(
                        &context,
                        NewOperation {
                            kind: "demo.step".to_string(),
                            target: OperationTarget {
                                path: Some(format!("/work/{n}, \"quoted\"")),
                                ..OperationTarget::default()
                            },
                            revision: None,
                            inputs: json!({"n": n}),
                            status: OperationStatus::Queued,
                            priority: 0,
                        },
                    )
                    .await
                    .unwrap();
            }
        });
    }

    fn head(&self) -> i64 {
        runtime().block_on(async { engine(&self.db).await.store().head().await.unwrap() })
    }

    fn command(&self) -> Command {
        let mut command = binary();
        command
            .arg("--database-url")
            .arg(&self.db)
            .env("OPLEDGER_ARTIFACT_DIR", &self.artifacts);
        command
    }

    /// Starts `opledger supervise` with `args` and the children's knobs.
    fn supervise(&self, args: &[&str], knobs: &[(&str, &str)]) -> Supervisor {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        // Named, so the wait below is for this supervisor's own heartbeat
        // (a killed one's file stays until somebody looks).
        let name = match args.iter().position(|arg| *arg == "--name") {
            Some(at) => args[at + 1].to_string(),
            None => format!("s{}", STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst)),
        };
        let mut command = self.command();
        command.arg("supervise").args(args);
        if !args.contains(&"--name") {
            command.args(["--name", &name]);
        }
        command
            .env("OPLEDGER_EXPORT_TEST_RUN_LOG", &self.run_log)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (name, value) in knobs {
            command.env(name, value);
        }
        let child = command.spawn().expect("the supervisor starts");
        let supervisor = Supervisor { child };
        let heartbeat = self.artifacts.join("supervisors").join(format!("{name}.json"));
        wait_for("the supervisor's first heartbeat", Duration::from_secs(20), || {
            heartbeat.exists()
        });
        supervisor
    }

    /// `export create`: (token, operation id, as_of_seq).
    fn create(&self, args: &[&str]) -> (String, String, i64) {
        let output = run(self.command().args(["export", "create", "--json"]).args(args));
        assert_exit(&output, 0);
        let created = json(&output);
        (
            created["job_token"].as_str().unwrap().to_string(),
            created["operation_id"].as_str().unwrap().to_string(),
            created["as_of_seq"].as_i64().unwrap(),
        )
    }

    fn status(&self, token: &str) -> Value {
        let output = run(self.command().args(["export", "status", token, "--json"]));
        assert_exit(&output, 0);
        json(&output)
    }

    fn wait_status(&self, token: &str, wanted: &str, within: Duration) -> Value {
        let mut last = Value::Null;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            last = self.status(token);
            if last["status"] == wanted {
                return last;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("export {token} did not become {wanted} within {within:?}; last: {last}");
    }

    fn download(&self, token: &str) -> Vec<u8> {
        let out = self
            .artifacts
            .parent()
            .unwrap()
            .join(format!("download-{}", &token[token.len() - 8..]));
        let output = run(self.command().args(["export", "download", token, "--out"]).arg(&out));
        assert_exit(&output, 0);
        std::fs::read(&out).unwrap()
    }

    fn files_in(&self, sub: &str) -> Vec<PathBuf> {
        std::fs::read_dir(self.artifacts.join(sub))
            .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
            .unwrap_or_default()
    }

    /// The children's run log: (event, pid, micros).
    fn runs(&self) -> Vec<(String, u32, i64)> {
        std::fs::read_to_string(&self.run_log)
            .unwrap_or_default()
            .lines()
            .map(|line| {
                let parts: Vec<&str> = line.split(' ').collect();
                (
                    parts[0].to_string(),
                    parts[1].parse().unwrap(),
                    parts[2].parse().unwrap(),
                )
            })
            .collect()
    }

    /// The pid of the export's child, from the supervisor's liveness file.
    fn child_pid(&self, operation: &str) -> u32 {
        let path = self.artifacts.join("jobs").join(format!("{operation}.json"));
        let live: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        live["child_pid"].as_u64().unwrap() as u32
    }
}

/// A running `opledger supervise`, SIGKILLed when dropped.
struct Supervisor {
    child: Child,
}

impl Supervisor {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not happen within {within:?}");
}

fn alive(pid: u32) -> bool {
    // A reaped process has no entry; a zombie is not running either.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn registering_an_export_while_no_supervisor_runs_exits_5_and_appends_nothing() {
    let ledger = Ledger::new(2, 0);
    let head = ledger.head();
    let output = run(ledger
        .command()
        .args(["export", "create", "--what", "operations", "--format", "csv"]));
    assert_exit(&output, 5);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no supervisor is running"),
        "{}",
        describe(&output)
    );
    assert_eq!(ledger.head(), head, "a refused registration appends nothing");
    // A supervisor that was SIGKILLed is no supervisor either.
    let mut supervisor = ledger.supervise(&[], &[]);
    supervisor.kill();
    let output = run(ledger
        .command()
        .args(["export", "create", "--what", "operations", "--format", "csv"]));
    assert_exit(&output, 5);
    assert_eq!(ledger.head(), head);
}

#[test]
fn progress_counts_equal_what_the_files_hold_and_total_is_null_while_aggregating() {
    let ledger = Ledger::new(30, 4);
    let _supervisor = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_BLOCK_MS", "1500")]);

    let (csv, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    // While the child aggregates, the size is not known.
    let deadline = Instant::now() + Duration::from_secs(10);
    let aggregating = loop {
        let status = ledger.status(&csv);
        if status["phase"] == "aggregating" && status["status"] == "running" {
            break status;
        }
        assert!(Instant::now() < deadline, "never seen aggregating: {status}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(aggregating["total"], Value::Null, "{aggregating}");
    let done = ledger.wait_status(&csv, "succeeded", Duration::from_secs(20));
    let file = lines(&ledger.download(&csv));
    let data_rows = file.len() as u64 - 1;
    // 30 plain operations, 8 tasks, and the export itself is not in its own file.
    assert_eq!(data_rows, 38, "{file:?}");
    assert_eq!(done["processed"], data_rows, "{done}");
    assert_eq!(done["total"], data_rows);
    assert_eq!(done["regular_rows"], data_rows);
    assert_eq!(done["logical_count_unit"], "rows");
    assert_eq!(
        done["artifact"]["size"],
        std::fs::metadata(
            ledger
                .artifacts
                .join("files")
                .join(format!("{}.csv", done["operation_id"].as_str().unwrap()))
        )
        .unwrap()
        .len()
    );

    let (pivot_csv, _, _) = ledger.create(&["--what", "capability_counts", "--format", "csv"]);
    let (pivot_json, _, _) = ledger.create(&["--what", "capability_counts", "--format", "json"]);
    let done_csv = ledger.wait_status(&pivot_csv, "succeeded", Duration::from_secs(20));
    let done_json = ledger.wait_status(&pivot_json, "succeeded", Duration::from_secs(20));

    let csv_lines = lines(&ledger.download(&pivot_csv));
    assert_eq!(csv_lines[0], "row_type,capability,status,count");
    let cells = csv_lines.iter().filter(|line| line.starts_with("cell,")).count() as u64;
    let subtotals = csv_lines.iter().filter(|line| line.starts_with("subtotal,")).count() as u64;
    assert_eq!(csv_lines.last().unwrap(), "total,,,8", "{csv_lines:?}");
    assert_eq!(done_csv["processed"], csv_lines.len() as u64 - 1, "{done_csv}");
    assert_eq!(done_csv["processed"], cells + subtotals + 1);
    assert_eq!(done_csv["regular_rows"], cells);
    assert_eq!(done_csv["logical_count_unit"], "rows");

    let pivot: Value = serde_json::from_slice(&ledger.download(&pivot_json)).unwrap();
    let capabilities = pivot["pivot"].as_object().unwrap();
    let pivot_cells: usize = capabilities
        .values()
        .map(|statuses| statuses.as_object().unwrap().len())
        .sum::<usize>()
        + 1;
    assert_eq!(pivot["total"], 8);
    assert_eq!(capabilities["metadata"]["subtotal"], 4);
    assert_eq!(done_json["logical_count_unit"], "pivot_cells");
    assert_eq!(done_json["processed"], pivot_cells as u64, "{done_json} {pivot}");
    assert_eq!(done_json["regular_rows"], cells);
}

#[test]
fn two_exports_at_one_position_are_byte_identical_and_events_appended_meanwhile_are_not_in_them() {
    let ledger = Ledger::new(40, 0);
    let _supervisor = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "25")]);
    let (first, _, as_of) = ledger.create(&["--what", "operations", "--format", "json"]);
    ledger.wait_status(&first, "running", Duration::from_secs(10));
    // The ledger moves on while the export runs.
    ledger.add_operations(5);
    let as_of_text = as_of.to_string();
    let (second, _, second_as_of) =
        ledger.create(&["--what", "operations", "--format", "json", "--as-of-seq", &as_of_text]);
    assert_eq!(second_as_of, as_of);
    let (later, _, later_as_of) = ledger.create(&["--what", "operations", "--format", "json"]);
    assert!(later_as_of > as_of);
    for token in [&first, &second, &later] {
        ledger.wait_status(token, "succeeded", Duration::from_secs(30));
    }
    let first_bytes = ledger.download(&first);
    assert_eq!(first_bytes, ledger.download(&second), "one position, one file");
    let first_rows = serde_json::from_slice::<Value>(&first_bytes).unwrap()["rows"]
        .as_array()
        .unwrap()
        .len();
    let later_rows = serde_json::from_slice::<Value>(&ledger.download(&later)).unwrap()["rows"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(first_rows, 40, "the five appended during the export are not in it");
    // The later one sees the five new operations and the first two exports.
    assert_eq!(later_rows, 40 + 5 + 2);
}

#[test]
fn a_cancelled_export_is_cancelled_only_after_its_child_exited_and_its_files_are_gone() {
    let ledger = Ledger::new(200, 0);
    let _supervisor = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "50")]);
    let (token, operation, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    wait_for("the child writing", Duration::from_secs(15), || {
        let status = ledger.status(&token);
        status["phase"] == "writing" && status["processed"].as_u64().unwrap_or(0) > 0
    });
    let pid = ledger.child_pid(&operation);
    assert!(
        !ledger.files_in("tmp").is_empty(),
        "the child writes its temporary file"
    );
    let output = run(ledger.command().args(["export", "cancel", &token]));
    assert_exit(&output, 0);
    // Durable at once, cancelled later.
    let asked = ledger.status(&token);
    assert_eq!(asked["cancel_requested"], true, "{asked}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = ledger.status(&token);
        if status["status"] == "cancelled" {
            assert!(!alive(pid), "cancelled is recorded only once the child is gone");
            break;
        }
        assert!(Instant::now() < deadline, "never cancelled: {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(ledger.files_in("tmp").is_empty(), "{:?}", ledger.files_in("tmp"));
    assert!(ledger.files_in("files").is_empty());
    let runs = ledger.runs();
    assert_eq!(
        runs.iter().filter(|(event, ..)| event == "end").count(),
        1,
        "the child stopped on its own: {runs:?}"
    );
}

#[test]
fn a_child_that_ignores_sigterm_is_killed_after_the_grace() {
    let ledger = Ledger::new(200, 0);
    let _supervisor = ledger.supervise(
        &["--grace-ms", "1500"],
        &[
            ("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "50"),
            ("OPLEDGER_EXPORT_TEST_IGNORE_TERM", "1"),
        ],
    );
    let (token, operation, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    wait_for("the child writing", Duration::from_secs(15), || {
        ledger.status(&token)["phase"] == "writing"
    });
    let pid = ledger.child_pid(&operation);
    let asked_at = Instant::now();
    assert_exit(&run(ledger.command().args(["export", "cancel", &token])), 0);
    let cancelled = ledger.wait_status(&token, "cancelled", Duration::from_secs(15));
    assert!(
        asked_at.elapsed() >= Duration::from_millis(1500),
        "{:?}: SIGKILL came only after the grace",
        asked_at.elapsed()
    );
    assert!(!alive(pid));
    assert_eq!(cancelled["reason"], "cancelled");
    let runs = ledger.runs();
    assert!(
        runs.iter().all(|(event, ..)| event == "start"),
        "a killed child writes no end: {runs:?}"
    );
    assert!(ledger.files_in("tmp").is_empty());
}

#[test]
fn an_export_past_its_run_time_fails_with_timeout_and_leaves_no_file() {
    let ledger = Ledger::new(200, 0);
    let _supervisor = ledger.supervise(&["--max-run-secs", "1"], &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "50")]);
    let (token, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let failed = ledger.wait_status(&token, "failed_terminal", Duration::from_secs(15));
    assert_eq!(failed["reason"], "timeout", "{failed}");
    assert_eq!(failed["artifact"], Value::Null);
    assert!(ledger.files_in("tmp").is_empty());
    assert!(ledger.files_in("files").is_empty());
    let output = run(ledger
        .command()
        .args(["export", "download", &token, "--out", "/dev/null"]));
    assert_exit(&output, 3);
}

#[test]
fn the_size_and_storage_limits_each_fail_an_export_with_their_reason() {
    let ledger = Ledger::new(50, 0);
    let mut supervisor = ledger.supervise(&["--max-artifact-bytes", "1000"], &[]);
    let (too_big, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let failed = ledger.wait_status(&too_big, "failed_terminal", Duration::from_secs(15));
    assert_eq!(failed["reason"], "size_limit", "{failed}");
    assert!(ledger.files_in("tmp").is_empty() && ledger.files_in("files").is_empty());
    supervisor.kill();

    // One export fits the storage; the second would pass it.
    let _supervisor = ledger.supervise(&["--max-storage-bytes", "11000"], &[]);
    let (fits, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let done = ledger.wait_status(&fits, "succeeded", Duration::from_secs(15));
    let size = done["artifact"]["size"].as_u64().unwrap();
    assert!(size > 5_500 && size < 11_000, "the test's sizes hold: {size}");
    let (full, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let failed = ledger.wait_status(&full, "failed_terminal", Duration::from_secs(15));
    assert_eq!(failed["reason"], "storage_full", "{failed}");
    assert_eq!(ledger.files_in("files").len(), 1, "only the first file is kept");
    assert!(ledger.files_in("tmp").is_empty());
}

#[test]
fn a_job_whose_supervisor_was_killed_is_failed_by_the_next_supervisor_and_never_runs_again() {
    let ledger = Ledger::new(200, 0);
    let mut first = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "50")]);
    let (token, operation, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    wait_for("the child writing", Duration::from_secs(15), || {
        ledger.status(&token)["phase"] == "writing"
    });
    let pid = ledger.child_pid(&operation);
    first.kill();
    // The child dies with its supervisor.
    wait_for("the orphaned child to die", Duration::from_secs(5), || !alive(pid));
    assert_eq!(ledger.status(&token)["status"], "running", "nobody has noticed yet");

    let _second = ledger.supervise(&[], &[]);
    let failed = ledger.wait_status(&token, "failed_terminal", Duration::from_secs(15));
    assert_eq!(failed["reason"], "supervisor_lost", "{failed}");
    assert!(
        ledger.files_in("tmp").is_empty(),
        "the leftover temporary file is removed"
    );
    assert!(ledger.files_in("files").is_empty());
    // Given time to (wrongly) run it again, the second supervisor does not.
    std::thread::sleep(Duration::from_millis(1500));
    let starts = ledger.runs().iter().filter(|(event, ..)| event == "start").count();
    assert_eq!(starts, 1, "the job ran exactly once");
}

#[test]
fn heartbeats_come_about_every_second_while_the_child_blocks_for_five_seconds() {
    let ledger = Ledger::new(3, 0);
    // Blocked 6.5 s from its start: watched for 4.5 s of it, after the
    // child's first report.
    let _supervisor = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_BLOCK_MS", "6500")]);
    let (token, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    ledger.wait_status(&token, "running", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(700));
    let mut beats: Vec<String> = Vec::new();
    let mut updated: Vec<String> = Vec::new();
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_millis(4500) {
        let status = ledger.status(&token);
        assert_eq!(status["phase"], "aggregating", "the child is still blocked: {status}");
        if let Some(beat) = status["heartbeat_at"].as_str() {
            if beats.last().map(String::as_str) != Some(beat) {
                beats.push(beat.to_string());
            }
        }
        let update = status["updated_at"].as_str().unwrap().to_string();
        if !updated.contains(&update) {
            updated.push(update);
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(beats.len() >= 4, "heartbeats while the child blocked: {beats:?}");
    let times: Vec<i64> = beats
        .iter()
        .map(|beat| opledger_domain::Timestamp::parse(beat).unwrap().as_micros())
        .collect();
    for pair in times.windows(2) {
        // About every second; the margin is for a loaded machine.
        assert!(pair[1] - pair[0] <= 2_500_000, "a gap between heartbeats: {beats:?}");
    }
    assert_eq!(
        updated.len(),
        1,
        "no progress was written while the child blocked: {updated:?}"
    );
    ledger.wait_status(&token, "succeeded", Duration::from_secs(10));
}

#[test]
fn three_jobs_on_two_slots_never_run_more_than_two_children_at_once() {
    let ledger = Ledger::new(30, 0);
    // Two supervisors of the same directory share its two slots.
    let knobs = [("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "40")];
    let _a = ledger.supervise(&["--slots", "2", "--name", "a"], &knobs);
    let _b = ledger.supervise(&["--slots", "2", "--name", "b"], &knobs);
    let tokens: Vec<String> = (0..3)
        .map(|_| ledger.create(&["--what", "operations", "--format", "csv"]).0)
        .collect();
    for token in &tokens {
        ledger.wait_status(token, "succeeded", Duration::from_secs(30));
    }
    let mut edges: Vec<(i64, i32)> = ledger
        .runs()
        .iter()
        .map(|(event, _, at)| (*at, if event == "start" { 1 } else { -1 }))
        .collect();
    assert_eq!(edges.len(), 6, "three children started and ended");
    // Ends sort before starts at the same instant.
    edges.sort();
    let mut running = 0;
    let mut most = 0;
    for (_, change) in edges {
        running += change;
        most = most.max(running);
    }
    assert_eq!(most, 2, "two slots: two children at once, never three");
}

#[test]
fn an_expired_artifact_is_swept_and_its_download_refused() {
    let ledger = Ledger::new(5, 0);
    let _supervisor = ledger.supervise(&["--expiry-secs", "1", "--patrol-secs", "1"], &[]);
    let (token, _, _) = ledger.create(&["--what", "operations", "--format", "json"]);
    let done = ledger.wait_status(&token, "succeeded", Duration::from_secs(15));
    assert!(done["artifact"]["size"].as_u64().unwrap() > 0, "{done}");
    wait_for("the patrol to remove the expired file", Duration::from_secs(10), || {
        ledger.files_in("files").is_empty()
    });
    let expired = ledger.status(&token);
    assert_eq!(expired["expired"], true, "{expired}");
    assert_eq!(expired["artifact"], Value::Null);
    let output = run(ledger
        .command()
        .args(["export", "download", &token, "--out", "/dev/null"]));
    assert_exit(&output, 4);
}

#[test]
fn a_job_queued_past_the_wait_limit_fails_with_queue_timeout_and_never_runs() {
    let ledger = Ledger::new(100, 0);
    let _supervisor = ledger.supervise(
        &["--slots", "1", "--max-queued-secs", "1", "--patrol-secs", "1"],
        &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "40")],
    );
    let (long, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    ledger.wait_status(&long, "running", Duration::from_secs(10));
    let (waiting, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let failed = ledger.wait_status(&waiting, "failed_terminal", Duration::from_secs(10));
    assert_eq!(failed["reason"], "queue_timeout", "{failed}");
    ledger.wait_status(&long, "succeeded", Duration::from_secs(20));
    let starts = ledger.runs().iter().filter(|(event, ..)| event == "start").count();
    assert_eq!(starts, 1, "only the first job ran");
}

#[test]
fn a_tampered_token_is_refused_and_a_queued_export_is_cancelled_at_once() {
    let ledger = Ledger::new(100, 0);
    // One slot, held by a slow first job: the second waits in the queue.
    let _supervisor = ledger.supervise(&["--slots", "1"], &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "40")]);
    let (running, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    ledger.wait_status(&running, "running", Duration::from_secs(10));
    let (queued, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    assert_eq!(ledger.status(&queued)["status"], "queued");

    let last = queued.chars().last().unwrap();
    let tampered = format!("{}{}", &queued[..queued.len() - 1], if last == '0' { '1' } else { '0' });
    let output = run(ledger.command().args(["export", "status", &tampered]));
    assert_exit(&output, 2);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("is not valid here"),
        "{}",
        describe(&output)
    );

    let output = run(ledger.command().args(["export", "cancel", &queued, "--json"]));
    assert_exit(&output, 0);
    assert_eq!(json(&output)["status"], "cancelled", "a queued export stops at once");
    assert_exit(&run(ledger.command().args(["export", "cancel", &running])), 0);
    ledger.wait_status(&running, "cancelled", Duration::from_secs(10));
    assert!(ledger.runs().iter().filter(|(event, ..)| event == "start").count() == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_two_supervisors_share_one_artifact_directory_and_an_export_runs_once() {
    // A database of its own on the test server (opledger-testkit: the loud
    // skip without a server, dropped when the test ends).
    let Some(database) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let url = database.url();
    let (_, operation) = common::ledger_with_a_task(&url);
    let dir = tempfile::tempdir().unwrap();
    let artifacts = dir.path().join("artifacts");
    let run_log = dir.path().join("runs.log");
    let on_postgres = |args: &[&str]| {
        let mut command = binary();
        command.arg("--database-url").arg(&url).args(args);
        command
    };
    // A PostgreSQL ledger has no file to put artifacts beside.
    let output = run(&mut on_postgres(&[
        "export",
        "create",
        "--what",
        "operations",
        "--format",
        "csv",
    ]));
    assert_exit(&output, 2);

    let start = |name: &str| Supervisor {
        child: on_postgres(&["supervise", "--name", name])
            .env("OPLEDGER_ARTIFACT_DIR", &artifacts)
            .env("OPLEDGER_EXPORT_TEST_RUN_LOG", &run_log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    };
    let _a = start("a");
    let _b = start("b");
    let beats = artifacts.join("supervisors");
    wait_for("both supervisors' heartbeats", Duration::from_secs(20), || {
        std::fs::read_dir(&beats).is_ok_and(|entries| {
            entries
                .flatten()
                .filter(|entry| entry.path().extension().is_some_and(|extension| extension == "json"))
                .count()
                == 2
        })
    });
    let with_dir = |args: &[&str]| {
        let mut command = on_postgres(args);
        command.env("OPLEDGER_ARTIFACT_DIR", &artifacts);
        run(&mut command)
    };
    let created = with_dir(&["export", "create", "--what", "operations", "--format", "csv", "--json"]);
    assert_exit(&created, 0);
    let token = json(&created)["job_token"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = json(&with_dir(&["export", "status", &token, "--json"]));
        if status["status"] == "succeeded" {
            assert_eq!(status["processed"], 1, "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "never succeeded: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = dir.path().join("ops.csv");
    assert_exit(
        &with_dir(&["export", "download", &token, "--out", out.to_str().unwrap()]),
        0,
    );
    let file = std::fs::read_to_string(&out).unwrap();
    assert!(file.lines().nth(1).unwrap().starts_with(&operation), "{file}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let starts = std::fs::read_to_string(&run_log)
        .unwrap()
        .lines()
        .filter(|line| line.starts_with("start"))
        .count();
    assert_eq!(starts, 1, "one of the two supervisors ran it, once");
}
