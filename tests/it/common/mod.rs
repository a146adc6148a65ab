//! What the command-line tests share: the `opledger` binary with no
//! database or log level chosen by the environment, what its output says,
//! a temporary database, and a runtime for the library calls beside it.
//!
//! Each test binary includes this module (`mod common;`) and uses a part
//! of it, so the helpers another binary uses would be dead code in this
//! one: hence the allowance below, for this module only.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_opledger");

/// The binary, with no database or log level chosen by the environment.
pub fn binary() -> Command {
    let mut command = Command::new(BIN);
    command.env_remove("OPLEDGER_DATABASE_URL").env_remove("OPLEDGER_LOG");
    command
}

/// The binary, run in `dir`, with no database or log level chosen by the
/// environment.
pub fn opledger(dir: &Path) -> Command {
    let mut command = binary();
    command.current_dir(dir);
    command
}

/// Runs a command to its end, whatever its exit.
pub fn run(command: &mut Command) -> Output {
    command.output().expect("the opledger binary runs")
}

/// A run's exit code, stdout and stderr, for failure messages.
pub fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

pub fn assert_exit(output: &Output, code: i32) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "expected exit {code}, got {}",
        describe(output)
    );
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

/// Stdout, parsed as JSON.
pub fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("stdout is not JSON ({error}): {}", describe(output)))
}

/// A temporary folder and the path of a database file in it (not created).
pub fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("ledger.db");
    (dir, db)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The declaration files of the reference pipeline and of the example
/// application pipeline, in the order they are applied.
pub const PIPELINE_FILES: [&str; 2] = [
    concat!(env!("CARGO_MANIFEST_DIR"), "/crates/media/kinds.toml"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/examples/pipeline.toml"),
];

/// Declares the pipeline's task kinds (`opledger kinds apply`) in the
/// ledger at `database_url`.
pub fn declare_pipeline(database_url: &str) {
    for file in PIPELINE_FILES {
        let output = run(binary().args(["kinds", "apply", file, "--database-url", database_url]));
        assert_exit(&output, 0);
    }
}

/// A content digest for test media: `sha256:` and 64 hex digits from `n`.
pub fn digest(n: u64) -> String {
    format!("sha256:{n:064x}")
}

/// Runs `opledger ARGS --database-url URL`.
pub fn at(url: &str, args: &[&str]) -> Output {
    run(binary().args(args).arg("--database-url").arg(url))
}

/// Runs `opledger ARGS --database-url URL`, which must succeed, and
/// parses its JSON answer.
pub fn ok_json_at(url: &str, args: &[&str]) -> Value {
    let output = at(url, args);
    assert_exit(&output, 0);
    json(&output)
}

/// A ledger with the pipeline's kinds and one media item whose `metadata`
/// task is requested: (media id, operation id).
pub fn ledger_with_a_task(url: &str) -> (String, String) {
    declare_pipeline(url);
    let media = ok_json_at(
        url,
        &[
            "media",
            "add",
            "--path",
            "/photos/one.png",
            "--digest",
            &digest(1),
            "--json",
        ],
    );
    let media_id = media["media_id"].as_str().expect("a media id").to_string();
    let requested = ok_json_at(
        url,
        &["task", "request", "--media", &media_id, "--kind", "metadata", "--json"],
    );
    let operation_id = requested["operation_id"].as_str().expect("an operation id").to_string();
    (media_id, operation_id)
}

/// Runs the binary with its standard output the write end of a pipe whose
/// read end is already closed, as after `| head -1` stopped reading: every
/// write to it fails.
pub fn run_into_closed_pipe(command: &mut Command) -> Output {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let child = command
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the opledger binary runs");
    child.wait_with_output().expect("the opledger binary ends")
}

/// Whether `replay --verify` finds the live projections identical.
pub fn assert_verify_identical(url: &str) {
    let verified = ok_json_at(url, &["replay", "--verify", "--json"]);
    assert_eq!(verified["identical"], true, "{verified}");
}

/// Runs the binary with `input` on its standard input.
pub fn run_with_stdin(command: &mut Command, input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the opledger binary runs");
    // The binary may refuse before reading it all; a broken pipe is its answer.
    let _ = child.stdin.take().expect("a stdin").write_all(input);
    child.wait_with_output().expect("the opledger binary ends")
}
