//! Bad input a new user hands the command line: refused with the right
//! exit code, a message that quotes at most a short part of it, and
//! nothing recorded or created. Foreign databases are refused untouched.

use crate::common;

use common::{assert_exit, at, binary, describe, digest, ledger_with_a_task, ok_json_at, run, temp_db};
use opledger_testkit::{backend_tests, Backend, Harness};
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// No message quotes more than a short part of what it refuses.
fn assert_short_stderr(output: &std::process::Output) {
    assert!(
        output.stderr.len() < 1_500,
        "{} bytes on stderr: {}",
        output.stderr.len(),
        describe(output)
    );
}

fn sqlite_ledger() -> (tempfile::TempDir, String) {
    let (folder, db) = temp_db();
    (folder, format!("sqlite:{}", db.display()))
}

fn head(url: &str) -> serde_json::Value {
    ok_json_at(url, &["status", "--json"])["head"].clone()
}

#[test]
fn invalid_inputs_of_10_mb_are_quoted_short_on_stderr() {
    let (_folder, url) = sqlite_ledger();
    let (media_id, _) = ledger_with_a_task(&url);
    let before = head(&url);
    // 10 MB is past what one argument may hold; `-` reads it from stdin.
    let huge = format!("{{\"max_side\": {}", "9".repeat(10_000_000));
    let output = common::run_with_stdin(
        binary().args([
            "task",
            "request",
            "--media",
            &media_id,
            "--kind",
            "thumbnail",
            "--inputs",
            "-",
            "--database-url",
            &url,
        ]),
        huge.as_bytes(),
    );
    assert_exit(&output, 2);
    assert!(
        stderr(&output).contains("--inputs is not valid JSON"),
        "{}",
        describe(&output)
    );
    assert!(stderr(&output).contains("10000013 bytes in all"), "{}", stderr(&output));
    assert_short_stderr(&output);
    assert_eq!(head(&url), before);
}

#[test]
fn a_long_value_the_parser_refuses_is_quoted_short() {
    let (_folder, url) = sqlite_ledger();
    // Near the 128 KiB one argument may hold.
    let long = "m".repeat(100_000);
    for args in [
        vec!["capabilities", "--media", long.as_str()],
        vec!["task", "complete", long.as_str()],
        vec!["task", "claim", "--worker", "w", "--lease", long.as_str()],
    ] {
        let output = at(&url, &args);
        assert_exit(&output, 2);
        assert_short_stderr(&output);
    }
    let output = run(binary().args(["status", "--database-url", &format!("mysql://{long}")]));
    assert_exit(&output, 2);
    assert_short_stderr(&output);
}

#[test]
fn a_malformed_or_empty_claim_token_is_invalid_input_not_a_conflict() {
    let (_folder, url) = sqlite_ledger();
    ledger_with_a_task(&url);
    for token in ["", "   ", "not-a-token", "0190f5a2-0000-7000-8000"] {
        for command in [
            &["task", "complete", token][..],
            &["task", "heartbeat", token],
            &["task", "release", token],
        ] {
            let output = at(&url, command);
            assert_exit(&output, 2);
            assert!(
                stderr(&output).contains("a claim token is the UUID"),
                "{}",
                describe(&output)
            );
        }
    }
    // A well-formed token that holds nothing is a conflict.
    let stale = at(&url, &["task", "complete", "0190f5a2-0000-7000-8000-000000000000"]);
    assert_exit(&stale, 3);
}

