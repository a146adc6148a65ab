//! Exports through the real binary and a real supervisor: what the files
//! hold (counts, the pivot, one position one file), expiry, tokens, the
//! queue, and PostgreSQL with two supervisors on one artifact directory.

use crate::common;
use crate::supervise_support;

use common::{assert_exit, binary, describe, json, run};
use opledger_testkit::Backend;
use serde_json::Value;
use std::process::Stdio;
use std::time::{Duration, Instant};
use supervise_support::{lines, wait_for, Ledger, Supervisor};

#[test]
fn progress_counts_equal_what_the_files_hold_and_total_is_null_while_aggregating() {
    let ledger = Ledger::new(30, 4);
    let _supervisor = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_BLOCK_MS", "1500")]);

    let (csv, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    // While the child aggregates, the size is not known.
    let deadline = Instant::now() + Duration::from_secs(10);
    let aggregating = loop {
        let status = ledger.status(&csv);
        if status["phase"] == "aggregating" && status["status"] == "running" {
            break status;
        }
        assert!(Instant::now() < deadline, "never seen aggregating: {status}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(aggregating["total"], Value::Null, "{aggregating}");
    let done = ledger.wait_status(&csv, "succeeded", Duration::from_secs(20));
    let file = lines(&ledger.download(&csv));
    let data_rows = file.len() as u64 - 1;
    // 30 plain operations, 8 tasks, and the export itself is not in its own file.
    assert_eq!(data_rows, 38, "{file:?}");
    assert_eq!(done["processed"], data_rows, "{done}");
    assert_eq!(done["total"], data_rows);
    assert_eq!(done["regular_rows"], data_rows);
    assert_eq!(done["logical_count_unit"], "rows");
    assert_eq!(
        done["artifact"]["size"],
        std::fs::metadata(
            ledger
                .artifacts
                .join("files")
                .join(format!("{}.csv", done["operation_id"].as_str().unwrap()))
        )
        .unwrap()
        .len()
    );

    let (pivot_csv, _, _) = ledger.create(&["--what", "capability_counts", "--format", "csv"]);
    let (pivot_json, _, _) = ledger.create(&["--what", "capability_counts", "--format", "json"]);
    let done_csv = ledger.wait_status(&pivot_csv, "succeeded", Duration::from_secs(20));
    let done_json = ledger.wait_status(&pivot_json, "succeeded", Duration::from_secs(20));

    let csv_lines = lines(&ledger.download(&pivot_csv));
    assert_eq!(csv_lines[0], "row_type,capability,status,count");
    let cells = csv_lines.iter().filter(|line| line.starts_with("cell,")).count() as u64;
    let subtotals = csv_lines.iter().filter(|line| line.starts_with("subtotal,")).count() as u64;
    assert_eq!(csv_lines.last().unwrap(), "total,,,8", "{csv_lines:?}");
    assert_eq!(done_csv["processed"], csv_lines.len() as u64 - 1, "{done_csv}");
    assert_eq!(done_csv["processed"], cells + subtotals + 1);
    assert_eq!(done_csv["regular_rows"], cells);
    assert_eq!(done_csv["logical_count_unit"], "rows");

    let pivot: Value = serde_json::from_slice(&ledger.download(&pivot_json)).unwrap();
    let capabilities = pivot["pivot"].as_object().unwrap();
    let pivot_cells: usize = capabilities
        .values()
        .map(|statuses| statuses.as_object().unwrap().len())
        .sum::<usize>()
        + 1;
    assert_eq!(pivot["total"], 8);
    assert_eq!(capabilities["metadata"]["subtotal"], 4);
    assert_eq!(done_json["logical_count_unit"], "pivot_cells");
    assert_eq!(done_json["processed"], pivot_cells as u64, "{done_json} {pivot}");
    assert_eq!(done_json["regular_rows"], cells);
}

#[test]
fn two_exports_at_one_position_are_byte_identical_and_events_appended_meanwhile_are_not_in_them() {
    let ledger = Ledger::new(40, 0);
    let _supervisor = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "25")]);
    let (first, _, as_of) = ledger.create(&["--what", "operations", "--format", "json"]);
    ledger.wait_status(&first, "running", Duration::from_secs(10));
    // The ledger moves on while the export runs.
    ledger.add_operations(5);
    let as_of_text = as_of.to_string();
    let (second, _, second_as_of) =
        ledger.create(&["--what", "operations", "--format", "json", "--as-of-seq", &as_of_text]);
    assert_eq!(second_as_of, as_of);
    let (later, _, later_as_of) = ledger.create(&["--what", "operations", "--format", "json"]);
    assert!(later_as_of > as_of);
    for token in [&first, &second, &later] {
        ledger.wait_status(token, "succeeded", Duration::from_secs(30));
    }
    let first_bytes = ledger.download(&first);
    assert_eq!(first_bytes, ledger.download(&second), "one position, one file");
    let first_rows = serde_json::from_slice::<Value>(&first_bytes).unwrap()["rows"]
        .as_array()
        .unwrap()
        .len();
    let later_rows = serde_json::from_slice::<Value>(&ledger.download(&later)).unwrap()["rows"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(first_rows, 40, "the five appended during the export are not in it");
    // The later one sees the five new operations and the first two exports.
    assert_eq!(later_rows, 40 + 5 + 2);
}

#[test]
fn an_expired_artifact_is_swept_and_its_download_refused() {
    let ledger = Ledger::new(5, 0);
    let _supervisor = ledger.supervise(&["--expiry-secs", "1", "--patrol-secs", "1"], &[]);
    let (token, _, _) = ledger.create(&["--what", "operations", "--format", "json"]);
    let done = ledger.wait_status(&token, "succeeded", Duration::from_secs(15));
    assert!(done["artifact"]["size"].as_u64().unwrap() > 0, "{done}");
    wait_for("the patrol to remove the expired file", Duration::from_secs(10), || {
        ledger.files_in("files").is_empty()
    });
    let expired = ledger.status(&token);
    assert_eq!(expired["expired"], true, "{expired}");
    assert_eq!(expired["artifact"], Value::Null);
    let output = run(ledger
        .command()
        .args(["export", "download", &token, "--out", "/dev/null"]));
    assert_exit(&output, 4);
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("the artifact of export") && said.contains("expired") && !said.contains("not found"),
        "the refusal reads as one sentence: {said}"
    );
}

