//! The measurement scripts under `benches/` against the schema they
//! measure. The PostgreSQL lifecycle floor (`benches/postgres-lifecycle-floor`)
//! claims to write exactly the rows opledger's lifecycle writes; if a
//! migration, a projection or the lifecycle itself changes, its SQL may stop
//! running or stop matching, and the bound it gives would silently be wrong.
//! So the floor runs here on a fresh database opledger created, and what it
//! leaves behind is compared with what the same number of tasks leaves
//! through opledger's own lifecycle. Needs `psql` and `pgbench` beside the
//! server; without a server (or the tools) the test skips loudly, and under
//! `CI=true` it fails instead.
//!
//! The raw results under `benches/results/` are written by `opledger bench
//! --record`; the tests here record into a folder of their own, never into
//! the repository.

use opledger_bench::lifecycle::{register_lifecycle_media, run_task_lifecycle};
use opledger_engine::Engine;
use opledger_store_postgres::PostgresStore;
use opledger_testkit::{Backend, PostgresBackend};
use sqlx::Row;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

fn floor_script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("benches/postgres-lifecycle-floor")
        .join(name)
}

/// Whether `tool` runs; a loud skip locally, a failure under `CI=true`.
fn have(tool: &str) -> bool {
    if Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
    {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{tool} is not on PATH, and CI=true: the bench script test must run in CI");
    }
    eprintln!("\n*** SKIPPED: {tool} is not on PATH; the benches/ script test did not run ***\n");
    false
}

/// Runs `command` to success and returns its standard output.
fn run(command: &mut Command) -> Vec<u8> {
    let output = command.output().unwrap_or_else(|error| panic!("{command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} exited {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Rows per table, and per status where the table has one: what a finished
/// lifecycle leaves behind.
async fn census(database: &PostgresBackend) -> BTreeMap<String, i64> {
    let mut connection = database.connect().await;
    let mut census = BTreeMap::new();
    for table in ["media", "media_operation_events", "task_leases"] {
        let count: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&mut connection)
            .await
            .unwrap();
        census.insert(table.to_string(), count);
    }
    for table in [
        "media_operations",
        "media_processing_states",
        "entity_capability_states",
    ] {
        let rows = sqlx::query(&format!("SELECT status, count(*) FROM {table} GROUP BY status"))
            .fetch_all(&mut connection)
            .await
            .unwrap();
        for row in rows {
            census.insert(format!("{table}.{}", row.get::<String, _>(0)), row.get::<i64, _>(1));
        }
    }
    census
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_lifecycle_floor_runs_on_the_current_schema_and_leaves_what_the_lifecycle_leaves() {
    let Some(floor_database) = opledger_testkit::postgres::backend().await else {
        return;
    };
    if !have("psql") || !have("pgbench") {
        return;
    }
    let Some(lifecycle_database) = opledger_testkit::postgres::backend().await else {
        return;
    };

    // As run.sh does: opledger creates the schema, setup.sql drops the
    // gap-free trigger, then two pgbench transactions of 32 tasks each.
    drop(PostgresStore::open(floor_database.config()).await.unwrap());
    run(Command::new("psql")
        .arg(floor_database.url())
        .args(["-q", "-v", "ON_ERROR_STOP=1", "-f"])
        .arg(floor_script("setup.sql")));
    run(Command::new("pgbench")
        .arg(floor_database.url())
        .args(["-n", "-D", "tasks=32", "-c", "1", "-t", "2", "-f"])
        .arg(floor_script("lifecycle.sql")));

    // The same 64 tasks (32 media items, two kinds each) through opledger.
    let store = PostgresStore::open(lifecycle_database.config()).await.unwrap();
    let (engine, _) = Engine::open(store).await.unwrap();
    let media = register_lifecycle_media(&engine, 32).await.unwrap();
    let lifecycle = run_task_lifecycle(&engine, &media, 2, 32).await.unwrap();
    assert_eq!(lifecycle.tasks, 64);
    drop(engine);

    let floor = census(&floor_database).await;
    let ours = census(&lifecycle_database).await;
    assert_eq!(
        floor.get("media_operation_events"),
        Some(&226),
        "3.5 events a task, and the two declarations: {floor:?}"
    );
    assert_eq!(floor, ours, "the floor's rows (left) against the lifecycle's (right)");
}

/// `opledger bench` run in `dir` (its own databases go there too).
fn bench_status_in(dir: &std::path::Path, record: Option<&std::path::Path>) -> serde_json::Value {
    let mut command = Command::new(env!("CARGO_BIN_EXE_opledger"));
    command
        .current_dir(dir)
        .args(["bench", "status", "--events", "2000", "--samples", "10", "--json"]);
    if let Some(record) = record {
        command.arg(format!("--record={}", record.display()));
    }
    serde_json::from_slice(&run(&mut command)).unwrap()
}

#[test]
fn a_recorded_bench_run_appends_its_printed_report_with_time_commit_cores_and_command() {
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let first = bench_status_in(dir.path(), Some(&results));
    let second = bench_status_in(dir.path(), Some(&results));
    let text = std::fs::read_to_string(results.join("status.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines.len(), 2, "one line per run: {text}");
    assert_eq!(lines[0]["report"], first);
    assert_eq!(lines[1]["report"], second);
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as u64;
    for line in &lines {
        assert_eq!(line["cores"].as_u64(), Some(cores), "{line}");
        assert!(
            line["recorded_at"].as_str().is_some_and(|at| at.ends_with('Z')),
            "{line}"
        );
        assert!(line.get("commit").is_some(), "{line}");
        assert_eq!(
            line["command"].as_str(),
            Some("opledger bench status --events 2000 --samples 10"),
            "{line}"
        );
    }
}

#[test]
fn an_unrecorded_bench_run_leaves_nothing_behind_in_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let report = bench_status_in(dir.path(), None);
    assert_eq!(report["workload"], "status");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
