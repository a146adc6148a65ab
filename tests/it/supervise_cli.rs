//! Supervised execution through the real binary: `opledger supervise`
//! processes running export children, real signals (SIGTERM, SIGKILL) and
//! real files — cancel, the grace, limits, a killed supervisor, heartbeats
//! and slots. The children are slowed down or made stubborn by the test
//! knobs of `opledger_supervise::export::child` (set on the supervisor,
//! inherited by its children), so every test runs in seconds; the children
//! append `start`/`end` lines to a run log, so runs and overlaps are
//! counted from the children themselves.

use crate::common;
use crate::supervise_support;

use common::{assert_exit, describe, run};
use serde_json::Value;
use std::time::{Duration, Instant};
use supervise_support::{alive, wait_for, Ledger};

#[test]
fn registering_an_export_while_no_supervisor_runs_exits_5_and_appends_nothing() {
    let ledger = Ledger::new(2, 0);
    let head = ledger.head();
    let output = run(ledger
        .command()
        .args(["export", "create", "--what", "operations", "--format", "csv"]));
    assert_exit(&output, 5);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no supervisor is running"),
        "{}",
        describe(&output)
    );
    assert_eq!(ledger.head(), head, "a refused registration appends nothing");
    // A supervisor that was SIGKILLed is no supervisor either.
    let mut supervisor = ledger.supervise(&[], &[]);
    supervisor.kill();
    let output = run(ledger
        .command()
        .args(["export", "create", "--what", "operations", "--format", "csv"]));
    assert_exit(&output, 5);
    assert_eq!(ledger.head(), head);
}

