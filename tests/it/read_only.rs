//! Reading commands open the store read-only: they work on a SQLite file
//! nobody may write (and in a folder nobody may write), and with a
//! PostgreSQL role granted only SELECT; they create, migrate, catch up and
//! rebuild nothing. Projections stored at another version are refused with
//! the writing command that rebuilds them; projections behind the log are
//! read as they are, and said to be behind.
//!
//! Permissions do not bind root, so as root the reading commands run as
//! the unprivileged user `nobody` (uid 65534), for whom the file really is
//! read-only.

use crate::common;

use common::{assert_exit, at, binary, describe, ledger_with_a_task, ok_json_at};
use opledger_testkit::{backend_tests, Backend, Harness};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

/// The user the reading commands run as when the tests run as root.
const NOBODY: u32 = 65_534;

/// Whether this process runs as root: `/proc/self` belongs to the
/// process's effective user.
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|metadata| metadata.uid() == 0)
        .unwrap_or(false)
}

/// The binary, as a user the file's permissions bind.
fn unprivileged() -> Command {
    let mut command = binary();
    if running_as_root() {
        command.uid(NOBODY).gid(NOBODY);
    }
    command
}

fn run_unprivileged(url: &str, args: &[&str]) -> Output {
    common::run(unprivileged().args(args).arg("--database-url").arg(url))
}

/// Every reading command of a ledger with one media item, its task, a
/// batch and a review entry: (arguments, whether it answers JSON).
fn reading_commands(media_id: &str, operation_id: &str, batch_id: &str) -> Vec<Vec<String>> {
    let commands: Vec<Vec<&str>> = vec![
        vec!["status", "--json"],
        vec!["timeline", operation_id, "--json"],
        vec!["capabilities", "--media", media_id, "--json"],
        vec!["kinds", "list", "--json"],
        vec!["kinds", "show", "metadata", "--json"],
        vec!["review", "list", "--json"],
        vec!["batch", "show", batch_id, "--json"],
        vec!["batch", "list", "--json"],
        vec!["task", "show", "--operation", operation_id, "--json"],
        vec!["replay", "--json"],
        vec!["replay", "--verify", "--json"],
    ];
    commands
        .into_iter()
        .map(|args| args.into_iter().map(str::to_string).collect())
        .collect()
}

/// A ledger with something in every projection: (media, operation, batch).
fn full_ledger(url: &str) -> (String, String, String) {
    let (media_id, operation_id) = ledger_with_a_task(url);
    let batch = ok_json_at(
        url,
        &[
            "batch",
            "create",
            "--name",
            "b",
            "--media",
            &media_id,
            "--kind",
            "thumbnail",
            "--json",
        ],
    );
    let batch_id = batch["batch_id"].as_str().expect("a batch id").to_string();
    let claim = ok_json_at(
        url,
        &[
            "task", "claim", "--kind", "metadata", "--worker", "w", "--lease", "60", "--json",
        ],
    );
    let token = claim["claim_token"].as_str().unwrap();
    assert_exit(&at(url, &["task", "fail", token, "--error", "broken", "--terminal"]), 0);
    (media_id, operation_id, batch_id)
}

fn assert_reading_commands_succeed(url: &str, run: impl Fn(&[&str]) -> Output, ledger: &(String, String, String)) {
    for args in reading_commands(&ledger.0, &ledger.1, &ledger.2) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = run(&args);
        assert_exit(&output, 0);
        serde_json::from_slice::<serde_json::Value>(&output.stdout)
            .unwrap_or_else(|error| panic!("{args:?} on {url}: not JSON ({error}): {}", describe(&output)));
    }
}

