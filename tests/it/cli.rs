//! The command line's contracts, through the real binary on real SQLite
//! files: where the database is, exit codes (0 ok, 1 differences, 2 bad
//! usage, 4 not found), and the JSON that programs parse.

use crate::common;

use common::{assert_exit, describe, json, opledger, run, runtime, stdout, temp_db};
use opledger_domain::decide::OperationCommand;
use opledger_domain::events::OperationTarget;
use opledger_domain::{MediaId, OperationId, OperationStatus};
use opledger_engine::{CommandContext, Engine, NewOperation};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use serde_json::Value;
use sqlx::{Connection, SqliteConnection};
use std::path::Path;
use std::process::Output;
use uuid::Uuid;

/// The 16 operation statuses, written out independently of the code.
const OPERATION_STATUSES: [&str; 16] = [
    "pending",
    "queued",
    "leased",
    "running",
    "retry_waiting",
    "succeeded",
    "no_result",
    "missing_confirmed",
    "not_applicable",
    "blocked",
    "failed_retryable",
    "failed_terminal",
    "dead_lettered",
    "cancelled",
    "interrupted",
    "skipped",
];

/// `opledger [args] --database-url db`, expecting exit 0.
fn ok_at(db: &Path, args: &[&str]) -> Output {
    let dir = db.parent().expect("the database is in a folder");
    let output = run(opledger(dir).args(args).arg("--database-url").arg(db));
    assert_exit(&output, 0);
    output
}

fn status_json(db: &Path) -> Value {
    json(&ok_at(db, &["status", "--json"]))
}

fn add_media(db: &Path, path: &str) -> MediaId {
    let output = ok_at(db, &["media", "add", "--path", path, "--json"]);
    let id = json(&output)["media_id"]
        .as_str()
        .expect("media_id is a string")
        .to_string();
    id.parse().expect("media_id is a uuid")
}

#[test]
fn a_writing_command_in_a_fresh_folder_creates_opledger_db_there_and_status_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!dir.path().join("opledger.db").exists());
    // A reading command creates nothing.
    assert_exit(&run(opledger(dir.path()).arg("status")), 4);
    assert!(!dir.path().join("opledger.db").exists());
    let output = run(opledger(dir.path()).arg("recover"));
    assert_exit(&output, 0);
    assert!(
        dir.path().join("opledger.db").is_file(),
        "recover did not create opledger.db in the current folder: {}",
        describe(&output)
    );
    let output = run(opledger(dir.path()).arg("status"));
    assert_exit(&output, 0);
    assert!(stdout(&output).contains("head at seq 0"), "{}", describe(&output));
}

#[test]
fn status_json_has_the_documented_keys_and_every_operation_status() {
    let dir = tempfile::tempdir().unwrap();
    assert_exit(&run(opledger(dir.path()).arg("recover")), 0);
    let output = run(opledger(dir.path()).args(["status", "--json"]));
    assert_exit(&output, 0);
    let status = json(&output);
    for key in [
        "backend",
        "head",
        "media",
        "operations",
        "operations_by_status",
        "projections",
    ] {
        assert!(status.get(key).is_some(), "status --json lacks {key:?}: {status:#}");
    }
    assert_eq!(status["backend"], "sqlite");
    assert_eq!(status["head"], 0);
    assert_eq!(status["media"], 0);
    assert_eq!(status["operations"], 0);
    let by_status = status["operations_by_status"]
        .as_object()
        .expect("operations_by_status is an object");
    let mut names: Vec<&str> = by_status.keys().map(String::as_str).collect();
    names.sort_unstable();
    let mut expected = OPERATION_STATUSES.to_vec();
    expected.sort_unstable();
    assert_eq!(
        names, expected,
        "operations_by_status must list exactly the 16 statuses"
    );
    assert!(by_status.values().all(|count| count == 0), "{by_status:?}");
    let projections = status["projections"].as_array().expect("projections is an array");
    let projection_names: Vec<&str> = projections.iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(projection_names.contains(&"media_registry"), "{projections:?}");
    assert!(projection_names.contains(&"media_operations"), "{projections:?}");
    for projection in projections {
        assert_eq!(projection["position"], 0, "{projection}");
        assert_eq!(projection["lag"], 0, "{projection}");
        assert!(
            projection["version"].as_u64().is_some_and(|version| version >= 1),
            "{projection}"
        );
    }
}

