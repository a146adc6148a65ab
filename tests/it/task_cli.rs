//! The work protocol through the command line, as a shell or
//! foreign-language worker drives it: the real binary on real SQLite files,
//! the JSON keys programs parse, exit codes (2 invalid input, 3 stale claim
//! or conflict, 4 not found), and refusals that append nothing.

use crate::common;

use common::{assert_exit, declare_pipeline, describe, json, opledger, run, temp_db, BIN};
use opledger_domain::events::BoundingBox;
use opledger_domain::{MediaId, Timestamp};
use opledger_engine::{CommandContext, Engine};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The keys of a JSON object, sorted.
fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys
}

fn sorted<'a>(names: &[&'a str]) -> Vec<&'a str> {
    let mut names = names.to_vec();
    names.sort_unstable();
    names
}

fn text(value: &Value) -> String {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value}"))
        .to_string()
}

fn timestamp(value: &Value) -> Timestamp {
    Timestamp::parse(&text(value)).unwrap_or_else(|error| panic!("{value} is not RFC 3339: {error}"))
}

fn is_uuid(value: &Value) -> bool {
    value.as_str().is_some_and(|id| {
        id.len() == 36 && id.chars().filter(|c| *c == '-').count() == 4 && id.parse::<MediaId>().is_ok()
    })
}

/// Sleeps until the wall clock is past `at` (plus a margin).
fn sleep_past(at: Timestamp) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64;
    let wait = at.as_micros() - now + 300_000;
    if wait > 0 {
        std::thread::sleep(Duration::from_micros(wait as u64));
    }
}

const THUMBNAIL_INPUTS: &str = r#"{"max_side": 256, "format": "png"}"#;

/// A temporary ledger file and the commands run against it.
struct Ledger {
    _dir: tempfile::TempDir,
    db: PathBuf,
}

impl Ledger {
    fn new() -> Self {
        let (dir, db) = temp_db();
        declare_pipeline(db.to_str().expect("a UTF-8 path"));
        Ledger { _dir: dir, db }
    }

    fn dir(&self) -> &Path {
        self.db.parent().unwrap()
    }

    /// `opledger ARGS --database-url DB`, whatever the exit.
    fn run(&self, args: &[&str]) -> Output {
        run(opledger(self.dir()).args(args).arg("--database-url").arg(&self.db))
    }

    /// `opledger ARGS --json`, expecting exit 0 and JSON on stdout.
    fn ok(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let output = self.run(&args);
        assert_exit(&output, 0);
        json(&output)
    }

    /// `opledger ARGS --json`, expecting `code`, nothing on stdout.
    fn refused(&self, args: &[&str], code: i32) -> Output {
        let mut args = args.to_vec();
        args.push("--json");
        let output = self.run(&args);
        assert_exit(&output, code);
        assert!(output.stdout.is_empty(), "a refusal printed: {}", describe(&output));
        output
    }

    fn head(&self) -> i64 {
        self.ok(&["status"])["head"].as_i64().expect("head is a number")
    }

    fn add_media(&self, path: &str) -> String {
        let digest = format!(
            "sha256:{:064x}",
            path.len() * 7919 + path.bytes().map(usize::from).sum::<usize>()
        );
        let added = self.ok(&["media", "add", "--path", path, "--digest", &digest]);
        text(&added["media_id"])
    }

    fn request_thumbnail(&self, media: &str) -> Value {
        self.ok(&[
            "task",
            "request",
            "--media",
            media,
            "--kind",
            "thumbnail",
            "--inputs",
            THUMBNAIL_INPUTS,
        ])
    }

    fn claim(&self, worker: &str, lease: &str) -> Value {
        self.ok(&[
            "task",
            "claim",
            "--kind",
            "thumbnail",
            "--worker",
            worker,
            "--lease",
            lease,
        ])
    }

    fn show(&self, operation_id: &str) -> Value {
        self.ok(&["task", "show", "--operation", operation_id])
    }

    fn event_types(&self, operation_id: &str) -> Vec<String> {
        self.ok(&["timeline", operation_id])
            .as_array()
            .expect("the timeline is an array")
            .iter()
            .map(|event| text(&event["event_type"]))
            .collect()
    }

    fn assert_replay_verifies(&self) {
        let output = self.run(&["replay", "--verify"]);
        assert_exit(&output, 0);
    }
}

const CLAIM_KEYS: [&str; 13] = [
    "claim_token",
    "kind_version",
    "operation_id",
    "media_id",
    "region_id",
    "task_kind",
    "revision",
    "inputs",
    "lease_expires_at",
    "attempt",
    "path",
    "media_kind",
    "content_digest",
];

