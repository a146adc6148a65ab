//! A total-queue history checker (after Jepsen's): worker processes record
//! every invoke and answer of request, claim and complete in a history
//! file of their own, one JSON object a line, written before and after each
//! call; the checker reads every file and the final log and reports tasks
//! lost (requested and acknowledged, never completed after the final
//! drain), duplicated (more than one accepted completion of one task),
//! and unexpected (completed, never requested).
//!
//! A call whose process died between its invoke and its answer is
//! *unknown*: it may or may not have happened. The log decides those: a
//! completion is counted from the log's `OperationSucceeded` events, so an
//! unknown completion that landed is one completion, and one that did not
//! leaves the task to another worker.

pub mod processes;

use opledger_domain::events::Event;
use opledger_domain::EventEnvelope;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// One process's history file: each record is one `write` of one line, so
/// a SIGKILL loses at most the record being written, never one before it.
pub struct HistoryWriter {
    process: String,
    file: File,
}

/// What a call did: `invoke` before it, then `ok`, `fail` (definitely not
/// applied: a fencing conflict) or `info` (unknown: any other error).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub process: String,
    /// `request`, `claim` or `complete`.
    pub f: String,
    /// `invoke`, `ok`, `fail` or `info`.
    pub t: String,
    /// The task: media item and kind (and operation once known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Record {
    pub fn new(f: &str, t: &str) -> Record {
        Record {
            process: String::new(),
            f: f.to_string(),
            t: t.to_string(),
            target: None,
            kind: None,
            op: None,
            revision: None,
            token: None,
            error: None,
        }
    }
}

impl HistoryWriter {
    pub fn create(dir: &Path, process: &str) -> HistoryWriter {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("history-{process}.jsonl")))
            .expect("open the history file");
        HistoryWriter {
            process: process.to_string(),
            file,
        }
    }

    pub fn record(&mut self, mut record: Record) {
        record.process = self.process.clone();
        let mut line = serde_json::to_string(&record).expect("a record serializes");
        line.push('\n');
        self.file.write_all(line.as_bytes()).expect("write the history");
    }

    /// Many records in one write (a claim of many tasks).
    pub fn record_all(&mut self, records: Vec<Record>) {
        let mut text = String::new();
        for mut record in records {
            record.process = self.process.clone();
            text.push_str(&serde_json::to_string(&record).expect("a record serializes"));
            text.push('\n');
        }
        self.file.write_all(text.as_bytes()).expect("write the history");
    }
}

/// Every record of every history file in `dir`. A last line cut short by
/// a SIGKILL is dropped (the call it began is unknown, as if unrecorded).
pub fn read_histories(dir: &Path) -> Vec<Record> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the history folder")
        .map(|entry| entry.expect("a folder entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("history-") && name.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    let mut records = Vec::new();
    for path in files {
        for line in BufReader::new(File::open(&path).expect("open a history file")).lines() {
            let line = line.expect("read a history line");
            if let Ok(record) = serde_json::from_str::<Record>(&line) {
                records.push(record);
            }
        }
    }
    records
}

/// What the checker found.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// Request calls recorded (invokes) and acknowledged tasks.
    pub requests_invoked: usize,
    pub requested: usize,
    pub claims: usize,
    pub completions_ok: usize,
    /// Completions refused by fencing (a stale claim).
    pub completions_refused: usize,
    /// Completions whose answer never came (process killed) or was an error.
    pub completions_unknown: usize,
    /// Successes in the log.
    pub succeeded_in_log: usize,
    /// Requested and acknowledged, not succeeded after the drain.
    pub lost: Vec<String>,
    /// More than one accepted completion (in the log, or acknowledged).
    pub duplicated: Vec<String>,
    /// Completed (in the log or acknowledged), never requested.
    pub unexpected: Vec<String>,
    /// Claims held by a process that was SIGKILLed before it completed them.
    pub killed_claims: usize,
    /// Of those, completed afterwards by another worker.
    pub killed_finished_elsewhere: usize,
    /// Of those, whose own completion had landed before the kill.
    pub killed_landed_before_death: usize,
    /// Killed claims that ended neither way.
    pub killed_unfinished: Vec<String>,
}

impl Verdict {
    pub fn is_clean(&self) -> bool {
        self.lost.is_empty()
            && self.duplicated.is_empty()
            && self.unexpected.is_empty()
            && self.killed_unfinished.is_empty()
    }

    /// One line for the test's output.
    pub fn summary(&self) -> Value {
        serde_json::json!({
            "requested": self.requested,
            "claims": self.claims,
            "completions_ok": self.completions_ok,
            "completions_refused": self.completions_refused,
            "completions_unknown": self.completions_unknown,
            "succeeded_in_log": self.succeeded_in_log,
            "lost": self.lost.len(),
            "duplicated": self.duplicated.len(),
            "unexpected": self.unexpected.len(),
            "killed_claims": self.killed_claims,
            "killed_finished_elsewhere": self.killed_finished_elsewhere,
            "killed_landed_before_death": self.killed_landed_before_death,
        })
    }
}