#[test]
fn database_url_flag_selects_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    for (url, file) in [
        ("sub/flag.db", "sub/flag.db"),
        ("sqlite:sub/prefixed.db", "sub/prefixed.db"),
    ] {
        let output = run(opledger(dir.path()).args(["media", "add", "--path", "/a.jpg", "--database-url", url]));
        assert_exit(&output, 0);
        assert!(dir.path().join(file).is_file(), "{url} did not create {file}");
        let status = json(&run(opledger(dir.path()).args([
            "status",
            "--json",
            "--database-url",
            url,
        ])));
        assert_eq!(status["media"], 1, "{url}: {status:#}");
    }
    assert!(
        !dir.path().join("opledger.db").exists(),
        "the default file was used despite --database-url"
    );
}

#[test]
fn database_url_env_var_selects_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(opledger(dir.path())
        .args(["media", "add", "--path", "/a.jpg"])
        .env("OPLEDGER_DATABASE_URL", "from-env.db"));
    assert_exit(&output, 0);
    assert!(dir.path().join("from-env.db").is_file());
    assert!(
        !dir.path().join("opledger.db").exists(),
        "the default file was used despite the env var"
    );
    let output = run(opledger(dir.path())
        .args(["status", "--json"])
        .env("OPLEDGER_DATABASE_URL", "from-env.db"));
    assert_eq!(json(&output)["media"], 1);
}

#[test]
fn database_url_flag_wins_over_the_env_var() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(opledger(dir.path())
        .args(["media", "add", "--path", "/a.jpg", "--database-url", "flag.db"])
        .env("OPLEDGER_DATABASE_URL", "env.db"));
    assert_exit(&output, 0);
    assert!(dir.path().join("flag.db").is_file());
    assert!(!dir.path().join("env.db").exists());
}

#[test]
fn media_add_json_prints_the_new_media_id_and_status_counts_it() {
    let (_dir, db) = temp_db();
    let output = ok_at(&db, &["media", "add", "--path", "/photos/a.jpg", "--json"]);
    let value = json(&output);
    let object = value.as_object().expect("an object");
    assert_eq!(object.keys().collect::<Vec<_>>(), vec!["media_id"], "{value}");
    let id = object["media_id"].as_str().expect("media_id is a string");
    Uuid::parse_str(id).unwrap_or_else(|error| panic!("media_id {id:?} is not a uuid: {error}"));
    let status = status_json(&db);
    assert_eq!(status["media"], 1, "{status:#}");
    assert_eq!(status["head"], 1, "{status:#}");
}

#[test]
fn media_add_plain_prints_only_the_id() {
    let (_dir, db) = temp_db();
    let output = ok_at(&db, &["media", "add", "--path", "/photos/a.jpg"]);
    let text = stdout(&output);
    let id = text.strip_suffix('\n').expect("one line");
    assert!(!id.contains(char::is_whitespace), "more than the id: {text:?}");
    Uuid::parse_str(id).unwrap_or_else(|error| panic!("{id:?} is not a uuid: {error}"));
    // Two adds get two different ids.
    let second = stdout(&ok_at(&db, &["media", "add", "--path", "/photos/b.jpg"]));
    assert_ne!(text, second);
    assert_eq!(status_json(&db)["media"], 2);
}