#[test]
fn a_shell_worker_drives_a_task_through_request_claim_heartbeat_progress_complete() {
    let ledger = Ledger::new();
    let media = ledger.add_media("/photos/beach.jpg");

    let requested = ledger.request_thumbnail(&media);
    assert_eq!(
        keys(&requested),
        sorted(&["operation_id", "requested_revision", "created", "status"]),
        "{requested}"
    );
    assert_eq!(requested["created"], true);
    assert_eq!(requested["status"], "queued");
    assert!(is_uuid(&requested["operation_id"]), "{requested}");
    let operation_id = text(&requested["operation_id"]);
    let revision = text(&requested["requested_revision"]);
    assert_eq!(revision.len(), 64, "a SHA-256 revision: {revision}");

    let claim = ledger.claim("shell-worker-1", "30");
    assert_eq!(keys(&claim), sorted(&CLAIM_KEYS), "{claim}");
    assert!(is_uuid(&claim["claim_token"]), "{claim}");
    assert_eq!(text(&claim["operation_id"]), operation_id);
    assert_eq!(text(&claim["media_id"]), media);
    assert!(claim["region_id"].is_null(), "{claim}");
    assert_eq!(claim["task_kind"], "thumbnail");
    assert_eq!(text(&claim["revision"]), revision);
    // Where the file is, for a worker that has only the claim.
    assert_eq!(claim["path"], "/photos/beach.jpg");
    assert_eq!(claim["media_kind"], "image");
    assert_eq!(claim["content_digest"], claim["inputs"]["content_digest"]);
    assert_eq!(claim["attempt"], 1);
    assert_eq!(claim["inputs"]["max_side"], 256, "inputs are embedded JSON: {claim}");
    assert_eq!(claim["inputs"]["format"], "png");
    assert!(
        text(&claim["inputs"]["content_digest"]).starts_with("sha256:"),
        "the target's digest is filled in: {claim}"
    );
    let granted = timestamp(&claim["lease_expires_at"]);
    let token = text(&claim["claim_token"]);

    let beat = ledger.ok(&["task", "heartbeat", &token, "--lease", "60"]);
    assert_eq!(keys(&beat), sorted(&["lease_expires_at", "cancel_requested"]), "{beat}");
    assert_eq!(beat["cancel_requested"], false);
    assert!(timestamp(&beat["lease_expires_at"]) > granted, "{beat} vs {granted}");

    for processed in ["0", "1"] {
        let progressed = ledger.ok(&[
            "task",
            "progress",
            &token,
            "--phase",
            "resizing",
            "--processed",
            processed,
            "--total",
            "2",
        ]);
        assert_eq!(progressed, json!({"ok": true}));
    }
    // Progress is visible from another process while the task runs.
    let running = ledger.show(&operation_id);
    assert_eq!(running["status"], "leased", "{running:#}");
    // A reading command shows the claim by its fingerprint only.
    assert_eq!(
        text(&running["claim_token"]),
        opledger_domain::claims::fingerprint(&token)
    );
    assert_eq!(running["progress"]["phase"], "resizing", "{running:#}");
    assert_eq!(running["progress"]["processed"], 1, "{running:#}");
    assert_eq!(running["progress"]["total"], 2, "{running:#}");
    assert_eq!(running["lease_expires_at"], beat["lease_expires_at"], "{running:#}");
    assert!(!running["heartbeat_at"].is_null(), "{running:#}");

    let completed = ledger.ok(&[
        "task",
        "complete",
        &token,
        "--revision",
        &revision,
        "--output",
        r#"{"thumbnail": "beach.256.png"}"#,
    ]);
    assert_eq!(
        keys(&completed),
        sorted(&["operation_id", "status", "requested_revision", "completed_revision"]),
        "{completed}"
    );
    assert_eq!(completed["status"], "succeeded");
    assert_eq!(text(&completed["operation_id"]), operation_id);
    assert_eq!(text(&completed["completed_revision"]), revision);
    assert_eq!(text(&completed["requested_revision"]), revision);

    let state = ledger.ok(&["task", "show", "--media", &media, "--kind", "thumbnail"]);
    for key in [
        "status",
        "requested_revision",
        "completed_revision",
        "attempt_count",
        "available_at",
        "last_error",
        "claim_token",
        "operation_id",
        "task_kind",
        "failure_count",
        "interruption_count",
        "cancel_requested",
        "lease_expires_at",
        "heartbeat_at",
        "output",
    ] {
        assert!(state.get(key).is_some(), "task show lacks {key:?}: {state:#}");
    }
    assert_eq!(state["status"], "succeeded", "{state:#}");
    assert_eq!(text(&state["completed_revision"]), revision);
    assert_eq!(text(&state["requested_revision"]), revision);
    assert_eq!(text(&state["operation_id"]), operation_id);
    assert_eq!(state["task_kind"], "thumbnail");
    assert_eq!(state["attempt_count"], 1);
    assert_eq!(state["failure_count"], 0);
    assert_eq!(state["interruption_count"], 0);
    assert_eq!(state["cancel_requested"], false);
    assert!(state["claim_token"].is_null(), "{state:#}");
    assert!(state["last_error"].is_null(), "{state:#}");
    assert!(state["lease_expires_at"].is_null(), "{state:#}");
    assert_eq!(state["output"], json!({"thumbnail": "beach.256.png"}), "{state:#}");
    timestamp(&state["available_at"]);
    assert_eq!(
        ledger.show(&operation_id),
        state,
        "--operation and --media/--kind show the same row"
    );

    let timeline = ledger.ok(&["timeline", &operation_id]);
    let events = timeline.as_array().unwrap();
    let types: Vec<String> = events.iter().map(|event| text(&event["event_type"])).collect();
    assert_eq!(
        types.first().map(String::as_str),
        Some("operation_created"),
        "{types:?}"
    );
    assert_eq!(types.get(1).map(String::as_str), Some("operation_claimed"), "{types:?}");
    assert_eq!(
        types.last().map(String::as_str),
        Some("operation_succeeded"),
        "{types:?}"
    );
    let progressed: Vec<&Value> = events
        .iter()
        .filter(|event| event["event_type"] == "operation_progressed")
        .collect();
    assert!(!progressed.is_empty(), "the phase is on the timeline: {types:?}");
    assert_eq!(
        progressed.last().unwrap()["payload"]["processed"],
        1,
        "the final counts are on the timeline"
    );
    assert_eq!(events[1]["actor"], "shell-worker-1", "the claim names its worker");

    ledger.assert_replay_verifies();
}

