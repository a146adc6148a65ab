//! The command line on PostgreSQL, selected by the `--database-url` scheme:
//! a shell worker drives a task through its lifecycle on a fresh database of
//! the server named by `OPLEDGER_TEST_POSTGRES_URL` (opledger-testkit; default
//! `postgres://root@127.0.0.1:5432/test`), and `replay --verify` passes.
//! Without a server the test says so loudly and skips; under `CI=true` it
//! fails instead.

use crate::common;

use common::{binary, declare_pipeline};
use opledger_testkit::Backend;
use serde_json::Value;
use std::process::Output;

fn run(url: &str, args: &[&str]) -> Output {
    common::run(binary().arg("--database-url").arg(url).args(args))
}

fn ok_json(url: &str, args: &[&str]) -> Value {
    let output = run(url, args);
    assert!(
        output.status.success(),
        "opledger {args:?}: exit {:?}\n{}{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_url_selects_the_postgres_backend_and_a_shell_worker_completes_a_task() {
    // A database of its own on the test server (opledger-testkit: the loud
    // skip without a server, dropped when the test ends).
    let Some(database) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let url = database.url();
    declare_pipeline(&url);
    let status = ok_json(&url, &["status", "--json"]);
    assert_eq!(status["backend"], "postgres");
    let media = run(
        &url,
        &[
            "media",
            "add",
            "--path",
            "/photos/pg.png",
            "--digest",
            &common::digest(0xab),
        ],
    );
    assert!(media.status.success(), "{}", String::from_utf8_lossy(&media.stderr));
    let media_id = String::from_utf8_lossy(&media.stdout).trim().to_string();
    let requested = ok_json(
        &url,
        &[
            "task",
            "request",
            "--media",
            &media_id,
            "--kind",
            "thumbnail",
            "--inputs",
            r#"{"max_side":256,"format":"png"}"#,
            "--json",
        ],
    );
    assert_eq!(requested["created"], true);
    let claim = ok_json(
        &url,
        &[
            "task",
            "claim",
            "--kind",
            "thumbnail",
            "--worker",
            "pg-worker",
            "--lease",
            "60",
            "--json",
        ],
    );
    let token = claim["claim_token"].as_str().expect("a claim").to_string();
    assert_eq!(claim["revision"], requested["requested_revision"]);
    let beat = ok_json(&url, &["task", "heartbeat", &token, "--json"]);
    assert_eq!(beat["cancel_requested"], false);
    let done = ok_json(
        &url,
        &["task", "complete", &token, "--output", r#"{"path":"t.png"}"#, "--json"],
    );
    assert_eq!(done["status"], "succeeded");
    // The token is spent: a second completion is a conflict (exit 3).
    assert_eq!(run(&url, &["task", "complete", &token]).status.code(), Some(3));
    let shown = ok_json(
        &url,
        &["task", "show", "--media", &media_id, "--kind", "thumbnail", "--json"],
    );
    assert_eq!(shown["completed_revision"], requested["requested_revision"]);
    let verify = run(&url, &["replay", "--verify"]);
    assert_eq!(
        verify.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
}
