//! A fuzz run of the HTTP API with schemathesis (PyPI) against its own
//! `/openapi.json`: a real `opledger serve` (anonymous reading allowed, an
//! admin token for the rest) over a small ledger, with a real `opledger
//! supervise` to run the exports it registers, every documented route
//! called with generated inputs, and no 5xx or answer outside the
//! documented schema allowed. Bounded to about two minutes.
//!
//! Without schemathesis the test is skipped, loudly; under `CI=true` it
//! fails instead (`.ci/run` installs it).

use crate::common;

use common::{binary, declare_pipeline, digest, ok_json_at, run, temp_db};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The `opledger serve` under test, killed when the test ends however it ends.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether the `st` command of schemathesis runs.
fn schemathesis_installed() -> bool {
    Command::new("st")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[test]
fn schemathesis_finds_no_server_error_and_no_answer_outside_the_documented_schema() {
    if !schemathesis_installed() {
        let message = "schemathesis is not installed (pip install schemathesis): the HTTP fuzz test did not run";
        if std::env::var("CI").is_ok_and(|value| value == "true") {
            panic!("{message}");
        }
        eprintln!("SKIPPED: {message}");
        return;
    }
    let (dir, db) = temp_db();
    let url = format!("sqlite:{}", db.display());
    declare_pipeline(&url);
    for n in 1..=3 {
        let path = format!("/photos/{n}.png");
        let media = ok_json_at(
            &url,
            &["media", "add", "--path", &path, "--digest", &digest(n), "--json"],
        );
        let media_id = media["media_id"].as_str().unwrap().to_string();
        ok_json_at(
            &url,
            &["task", "request", "--media", &media_id, "--kind", "metadata", "--json"],
        );
    }
    let tokens = dir.path().join("tokens.toml");
    let made = run(binary()
        .args(["token", "new", "--role", "admin", "--name", "fuzz", "--tokens-file"])
        .arg(&tokens));
    assert!(made.status.success(), "{}", common::describe(&made));
    let token = String::from_utf8(made.stdout).unwrap().trim().to_string();

    let mut child = binary()
        .args(["serve", "--bind", "127.0.0.1:0", "--allow-anonymous-read", "--tokens"])
        .arg(&tokens)
        .args(["--database-url", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("opledger serve starts");
    let stdout = child.stdout.take().unwrap();
    let served = Served(child);
    let mut first = String::new();
    BufReader::new(stdout).read_line(&mut first).unwrap();
    let base = first
        .trim()
        .strip_prefix("opledger serving on ")
        .unwrap_or_else(|| panic!("serve's first line names its address: {first:?}"))
        .to_string();

    // A supervisor beside the service, so that registering an export is
    // answered as in production (a 201) rather than 503 for want of one.
    let supervisor = Served(
        binary()
            .args(["supervise", "--database-url", &url])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("opledger supervise starts"),
    );
    let heartbeats = db.with_file_name("artifacts").join("supervisors");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read_dir(&heartbeats).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|entry| entry.path().extension().is_some_and(|extension| extension == "json"))
    }) {
        assert!(std::time::Instant::now() < deadline, "the supervisor never beat");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    let output = Command::new("st")
        .current_dir(dir.path())
        .args(["run", &format!("{base}/openapi.json")])
        .args(["--header", &format!("Authorization: Bearer {token}")])
        .args(["--checks", "not_a_server_error,response_schema_conformance"])
        // A claim long-poll may rightly wait its whole 30 s cap before it
        // answers, so a request has longer than that.
        .args(["--max-examples", "30", "--max-time", "100", "--request-timeout", "35"])
        .args([
            "--wait-for-schema",
            "15",
            "--seed",
            "26",
            "--generation-database",
            "none",
        ])
        .args(["--no-color", "--output-truncate", "true"])
        .output()
        .expect("schemathesis runs");
    drop(served);
    drop(supervisor);
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "schemathesis found failures:\n{report}");
    assert!(report.contains("passed"), "{report}");
}
