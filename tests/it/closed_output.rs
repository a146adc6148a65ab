//! Output into a closed pipe (`| head -1` that stopped reading): the
//! command ends quietly with exit 141 instead of panicking, and a claim
//! whose answer could not be written is given back at once (a release on
//! its timeline, queued again, no attempt or failure counted), so no task
//! stays leased to a caller that never saw its token. `task release` gives
//! a claim back the same way, fenced like every report. Real processes and
//! real pipes, on SQLite and PostgreSQL.

use crate::common;

use common::{assert_exit, at, binary, describe, ledger_with_a_task, ok_json_at, run_into_closed_pipe};
use opledger_testkit::{backend_tests, Backend};

/// What a closed standard output exits with (128 + SIGPIPE).
const OUTPUT_CLOSED: i32 = 141;

async fn a_reading_command_into_a_closed_pipe_ends_quietly_with_exit_141<B: Backend>(backend: &B) {
    let url = backend.url();
    ledger_with_a_task(&url);
    for args in [
        &["status"][..],
        &["kinds", "list"],
        &["batch", "list"],
        &["kinds", "list", "--json"],
    ] {
        let output = run_into_closed_pipe(binary().args(args).arg("--database-url").arg(&url));
        assert_eq!(
            output.status.code(),
            Some(OUTPUT_CLOSED),
            "{args:?}: {}",
            describe(&output)
        );
        assert!(
            output.stderr.is_empty(),
            "{args:?}: nothing on stderr: {}",
            describe(&output)
        );
    }
}

async fn a_claim_whose_answer_cannot_be_written_is_given_back<B: Backend>(backend: &B) {
    let url = backend.url();
    let (_, operation_id) = ledger_with_a_task(&url);
    let output = run_into_closed_pipe(binary().args([
        "task",
        "claim",
        "--worker",
        "w1",
        "--lease",
        "600",
        "--json",
        "--database-url",
        &url,
    ]));
    assert_eq!(output.status.code(), Some(OUTPUT_CLOSED), "{}", describe(&output));
    assert!(output.stderr.is_empty(), "{}", describe(&output));

    let task = ok_json_at(&url, &["task", "show", "--operation", &operation_id, "--json"]);
    assert_eq!(task["status"], "queued", "{task}");
    assert_eq!(task["claim_token"], serde_json::Value::Null, "{task}");
    assert_eq!(task["attempt_count"], 0, "{task}");
    assert_eq!(task["failure_count"], 0, "{task}");
    let timeline = ok_json_at(&url, &["timeline", &operation_id, "--json"]);
    let types: Vec<&str> = timeline
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types[types.len() - 2..],
        ["operation_claimed", "operation_released"],
        "{types:?}"
    );
    let released = timeline.as_array().unwrap().last().unwrap();
    assert_eq!(released["actor"], "w1");
    assert!(
        released["payload"]["reason"]
            .as_str()
            .unwrap()
            .contains("could not be written"),
        "{released}"
    );

    // The next worker that asks gets it at once.
    let claim = ok_json_at(&url, &["task", "claim", "--worker", "w2", "--lease", "60", "--json"]);
    assert_eq!(claim["operation_id"].as_str(), Some(operation_id.as_str()), "{claim}");
    assert_eq!(claim["attempt"], 1, "{claim}");
    common::assert_verify_identical(&url);
}

async fn a_worker_gives_a_claim_back_with_task_release_fenced_like_a_report<B: Backend>(backend: &B) {
    let url = backend.url();
    let (_, operation_id) = ledger_with_a_task(&url);
    let claim = ok_json_at(&url, &["task", "claim", "--worker", "w1", "--lease", "60", "--json"]);
    let token = claim["claim_token"].as_str().unwrap().to_string();
    let revision = claim["revision"].as_str().unwrap().to_string();

    // A wrong revision is refused and changes nothing.
    let wrong = at(&url, &["task", "release", &token, "--revision", "nope"]);
    assert_exit(&wrong, 3);
    let released = ok_json_at(
        &url,
        &[
            "task",
            "release",
            &token,
            "--revision",
            &revision,
            "--reason",
            "out of memory here",
            "--json",
        ],
    );
    assert_eq!(released["status"], "queued", "{released}");
    assert_eq!(released["attempt_count"], 0, "{released}");
    let timeline = ok_json_at(&url, &["timeline", &operation_id, "--json"]);
    let last = timeline.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["event_type"], "operation_released");
    assert_eq!(last["payload"]["reason"], "out of memory here");

    // The token no longer holds anything: exit 3, nothing appended.
    let head = ok_json_at(&url, &["status", "--json"])["head"].clone();
    let stale = at(&url, &["task", "release", &token]);
    assert_exit(&stale, 3);
    assert_eq!(ok_json_at(&url, &["status", "--json"])["head"], head);
    common::assert_verify_identical(&url);
}

backend_tests!(
    a_reading_command_into_a_closed_pipe_ends_quietly_with_exit_141,
    a_claim_whose_answer_cannot_be_written_is_given_back,
    a_worker_gives_a_claim_back_with_task_release_fenced_like_a_report,
);

/// A real shell pipeline: `head -c 1` stops reading after one byte of an
/// answer larger than the pipe's buffer, so the write after it fails.
#[test]
fn a_shell_pipeline_into_head_ends_quietly_with_exit_141() {
    let (_folder, db) = common::temp_db();
    let url = format!("sqlite:{}", db.display());
    let (_, operation_id) = ledger_with_a_task(&url);
    let claim = ok_json_at(&url, &["task", "claim", "--worker", "w", "--lease", "60", "--json"]);
    let token = claim["claim_token"].as_str().unwrap();
    // An output of 200 KB, past the 64 KiB a pipe buffers.
    let big = format!("{{\"text\": \"{}\"}}", "x".repeat(200_000));
    let complete = common::run_with_stdin(
        binary().args([
            "task",
            "complete",
            token,
            "--output",
            "-",
            "--max-text-bytes",
            "300000",
            "--database-url",
            &url,
        ]),
        big.as_bytes(),
    );
    assert_exit(&complete, 0);
    let script = format!(
        "set -o pipefail; '{}' timeline {operation_id} --json --database-url '{url}' | head -c 1 >/dev/null",
        common::BIN
    );
    let output = common::run(std::process::Command::new("bash").arg("-c").arg(&script));
    assert_eq!(output.status.code(), Some(OUTPUT_CLOSED), "{}", describe(&output));
    assert!(output.stderr.is_empty(), "no panic, no message: {}", describe(&output));
}
