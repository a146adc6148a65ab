//! What the supervised-execution tests share: a ledger with its artifact
//! directory and the children's run log, `opledger supervise` processes
//! (SIGKILLed when dropped), and what the children and files say.

use crate::common::{assert_exit, binary, declare_pipeline, json, run, temp_db};
use opledger_domain::events::OperationTarget;
use opledger_domain::OperationStatus;
use opledger_engine::{CommandContext, Engine, NewOperation, TaskRequest, TaskTarget};
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A ledger file, its artifact directory and the run log its children write.
pub struct Ledger {
    _dir: tempfile::TempDir,
    pub db: PathBuf,
    pub artifacts: PathBuf,
    pub run_log: PathBuf,
}

pub fn runtime() -> tokio::runtime::Runtime {
    crate::common::runtime()
}

pub async fn engine(db: &Path) -> Engine<SqliteStore> {
    let store = SqliteStore::open(SqliteConfig::from_url(db.to_str().unwrap()).unwrap())
        .await
        .expect("the ledger opens");
    Engine::open(store).await.expect("startup").0
}

impl Ledger {
    /// A ledger with `operations` plain operations, and `media` items with
    /// their `metadata` and `thumbnail` tasks requested.
    pub fn new(operations: usize, media: usize) -> Ledger {
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
                        Some(crate::common::digest(n as u64 + 1)),
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
    pub fn add_operations(&self, count: usize) {
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

    pub fn head(&self) -> i64 {
        runtime().block_on(async { engine(&self.db).await.store().head().await.unwrap() })
    }

    pub fn command(&self) -> Command {
        let mut command = binary();
        command
            .arg("--database-url")
            .arg(&self.db)
            .env("OPLEDGER_ARTIFACT_DIR", &self.artifacts);
        command
    }

    /// Starts `opledger supervise` with `args` and the children's knobs.
    pub fn supervise(&self, args: &[&str], knobs: &[(&str, &str)]) -> Supervisor {
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
    pub fn create(&self, args: &[&str]) -> (String, String, i64) {
        let output = run(self.command().args(["export", "create", "--json"]).args(args));
        assert_exit(&output, 0);
        let created = json(&output);
        (
            created["job_token"].as_str().unwrap().to_string(),
            created["operation_id"].as_str().unwrap().to_string(),
            created["as_of_seq"].as_i64().unwrap(),
        )
    }

    pub fn status(&self, token: &str) -> Value {
        let output = run(self.command().args(["export", "status", token, "--json"]));
        assert_exit(&output, 0);
        json(&output)
    }

    pub fn wait_status(&self, token: &str, wanted: &str, within: Duration) -> Value {
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

    pub fn download(&self, token: &str) -> Vec<u8> {
        let out = self
            .artifacts
            .parent()
            .unwrap()
            .join(format!("download-{}", &token[token.len() - 8..]));
        let output = run(self.command().args(["export", "download", token, "--out"]).arg(&out));
        assert_exit(&output, 0);
        std::fs::read(&out).unwrap()
    }

    pub fn files_in(&self, sub: &str) -> Vec<PathBuf> {
        std::fs::read_dir(self.artifacts.join(sub))
            .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
            .unwrap_or_default()
    }

    /// The children's run log: (event, pid, micros).
    pub fn runs(&self) -> Vec<(String, u32, i64)> {
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
    pub fn child_pid(&self, operation: &str) -> u32 {
        let path = self.artifacts.join("jobs").join(format!("{operation}.json"));
        let live: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        live["child_pid"].as_u64().unwrap() as u32
    }
}

/// A running `opledger supervise`, SIGKILLed when dropped.
pub struct Supervisor {
    pub child: Child,
}

impl Supervisor {
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not happen within {within:?}");
}

pub fn alive(pid: u32) -> bool {
    // A reaped process has no entry; a zombie is not running either.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

pub fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}
