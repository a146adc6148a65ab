//! The support and operator surface through the real binary on real
//! SQLite files: `describe` (header, one-sentence why, history; JSON),
//! `timeline` as a history in the reader's zone (golden, TZ=UTC),
//! `timeline --follow` and `status --watch` as long-running processes that
//! print what is appended and end with exit 0 at SIGINT, and `review
//! resolve --all` (dry run, filters, limit, exit codes). Every scenario
//! ends with `replay --verify` identical.

use crate::common;

use common::{assert_exit, declare_pipeline, describe, json, opledger, run, temp_db};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

const THUMBNAIL_INPUTS: &str = r#"{"max_side": 256, "format": "png"}"#;

/// A temporary ledger with the pipeline declared; commands run with TZ=UTC.
struct Ledger {
    _dir: tempfile::TempDir,
    db: PathBuf,
}

impl Ledger {
    fn new() -> Self {
        let (dir, db) = temp_db();
        declare_pipeline(db.to_str().expect("a UTF-8 path"));
        Ledger { _dir: dir, db }
    }

    fn dir(&self) -> &Path {
        self.db.parent().unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = opledger(self.dir());
        command.args(args).arg("--database-url").arg(&self.db).env("TZ", "UTC");
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        run(&mut self.command(args))
    }

    fn ok(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let output = self.run(&args);
        assert_exit(&output, 0);
        json(&output)
    }

    fn text(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert_exit(&output, 0);
        String::from_utf8(output.stdout).expect("UTF-8")
    }

    fn head(&self) -> i64 {
        self.ok(&["status"])["head"].as_i64().expect("a head")
    }

    fn add_media(&self, path: &str) -> String {
        let digest = format!("sha256:{:064x}", path.len() * 7919);
        let added = self.ok(&["media", "add", "--path", path, "--digest", &digest]);
        added["media_id"].as_str().unwrap().to_string()
    }

    fn request_thumbnail(&self, media: &str) -> String {
        let requested = self.ok(&[
            "task",
            "request",
            "--media",
            media,
            "--kind",
            "thumbnail",
            "--inputs",
            THUMBNAIL_INPUTS,
        ]);
        requested["operation_id"].as_str().unwrap().to_string()
    }

    fn claim(&self, worker: &str) -> String {
        let claim = self.ok(&[
            "task",
            "claim",
            "--kind",
            "thumbnail",
            "--worker",
            worker,
            "--lease",
            "60",
        ]);
        claim["claim_token"].as_str().expect("a claim").to_string()
    }

    fn assert_replay_verifies(&self) {
        assert_exit(&self.run(&["replay", "--verify"]), 0);
    }
}

/// A long-running command's stdout, line by line, as it prints it.
struct Running {
    child: Child,
    lines: Receiver<String>,
}

impl Running {
    fn start(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Running { child, lines }
    }

    /// Reads lines until one satisfies `wanted`; fails after 20 s.
    fn until(&self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(20)) {
                Ok(line) if wanted(&line) => return line,
                Ok(_) => continue,
                Err(error) => panic!("no line with {what} within 20 s ({error})"),
            }
        }
    }

    /// Sends SIGINT and waits for the exit code.
    fn interrupt(mut self) -> Option<i32> {
        let signalled = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(signalled.success());
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().unwrap() {
                if status.code() != Some(0) {
                    let mut stderr = String::new();
                    std::io::Read::read_to_string(self.child.stderr.as_mut().unwrap(), &mut stderr).ok();
                    eprintln!("stderr: {stderr}");
                }
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child.kill().ok();
        panic!("the process did not end within 10 s of SIGINT");
    }
}

