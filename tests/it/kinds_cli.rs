//! `opledger kinds` and `opledger reprocess` as a user runs them: a
//! declaration file applied, refused with its line, listed and shown; a
//! new version making results stale, counted by `status` and run again by
//! `reprocess --stale`.

use crate::common;

use common::{assert_exit, binary, json, run, stdout, temp_db, PIPELINE_FILES};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

fn opledger(db: &Path, args: &[&str]) -> Output {
    run(binary().args(args).arg("--database-url").arg(db))
}

fn ok(db: &Path, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    let output = opledger(db, &args);
    assert_exit(&output, 0);
    json(&output)
}

fn statuses(report: &Value) -> Vec<(String, String)> {
    report["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kind| {
            (
                kind["name"].as_str().unwrap().to_string(),
                kind["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn kinds_are_applied_refused_with_their_line_listed_and_shown() {
    let (dir, db) = temp_db();
    let [reference, example] = PIPELINE_FILES;
    // The example needs `metadata`, which only the reference file declares.
    let refused = opledger(&db, &["kinds", "apply", example, "--json"]);
    assert_exit(&refused, 2);
    let report: Value = serde_json::from_slice(&refused.stdout).unwrap();
    let caption = report["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|kind| kind["name"] == "caption")
        .unwrap();
    assert_eq!(caption["status"], "refused");
    assert!(
        caption["error"].as_str().unwrap().contains("which no kind produces"),
        "{caption}"
    );
    assert!(caption["error"].as_str().unwrap().starts_with("line "), "{caption}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("nothing was recorded"));
    assert_eq!(ok(&db, &["status"])["head"], 0, "a refused file records nothing");

    let applied = ok(&db, &["kinds", "apply", reference]);
    assert!(
        statuses(&applied).iter().all(|(_, status)| status == "declared"),
        "{applied}"
    );
    let applied = ok(&db, &["kinds", "apply", example]);
    assert_eq!(statuses(&applied).len(), 6);
    let head = ok(&db, &["status"])["head"].clone();
    let again = ok(&db, &["kinds", "apply", example]);
    assert!(
        statuses(&again).iter().all(|(_, status)| status == "unchanged"),
        "{again}"
    );
    assert_eq!(ok(&db, &["status"])["head"], head, "an unchanged file appends nothing");

    let listed = ok(&db, &["kinds", "list"]);
    // The reference pipeline's six (three image kinds, two of videos, one
    // of sounds) and the example application's six.
    assert_eq!(listed["kinds"].as_array().unwrap().len(), 12);
    let shown = ok(&db, &["kinds", "show", "caption"]);
    assert_eq!(shown["version"], "2");
    assert_eq!(shown["inputs"]["max_words"]["max"], 200);
    assert_eq!(shown["inputs"]["language"]["enum"][1], "ja");
    assert_eq!(shown["retry"]["exhausted"], "dead_lettered");
    assert_eq!(shown["needs"][0], "metadata");
    let plain = stdout(&opledger(&db, &["kinds", "show", "caption"]));
    assert!(
        plain.contains("max_words: integer, default 30, min 1, max 200"),
        "{plain}"
    );

    let unknown = opledger(&db, &["kinds", "show", "transcode"]);
    assert_exit(&unknown, 2);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("declared kinds: audio_metadata, auto_tagging"));

    // A malformed file: its line and column, nothing recorded.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[kind]]\nname = \"x\"\ntarget = \"media\"\nversion = \"1\"\ncolour = \"red\"\n",
    )
    .unwrap();
    let output = opledger(&db, &["kinds", "apply", bad.to_str().unwrap()]);
    assert_exit(&output, 2);
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("line 5, column 1"), "{message}");
    assert!(message.contains("colour"), "{message}");
    assert_eq!(ok(&db, &["status"])["head"], head);
}

#[test]
fn a_new_version_is_counted_stale_by_status_and_reprocessed_in_one_batch() {
    let (dir, db) = temp_db();
    for file in PIPELINE_FILES {
        ok(&db, &["kinds", "apply", file]);
    }
    let mut media = Vec::new();
    for n in 0..3 {
        let output = opledger(
            &db,
            &[
                "media",
                "add",
                "--path",
                &format!("/p/{n}.jpg"),
                "--digest",
                &format!("sha256:{n:064x}"),
            ],
        );
        assert_exit(&output, 0);
        media.push(stdout(&output).trim().to_string());
    }
    for id in &media {
        ok(
            &db,
            &[
                "task",
                "request",
                "--media",
                id,
                "--kind",
                "auto_tagging",
                "--inputs",
                r#"{"model":"clip","model_revision":"1"}"#,
            ],
        );
    }
    let claims = ok(
        &db,
        &[
            "task",
            "claim",
            "--kind",
            "auto_tagging",
            "--worker",
            "py-1",
            "--lease",
            "60",
            "--limit",
            "3",
        ],
    );
    for claim in claims["claims"].as_array().unwrap() {
        assert!(claim["path"].as_str().unwrap().starts_with("/p/"), "{claim}");
        ok(
            &db,
            &[
                "task",
                "complete",
                claim["claim_token"].as_str().unwrap(),
                "--output",
                "{}",
            ],
        );
    }
    let bumped = dir.path().join("bumped.toml");
    let text = std::fs::read_to_string(PIPELINE_FILES[1]).unwrap().replacen(
        "name = \"auto_tagging\"\ntarget = \"media\"\nversion = \"1\"",
        "name = \"auto_tagging\"\ntarget = \"media\"\nversion = \"2\"",
        1,
    );
    std::fs::write(&bumped, text).unwrap();
    let dry = ok(&db, &["kinds", "apply", bumped.to_str().unwrap(), "--dry-run"]);
    let tagging = |report: &Value| {
        report["kinds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|kind| kind["name"] == "auto_tagging")
            .unwrap()
            .clone()
    };
    assert_eq!(
        (tagging(&dry)["status"].clone(), tagging(&dry)["stale_items"].clone()),
        ("changed".into(), 3.into())
    );
    assert_eq!(
        ok(&db, &["status"])["stale_by_kind"],
        serde_json::json!({}),
        "a dry run records nothing"
    );
    let applied = ok(&db, &["kinds", "apply", bumped.to_str().unwrap()]);
    assert_eq!(tagging(&applied)["stale_items"], 3);
    assert_eq!(ok(&db, &["status"])["stale_by_kind"]["auto_tagging"], 3);
    let capabilities = ok(&db, &["capabilities", "--media", &media[0]]);
    assert_eq!(capabilities["capabilities"][0]["status"], "stale");

    let reprocessed = ok(&db, &["reprocess", "--stale", "--kind", "auto_tagging"]);
    assert_eq!(reprocessed["requested"], 3);
    let batch = reprocessed["batch_id"].as_str().unwrap().to_string();
    let claims = ok(
        &db,
        &[
            "task",
            "claim",
            "--kind",
            "auto_tagging",
            "--worker",
            "py-1",
            "--lease",
            "60",
            "--limit",
            "3",
        ],
    );
    assert_eq!(claims["claims"].as_array().unwrap().len(), 3);
    for claim in claims["claims"].as_array().unwrap() {
        assert_eq!(claim["inputs"]["model"], "clip", "the inputs it was requested with");
        ok(
            &db,
            &[
                "task",
                "complete",
                claim["claim_token"].as_str().unwrap(),
                "--output",
                "{}",
            ],
        );
    }
    let shown = ok(&db, &["batch", "show", &batch]);
    assert_eq!(shown["succeeded"], 3, "{shown}");
    assert_eq!(ok(&db, &["status"])["stale_by_kind"], serde_json::json!({}));
    let nothing = ok(&db, &["reprocess", "--stale"]);
    assert_eq!(
        (nothing["batch_id"].clone(), nothing["requested"].clone()),
        (Value::Null, 0.into())
    );
    assert_exit(&opledger(&db, &["replay", "--verify"]), 0);
}

#[test]
fn a_worker_states_its_version_on_the_command_line_and_is_offered_only_tasks_requested_at_it() {
    let (dir, db) = temp_db();
    for file in PIPELINE_FILES {
        ok(&db, &["kinds", "apply", file]);
    }
    let mut media = Vec::new();
    for n in 0..2 {
        let output = opledger(
            &db,
            &[
                "media",
                "add",
                "--path",
                &format!("/v/{n}.jpg"),
                "--digest",
                &format!("sha256:{n:064x}"),
            ],
        );
        assert_exit(&output, 0);
        media.push(stdout(&output).trim().to_string());
    }
    let inputs = r#"{"model":"clip","model_revision":"1"}"#;
    for id in &media {
        ok(
            &db,
            &[
                "task",
                "request",
                "--media",
                id,
                "--kind",
                "auto_tagging",
                "--inputs",
                inputs,
            ],
        );
    }
    let claim = |version: &str| {
        let mut args = vec![
            "task",
            "claim",
            "--kind",
            "auto_tagging",
            "--worker",
            "py-1",
            "--lease",
            "60",
        ];
        args.extend(["--version", version]);
        ok(&db, &args)
    };
    let first = claim("1");
    assert_eq!(first["kind_version"], "1", "the claim says the version to run: {first}");

    let bumped = dir.path().join("bumped.toml");
    let text = std::fs::read_to_string(PIPELINE_FILES[1]).unwrap().replacen(
        "name = \"auto_tagging\"\ntarget = \"media\"\nversion = \"1\"",
        "name = \"auto_tagging\"\ntarget = \"media\"\nversion = \"2\"",
        1,
    );
    std::fs::write(&bumped, text).unwrap();
    let applied = ok(&db, &["kinds", "apply", bumped.to_str().unwrap()]);
    let tagging = applied["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|kind| kind["name"] == "auto_tagging")
        .unwrap()
        .clone();
    assert_eq!(
        tagging["retargeted"], 1,
        "the waiting task moved to version 2: {tagging}"
    );

    assert_eq!(
        claim("1")["claim_token"],
        Value::Null,
        "version-1 code is offered no version-2 task"
    );
    let second = claim("auto_tagging=2");
    assert_eq!(second["kind_version"], "2", "{second}");

    // A bare version with no kind, or of a kind the claim does not name, is
    // refused before anything is recorded.
    let head = ok(&db, &["status"])["head"].clone();
    let refused = opledger(
        &db,
        &["task", "claim", "--worker", "w", "--lease", "60", "--version", "2"],
    );
    assert_exit(&refused, 2);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("names no kind"));
    let refused = opledger(
        &db,
        &[
            "task",
            "claim",
            "--kind",
            "auto_tagging",
            "--worker",
            "w",
            "--lease",
            "60",
            "--version",
            "caption=1",
        ],
    );
    assert_exit(&refused, 2);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("which no --kind names"));
    assert_eq!(ok(&db, &["status"])["head"], head, "nothing appended");
    // The program's own version flag still answers at the top.
    assert_exit(&run(binary().arg("--version")), 0);
}