#[test]
fn media_add_with_an_empty_path_exits_2_and_appends_nothing() {
    let (_dir, db) = temp_db();
    add_media(&db, "/photos/a.jpg");
    let before = status_json(&db);
    for path in ["", "   "] {
        let output = run(opledger(db.parent().unwrap())
            .args(["media", "add", "--path", path, "--database-url"])
            .arg(&db));
        assert_exit(&output, 2);
        assert!(output.stdout.is_empty(), "a refused add printed: {}", describe(&output));
    }
    let after = status_json(&db);
    assert_eq!(after["head"], before["head"], "a refused command appended to the log");
    assert_eq!(after["media"], 1);
}

#[test]
fn media_add_with_a_negative_size_exits_2() {
    let (_dir, db) = temp_db();
    let output = run(opledger(db.parent().unwrap())
        .args(["media", "add", "--path", "/a.jpg", "--size=-1", "--database-url"])
        .arg(&db));
    assert_exit(&output, 2);
    assert_eq!(status_json(&db)["head"], 0);
}

#[test]
fn timeline_of_an_unknown_operation_exits_4() {
    let (_dir, db) = temp_db();
    assert_exit(
        &run(opledger(db.parent().unwrap())
            .args(["recover", "--database-url"])
            .arg(&db)),
        0,
    );
    let unknown = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef).to_string();
    let output = run(opledger(db.parent().unwrap())
        .args(["timeline", &unknown, "--database-url"])
        .arg(&db));
    assert_exit(&output, 4);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(&unknown),
        "{}",
        describe(&output)
    );
}

#[test]
fn timeline_with_a_malformed_id_exits_2() {
    let (_dir, db) = temp_db();
    for id in ["not-a-uuid", "1234", ""] {
        let output = run(opledger(db.parent().unwrap())
            .args(["timeline", id, "--database-url"])
            .arg(&db));
        assert_exit(&output, 2);
    }
}

#[test]
fn timeline_json_lists_the_operations_events_in_order_with_actor_and_cause() {
    let (_dir, db) = temp_db();
    let media_id = add_media(&db, "/photos/a.jpg");
    let operation_id: OperationId = runtime().block_on(async {
        let store = SqliteStore::open(SqliteConfig::at(&db)).await.unwrap();
        let (engine, _) = Engine::open(store).await.unwrap();
        let worker = CommandContext::actor("worker-7").with_correlation("run-42");
        let operation_id = engine
            .create_operation(
                &CommandContext::actor("scheduler"),
                NewOperation {
                    kind: "export".into(),
                    target: OperationTarget {
                        media_id: Some(media_id),
                        region_id: None,
                        path: None,
                    },
                    revision: Some("r1".into()),
                    inputs: serde_json::json!({"size": 256}),
                    status: OperationStatus::Queued,
                    priority: 0,
                },
            )
            .await
            .unwrap();
        let token = engine
            .claim_operation(&worker, operation_id, "worker-7", 30_000)
            .await
            .unwrap();
        engine
            .operation_command(
                &worker,
                operation_id,
                OperationCommand::Succeed {
                    claim_token: token,
                    output: serde_json::json!({"thumbnail": "a.webp"}),
                },
            )
            .await
            .unwrap();
        operation_id
    });

    let output = ok_at(&db, &["timeline", &operation_id.to_string(), "--json"]);
    let events = json(&output);
    let events = events.as_array().expect("an array of events");
    let types: Vec<&str> = events
        .iter()
        .map(|event| event["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        vec!["operation_created", "operation_claimed", "operation_succeeded"]
    );
    let versions: Vec<i64> = events
        .iter()
        .map(|event| event["stream_version"].as_i64().unwrap())
        .collect();
    assert_eq!(versions, vec![1, 2, 3]);
    let seqs: Vec<i64> = events.iter().map(|event| event["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "{seqs:?}");
    assert_eq!(events[0]["actor"], "scheduler");
    assert_eq!(events[1]["actor"], "worker-7");
    assert_eq!(events[1]["correlation_id"], "run-42");
    assert_eq!(events[2]["correlation_id"], "run-42");
    for event in events {
        for key in ["recorded_at", "causation_id", "schema_version", "payload", "stream_id"] {
            assert!(!event[key].is_null(), "{key} missing in {event}");
        }
    }
    assert_eq!(events[2]["payload"]["output"]["thumbnail"], "a.webp");

    // The text form reads as a history: one line per event, in the same order.
    let text = stdout(&ok_at(&db, &["timeline", &operation_id.to_string()]));
    let positions: Vec<usize> = ["created: export", "claimed by worker-7", "succeeded:"]
        .iter()
        .map(|step| text.find(step).unwrap_or_else(|| panic!("{step:?} in {text}")))
        .collect();
    assert!(positions.windows(2).all(|pair| pair[0] < pair[1]), "{text}");
    assert!(text.contains("worker-7"), "{text}");
}

#[test]
fn unknown_subcommand_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(opledger(dir.path()).arg("frobnicate"));
    assert_exit(&output, 2);
    assert!(
        !dir.path().join("opledger.db").exists(),
        "bad usage must not create a database"
    );
}

#[test]
fn unknown_database_url_option_exits_2_without_creating_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(opledger(dir.path()).args(["status", "--database-url", "sqlite:x.db?journal=off"]));
    assert_exit(&output, 2);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("journal=off"),
        "{}",
        describe(&output)
    );
    assert!(!dir.path().join("x.db").exists());
    assert!(!dir.path().join("opledger.db").exists());
}

