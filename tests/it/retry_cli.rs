//! `--request-id` through the real binary on a real SQLite file: a shell
//! worker whose answer was lost runs the same command again with the same
//! id and gets the first run's result, with nothing appended twice; the
//! same id for another command exits 3; a bad id exits 2.

use crate::common;

use common::{assert_exit, declare_pipeline, describe, json, opledger, run, temp_db};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Output;

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

    fn run(&self, args: &[&str]) -> Output {
        run(opledger(self.db.parent().unwrap())
            .args(args)
            .arg("--json")
            .arg("--database-url")
            .arg(&self.db))
    }

    fn ok(&self, args: &[&str]) -> Value {
        let output = self.run(args);
        assert_exit(&output, 0);
        json(&output)
    }

    fn head(&self) -> i64 {
        self.ok(&["status"])["head"].as_i64().expect("head is a number")
    }
}

fn text(value: &Value) -> String {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value}"))
        .to_string()
}

#[test]
fn a_command_run_again_with_its_request_id_prints_the_first_result_and_appends_nothing() {
    let ledger = Ledger::new();
    let added = ledger.ok(&[
        "media",
        "add",
        "--path",
        "/photos/a.jpg",
        "--digest",
        &format!("sha256:{}", "a".repeat(64)),
    ]);
    let media = text(&added["media_id"]);
    let request = [
        "task",
        "request",
        "--media",
        &media,
        "--kind",
        "thumbnail",
        "--inputs",
        r#"{"max_side":256,"format":"png"}"#,
        "--request-id",
        "req-1",
    ];
    let requested = ledger.ok(&request);
    assert_eq!(requested["created"], true);
    let head = ledger.head();
    // The first answer again, `created` included: the request is not re-decided.
    assert_eq!(ledger.ok(&request), requested);
    assert_eq!(ledger.head(), head);

    let claim = [
        "task",
        "claim",
        "--kind",
        "thumbnail",
        "--worker",
        "sh-1",
        "--lease",
        "60",
        "--request-id",
        "claim-1",
    ];
    let claimed = ledger.ok(&claim);
    let token = text(&claimed["claim_token"]);
    let head = ledger.head();
    let again = ledger.ok(&claim);
    assert_eq!(again, claimed, "the retried claim prints the same claim");
    assert_eq!(ledger.head(), head);

    let complete = [
        "task",
        "complete",
        &token,
        "--output",
        r#"{"path":"/t/a.png"}"#,
        "--request-id",
        "done-1",
    ];
    let completed = ledger.ok(&complete);
    assert_eq!(completed["status"], "succeeded");
    let head = ledger.head();
    // Without an id the retry would be a stale claim (exit 3); with it, the first answer.
    assert_eq!(ledger.ok(&complete), completed);
    assert_eq!(ledger.head(), head);
    let without_id = ledger.run(&["task", "complete", &token, "--output", r#"{"path":"/t/a.png"}"#]);
    assert_exit(&without_id, 3);

    // The same id for another command: exit 3, naming the id, nothing written.
    let reused = ledger.run(&[
        "task",
        "cancel",
        &text(&requested["operation_id"]),
        "--request-id",
        "done-1",
    ]);
    assert_exit(&reused, 3);
    assert!(
        String::from_utf8_lossy(&reused.stderr).contains("done-1"),
        "{}",
        describe(&reused)
    );
    assert_eq!(ledger.head(), head);

    // A bad id is refused before anything runs.
    let bad = ledger.run(&[
        "task",
        "cancel",
        &text(&requested["operation_id"]),
        "--request-id",
        "has space",
    ]);
    assert_exit(&bad, 2);
    assert_eq!(ledger.head(), head);
    assert_exit(&ledger.run(&["replay", "--verify"]), 0);
}
