//! `opledger replay --rebuild` repairs projections that drifted from the
//! log (a row changed behind opledger's back, found by `replay --verify`),
//! on SQLite and PostgreSQL; and `replay --verify` on a full disk says so
//! first, in plain words. `replay --verify` also walks the log's hash
//! chain: an event changed together with its projection row is named by
//! its seq (exit 1), and `status` says when the log was last checked.

use crate::common;

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

/// SQL that changes a stored event, which the log refuses: what someone
/// holding the database's credentials could run.
fn unlocked_event_update<B: Backend>(backend: &B, update: &str) -> String {
    if backend.name() == "sqlite" {
        format!("DROP TRIGGER media_operation_events_no_update; {update}")
    } else {
        format!("ALTER TABLE media_operation_events DISABLE TRIGGER USER; {update}")
    }
}

async fn verify_names_the_seq_of_an_event_changed_with_its_row_and_status_says_when_it_was_checked<B: Backend>(
    backend: &B,
) {
    let url = backend.url();
    ledger_with_a_task(&url);
    let never = ok_json_at(&url, &["status", "--json"]);
    assert_eq!(never["integrity"], serde_json::Value::Null, "{never}");
    assert!(common::stdout(&at(&url, &["status"])).contains("log integrity: never checked"));
    common::assert_verify_identical(&url);
    let checked = ok_json_at(&url, &["status", "--json"]);
    assert_eq!(checked["integrity"]["intact"], true, "{checked}");
    assert_eq!(checked["integrity"]["position"], checked["head"], "{checked}");

    let registered = ok_json_at(&url, &["replay", "--verify", "--json"]);
    assert_eq!(registered["chain"]["intact"], true, "{registered}");
    // The registration of /photos/one.png and the media row it folded
    // into, changed alike: the replay agrees with the live rows.
    backend
        .execute_raw(&unlocked_event_update(
            backend,
            "UPDATE media_operation_events SET payload = replace(payload, '/photos/one.png', '/photos/two.png') \
             WHERE event_type = 'media_registered'",
        ))
        .await
        .unwrap();
    backend
        .execute_raw("UPDATE media SET path = '/photos/two.png' WHERE path = '/photos/one.png'")
        .await
        .unwrap();
    let shown = ok_json_at(&url, &["media", "show", "--path", "/photos/two.png", "--json"]);
    assert!(shown.is_object(), "the tampered path reads as real: {shown}");

    let broken = at(&url, &["replay", "--verify", "--json"]);
    assert_exit(&broken, 1);
    let report = common::json(&broken);
    assert_eq!(report["differences"], serde_json::json!([]), "{report}");
    assert_eq!(report["chain"]["intact"], false, "{report}");
    let at_seq = report["chain"]["broken_at"]
        .as_i64()
        .expect("the seq where the chain breaks");
    let plain = at(&url, &["replay", "--verify"]);
    assert_exit(&plain, 1);
    assert!(
        common::stdout(&plain).contains(&format!("the log's chain breaks at seq {at_seq}")),
        "{}",
        describe(&plain)
    );
    let status = ok_json_at(&url, &["status", "--json"]);
    assert_eq!(status["integrity"]["broken_at"], at_seq, "{status}");
    assert_eq!(status["integrity"]["intact"], false, "{status}");
    assert!(
        common::stdout(&at(&url, &["status"])).contains(&format!("found the chain broken at seq {at_seq}")),
        "status names the break"
    );
}

backend_tests!(
    replay_rebuild_repairs_a_tampered_row_and_verify_is_identical_afterwards,
    verify_names_the_seq_of_an_event_changed_with_its_row_and_status_says_when_it_was_checked,
);

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
