//! The powerloss VFS really loses what was never synced: a child process
//! commits one row with a sync and more rows without one, reads them all
//! back through the VFS, and is SIGKILLed; the parent, on the plain unix
//! VFS, finds the synced row and none of the others. The same child without
//! the VFS loses nothing to the same kill (the operating system keeps what
//! a killed process wrote), so the loss is the VFS's doing. Without this,
//! the power-loss tests of the ledger could pass because nothing was ever
//! dropped.
//!
//! The child is this test binary run again with `OPLEDGER_POWERLOSS_VFS_CHILD`
//! set to the database path (and `OPLEDGER_POWERLOSS_VFS_PLAIN` to leave the
//! VFS out), selecting [`powerloss_vfs_child_writes_then_waits_to_be_killed`],
//! which does nothing in a normal run.

use crate::powerloss;
use rusqlite::Connection;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const CHILD_ENV: &str = "OPLEDGER_POWERLOSS_VFS_CHILD";
const PLAIN_ENV: &str = "OPLEDGER_POWERLOSS_VFS_PLAIN";
const CHILD_TEST: &str = "powerloss_vfs_tests::powerloss_vfs_child_writes_then_waits_to_be_killed";
/// Rows committed without a sync: enough pages (a 2 KiB row each) that the
/// WAL grows over many blocks of the overlay.
const UNSYNCED_ROWS: usize = 200;

/// Not a test on its own: the child of the tests below. Without
/// `OPLEDGER_POWERLOSS_VFS_CHILD` it returns at once.
#[test]
fn powerloss_vfs_child_writes_then_waits_to_be_killed() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    if std::env::var_os(PLAIN_ENV).is_none() {
        powerloss::install().expect("register the powerloss VFS");
        assert!(powerloss::is_default(), "the powerloss VFS is not the default");
    }
    let connection = Connection::open(&path).expect("open the database");
    connection
        .execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
             CREATE TABLE rows (name TEXT NOT NULL, filler BLOB NOT NULL);
             INSERT INTO rows VALUES ('synced', zeroblob(16));",
        )
        .expect("commit the synced row");
    // From here on no commit syncs anything.
    connection
        .execute_batch("PRAGMA synchronous = OFF; PRAGMA wal_autocheckpoint = 0;")
        .expect("stop syncing");
    for row in 0..UNSYNCED_ROWS {
        connection
            .execute(
                "INSERT INTO rows VALUES (?1, randomblob(2048))",
                [format!("unsynced {row}")],
            )
            .expect("commit an unsynced row");
    }
    // Read back through the VFS (a second connection, as a read pool
    // would): the process sees its unsynced rows.
    let reader = Connection::open(&path).expect("open a second connection");
    let count: i64 = reader
        .query_row("SELECT count(*) FROM rows", [], |row| row.get(0))
        .expect("count the rows");
    let check: String = reader
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("check the database");
    let mut stdout = std::io::stdout().lock();
    // libtest has printed `test NAME ... ` without a newline; start afresh.
    write!(stdout, "\nrows {count} {check}\n")
        .and_then(|()| stdout.flush())
        .expect("report");
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// Runs the child until it reports, SIGKILLs it, and returns what it saw.
fn write_and_kill(db: &Path, through_vfs: bool) -> String {
    let mut command = Command::new(std::env::current_exe().expect("this test binary"));
    command
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, db)
        .env_remove(PLAIN_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !through_vfs {
        command.env(PLAIN_ENV, "1");
    }
    let mut child = command.spawn().expect("start the child");
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let report = lines
        .find_map(|line| line.ok().filter(|line| line.starts_with("rows ")))
        .unwrap_or_default();
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("reap the child");
    let mut stderr = String::new();
    let _ = child.stderr.take().expect("piped stderr").read_to_string(&mut stderr);
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "the child ended by itself ({status}):\n{stderr}"
        );
    }
    assert!(!report.is_empty(), "the child never reported its rows:\n{stderr}");
    report
}

/// The rows' names as the plain unix VFS finds them on disk.
fn names_on_disk(db: &Path) -> (Vec<String>, String) {
    assert!(!powerloss::is_default(), "the parent must read the disk, not the VFS");
    let connection = Connection::open(db).expect("reopen the database");
    let check: String = connection
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("check the database");
    let mut statement = connection
        .prepare("SELECT name FROM rows ORDER BY rowid")
        .expect("prepare");
    let names = statement
        .query_map([], |row| row.get(0))
        .expect("read the rows")
        .collect::<Result<Vec<String>, _>>()
        .expect("read the rows");
    (names, check)
}

#[test]
fn rows_committed_without_a_sync_are_gone_after_a_kill_through_the_powerloss_vfs_and_a_synced_row_stays() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("vfs.db");
    let report = write_and_kill(&db, true);
    assert_eq!(
        report,
        format!("rows {} ok", UNSYNCED_ROWS + 1),
        "the child did not read its own unsynced rows back through the VFS"
    );
    let (names, check) = names_on_disk(&db);
    assert_eq!(check, "ok");
    assert_eq!(
        names,
        vec!["synced".to_string()],
        "after the kill the disk should hold the synced row and nothing written without a sync"
    );
}

#[test]
fn the_same_rows_survive_the_same_kill_without_the_powerloss_vfs() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let db = dir.path().join("plain.db");
    let report = write_and_kill(&db, false);
    assert_eq!(report, format!("rows {} ok", UNSYNCED_ROWS + 1));
    let (names, check) = names_on_disk(&db);
    assert_eq!(check, "ok");
    assert_eq!(
        names.len(),
        UNSYNCED_ROWS + 1,
        "a killed process's writes are in the operating system's cache: only the VFS loses them"
    );
}