#[test]
fn requesting_the_same_revision_twice_creates_nothing() {
    let ledger = Ledger::new();
    let media = ledger.add_media("/photos/a.jpg");
    let first = ledger.request_thumbnail(&media);
    assert_eq!(first["created"], true);
    let head = ledger.head();

    // The same inputs, written differently, are the same revision.
    let again = ledger.ok(&[
        "task",
        "request",
        "--media",
        &media,
        "--kind",
        "thumbnail",
        "--inputs",
        r#"{ "format":"png","max_side":256.0 }"#,
    ]);
    assert_eq!(again["created"], false, "{again}");
    assert_eq!(again["operation_id"], first["operation_id"]);
    assert_eq!(again["requested_revision"], first["requested_revision"]);
    assert_eq!(ledger.head(), head, "a repeated request appended to the log");
    assert_eq!(
        ledger.event_types(&text(&first["operation_id"])),
        vec!["operation_created"]
    );

    // Also once that revision is completed.
    let claim = ledger.claim("w", "30");
    ledger.ok(&["task", "complete", &text(&claim["claim_token"])]);
    let head = ledger.head();
    assert_eq!(ledger.request_thumbnail(&media)["created"], false);
    assert_eq!(ledger.head(), head);

    // Other inputs are a new revision of the same task.
    let bigger = ledger.ok(&[
        "task",
        "request",
        "--media",
        &media,
        "--kind",
        "thumbnail",
        "--inputs",
        r#"{"max_side": 512, "format": "png"}"#,
    ]);
    assert_eq!(bigger["created"], true);
    assert_eq!(bigger["operation_id"], first["operation_id"]);
    assert_ne!(bigger["requested_revision"], first["requested_revision"]);
    assert_eq!(ledger.head(), head + 1);
    let state = ledger.show(&text(&first["operation_id"]));
    assert_eq!(state["status"], "queued", "{state:#}");
    assert_eq!(state["requested_revision"], bigger["requested_revision"]);
    assert_eq!(state["completed_revision"], first["requested_revision"]);
    ledger.assert_replay_verifies();
}

#[test]
fn claim_with_nothing_available_prints_a_null_token() {
    let ledger = Ledger::new();
    let head = ledger.head();
    assert_eq!(ledger.claim("idle", "30"), json!({"claim_token": null}));
    assert_eq!(
        ledger.ok(&["task", "claim", "--worker", "idle", "--lease", "30", "--limit", "4"]),
        json!({"claims": []})
    );
    let output = ledger.run(&["task", "claim", "--worker", "idle", "--lease", "30"]);
    assert_exit(&output, 0);
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("nothing to claim"),
        "{}",
        describe(&output)
    );

    // Work of another kind is not taken; claimed work is not claimable.
    let media = ledger.add_media("/photos/a.jpg");
    ledger.request_thumbnail(&media);
    let other = ledger.ok(&["task", "claim", "--kind", "metadata", "--worker", "w", "--lease", "30"]);
    assert_eq!(other, json!({"claim_token": null}));
    assert!(ledger.claim("w", "30")["claim_token"].is_string());
    assert_eq!(ledger.claim("w2", "30"), json!({"claim_token": null}));
    assert_eq!(ledger.head(), head + 3, "media, request and one claim");
}