#[test]
fn text_flags_past_the_bound_are_refused_and_nothing_is_appended() {
    let (_folder, url) = sqlite_ledger();
    let (_, operation_id) = ledger_with_a_task(&url);
    let claim = ok_json_at(&url, &["task", "claim", "--worker", "w", "--lease", "60", "--json"]);
    let token = claim["claim_token"].as_str().unwrap().to_string();
    let before = head(&url);
    let long = "e".repeat(70_000);
    let output_json = format!("\"{long}\"");
    for args in [
        vec!["task", "fail", &token, "--error", &long],
        vec!["task", "complete", &token, "--output", &output_json],
        vec!["task", "complete", &token, "--no-result", &long],
        vec!["task", "release", &token, "--reason", &long],
        vec!["task", "cancel", &operation_id, "--reason", &long],
    ] {
        let output = at(&url, &args);
        assert_exit(&output, 2);
        let message = stderr(&output);
        assert!(message.contains("bytes, more than the 65536"), "{message}");
        assert!(message.contains("--max-text-bytes"), "{message}");
        assert_short_stderr(&output);
    }
    // From standard input too.
    let piped = common::run_with_stdin(
        binary().args(["task", "complete", &token, "--output", "-", "--database-url", &url]),
        output_json.as_bytes(),
    );
    assert_exit(&piped, 2);
    assert!(
        stderr(&piped).contains("--output - is longer, more than the 65536"),
        "{}",
        describe(&piped)
    );
    assert_eq!(head(&url), before, "nothing was appended");

    // The bound is configurable: by flag, and by the environment.
    let raised = at(
        &url,
        &[
            "task",
            "release",
            &token,
            "--reason",
            &long,
            "--max-text-bytes",
            "100000",
        ],
    );
    assert_exit(&raised, 0);
    let claim = ok_json_at(&url, &["task", "claim", "--worker", "w", "--lease", "60", "--json"]);
    let token = claim["claim_token"].as_str().unwrap();
    let by_env = run(binary()
        .args(["task", "complete", token, "--no-result", &long, "--database-url", &url])
        .env("OPLEDGER_MAX_TEXT_BYTES", "80000"));
    assert_exit(&by_env, 0);
}

#[test]
fn task_show_clips_long_text_in_plain_output_and_shows_it_whole_in_json() {
    let (_folder, url) = sqlite_ledger();
    let (_, operation_id) = ledger_with_a_task(&url);
    let claim = ok_json_at(&url, &["task", "claim", "--worker", "w", "--lease", "60", "--json"]);
    let token = claim["claim_token"].as_str().unwrap();
    let long = "z".repeat(50_000);
    assert_exit(&at(&url, &["task", "fail", token, "--error", &long]), 0);
    let plain = at(&url, &["task", "show", "--operation", &operation_id]);
    assert_exit(&plain, 0);
    let text = common::stdout(&plain);
    assert!(text.len() < 3_000, "{} bytes", text.len());
    assert!(text.contains("(50000 bytes in all; --json shows everything)"), "{text}");
    let json = ok_json_at(&url, &["task", "show", "--operation", &operation_id, "--json"]);
    assert_eq!(json["last_error"].as_str().map(str::len), Some(50_000));
}

#[test]
fn database_urls_opledger_cannot_use_are_refused_with_the_forms_it_accepts() {
    let folder = tempfile::tempdir().unwrap();
    for url in [
        "postgres://",
        "postgresql://",
        "postgres://root@127.0.0.1:5432/",
        "postgres://root@127.0.0.1:5432",
        "mysql://root@127.0.0.1:3306/ledger",
        ":memory:",
        "sqlite::memory:",
    ] {
        let output = run(common::opledger(folder.path()).args(["status", "--database-url", url]));
        assert_exit(&output, 2);
        let message = stderr(&output);
        assert!(
            message.contains("postgres://USER") && (message.contains("SQLite file") || url.starts_with("postgres")),
            "{url}: {message}"
        );
    }
    assert_eq!(
        std::fs::read_dir(folder.path()).unwrap().count(),
        0,
        "no file was created"
    );
}

#[test]
fn content_digests_must_be_sha256_and_64_lowercase_hex() {
    let (_folder, url) = sqlite_ledger();
    let (media_id, _) = ledger_with_a_task(&url);
    let before = head(&url);
    for bad in [
        "sha256:ab",
        &format!("SHA256:{}", "a".repeat(64)),
        &format!("sha256:{}", "A".repeat(64)),
    ] {
        let added = at(&url, &["media", "add", "--path", "/d.png", "--digest", bad]);
        assert_exit(&added, 2);
        assert!(
            stderr(&added).contains("64 lowercase hex digits"),
            "{}",
            describe(&added)
        );
        let inputs = format!("{{\"max_side\": 64, \"format\": \"png\", \"content_digest\": \"{bad}\"}}");
        let requested = at(
            &url,
            &[
                "task",
                "request",
                "--media",
                &media_id,
                "--kind",
                "thumbnail",
                "--inputs",
                &inputs,
            ],
        );
        assert_exit(&requested, 2);
        assert!(
            stderr(&requested).contains("64 lowercase hex digits"),
            "{}",
            describe(&requested)
        );
    }
    assert_eq!(head(&url), before);
    assert_exit(
        &at(&url, &["media", "add", "--path", "/d.png", "--digest", &digest(7)]),
        0,
    );
}