/// A failed task's operation id, with a progress report and a retry on
/// its timeline.
fn failed_once(ledger: &Ledger) -> String {
    let media = ledger.add_media("/photos/beach.jpg");
    let operation = ledger.request_thumbnail(&media);
    let token = ledger.claim("py-1");
    ledger.ok(&[
        "task",
        "progress",
        &token,
        "--phase",
        "resizing",
        "--processed",
        "10",
        "--total",
        "40",
    ]);
    ledger.ok(&["task", "fail", &token, "--error", "decoder crashed", "--worker", "py-1"]);
    operation
}

#[test]
fn describe_prints_the_header_the_why_and_the_history() {
    let ledger = Ledger::new();
    let operation = failed_once(&ledger);
    let text = ledger.text(&["describe", &operation]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(&format!("thumbnail {operation} on media ")),
        "{text}"
    );
    for field in [
        "  path:       /photos/beach.jpg",
        "  status:     retry_waiting",
        "  attempts:   1 claimed; failed 1 of 5; interrupted 0 of 3",
        "  claim:      none",
        "  last error: decoder crashed",
    ] {
        assert!(lines.contains(&field), "{field:?} missing from:\n{text}");
    }
    let why = lines.iter().find(|line| line.starts_with("why: ")).expect("a why line");
    assert!(
        why.starts_with("why: waiting for a retry at ") && why.ends_with("(attempt 1 of 5 failed: decoder crashed)"),
        "{why}"
    );
    assert!(text.contains("failed: decoder crashed"), "{text}");
    assert!(
        text.lines()
            .any(|line| line.ends_with("(UTC)") || line.ends_with("(+00:00)")),
        "{text}"
    );

    let described = ledger.ok(&["describe", &operation]);
    assert_eq!(described["status"], "retry_waiting");
    assert_eq!(described["why"]["standing"], "retry_waiting");
    assert_eq!(described["attempts"]["failures"], 1);
    assert_eq!(described["attempts"]["max_attempts"], 5);
    assert_eq!(described["attempts"]["max_interruptions"], 3);
    assert!(described["sentence"]
        .as_str()
        .unwrap()
        .starts_with("waiting for a retry at "));
    let timeline = described["timeline"].as_array().unwrap();
    assert_eq!(timeline.len(), 5, "{described}");
    assert!(
        timeline[1]["payload"]["claim_token"].is_string(),
        "the JSON timeline is whole"
    );
    ledger.assert_replay_verifies();
}

#[test]
fn describe_refuses_a_bad_id_with_2_and_an_unknown_one_with_4() {
    let ledger = Ledger::new();
    let bad = ledger.run(&["describe", "not-an-id"]);
    assert_exit(&bad, 2);
    assert!(bad.stdout.is_empty(), "{}", describe(&bad));
    let unknown = ledger.run(&["describe", "01900000-0000-7000-8000-000000000000"]);
    assert_exit(&unknown, 4);
    assert_exit(&ledger.run(&["timeline", "01900000-0000-7000-8000-000000000000"]), 4);
}

#[test]
fn the_plain_timeline_reads_as_a_history_without_claim_tokens() {
    let ledger = Ledger::new();
    let operation = failed_once(&ledger);
    let events = ledger.ok(&["timeline", &operation]);
    let token = events[1]["payload"]["claim_token"].as_str().unwrap().to_string();
    let plain = ledger.text(&["timeline", &operation]);
    assert!(!plain.contains(&token), "{plain}");
    let verbose = ledger.text(&["timeline", &operation, "--verbose"]);
    assert!(verbose.contains(&token), "--verbose shows every field: {verbose}");
    insta::with_settings!({filters => vec![
        (r"\d{4}-\d{2}-\d{2}", "[date]"),
        (r"\d{2}:\d{2}:\d{2}", "[time]"),
        (r"\+[0-9.]+ (s|min|h|d)( [0-9]+ (s|min|h))?", "+[step]"),
        (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "[id]"),
        (r"on media [0-9a-f]{8}", "on media [id]"),
        (r"revision [0-9a-f]{8}", "revision [rev]"),
        (r"jitter [0-9.]+ s", "jitter [jitter]"),
        (r" +", " "),
    ]}, {
        insta::assert_snapshot!(plain);
    });
    ledger.assert_replay_verifies();
}