#[test]
fn bad_input_is_refused_with_exit_2_or_4_and_appends_nothing() {
    let ledger = Ledger::new();
    let media = ledger.add_media("/photos/a.jpg");
    ledger.request_thumbnail(&media);
    let before = ledger.head();
    let unknown = "01234567-89ab-7def-8123-456789abcdef";

    let request = |target: &str, id: &str, kind: &str, inputs: &str| {
        vec![
            "task".to_string(),
            "request".to_string(),
            target.to_string(),
            id.to_string(),
            "--kind".to_string(),
            kind.to_string(),
            "--inputs".to_string(),
            inputs.to_string(),
        ]
    };
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (request("--media", unknown, "thumbnail", THUMBNAIL_INPUTS), 4, unknown),
        (
            request("--media", &media, "transcode", THUMBNAIL_INPUTS),
            2,
            "transcode",
        ),
        (
            request(
                "--media",
                &media,
                "crop_embedding",
                r#"{"model": "m", "model_revision": "1", "embedding_version": "1"}"#,
            ),
            2,
            "crop_embedding",
        ),
        (
            request("--media", &media, "thumbnail", r#"{"max_side": 256,"#),
            2,
            "--inputs",
        ),
        (request("--media", &media, "thumbnail", r#"[256]"#), 2, "object"),
        (
            request("--media", &media, "thumbnail", r#"{"max_side": -5}"#),
            2,
            "\"max_side\" must be at least 1, not -5",
        ),
        (
            request("--media", &media, "transcode", "{}"),
            2,
            "declared kinds: audio_metadata, auto_tagging, caption",
        ),
        (
            request("--media", "not-a-uuid", "thumbnail", THUMBNAIL_INPUTS),
            2,
            "not-a-uuid",
        ),
        (request("--region", unknown, "crop_embedding", "{}"), 4, unknown),
        (
            vec!["task", "request", "--kind", "thumbnail", "--inputs", THUMBNAIL_INPUTS]
                .into_iter()
                .map(String::from)
                .collect(),
            2,
            "",
        ),
        (
            ["task", "claim", "--worker", "w", "--lease=-5"]
                .map(String::from)
                .to_vec(),
            2,
            "lease",
        ),
        (
            ["task", "claim", "--worker", "w", "--lease", "-5"]
                .map(String::from)
                .to_vec(),
            2,
            "lease",
        ),
        (
            ["task", "claim", "--worker", "w", "--lease", "0"]
                .map(String::from)
                .to_vec(),
            2,
            "lease",
        ),
        (
            ["task", "claim", "--worker", "w", "--lease", "1.5"]
                .map(String::from)
                .to_vec(),
            2,
            "lease",
        ),
        (
            ["task", "claim", "--worker", "w", "--lease", "99999999"]
                .map(String::from)
                .to_vec(),
            2,
            "lease",
        ),
        (
            ["task", "claim", "--kind", "transcode", "--worker", "w", "--lease", "30"]
                .map(String::from)
                .to_vec(),
            2,
            "transcode",
        ),
        (
            ["task", "claim", "--worker", " ", "--lease", "30"]
                .map(String::from)
                .to_vec(),
            2,
            "worker",
        ),
        (
            ["task", "claim", "--worker", "w", "--lease", "30", "--limit", "0"]
                .map(String::from)
                .to_vec(),
            2,
            "limit",
        ),
        (["task", "cancel", unknown].map(String::from).to_vec(), 4, unknown),
        (["task", "cancel", "nope"].map(String::from).to_vec(), 2, "nope"),
        (
            ["task", "show", "--operation", unknown].map(String::from).to_vec(),
            4,
            unknown,
        ),
        (
            ["task", "show", "--media", unknown, "--kind", "thumbnail"]
                .map(String::from)
                .to_vec(),
            4,
            unknown,
        ),
        (
            ["task", "show", "--media", &media, "--kind", "metadata"]
                .map(String::from)
                .to_vec(),
            4,
            "metadata",
        ),
        (
            ["task", "show", "--media", &media].map(String::from).to_vec(),
            2,
            "kind",
        ),
    ];
    for (args, code, needle) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = ledger.refused(&args, *code);
        assert!(
            String::from_utf8_lossy(&output.stderr).contains(needle),
            "{args:?}: stderr does not name {needle:?}: {}",
            describe(&output)
        );
        assert_eq!(ledger.head(), before, "{args:?} appended to the log");
    }

    // A claim's reports refuse bad input too, and leave the claim as it was.
    let claim = ledger.claim("w", "30");
    let token = text(&claim["claim_token"]);
    let held = ledger.head();
    let state = ledger.show(&text(&claim["operation_id"]));
    let report_cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["task", "complete", &token, "--output", "{oops"], "--output"),
        (vec!["task", "heartbeat", &token, "--lease", "0"], "lease"),
        (vec!["task", "heartbeat", &token, "--lease=-1"], "lease"),
        (
            vec!["task", "progress", &token, "--phase", "x", "--processed", "-1"],
            "negative",
        ),
        (
            vec![
                "task",
                "progress",
                &token,
                "--phase",
                "x",
                "--processed",
                "3",
                "--total",
                "2",
            ],
            "exceed",
        ),
        (
            vec!["task", "progress", &token, "--phase", " ", "--processed", "1"],
            "phase",
        ),
        (vec!["task", "fail", &token, "--error", " "], "error"),
        (
            vec!["task", "complete", &token, "--output", "1", "--no-result", "why"],
            "",
        ),
    ];
    for (args, needle) in &report_cases {
        let output = ledger.refused(args, 2);
        assert!(
            String::from_utf8_lossy(&output.stderr).contains(needle),
            "{args:?}: stderr does not name {needle:?}: {}",
            describe(&output)
        );
        assert_eq!(ledger.head(), held, "{args:?} appended to the log");
    }
    assert_eq!(ledger.show(&text(&claim["operation_id"])), state);
    ledger.assert_replay_verifies();
}