#[test]
fn replay_verify_exits_0_and_reports_identical_on_a_healthy_database() {
    let (_dir, db) = temp_db();
    for index in 0..3 {
        add_media(&db, &format!("/photos/{index}.jpg"));
    }
    let report = json(&ok_at(&db, &["replay", "--verify", "--json"]));
    assert_eq!(report["identical"], true, "{report:#}");
    assert_eq!(report["position"], 3, "{report:#}");
    assert_eq!(report["events"], 3, "{report:#}");
    assert_eq!(report["differences"], serde_json::json!([]), "{report:#}");
    let text = stdout(&ok_at(&db, &["replay", "--verify"]));
    assert!(text.contains("matches"), "{text}");
}

/// Writes straight into a projection table, behind the engine's back.
fn tamper(db: &Path, sql: &str, bind: &str) {
    runtime().block_on(async {
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(db);
        let mut connection = SqliteConnection::connect_with(&options)
            .await
            .expect("open the database");
        let done = sqlx::query(sql)
            .bind(bind)
            .execute(&mut connection)
            .await
            .expect("tamper");
        assert_eq!(done.rows_affected(), 1, "{sql} touched no row");
        connection.close().await.expect("close");
    });
}

/// A JSON cell value as text, whether or not the output quotes text cells.
fn cell_text(value: &Value) -> String {
    value.as_str().expect("cells are strings").trim_matches('"').to_string()
}

#[test]
fn replay_verify_exits_1_and_names_table_column_and_values_after_tampering() {
    let (_dir, db) = temp_db();
    let tampered = add_media(&db, "/photos/original.jpg");
    add_media(&db, "/photos/untouched.jpg");
    tamper(
        &db,
        "UPDATE media SET path = 'tampered' WHERE id = ?",
        &tampered.to_string(),
    );

    let output = run(opledger(db.parent().unwrap())
        .args(["replay", "--verify", "--database-url"])
        .arg(&db));
    assert_exit(&output, 1);
    let text = stdout(&output);
    for needle in [
        "media",
        "path",
        "tampered",
        "/photos/original.jpg",
        &tampered.to_string(),
    ] {
        assert!(
            text.contains(needle),
            "the difference does not mention {needle:?}:\n{text}"
        );
    }
    assert!(!text.contains("untouched"), "an identical row was reported:\n{text}");
    let path_line = text
        .lines()
        .find(|line| line.contains("path"))
        .expect("a line for the path column");
    assert!(
        path_line.contains("tampered") && path_line.contains("/photos/original.jpg"),
        "the path line should show both values: {path_line}"
    );

    let output = run(opledger(db.parent().unwrap())
        .args(["replay", "--verify", "--json", "--database-url"])
        .arg(&db));
    assert_exit(&output, 1);
    let report = json(&output);
    assert_eq!(report["identical"], false, "{report:#}");
    let differences = report["differences"].as_array().expect("differences is an array");
    assert_eq!(differences.len(), 1, "only the media table differs: {report:#}");
    let difference = &differences[0];
    assert_eq!(difference["table"], "media");
    assert_eq!(difference["live_rows"], 2);
    assert_eq!(difference["replayed_rows"], 2);
    let rows = difference["rows"].as_array().expect("rows is an array");
    assert_eq!(rows.len(), 1, "{difference:#}");
    assert!(
        rows[0]["key"].as_str().unwrap().contains(&tampered.to_string()),
        "{difference:#}"
    );
    assert_eq!(cell_text(&rows[0]["live"]["path"]), "tampered", "{difference:#}");
    assert_eq!(
        cell_text(&rows[0]["replayed"]["path"]),
        "/photos/original.jpg",
        "{difference:#}"
    );
}