/// Supervisors started with different expiry limits share one directory:
/// each artifact lives until the expiry its job recorded, whoever sweeps.
#[test]
fn a_supervisor_with_a_shorter_expiry_keeps_other_jobs_artifacts_until_their_recorded_expiry() {
    let ledger = Ledger::new(5, 0);
    let mut long = ledger.supervise(&["--name", "long"], &[]);
    let (token, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    let done = ledger.wait_status(&token, "succeeded", Duration::from_secs(15));
    long.kill();
    let artifact = ledger.files_in("files");
    assert_eq!(artifact.len(), 1, "{done}");
    // Both files look an hour old; only the one no job records may go.
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3_600);
    let orphan = artifact[0].with_file_name("orphan.csv");
    std::fs::write(&orphan, b"left by nobody").unwrap();
    for file in [&artifact[0], &orphan] {
        std::fs::File::options()
            .write(true)
            .open(file)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
    }
    let _short = ledger.supervise(&["--name", "short", "--expiry-secs", "1", "--patrol-secs", "1"], &[]);
    wait_for(
        "the short supervisor's patrol to sweep the orphan",
        Duration::from_secs(20),
        || !orphan.exists(),
    );
    assert!(
        artifact[0].exists(),
        "the job's artifact is kept until its recorded expiry"
    );
    let status = ledger.status(&token);
    assert_eq!(status["expired"], false, "{status}");
    assert!(!ledger.download(&token).is_empty());
}