/// The file's bytes, to compare before and after.
fn file_digest(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Checkpoints the ledger's WAL into its file and closes it as the last
/// connection does, which removes the `-wal` and `-shm` files: the state a
/// ledger nobody is writing to is left in.
fn close_cleanly(db: &Path) {
    common::runtime().block_on(async {
        use sqlx::{ConnectOptions, Connection, Executor};
        let mut connection = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(db)
            .connect()
            .await
            .unwrap();
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").await.unwrap();
        connection.close().await.unwrap();
    });
}

/// A SQLite ledger, cleanly closed, its file made read-only.
fn read_only_sqlite_ledger() -> (tempfile::TempDir, std::path::PathBuf, (String, String, String)) {
    let folder = tempfile::tempdir().unwrap();
    let db = folder.path().join("ledger.db");
    let url = format!("sqlite:{}", db.display());
    let ledger = full_ledger(&url);
    close_cleanly(&db);
    set_mode(&db, 0o444);
    set_mode(folder.path(), 0o755);
    (folder, db, ledger)
}

#[test]
fn reading_commands_work_on_a_read_only_sqlite_file() {
    let (folder, db, ledger) = read_only_sqlite_ledger();
    let url = format!("sqlite:{}", db.display());
    // The folder is writable by the reader (SQLite keeps its WAL files there).
    set_mode(folder.path(), 0o777);
    let before = file_digest(&db);
    assert_reading_commands_succeed(&url, |args| run_unprivileged(&url, args), &ledger);
    assert_eq!(file_digest(&db), before, "the ledger file is unchanged");
    // A writing command cannot write there: exit 5, nothing changed.
    let refused = run_unprivileged(&url, &["media", "add", "--path", "/x.png"]);
    assert_exit(&refused, 5);
    assert_eq!(file_digest(&db), before);
    set_mode(folder.path(), 0o755);
}

#[test]
fn reading_commands_work_in_a_read_only_folder() {
    let (folder, db, ledger) = read_only_sqlite_ledger();
    let url = format!("sqlite:{}", db.display());
    set_mode(folder.path(), 0o555);
    let before = file_digest(&db);
    assert_reading_commands_succeed(&url, |args| run_unprivileged(&url, args), &ledger);
    assert_eq!(file_digest(&db), before);
    let entries: Vec<_> = std::fs::read_dir(folder.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(
        entries,
        ["ledger.db"],
        "nothing was created beside the ledger (its WAL files included)"
    );
    set_mode(folder.path(), 0o755);
}

#[test]
fn a_reading_command_creates_no_database() {
    let (folder, db) = common::temp_db();
    let url = format!("sqlite:{}", db.display());
    let output = at(&url, &["status"]);
    assert_exit(&output, 4);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no ledger"), "{stderr}");
    assert!(!db.exists(), "status created {}", db.display());
    assert_eq!(std::fs::read_dir(folder.path()).unwrap().count(), 0);
}

/// The URL of the same database for another user.
fn url_as(url: &str, user: &str) -> String {
    let start = url.find("://").unwrap() + 3;
    match url[start..].find('@') {
        Some(at) => format!("{}{user}@{}", &url[..start], &url[start + at + 1..]),
        None => format!("{}{user}@{}", &url[..start], &url[start..]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_commands_work_with_a_postgres_role_granted_only_select() {
    let Some(backend) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let url = backend.url();
    let ledger = full_ledger(&url);
    let role = format!("opledger_reader_{}", std::process::id());
    backend
        .execute_raw(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; \
             GRANT CONNECT ON DATABASE {database} TO {role}; GRANT USAGE ON SCHEMA public TO {role}; \
             GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role};",
            database = backend.database()
        ))
        .await
        .unwrap();
    let reader = url_as(&url, &role);
    let head = ok_json_at(&url, &["status", "--json"])["head"].clone();
    let checked = std::panic::catch_unwind(|| {
        assert_reading_commands_succeed(&reader, |args| at(&reader, args), &ledger);
        // A writing command is refused by the server: exit 5, nothing appended.
        let refused = at(&reader, &["media", "add", "--path", "/x.png"]);
        assert_exit(&refused, 5);
    });
    assert_eq!(ok_json_at(&url, &["status", "--json"])["head"], head);
    backend
        .execute_raw(&format!("DROP OWNED BY {role}; DROP ROLE {role};"))
        .await
        .unwrap();
    if let Err(panic) = checked {
        std::panic::resume_unwind(panic);
    }
}

async fn a_reading_command_refuses_projections_at_another_version_naming_the_command_that_rebuilds_them<B: Backend>(
    backend: &B,
) {
    let url = backend.url();
    ledger_with_a_task(&url);
    backend
        .execute_raw("UPDATE projection_positions SET version = version + 7 WHERE name = 'batches'")
        .await
        .unwrap();
    let refused = at(&url, &["status"]);
    assert_exit(&refused, 5);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    let version = opledger_domain::projections::BATCHES.version;
    let named = format!("batches (stored v{}, this build reads v{version})", version + 7);
    assert!(stderr.contains(&named), "{stderr}");
    assert!(stderr.contains("opledger recover"), "{stderr}");
    // The writing command named rebuilds them; reading works again.
    assert_exit(&at(&url, &["recover"]), 0);
    ok_json_at(&url, &["status", "--json"]);
    common::assert_verify_identical(&url);
}

async fn a_reading_command_reads_projections_behind_the_log_and_says_how_far<B: Backend>(backend: &B) {
    let url = backend.url();
    ledger_with_a_task(&url);
    backend
        .execute_raw("UPDATE projection_positions SET position = position - 2 WHERE name = 'review_queue'")
        .await
        .unwrap();
    let output = at(&url, &["status", "--json"]);
    assert_exit(&output, 0);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("2 events behind the log"), "{stderr}");
    let status = common::json(&output);
    let lag = status["projections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|projection| projection["name"] == "review_queue")
        .map(|projection| projection["lag"].clone());
    assert_eq!(lag, Some(serde_json::json!(2)), "{status}");
}

async fn a_reading_command_on_an_empty_database_creates_nothing<B: Backend>(backend: &B) {
    let output = at(&backend.url(), &["kinds", "list"]);
    assert_exit(&output, 4);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no ledger"),
        "{}",
        describe(&output)
    );
}

backend_tests!(
    a_reading_command_refuses_projections_at_another_version_naming_the_command_that_rebuilds_them,
    a_reading_command_reads_projections_behind_the_log_and_says_how_far,
    a_reading_command_on_an_empty_database_creates_nothing,
);