#[test]
fn replay_verify_exits_1_when_a_projected_row_is_missing() {
    let (_dir, db) = temp_db();
    let deleted = add_media(&db, "/photos/gone.jpg");
    tamper(&db, "DELETE FROM media WHERE id = ?", &deleted.to_string());
    let output = run(opledger(db.parent().unwrap())
        .args(["replay", "--verify", "--json", "--database-url"])
        .arg(&db));
    assert_exit(&output, 1);
    let report = json(&output);
    let difference = &report["differences"][0];
    assert_eq!(difference["table"], "media", "{report:#}");
    assert_eq!(difference["live_rows"], 0);
    assert_eq!(difference["replayed_rows"], 1);
    assert!(difference["rows"][0]["live"].is_null(), "{report:#}");
}

#[test]
fn state_machine_doc_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/state-machines.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let dir = tempfile::tempdir().unwrap();
    let output = run(opledger(dir.path()).args(["docs", "state-machines"]));
    assert_exit(&output, 0);
    let generated = stdout(&output);
    assert!(generated.contains("stateDiagram-v2"), "{generated}");
    assert!(
        committed == generated,
        "docs/state-machines.md is out of date with the transition table; regenerate it with\n\n    \
         cargo run -q -- docs state-machines > docs/state-machines.md\n"
    );
}

/// A committed reference is exactly what `opledger docs WHAT` prints now.
fn assert_generated_doc_is_current(what: &str, file: &str, expect: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let dir = tempfile::tempdir().unwrap();
    let output = run(opledger(dir.path()).args(["docs", what]));
    assert_exit(&output, 0);
    let generated = stdout(&output);
    assert!(generated.contains(expect), "{generated}");
    assert!(
        committed == generated,
        "{file} is out of date; regenerate it with\n\n    cargo run -q -- docs {what} > {file}\n"
    );
}

#[test]
fn cli_reference_doc_is_current() {
    // Every visible command, a nested one and a global option are in it.
    assert_generated_doc_is_current("cli", "docs/cli.md", "## opledger task release");
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md")).unwrap();
    for expected in [
        "## opledger ingest",
        "## opledger export download",
        "`--database-url <DATABASE_URL>`",
    ] {
        assert!(text.contains(expected), "docs/cli.md lacks {expected}");
    }
    assert!(
        !text.contains("__run-supervised"),
        "hidden commands stay out of docs/cli.md"
    );
}

#[test]
fn http_reference_doc_is_current() {
    // Rendered from the same document the service serves and
    // docs/openapi.json holds (crates/http/tests/it/contract.rs).
    assert_generated_doc_is_current("http", "docs/http.md", "## POST /api/v1/claims/{token}/release");
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/http.md")).unwrap();
    let document: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json")).unwrap(),
    )
    .unwrap();
    for (path, item) in document["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let heading = format!("## {} {path}\n", method.to_uppercase());
            assert!(text.contains(&heading), "docs/http.md lacks {heading}");
        }
    }
}