#[test]
fn ingest_of_a_missing_folder_creates_no_database() {
    let folder = tempfile::tempdir().unwrap();
    let output = run(common::opledger(folder.path()).args(["ingest", "/nonexistent/photos"]));
    assert_exit(&output, 2);
    assert!(stderr(&output).contains("is not a folder"), "{}", describe(&output));
    assert_eq!(
        std::fs::read_dir(folder.path()).unwrap().count(),
        0,
        "no database was created"
    );
}

#[test]
fn a_foreign_sqlite_database_is_refused_and_left_untouched() {
    let folder = tempfile::tempdir().unwrap();
    let db = folder.path().join("shop.db");
    common::runtime().block_on(async {
        use sqlx::{ConnectOptions, Connection, Executor};
        let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        connection
            .execute("CREATE TABLE customers (id INTEGER); CREATE TABLE orders (id INTEGER)")
            .await
            .unwrap();
        connection.close().await.unwrap();
    });
    let before = std::fs::read(&db).unwrap();
    let url = format!("sqlite:{}", db.display());
    for args in [
        &["kinds", "apply", common::PIPELINE_FILES[0]][..],
        &["status"],
        &["media", "add", "--path", "/x"],
    ] {
        let output = at(&url, args);
        assert_exit(&output, 5);
        let message = stderr(&output);
        assert!(
            message.contains("holds tables customers, orders but no media_operation_events: not an opledger ledger"),
            "{args:?}: {message}"
        );
    }
    assert_eq!(std::fs::read(&db).unwrap(), before, "the foreign database is untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_postgres_database_is_refused_and_left_untouched() {
    let Some(backend) = opledger_testkit::postgres::backend().await else {
        return;
    };
    backend
        .execute_raw("CREATE TABLE customers (id integer); CREATE TABLE orders (id integer)")
        .await
        .unwrap();
    let output = at(&backend.url(), &["media", "add", "--path", "/x"]);
    assert_exit(&output, 5);
    assert!(
        stderr(&output).contains("holds tables customers, orders but no media_operation_events"),
        "{}",
        describe(&output)
    );
    let mut connection = backend.connect().await;
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .fetch_one(&mut connection)
        .await
        .unwrap();
    assert_eq!(tables, 2, "nothing was created beside the foreign tables");
}

#[test]
fn an_unreachable_postgres_server_fails_within_the_connect_timeout_naming_host_and_port() {
    // A server that accepts connections and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let _held = std::thread::spawn(move || {
        let _connections: Vec<_> = listener.incoming().take(4).collect();
    });
    for (url, bound) in [
        (
            format!("postgres://root@127.0.0.1:{port}/ledger"),
            Duration::from_secs(8),
        ),
        (
            format!("postgres://root@127.0.0.1:{port}/ledger?connect_timeout=1"),
            Duration::from_secs(4),
        ),
    ] {
        let started = Instant::now();
        let output = at(&url, &["status"]);
        let took = started.elapsed();
        assert_exit(&output, 5);
        assert!(took < bound, "took {took:?} for {url}");
        assert!(
            stderr(&output).contains(&format!("127.0.0.1:{port}")),
            "{}",
            describe(&output)
        );
        assert!(
            stderr(&output).contains("did not answer within"),
            "{}",
            describe(&output)
        );
    }
}

async fn media_add_refuses_a_registered_path_unless_allowed<B: Backend>(backend: &B) {
    let url = backend.url();
    let first = ok_json_at(&url, &["media", "add", "--path", "/photos/same.png", "--json"]);
    let before = head(&url);
    let again = at(&url, &["media", "add", "--path", "/photos/same.png"]);
    assert_exit(&again, 3);
    let message = stderr(&again);
    assert!(
        message.contains(first["media_id"].as_str().unwrap()),
        "the existing id is named: {message}"
    );
    assert!(message.contains("--allow-duplicate-path"), "{message}");
    assert_eq!(head(&url), before);
    let allowed = ok_json_at(
        &url,
        &[
            "media",
            "add",
            "--path",
            "/photos/same.png",
            "--allow-duplicate-path",
            "--json",
        ],
    );
    assert_ne!(allowed["media_id"], first["media_id"]);
}

backend_tests!(media_add_refuses_a_registered_path_unless_allowed);