#[test]
fn a_stale_token_gets_exit_3_for_heartbeat_progress_complete_and_fail() {
    let ledger = Ledger::new();
    let media = ledger.add_media("/photos/a.jpg");
    let operation_id = text(&ledger.request_thumbnail(&media)["operation_id"]);
    let claim = ledger.claim("dying-worker", "1");
    let stale = text(&claim["claim_token"]);
    sleep_past(timestamp(&claim["lease_expires_at"]));

    let recovered = ledger.ok(&["recover"]);
    assert_eq!(
        keys(&recovered),
        sorted(&["interrupted", "requeued", "cancelled", "failed", "skipped"]),
        "{recovered}"
    );
    assert_eq!(
        recovered,
        json!({"interrupted": 1, "requeued": 1, "cancelled": 0, "failed": 0, "skipped": 0})
    );
    let state = ledger.show(&operation_id);
    assert_eq!(state["status"], "queued", "{state:#}");
    assert_eq!(state["interruption_count"], 1, "{state:#}");
    assert!(state["claim_token"].is_null(), "{state:#}");
    let head = ledger.head();

    let stale_reports: [Vec<&str>; 6] = [
        vec!["task", "heartbeat", &stale],
        vec!["task", "heartbeat", &stale, "--lease", "30"],
        vec!["task", "progress", &stale, "--phase", "resizing", "--processed", "1"],
        vec!["task", "complete", &stale, "--output", r#"{"thumbnail": "late.png"}"#],
        vec!["task", "fail", &stale, "--error", "too late"],
        vec!["task", "ack-cancel", &stale],
    ];
    let refuse_all = |ledger: &Ledger| {
        for args in &stale_reports {
            let output = ledger.refused(args, 3);
            assert!(
                String::from_utf8_lossy(&output.stderr).contains(&stale),
                "{args:?}: the refusal does not name the claim: {}",
                describe(&output)
            );
        }
    };
    refuse_all(&ledger);
    assert_eq!(ledger.head(), head, "a stale report appended to the log");
    assert_eq!(ledger.show(&operation_id), state, "a stale report changed the state");
    // A well-formed token that never existed is refused the same way; a
    // malformed one is bad input.
    ledger.refused(&["task", "heartbeat", "0190f5a2-0000-7000-8000-000000000000"], 3);
    ledger.refused(&["task", "heartbeat", "not-a-token"], 2);

    // Another worker takes the task; the old token still cannot touch it.
    let second = ledger.claim("second-worker", "30");
    assert_eq!(text(&second["operation_id"]), operation_id);
    assert_eq!(second["attempt"], 2, "{second}");
    let token = text(&second["claim_token"]);
    assert_ne!(token, stale);
    let head = ledger.head();
    let held = ledger.show(&operation_id);
    refuse_all(&ledger);
    assert_eq!(ledger.head(), head);
    assert_eq!(ledger.show(&operation_id), held);
    // A wrong revision is a stale fence too.
    ledger.refused(&["task", "heartbeat", &token, "--revision", "0000"], 3);

    let done = ledger.ok(&["task", "complete", &token, "--output", r#"{"thumbnail": "a.png"}"#]);
    assert_eq!(done["status"], "succeeded");
    let types = ledger.event_types(&operation_id);
    let position = |kind: &str| {
        types
            .iter()
            .position(|event| event == kind)
            .unwrap_or_else(|| panic!("{kind} not on the timeline: {types:?}"))
    };
    assert!(
        position("operation_interrupted") < position("operation_requeued"),
        "{types:?}"
    );
    assert!(
        position("operation_requeued") < position("operation_succeeded"),
        "{types:?}"
    );
    assert_eq!(types.iter().filter(|event| *event == "operation_claimed").count(), 2);
    ledger.assert_replay_verifies();
}

/// Claims recorded by a killed process: a stream of pretty-printed JSON
/// objects, the last possibly cut short.
fn claims_written(path: &Path) -> Vec<Value> {
    let written = std::fs::read_to_string(path).unwrap_or_default();
    serde_json::Deserializer::from_str(&written)
        .into_iter::<Value>()
        .map_while(Result::ok)
        .filter(|claim| claim["claim_token"].is_string())
        .collect()
}

/// Every task's state, by operation id, read by a new process.
fn states(ledger: &Ledger, operations: &[String]) -> Vec<Value> {
    operations.iter().map(|operation| ledger.show(operation)).collect()
}

/// After the dead claims' leases pass, one recovery pass interrupts every
/// one of them and requeues it; then a live worker finishes everything.
fn recover_and_finish(ledger: &Ledger, operations: &[String], dead: usize) {
    let leased: Vec<Value> = states(ledger, operations)
        .into_iter()
        .filter(|state| state["status"] == "leased")
        .collect();
    assert_eq!(leased.len(), dead);
    let latest = leased
        .iter()
        .map(|state| timestamp(&state["lease_expires_at"]))
        .max()
        .expect("dead claims");
    sleep_past(latest);
    let recovered = ledger.ok(&["recover"]);
    assert_eq!(recovered["interrupted"], dead as u64, "{recovered}");
    assert_eq!(recovered["requeued"], dead as u64, "{recovered}");
    assert_eq!(recovered["failed"], 0, "{recovered}");
    assert_eq!(ledger.ok(&["recover"])["interrupted"], 0, "recovery is done once");
    for state in states(ledger, operations) {
        assert_eq!(state["status"], "queued", "every task is claimable again: {state:#}");
        assert!(state["claim_token"].is_null(), "{state:#}");
    }
    for state in &leased {
        let types = ledger.event_types(&text(&state["operation_id"]));
        assert!(types.contains(&"operation_interrupted".to_string()), "{types:?}");
    }

    let claims = ledger.ok(&[
        "task",
        "claim",
        "--kind",
        "thumbnail",
        "--worker",
        "survivor",
        "--lease",
        "60",
        "--limit",
        "100",
    ]);
    let claims = claims["claims"].as_array().expect("a claims array").clone();
    let claimed: BTreeSet<String> = claims.iter().map(|claim| text(&claim["operation_id"])).collect();
    assert_eq!(
        claimed,
        operations.iter().cloned().collect::<BTreeSet<_>>(),
        "every task is claimed again"
    );
    for claim in &claims {
        let done = ledger.ok(&[
            "task",
            "complete",
            &text(&claim["claim_token"]),
            "--output",
            r#"{"thumbnail": "done.png"}"#,
        ]);
        assert_eq!(done["status"], "succeeded", "{done}");
    }
    for state in states(ledger, operations) {
        assert_eq!(state["status"], "succeeded", "{state:#}");
        assert_eq!(state["completed_revision"], state["requested_revision"], "{state:#}");
    }
    ledger.assert_replay_verifies();
}

fn request_tasks(ledger: &Ledger, count: usize) -> Vec<String> {
    (0..count)
        .map(|index| {
            let media = ledger.add_media(&format!("/photos/{index}.jpg"));
            text(&ledger.request_thumbnail(&media)["operation_id"])
        })
        .collect()
}

#[test]
fn restart_after_sigkill_restores_states_and_recovery_interrupts_dead_claims() {
    // 1. A worker claims five tasks and is gone (the process exits).
    let ledger = Ledger::new();
    let operations = request_tasks(&ledger, 5);
    let claims = ledger.ok(&[
        "task",
        "claim",
        "--kind",
        "thumbnail",
        "--worker",
        "doomed",
        "--lease",
        "2",
        "--limit",
        "5",
    ]);
    let claims = claims["claims"].as_array().expect("a claims array").clone();
    assert_eq!(claims.len(), 5);
    for claim in &claims {
        assert_eq!(keys(claim), sorted(&CLAIM_KEYS), "{claim}");
        let state = ledger.show(&text(&claim["operation_id"]));
        assert_eq!(state["status"], "leased", "{state:#}");
        assert_eq!(
            text(&state["claim_token"]),
            opledger_domain::claims::fingerprint(&text(&claim["claim_token"])),
            "{state:#}"
        );
        assert_eq!(state["worker"], "doomed", "{state:#}");
        assert_eq!(state["lease_expires_at"], claim["lease_expires_at"], "{state:#}");
    }
    ledger.assert_replay_verifies();
    recover_and_finish(&ledger, &operations, 5);

    // 2. A worker loop is killed with SIGKILL mid-run, possibly inside a
    // claim's transaction.
    let ledger = Ledger::new();
    let operations = request_tasks(&ledger, 12);
    let written = ledger.dir().join("claims.jsonl");
    let script = r#"while :; do "$0" task claim --kind thumbnail --worker looper --lease 5 --json --database-url "$1" >> "$2" || exit 1; done"#;
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg(script)
        .arg(BIN)
        .arg(&ledger.db)
        .arg(&written)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .env_remove("OPLEDGER_LOG");
    // Its own process group, so the kill reaches the opledger process it runs.
    std::os::unix::process::CommandExt::process_group(&mut shell, 0);
    let mut child = shell.spawn().expect("sh runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while claims_written(&written).len() < 3 {
        assert!(Instant::now() < deadline, "the worker loop claimed nothing");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the worker loop stopped on its own"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("sh")
        .arg("-c")
        .arg(format!("kill -9 -{}", child.id()))
        .status()
        .expect("kill runs");
    assert!(killed.success());
    child.kill().ok();
    child.wait().expect("the killed loop is reaped");
    // Let any other member of the killed group finish dying.
    std::thread::sleep(Duration::from_millis(200));

    // A new process sees every claim the dead loop reported, as it was.
    let claims = claims_written(&written);
    let after_kill = states(&ledger, &operations);
    let leased: Vec<&Value> = after_kill.iter().filter(|state| state["status"] == "leased").collect();
    for claim in &claims {
        let state = after_kill
            .iter()
            .find(|state| state["operation_id"] == claim["operation_id"])
            .expect("the claimed task exists");
        assert_eq!(state["status"], "leased", "{state:#}");
        assert_eq!(
            text(&state["claim_token"]),
            opledger_domain::claims::fingerprint(&text(&claim["claim_token"])),
            "{state:#}"
        );
        assert_eq!(state["worker"], "looper");
    }
    // The kill may land after a claim committed and before it was written out.
    assert!(
        leased.len() == claims.len() || leased.len() == claims.len() + 1,
        "{} leased tasks, {} claims written",
        leased.len(),
        claims.len()
    );
    for state in &after_kill {
        if state["status"] != "leased" {
            assert_eq!(state["status"], "queued", "{state:#}");
            assert!(state["claim_token"].is_null(), "{state:#}");
        }
    }
    ledger.assert_replay_verifies();
    let dead = leased.len();
    recover_and_finish(&ledger, &operations, dead);
}

#[test]
fn cancel_of_a_running_task_reaches_the_worker_at_its_heartbeat() {
    let ledger = Ledger::new();
    let operations = request_tasks(&ledger, 3);

    // A running task: asked to stop, cancelled once the worker acknowledges.
    let claim = ledger.claim("worker-1", "30");
    let running = text(&claim["operation_id"]);
    let token = text(&claim["claim_token"]);
    let asked = ledger.ok(&["task", "cancel", &running, "--reason", "the user deleted the album"]);
    assert_eq!(
        keys(&asked),
        sorted(&["operation_id", "status", "cancel_requested"]),
        "{asked}"
    );
    assert_eq!(text(&asked["operation_id"]), running);
    assert_eq!(asked["status"], "leased");
    assert_eq!(asked["cancel_requested"], true);
    let head = ledger.head();
    assert_eq!(
        ledger.ok(&["task", "cancel", &running])["cancel_requested"],
        true,
        "a second request changes nothing"
    );
    assert_eq!(ledger.head(), head);
    let beat = ledger.ok(&["task", "heartbeat", &token]);
    assert_eq!(beat["cancel_requested"], true, "{beat}");
    let output = ledger.run(&["task", "heartbeat", &token]);
    assert_exit(&output, 0);
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("CANCEL REQUESTED"),
        "{}",
        describe(&output)
    );
    let acknowledged = ledger.ok(&["task", "ack-cancel", &token]);
    assert_eq!(
        keys(&acknowledged),
        sorted(&["operation_id", "status"]),
        "{acknowledged}"
    );
    assert_eq!(acknowledged["status"], "cancelled");
    let state = ledger.show(&running);
    assert_eq!(state["status"], "cancelled", "{state:#}");
    assert!(state["claim_token"].is_null(), "{state:#}");
    ledger.refused(&["task", "heartbeat", &token], 3);
    ledger.refused(&["task", "cancel", &running], 3);
    let types = ledger.event_types(&running);
    assert_eq!(
        types[types.len() - 2..],
        ["operation_cancel_requested", "operation_cancelled"],
        "{types:?}"
    );

    // A queued task: cancelled at once.
    let queued = operations
        .iter()
        .find(|operation| ledger.show(operation)["status"] == "queued")
        .unwrap()
        .clone();
    let cancelled = ledger.ok(&["task", "cancel", &queued]);
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(ledger.show(&queued)["status"], "cancelled");

    // A dead worker's task: recovery finishes the cancel.
    let claim = ledger.claim("worker-2", "1");
    let abandoned = text(&claim["operation_id"]);
    assert!(abandoned != running && abandoned != queued);
    let asked = ledger.ok(&["task", "cancel", &abandoned]);
    assert_eq!(asked["status"], "leased");
    assert_eq!(asked["cancel_requested"], true);
    sleep_past(timestamp(&claim["lease_expires_at"]));
    let recovered = ledger.ok(&["recover"]);
    assert_eq!(
        recovered,
        json!({"interrupted": 1, "requeued": 0, "cancelled": 1, "failed": 0, "skipped": 0})
    );
    assert_eq!(ledger.show(&abandoned)["status"], "cancelled");
    assert_eq!(ledger.claim("worker-3", "30"), json!({"claim_token": null}));
    ledger.assert_replay_verifies();
}

#[test]
fn a_failure_is_retried_after_its_backoff_and_a_terminal_one_is_final() {
    let ledger = Ledger::new();
    let media = ledger.add_media("/photos/a.jpg");
    let operation_id = text(&ledger.request_thumbnail(&media)["operation_id"]);
    let claim = ledger.claim("w", "30");
    let failed = ledger.ok(&[
        "task",
        "fail",
        &text(&claim["claim_token"]),
        "--error",
        "decoder crashed",
    ]);
    assert_eq!(
        keys(&failed),
        sorted(&[
            "operation_id",
            "status",
            "attempt_count",
            "failure_count",
            "available_at",
            "last_error"
        ]),
        "{failed}"
    );
    assert_eq!(text(&failed["operation_id"]), operation_id);
    assert_eq!(failed["status"], "retry_waiting");
    assert_eq!(failed["attempt_count"], 1);
    assert_eq!(failed["failure_count"], 1);
    assert_eq!(failed["last_error"], "decoder crashed");
    let due = timestamp(&failed["available_at"]);
    // The claim took a 30 s lease; the first retry waits at least a second.
    assert!(
        due >= timestamp(&claim["lease_expires_at"]).plus_millis(-29_000),
        "{failed}"
    );
    assert_eq!(
        ledger.claim("w", "30"),
        json!({"claim_token": null}),
        "not before its backoff"
    );

    sleep_past(due);
    let retry = ledger.claim("w", "30");
    assert_eq!(retry["attempt"], 2, "{retry}");
    let last = ledger.ok(&[
        "task",
        "fail",
        &text(&retry["claim_token"]),
        "--error",
        "unsupported format",
        "--terminal",
    ]);
    assert_eq!(last["status"], "failed_terminal", "{last}");
    assert_eq!(last["last_error"], "unsupported format");
    assert_eq!(ledger.claim("w", "30"), json!({"claim_token": null}));
    ledger.assert_replay_verifies();
}

#[test]
fn complete_with_no_result_records_an_optional_output_as_missing() {
    let ledger = Ledger::new();
    let media = ledger.add_media("/photos/a.jpg");
    ledger.request_thumbnail(&media);
    let claim = ledger.claim("w", "30");
    let done = ledger.ok(&[
        "task",
        "complete",
        &text(&claim["claim_token"]),
        "--no-result",
        "no preview for this format",
    ]);
    assert_eq!(done["status"], "no_result", "{done}");
    ledger.assert_replay_verifies();
}

#[test]
fn a_region_task_is_requested_shown_and_claimed_by_region_id() {
    let ledger = Ledger::new();
    let media = ledger.add_media("/photos/group.jpg");
    let region = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let store = SqliteStore::open(SqliteConfig::at(&ledger.db)).await.unwrap();
            let (engine, _) = Engine::open(store).await.unwrap();
            engine
                .add_region(
                    &CommandContext::actor("detector"),
                    media.parse().unwrap(),
                    BoundingBox {
                        x: 10,
                        y: 20,
                        width: 64,
                        height: 48,
                    },
                    1,
                )
                .await
                .unwrap()
        })
        .to_string();
    let inputs = r#"{"model": "clip", "model_revision": "2024-01", "embedding_version": "3"}"#;
    let head = ledger.head();
    ledger.refused(
        &[
            "task",
            "request",
            "--region",
            &region,
            "--kind",
            "thumbnail",
            "--inputs",
            THUMBNAIL_INPUTS,
        ],
        2,
    );
    ledger.refused(
        &[
            "task",
            "request",
            "--media",
            &media,
            "--region",
            &region,
            "--kind",
            "crop_embedding",
            "--inputs",
            inputs,
        ],
        2,
    );
    assert_eq!(ledger.head(), head);

    let requested = ledger.ok(&[
        "task",
        "request",
        "--region",
        &region,
        "--kind",
        "crop_embedding",
        "--inputs",
        inputs,
        "--priority",
        "5",
    ]);
    assert_eq!(requested["created"], true);
    let state = ledger.ok(&["task", "show", "--region", &region, "--kind", "crop_embedding"]);
    assert_eq!(state["status"], "queued", "{state:#}");
    assert_eq!(text(&state["region_id"]), region);
    let claim = ledger.ok(&[
        "task",
        "claim",
        "--kind",
        "crop_embedding,thumbnail",
        "--worker",
        "py-embedder",
        "--lease",
        "30",
    ]);
    assert_eq!(keys(&claim), sorted(&CLAIM_KEYS), "{claim}");
    assert_eq!(text(&claim["region_id"]), region);
    assert_eq!(claim["task_kind"], "crop_embedding");
    assert_eq!(
        claim["inputs"]["bbox"],
        json!({"x": 10, "y": 20, "width": 64, "height": 48}),
        "{claim}"
    );
    assert_eq!(claim["inputs"]["region_revision"], 1);
    ledger.ok(&[
        "task",
        "complete",
        &text(&claim["claim_token"]),
        "--output",
        r#"{"embedding": [0.1, 0.2]}"#,
    ]);
    let state = ledger.ok(&["task", "show", "--region", &region, "--kind", "crop_embedding"]);
    assert_eq!(state["status"], "succeeded", "{state:#}");
    assert_eq!(state["output"], json!({"embedding": [0.1, 0.2]}));
    ledger.assert_replay_verifies();
}

#[test]
fn without_json_each_command_prints_a_short_readable_line() {
    let ledger = Ledger::new();
    let media = ledger.add_media("/photos/a.jpg");
    let line = |args: &[&str]| {
        let output = ledger.run(args);
        assert_exit(&output, 0);
        String::from_utf8(output.stdout).unwrap()
    };
    let requested = line(&[
        "task",
        "request",
        "--media",
        &media,
        "--kind",
        "thumbnail",
        "--inputs",
        THUMBNAIL_INPUTS,
    ]);
    assert!(
        requested.contains("thumbnail") && requested.contains(&media),
        "{requested}"
    );
    let claimed = line(&["task", "claim", "--kind", "thumbnail", "--worker", "w", "--lease", "30"]);
    assert!(
        claimed.starts_with(&format!("claimed thumbnail version 3 on media {media}: token ")),
        "{claimed}"
    );
    let token = claimed
        .split("token ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the line names the token");
    assert!(line(&["task", "heartbeat", token]).contains("lease held until"));
    let shown = line(&["task", "show", "--media", &media, "--kind", "thumbnail"]);
    assert!(
        shown.contains("leased")
            && shown.contains(&opledger_domain::claims::fingerprint(token))
            && !shown.contains(token),
        "{shown}"
    );
    assert!(line(&["task", "complete", token]).contains("succeeded"));
    assert!(line(&["recover"]).contains("0 expired claim"));
}

#[test]
fn claim_first_recovers_expired_claims_so_a_dead_workers_task_is_taken_again() {
    let ledger = Ledger::new();
    let media = ledger.add_media("/photos/a.jpg");
    let operation_id = text(&ledger.request_thumbnail(&media)["operation_id"]);
    let dead = ledger.claim("dead-worker", "1");
    assert_eq!(ledger.claim("live-worker", "30"), json!({"claim_token": null}));
    sleep_past(timestamp(&dead["lease_expires_at"]));

    // No separate `recover`: the claim runs one recovery pass first.
    let taken = ledger.claim("live-worker", "30");
    assert_eq!(text(&taken["operation_id"]), operation_id, "{taken}");
    assert_ne!(taken["claim_token"], dead["claim_token"]);
    let types = ledger.event_types(&operation_id);
    assert_eq!(
        types,
        [
            "operation_created",
            "operation_claimed",
            "operation_interrupted",
            "operation_requeued",
            "operation_claimed"
        ],
        "{types:?}"
    );
    let state = ledger.show(&operation_id);
    assert_eq!(state["worker"], "live-worker", "{state:#}");
    assert_eq!(state["interruption_count"], 1, "{state:#}");
    ledger.refused(&["task", "complete", &text(&dead["claim_token"])], 3);
    ledger.assert_replay_verifies();
}