#[test]
fn a_cancelled_export_is_cancelled_only_after_its_child_exited_and_its_files_are_gone() {
    let ledger = Ledger::new(200, 0);
    let _supervisor = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "50")]);
    let (token, operation, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    wait_for("the child writing", Duration::from_secs(15), || {
        let status = ledger.status(&token);
        status["phase"] == "writing" && status["processed"].as_u64().unwrap_or(0) > 0
    });
    let pid = ledger.child_pid(&operation);
    assert!(
        !ledger.files_in("tmp").is_empty(),
        "the child writes its temporary file"
    );
    let output = run(ledger.command().args(["export", "cancel", &token]));
    assert_exit(&output, 0);
    // Durable at once, cancelled later.
    let asked = ledger.status(&token);
    assert_eq!(asked["cancel_requested"], true, "{asked}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = ledger.status(&token);
        if status["status"] == "cancelled" {
            assert!(!alive(pid), "cancelled is recorded only once the child is gone");
            break;
        }
        assert!(Instant::now() < deadline, "never cancelled: {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(ledger.files_in("tmp").is_empty(), "{:?}", ledger.files_in("tmp"));
    assert!(ledger.files_in("files").is_empty());
    let runs = ledger.runs();
    assert_eq!(
        runs.iter().filter(|(event, ..)| event == "end").count(),
        1,
        "the child stopped on its own: {runs:?}"
    );
}

#[test]
fn a_child_that_ignores_sigterm_is_killed_after_the_grace() {
    let ledger = Ledger::new(200, 0);
    let _supervisor = ledger.supervise(
        &["--grace-ms", "1500"],
        &[
            ("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "50"),
            ("OPLEDGER_EXPORT_TEST_IGNORE_TERM", "1"),
        ],
    );
    let (token, operation, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    wait_for("the child writing", Duration::from_secs(15), || {
        ledger.status(&token)["phase"] == "writing"
    });
    let pid = ledger.child_pid(&operation);
    let asked_at = Instant::now();
    assert_exit(&run(ledger.command().args(["export", "cancel", &token])), 0);
    let cancelled = ledger.wait_status(&token, "cancelled", Duration::from_secs(15));
    assert!(
        asked_at.elapsed() >= Duration::from_millis(1500),
        "{:?}: SIGKILL came only after the grace",
        asked_at.elapsed()
    );
    assert!(!alive(pid));
    assert_eq!(cancelled["reason"], "cancelled");
    let runs = ledger.runs();
    assert!(
        runs.iter().all(|(event, ..)| event == "start"),
        "a killed child writes no end: {runs:?}"
    );
    assert!(ledger.files_in("tmp").is_empty());
}

#[test]
fn an_export_past_its_run_time_fails_with_timeout_and_leaves_no_file() {
    let ledger = Ledger::new(200, 0);
    let _supervisor = ledger.supervise(&["--max-run-secs", "1"], &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "50")]);
    let (token, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let failed = ledger.wait_status(&token, "failed_terminal", Duration::from_secs(15));
    assert_eq!(failed["reason"], "timeout", "{failed}");
    assert_eq!(failed["artifact"], Value::Null);
    assert!(ledger.files_in("tmp").is_empty());
    assert!(ledger.files_in("files").is_empty());
    let output = run(ledger
        .command()
        .args(["export", "download", &token, "--out", "/dev/null"]));
    assert_exit(&output, 3);
}

#[test]
fn the_size_and_storage_limits_each_fail_an_export_with_their_reason() {
    let ledger = Ledger::new(50, 0);
    let mut supervisor = ledger.supervise(&["--max-artifact-bytes", "1000"], &[]);
    let (too_big, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let failed = ledger.wait_status(&too_big, "failed_terminal", Duration::from_secs(15));
    assert_eq!(failed["reason"], "size_limit", "{failed}");
    assert!(ledger.files_in("tmp").is_empty() && ledger.files_in("files").is_empty());
    supervisor.kill();

    // One export fits the storage; the second would pass it.
    let _supervisor = ledger.supervise(&["--max-storage-bytes", "11000"], &[]);
    let (fits, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let done = ledger.wait_status(&fits, "succeeded", Duration::from_secs(15));
    let size = done["artifact"]["size"].as_u64().unwrap();
    assert!(size > 5_500 && size < 11_000, "the test's sizes hold: {size}");
    let (full, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let failed = ledger.wait_status(&full, "failed_terminal", Duration::from_secs(15));
    assert_eq!(failed["reason"], "storage_full", "{failed}");
    assert_eq!(ledger.files_in("files").len(), 1, "only the first file is kept");
    assert!(ledger.files_in("tmp").is_empty());
}

#[test]
fn a_job_whose_supervisor_was_killed_is_failed_by_the_next_supervisor_and_never_runs_again() {
    let ledger = Ledger::new(200, 0);
    let mut first = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "50")]);
    let (token, operation, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    wait_for("the child writing", Duration::from_secs(15), || {
        ledger.status(&token)["phase"] == "writing"
    });
    let pid = ledger.child_pid(&operation);
    first.kill();
    // The child dies with its supervisor.
    wait_for("the orphaned child to die", Duration::from_secs(5), || !alive(pid));
    assert_eq!(ledger.status(&token)["status"], "running", "nobody has noticed yet");

    let _second = ledger.supervise(&[], &[]);
    let failed = ledger.wait_status(&token, "failed_terminal", Duration::from_secs(15));
    assert_eq!(failed["reason"], "supervisor_lost", "{failed}");
    assert!(
        ledger.files_in("tmp").is_empty(),
        "the leftover temporary file is removed"
    );
    assert!(ledger.files_in("files").is_empty());
    // Given time to (wrongly) run it again, the second supervisor does not.
    std::thread::sleep(Duration::from_millis(1500));
    let starts = ledger.runs().iter().filter(|(event, ..)| event == "start").count();
    assert_eq!(starts, 1, "the job ran exactly once");
}

#[test]
fn heartbeats_come_about_every_second_while_the_child_blocks_for_five_seconds() {
    let ledger = Ledger::new(3, 0);
    // Blocked 6.5 s from its start: watched for 4.5 s of it, after the
    // child's first report.
    let _supervisor = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_BLOCK_MS", "6500")]);
    let (token, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    ledger.wait_status(&token, "running", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(700));
    let mut beats: Vec<String> = Vec::new();
    let mut updated: Vec<String> = Vec::new();
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_millis(4500) {
        let status = ledger.status(&token);
        assert_eq!(status["phase"], "aggregating", "the child is still blocked: {status}");
        if let Some(beat) = status["heartbeat_at"].as_str() {
            if beats.last().map(String::as_str) != Some(beat) {
                beats.push(beat.to_string());
            }
        }
        let update = status["updated_at"].as_str().unwrap().to_string();
        if !updated.contains(&update) {
            updated.push(update);
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(beats.len() >= 4, "heartbeats while the child blocked: {beats:?}");
    let times: Vec<i64> = beats
        .iter()
        .map(|beat| opledger_domain::Timestamp::parse(beat).unwrap().as_micros())
        .collect();
    for pair in times.windows(2) {
        // About every second; the margin is for a loaded machine.
        assert!(pair[1] - pair[0] <= 2_500_000, "a gap between heartbeats: {beats:?}");
    }
    assert_eq!(
        updated.len(),
        1,
        "no progress was written while the child blocked: {updated:?}"
    );
    ledger.wait_status(&token, "succeeded", Duration::from_secs(10));
}

#[test]
fn three_jobs_on_two_slots_never_run_more_than_two_children_at_once() {
    let ledger = Ledger::new(30, 0);
    // Two supervisors of the same directory share its two slots.
    let knobs = [("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "40")];
    let _a = ledger.supervise(&["--slots", "2", "--name", "a"], &knobs);
    let _b = ledger.supervise(&["--slots", "2", "--name", "b"], &knobs);
    let tokens: Vec<String> = (0..3)
        .map(|_| ledger.create(&["--what", "operations", "--format", "csv"]).0)
        .collect();
    for token in &tokens {
        ledger.wait_status(token, "succeeded", Duration::from_secs(30));
    }
    let mut edges: Vec<(i64, i32)> = ledger
        .runs()
        .iter()
        .map(|(event, _, at)| (*at, if event == "start" { 1 } else { -1 }))
        .collect();
    assert_eq!(edges.len(), 6, "three children started and ended");
    // Ends sort before starts at the same instant.
    edges.sort();
    let mut running = 0;
    let mut most = 0;
    for (_, change) in edges {
        running += change;
        most = most.max(running);
    }
    assert_eq!(most, 2, "two slots: two children at once, never three");
}

#[test]
fn a_job_queued_past_the_wait_limit_fails_with_queue_timeout_and_never_runs() {
    let ledger = Ledger::new(100, 0);
    let _supervisor = ledger.supervise(
        &["--slots", "1", "--max-queued-secs", "1", "--patrol-secs", "1"],
        &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "40")],
    );
    let (long, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    ledger.wait_status(&long, "running", Duration::from_secs(10));
    let (waiting, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let failed = ledger.wait_status(&waiting, "failed_terminal", Duration::from_secs(10));
    assert_eq!(failed["reason"], "queue_timeout", "{failed}");
    ledger.wait_status(&long, "succeeded", Duration::from_secs(20));
    let starts = ledger.runs().iter().filter(|(event, ..)| event == "start").count();
    assert_eq!(starts, 1, "only the first job ran");
}
