//! `opledger replay --rebuild` repairs projections that drifted from the
//! log (a row changed behind opledger's back, found by `replay --verify`),
//! on SQLite and PostgreSQL; and `replay --verify` on a full disk says so
//! first, in plain words.

mod common;

use common::{assert_exit, at, describe, ledger_with_a_task, ok_json_at};
use opledger_testkit::{backend_tests, Backend};

async fn replay_rebuild_repairs_a_tampered_row_and_verify_is_identical_afterwards<B: Backend>(backend: &B) {
    let url = backend.url();
    let (_, operation_id) = ledger_with_a_task(&url);
    common::assert_verify_identical(&url);
    backend
        .execute_raw(&format!(
            "UPDATE media_operations SET status = 'succeeded', status_reason = 'tampered' WHERE id = '{operation_id}'"
        ))
        .await
        .unwrap();
    let drifted = at(&url, &["replay", "--verify", "--json"]);
    assert_exit(&drifted, 1);
    let report = common::json(&drifted);
    assert_eq!(report["identical"], false);
    assert!(report["differences"].to_string().contains("tampered"), "{report}");

    let rebuilt = ok_json_at(&url, &["replay", "--rebuild", "--json"]);
    let names: Vec<&str> = rebuilt["rebuilt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|projection| projection["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"media_operations"), "{rebuilt}");
    let plain = at(&url, &["replay", "--rebuild"]);
    assert_exit(&plain, 0);
    assert!(common::stdout(&plain).contains("rebuilt"), "{}", describe(&plain));
    common::assert_verify_identical(&url);
    let task = ok_json_at(&url, &["task", "show", "--operation", &operation_id, "--json"]);
    assert_eq!(task["status"], "queued");
}

backend_tests!(replay_rebuild_repairs_a_tampered_row_and_verify_is_identical_afterwards);

#[test]
fn replay_verify_and_rebuild_are_exclusive() {
    let (_folder, db) = common::temp_db();
    let output = at(
        &format!("sqlite:{}", db.display()),
        &["replay", "--verify", "--rebuild"],
    );
    assert_exit(&output, 2);
}

/// Runs `script` in a mount namespace of its own (so its mounts vanish
/// with it), or None when this machine does not allow one (not root): a
/// loud skip, a failure under `CI=true`.
fn in_own_mount_namespace(script: &str) -> Option<std::process::Output> {
    let probe = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .output();
    if !probe.as_ref().is_ok_and(|output| output.status.success()) {
        let why = format!("cannot make a mount namespace here ({probe:?})");
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{why}");
        }
        eprintln!("SKIPPED: {why}");
        return None;
    }
    Some(common::run(
        std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "bash", "-c"])
            .arg(script),
    ))
}

#[test]
fn replay_verify_on_a_full_disk_says_disk_full_first() {
    let (folder, db) = common::temp_db();
    let url = format!("sqlite:{}", db.display());
    ledger_with_a_task(&url);
    // The scratch copy of a read-only replay goes to the temporary folder:
    // a tmpfs of 32 KiB there is full before its tables are made.
    let full = folder.path().join("full");
    std::fs::create_dir(&full).unwrap();
    let script = format!(
        "mount -t tmpfs -o size=32k tmpfs '{full}' && TMPDIR='{full}' exec '{bin}' replay --verify --database-url '{url}'",
        full = full.display(),
        bin = common::BIN,
    );
    let Some(output) = in_own_mount_namespace(&script) else {
        return;
    };
    assert_exit(&output, 5);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("opledger: disk full: "), "{stderr}");
    assert!(stderr.len() < 600, "{} bytes: {stderr}", stderr.len());
    // Nothing of the ledger was touched.
    common::assert_verify_identical(&url);
}