#[test]
fn timeline_follow_prints_each_new_event_as_it_is_appended_and_sigint_ends_it_with_0() {
    let ledger = Ledger::new();
    let media = ledger.add_media("/photos/beach.jpg");
    let operation = ledger.request_thumbnail(&media);
    let follow = Running::start(ledger.command(&["timeline", &operation, "--follow"]));
    follow.until("the creation", |line| line.contains("created: thumbnail"));
    let token = ledger.claim("py-7");
    follow.until("the claim", |line| line.contains("claimed by py-7"));
    ledger.ok(&["task", "complete", &token, "--output", r#"{"path":"/t/beach.png"}"#]);
    let succeeded = follow.until("the success", |line| line.contains("succeeded"));
    assert!(succeeded.contains(r#"{"path":"/t/beach.png"}"#), "{succeeded}");
    assert_eq!(follow.interrupt(), Some(0));

    // With --json: one whole envelope a line, the old ones first.
    let follow = Running::start(ledger.command(&["timeline", &operation, "--follow", "--json"]));
    let mut types = Vec::new();
    for _ in 0..3 {
        let line = follow.until("an envelope", |_| true);
        let envelope: Value = serde_json::from_str(&line).expect("a JSON line");
        types.push(envelope["event_type"].as_str().unwrap().to_string());
    }
    assert_eq!(types, ["operation_created", "operation_claimed", "operation_succeeded"]);
    ledger.ok(&[
        "task",
        "request",
        "--media",
        &media,
        "--kind",
        "thumbnail",
        "--inputs",
        r#"{"max_side": 128, "format": "png"}"#,
    ]);
    let line = follow.until("the new request", |_| true);
    let envelope: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(envelope["event_type"], "operation_revision_requested");
    assert_eq!(envelope["stream_version"], 4);
    assert_eq!(follow.interrupt(), Some(0));
    ledger.assert_replay_verifies();
}

#[test]
fn status_watch_prints_again_once_the_ledger_changed_and_sigint_ends_it_with_0() {
    let ledger = Ledger::new();
    let watch = Running::start(ledger.command(&["status", "--watch", "--interval", "0.1", "--json"]));
    let first: Value = serde_json::from_str(&watch.until("a first report", |_| true)).unwrap();
    assert_eq!(first["media"], 0);
    ledger.add_media("/photos/beach.jpg");
    let second: Value = serde_json::from_str(&watch.until("a second report", |_| true)).unwrap();
    assert_eq!(second["media"], 1);
    assert!(second["head"].as_i64() > first["head"].as_i64());
    assert_eq!(watch.interrupt(), Some(0));

    let plain = Running::start(ledger.command(&["status", "--watch"]));
    plain.until("the summary", |line| line.starts_with("media: 1 items"));
    assert_eq!(plain.interrupt(), Some(0));
    assert_exit(&ledger.run(&["status", "--watch", "--interval", "0"]), 2);
    assert_exit(&ledger.run(&["status", "--interval", "1"]), 2);
}

/// Three thumbnails and one metadata task failed for good: four open entries.
fn four_failures(ledger: &Ledger) -> Vec<String> {
    let mut operations = Vec::new();
    for n in 0..3 {
        let media = ledger.add_media(&format!("/photos/{n}.jpg"));
        operations.push(ledger.request_thumbnail(&media));
        let token = ledger.claim("py-1");
        ledger.ok(&["task", "fail", &token, "--error", "decoder crashed", "--terminal"]);
    }
    let media = ledger.add_media("/photos/other.jpg");
    ledger.ok(&["task", "request", "--media", &media, "--kind", "metadata"]);
    let claim = ledger.ok(&[
        "task", "claim", "--kind", "metadata", "--worker", "py-1", "--lease", "60",
    ]);
    ledger.ok(&[
        "task",
        "fail",
        claim["claim_token"].as_str().unwrap(),
        "--error",
        "bad",
        "--terminal",
    ]);
    operations
}

#[test]
fn review_resolve_all_dry_runs_then_resolves_the_matching_entries_one_action_each() {
    let ledger = Ledger::new();
    let thumbnails = four_failures(&ledger);
    let head = ledger.head();
    let planned = ledger.ok(&[
        "review",
        "resolve",
        "--all",
        "--kind",
        "thumbnail",
        "--action",
        "dismiss",
        "--dry-run",
    ]);
    assert_eq!(planned["dry_run"], true);
    assert_eq!(
        (planned["matched"].as_i64(), planned["resolved"].as_i64()),
        (Some(3), Some(0))
    );
    assert_eq!(planned["entries"].as_array().unwrap().len(), 3);
    assert!(planned["skipped"].as_array().unwrap().is_empty());
    assert_eq!(ledger.head(), head, "a dry run appends nothing");
    let text = ledger.text(&["review", "resolve", "--all", "--action", "retry", "--dry-run"]);
    assert!(
        text.starts_with("dry run: would retry 4 of 4 matching open entries"),
        "{text}"
    );
    assert!(text.contains("/photos/0.jpg"), "{text}");

    let done = ledger.ok(&[
        "review",
        "resolve",
        "--all",
        "--kind",
        "thumbnail",
        "--reason-code",
        "failed_terminal",
        "--action",
        "dismiss",
        "--reason",
        "known bad scans",
        "--limit",
        "2",
    ]);
    assert_eq!(done["dry_run"], false);
    assert_eq!(
        (
            done["matched"].as_i64(),
            done["resolved"].as_i64(),
            done["remaining"].as_i64()
        ),
        (Some(3), Some(2), Some(1))
    );
    assert!(done["skipped"].as_array().unwrap().is_empty());
    assert_eq!(ledger.head(), head + 2, "one review_resolved event per entry");
    let resolved: Vec<Value> = thumbnails
        .iter()
        .flat_map(|operation| ledger.ok(&["timeline", operation]).as_array().unwrap().clone())
        .filter(|event| event["event_type"] == "review_resolved")
        .collect();
    assert_eq!(resolved.len(), 2);
    for event in &resolved {
        assert_eq!(event["actor"], "cli");
        assert_eq!(event["payload"]["reason"], "known bad scans");
    }
    assert_eq!(ledger.ok(&["review", "list"])["items"].as_array().unwrap().len(), 2);
    ledger.assert_replay_verifies();
}

#[test]
fn review_resolve_needs_an_entry_or_all_and_its_filters_need_all() {
    let ledger = Ledger::new();
    let head = ledger.head();
    for args in [
        vec!["review", "resolve", "--action", "dismiss"],
        vec!["review", "resolve", "12", "--all", "--action", "dismiss"],
        vec!["review", "resolve", "12", "--kind", "thumbnail", "--action", "dismiss"],
        vec!["review", "resolve", "12", "--dry-run", "--action", "dismiss"],
        vec!["review", "resolve", "--all", "--revision", "abc", "--action", "retry"],
        vec![
            "review",
            "resolve",
            "--all",
            "--reason-code",
            "bogus",
            "--action",
            "dismiss",
        ],
        vec!["review", "resolve", "--all", "--limit", "0", "--action", "dismiss"],
    ] {
        let output = ledger.run(&args);
        assert_exit(&output, 2);
        assert!(output.stdout.is_empty(), "{args:?}: {}", describe(&output));
    }
    let unknown_batch = ledger.run(&[
        "review",
        "resolve",
        "--all",
        "--batch",
        "01900000-0000-7000-8000-000000000000",
        "--action",
        "dismiss",
    ]);
    assert_exit(&unknown_batch, 4);
    assert_eq!(ledger.head(), head);
}