#[test]
fn a_tampered_token_is_refused_and_a_queued_export_is_cancelled_at_once() {
    let ledger = Ledger::new(100, 0);
    // One slot, held by a slow first job: the second waits in the queue.
    let _supervisor = ledger.supervise(&["--slots", "1"], &[("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS", "40")]);
    let (running, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    ledger.wait_status(&running, "running", Duration::from_secs(10));
    let (queued, _, _) = ledger.create(&["--what", "operations", "--format", "csv"]);
    assert_eq!(ledger.status(&queued)["status"], "queued");

    let last = queued.chars().last().unwrap();
    let tampered = format!("{}{}", &queued[..queued.len() - 1], if last == '0' { '1' } else { '0' });
    let output = run(ledger.command().args(["export", "status", &tampered]));
    assert_exit(&output, 2);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("is not valid here"),
        "{}",
        describe(&output)
    );

    let output = run(ledger.command().args(["export", "cancel", &queued, "--json"]));
    assert_exit(&output, 0);
    assert_eq!(json(&output)["status"], "cancelled", "a queued export stops at once");
    assert_exit(&run(ledger.command().args(["export", "cancel", &running])), 0);
    ledger.wait_status(&running, "cancelled", Duration::from_secs(10));
    assert!(ledger.runs().iter().filter(|(event, ..)| event == "start").count() == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_two_supervisors_share_one_artifact_directory_and_an_export_runs_once() {
    // A database of its own on the test server (opledger-testkit: the loud
    // skip without a server, dropped when the test ends).
    let Some(database) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let url = database.url();
    let (_, operation) = common::ledger_with_a_task(&url);
    let dir = tempfile::tempdir().unwrap();
    let artifacts = dir.path().join("artifacts");
    let run_log = dir.path().join("runs.log");
    let on_postgres = |args: &[&str]| {
        let mut command = binary();
        command.arg("--database-url").arg(&url).args(args);
        command
    };
    // A PostgreSQL ledger has no file to put artifacts beside.
    let output = run(&mut on_postgres(&[
        "export",
        "create",
        "--what",
        "operations",
        "--format",
        "csv",
    ]));
    assert_exit(&output, 2);

    let start = |name: &str| Supervisor {
        child: on_postgres(&["supervise", "--name", name])
            .env("OPLEDGER_ARTIFACT_DIR", &artifacts)
            .env("OPLEDGER_EXPORT_TEST_RUN_LOG", &run_log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    };
    let _a = start("a");
    let _b = start("b");
    let beats = artifacts.join("supervisors");
    wait_for("both supervisors' heartbeats", Duration::from_secs(20), || {
        std::fs::read_dir(&beats).is_ok_and(|entries| {
            entries
                .flatten()
                .filter(|entry| entry.path().extension().is_some_and(|extension| extension == "json"))
                .count()
                == 2
        })
    });
    let with_dir = |args: &[&str]| {
        let mut command = on_postgres(args);
        command.env("OPLEDGER_ARTIFACT_DIR", &artifacts);
        run(&mut command)
    };
    let created = with_dir(&["export", "create", "--what", "operations", "--format", "csv", "--json"]);
    assert_exit(&created, 0);
    let token = json(&created)["job_token"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = json(&with_dir(&["export", "status", &token, "--json"]));
        if status["status"] == "succeeded" {
            assert_eq!(status["processed"], 1, "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "never succeeded: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = dir.path().join("ops.csv");
    assert_exit(
        &with_dir(&["export", "download", &token, "--out", out.to_str().unwrap()]),
        0,
    );
    let file = std::fs::read_to_string(&out).unwrap();
    assert!(file.lines().nth(1).unwrap().starts_with(&operation), "{file}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let starts = std::fs::read_to_string(&run_log)
        .unwrap()
        .lines()
        .filter(|line| line.starts_with("start"))
        .count();
    assert_eq!(starts, 1, "one of the two supervisors ran it, once");
}

#[test]
fn a_batch_items_export_lists_the_batch_items_in_order_and_a_batch_missing_at_its_position_fails_it() {
    let ledger = Ledger::new(0, 0);
    let mut media = Vec::new();
    for n in 0..3 {
        let path = format!("/photos/b{n}.png");
        let digest = common::digest(100 + n);
        let output = run(ledger
            .command()
            .args(["media", "add", "--path", &path, "--digest", &digest, "--json"]));
        assert_exit(&output, 0);
        media.push(json(&output)["media_id"].as_str().unwrap().to_string());
    }
    let head_before_batch = ledger.head();
    let mut create = ledger.command();
    create
        .args([
            "batch", "create", "--name", "b", "--kind", "metadata", "--json", "--media",
        ])
        .args(&media);
    let output = run(&mut create);
    assert_exit(&output, 0);
    let batch = json(&output)["batch_id"].as_str().unwrap().to_string();
    let _supervisor = ledger.supervise(&[], &[]);

    // A batch export needs its batch, and only it takes one.
    let refused = run(ledger
        .command()
        .args(["export", "create", "--what", "batch_items", "--format", "csv"]));
    assert_exit(&refused, 2);
    let refused = run(ledger.command().args([
        "export",
        "create",
        "--what",
        "operations",
        "--format",
        "csv",
        "--batch",
        &batch,
    ]));
    assert_exit(&refused, 2);

    let (token, _, _) = ledger.create(&["--what", "batch_items", "--format", "csv", "--batch", &batch]);
    let done = ledger.wait_status(&token, "succeeded", Duration::from_secs(15));
    let file = lines(&ledger.download(&token));
    assert_eq!(file[0], "position,operation_id,label,outcome,last_status,runs");
    assert_eq!(file.len(), 4, "{file:?}");
    assert_eq!(done["processed"], 3);
    let positions: Vec<&str> = file[1..].iter().map(|line| line.split(',').next().unwrap()).collect();
    assert_eq!(positions, ["0", "1", "2"]);

    // Before the batch existed, there is nothing to export.
    let before = head_before_batch.to_string();
    let (early, _, _) = ledger.create(&[
        "--what",
        "batch_items",
        "--format",
        "csv",
        "--batch",
        &batch,
        "--as-of-seq",
        &before,
    ]);
    let failed = ledger.wait_status(&early, "failed_terminal", Duration::from_secs(15));
    let reason = failed["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("child_failed") && reason.contains("did not exist"),
        "{failed}"
    );
    assert!(ledger.files_in("tmp").is_empty());
}