/// Checks the histories against the final log. `killed` names the
/// processes that were SIGKILLed.
pub fn check(records: &[Record], log: &[EventEnvelope], killed: &BTreeSet<String>) -> Verdict {
    let mut verdict = Verdict::default();
    // (target, kind) a request was invoked for; operation → (target, kind)
    // of acknowledged requests.
    let mut invoked: BTreeSet<(String, String)> = BTreeSet::new();
    let mut requested: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut acknowledged_completions: BTreeMap<String, usize> = BTreeMap::new();
    // Per process, the claims it took and the completions it got an answer for.
    let mut claimed_by: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut answered: BTreeSet<(String, String)> = BTreeSet::new();
    let mut invoked_completions: BTreeSet<(String, String)> = BTreeSet::new();

    for record in records {
        let op = record.op.clone().unwrap_or_default();
        match (record.f.as_str(), record.t.as_str()) {
            ("request", "invoke") => {
                verdict.requests_invoked += 1;
                invoked.insert((
                    record.target.clone().unwrap_or_default(),
                    record.kind.clone().unwrap_or_default(),
                ));
            }
            ("request", "ok") => {
                requested.insert(
                    op,
                    (
                        record.target.clone().unwrap_or_default(),
                        record.kind.clone().unwrap_or_default(),
                    ),
                );
            }
            // An empty claim is recorded as an `ok` without an operation.
            ("claim", "ok") if record.op.is_some() => {
                verdict.claims += 1;
                claimed_by
                    .entry(record.process.clone())
                    .or_default()
                    .insert(op, record.token.clone().unwrap_or_default());
            }
            ("complete", "invoke") => {
                invoked_completions.insert((record.process.clone(), record.token.clone().unwrap_or_default()));
            }
            ("complete", "ok") => {
                verdict.completions_ok += 1;
                *acknowledged_completions.entry(op).or_default() += 1;
                answered.insert((record.process.clone(), record.token.clone().unwrap_or_default()));
            }
            ("complete", "fail") => {
                verdict.completions_refused += 1;
                answered.insert((record.process.clone(), record.token.clone().unwrap_or_default()));
            }
            ("complete", "info") => verdict.completions_unknown += 1,
            _ => {}
        }
    }
    verdict.completions_unknown += invoked_completions.difference(&answered).count();
    verdict.requested = requested.len();

    // From the log: every operation's successes, with the worker (actor)
    // and the claim token that completed it.
    let mut successes: BTreeMap<String, Vec<(String, Option<String>)>> = BTreeMap::new();
    for envelope in log {
        if let Event::OperationSucceeded(done) = &envelope.event {
            successes
                .entry(done.operation_id.to_string())
                .or_default()
                .push((envelope.actor.clone(), done.claim_token.clone()));
        }
    }
    verdict.succeeded_in_log = successes.values().map(Vec::len).sum();

    for op in requested.keys() {
        if !successes.contains_key(op) {
            verdict.lost.push(op.clone());
        }
    }
    for (op, done) in &successes {
        if done.len() > 1 || acknowledged_completions.get(op).copied().unwrap_or(0) > 1 {
            verdict.duplicated.push(op.clone());
        }
        // The requester is never killed, so every request it invoked was
        // answered: a success of an operation no answer named is unexpected.
        if !requested.contains_key(op) {
            verdict.unexpected.push(op.clone());
        }
    }
    for op in acknowledged_completions.keys() {
        if !successes.contains_key(op) {
            // Acknowledged, yet not in the log: a completion that was lost.
            verdict.lost.push(format!("{op} (acknowledged, not in the log)"));
        }
    }
    // Operations in the log that no request invoke names: created behind
    // the requester's back.
    let invoked_targets: BTreeSet<&(String, String)> = invoked.iter().collect();
    for (op, target_kind) in &requested {
        if !invoked_targets.contains(target_kind) {
            verdict
                .unexpected
                .push(format!("{op} (acknowledged without an invoke)"));
        }
    }

    for process in killed {
        let Some(claims) = claimed_by.get(process) else {
            continue;
        };
        for (op, token) in claims {
            if answered.contains(&(process.clone(), token.clone())) {
                continue;
            }
            verdict.killed_claims += 1;
            match successes.get(op).and_then(|done| done.first()) {
                Some((actor, Some(done_token))) if actor == process && done_token == token => {
                    verdict.killed_landed_before_death += 1
                }
                Some((actor, _)) if actor != process => verdict.killed_finished_elsewhere += 1,
                // Completed under an earlier claim of this process, before
                // this claim of the same operation: not this claim's task.
                Some(_) => verdict.killed_finished_elsewhere += 1,
                None => verdict.killed_unfinished.push(op.clone()),
            }
        }
    }
    verdict
}
