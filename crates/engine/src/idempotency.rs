//! Idempotent retries: a writing command issued with a caller-chosen
//! request id ([`RequestId`], carried by its [`CommandContext`]) is
//! recorded under that id in the same write transaction as its events —
//! what it asked (a fingerprint), what it answered, the seqs it appended
//! ([`opledger_store::CommandRecord`], the `command_requests` table of
//! migration 0005). A retry with the same id, after an answer that never
//! arrived or a failure reported for a commit that was in fact applied,
//! finds the record first, inside its own write transaction, and answers
//! the recorded answer without deciding or appending anything again. The
//! same id with a different command or different arguments is refused as
//! a conflict, never silently answered with another command's result.
//!
//! Records are kept [`REQUEST_RETENTION_MS`] (seven days) and swept by
//! recovery (`Engine::forget_old_requests`): a retry later than that runs
//! as a new command. *Why a table and not the log:* a request id is the
//! caller's, not a fact of the ledger, and must be forgettable; the log is
//! never changed, and replay must not depend on what callers named their
//! calls. So the table is durable schema beside the projections, not a
//! projection, and `replay --verify` does not compare it.
//!
//! This module knows no command and no transaction: each command names
//! itself and what it asked (`CommandContext::once`, in `tx`, makes the
//! [`Once`]); the write helper that checks and records is
//! `Engine::command_once` (in `tx`).

use crate::error::EngineError;
use opledger_domain::revision::sha256_hex;
use opledger_domain::{quote, DomainError};
use opledger_store::CommandRecord;
use serde_json::{json, Value};

/// The longest request id, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 200;

/// How long a command stays recorded under its request id: seven days.
/// A retry within it is answered from the record; after it the id is
/// free again.
pub const REQUEST_RETENTION_MS: i64 = 7 * 24 * 60 * 60 * 1000;

/// Records forgotten per transaction of a sweep, so a sweep never holds
/// the writer long; a sweep runs transactions until none are left.
pub(crate) const FORGET_PER_TRANSACTION: usize = 5_000;

/// A caller-chosen id naming one logical command across its retries:
/// 1 to [`MAX_REQUEST_ID_BYTES`] bytes of visible ASCII (no spaces or
/// control characters), e.g. a UUID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestId(String);

impl RequestId {
    /// Checks an id; a bad one is invalid input quoting (a short part of) it.
    pub fn new(text: impl Into<String>) -> Result<Self, EngineError> {
        let text = text.into();
        if text.is_empty() || text.len() > MAX_REQUEST_ID_BYTES {
            return Err(EngineError::invalid(format!(
                "a request id has 1 to {MAX_REQUEST_ID_BYTES} characters, not {}",
                text.len()
            )));
        }
        if let Some(bad) = text.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(EngineError::invalid(format!(
                "a request id is visible ASCII without spaces; {} holds {bad:?}",
                quote(&text)
            )));
        }
        Ok(RequestId(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id of one part of a command that runs as many commands (a bulk
    /// review resolution: one per entry).
    pub(crate) fn part(&self, part: impl std::fmt::Display) -> RequestId {
        RequestId(format!("{}/{part}", self.0))
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One command under a request id: the id, which command, and the
/// fingerprint of what it asked.
#[derive(Debug, Clone)]
pub(crate) struct Once {
    request_id: RequestId,
    command: &'static str,
    fingerprint: String,
}

impl Once {
    /// The command `command` of `actor` asking `asked`, under
    /// `request_id`. The fingerprint is the SHA-256 of the command's name,
    /// the actor and the arguments as JSON (object keys sorted): what
    /// decides whether a retry is the same command. The time and the ids
    /// the engine makes are not in it — a retry comes later and would be
    /// given new ones.
    pub(crate) fn new(request_id: &RequestId, actor: &str, command: &'static str, asked: Value) -> Once {
        let document = json!({"command": command, "actor": actor, "asked": asked});
        Once {
            request_id: request_id.clone(),
            command,
            fingerprint: sha256_hex(document.to_string().as_bytes()),
        }
    }

    pub(crate) fn request_id(&self) -> &str {
        self.request_id.as_str()
    }

    /// The recorded answer of this command, or the conflict of an id used
    /// for another command.
    pub(crate) fn recorded_answer(&self, record: &CommandRecord) -> Result<String, EngineError> {
        if record.fingerprint != self.fingerprint {
            let what = if record.command == self.command {
                format!("another {} with other arguments", record.command)
            } else {
                format!("a {} command", record.command)
            };
            return Err(EngineError::Domain(DomainError::Conflict(format!(
                "request id {} was used for {what} (at {}); a request id names one command: \
                 choose a new id for a new command",
                quote(self.request_id.as_str()),
                record.recorded_at.to_rfc3339()
            ))));
        }
        Ok(record.answer.clone())
    }

    /// The record of this command with its answer and appended seqs.
    pub(crate) fn record(
        &self,
        answer: String,
        seqs: Option<(i64, i64)>,
        recorded_at: opledger_domain::Timestamp,
    ) -> CommandRecord {
        CommandRecord {
            request_id: self.request_id.as_str().to_string(),
            command: self.command.to_string(),
            fingerprint: self.fingerprint.clone(),
            answer,
            seqs,
            recorded_at,
        }
    }
}

/// A report's outcome as a command's arguments (for the fingerprint).
pub(crate) fn asked_outcome(outcome: &opledger_domain::work::ClaimOutcome) -> Value {
    use opledger_domain::work::{ClaimOutcome, Completion};
    match outcome {
        ClaimOutcome::Complete(Completion::Output(output)) => json!({"complete": output}),
        ClaimOutcome::Complete(Completion::NoResult { reason }) => json!({"no_result": reason}),
        ClaimOutcome::Fail { error, terminal } => json!({"fail": error, "terminal": terminal}),
        ClaimOutcome::AcknowledgeCancel => json!("acknowledge_cancel"),
        ClaimOutcome::Release { reason } => json!({"release": reason}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_id_is_visible_ascii_of_bounded_length() {
        assert!(RequestId::new("0193a5c2-7d1e-7c3a-9b1e-1f2a3b4c5d6e").is_ok());
        assert!(RequestId::new("x".repeat(MAX_REQUEST_ID_BYTES)).is_ok());
        for bad in ["", "has space", "tab\there", "é", &"x".repeat(MAX_REQUEST_ID_BYTES + 1)] {
            assert!(
                matches!(
                    RequestId::new(bad),
                    Err(EngineError::Domain(DomainError::InvalidInput(_)))
                ),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn the_fingerprint_names_the_command_the_actor_and_the_arguments() {
        let id = RequestId::new("r1").unwrap();
        let once = |actor, command, asked| Once::new(&id, actor, command, asked).fingerprint;
        let base = once("worker-1", "task.claim", json!({"limit": 1, "kinds": ["a"]}));
        assert_eq!(
            base,
            once("worker-1", "task.claim", json!({"kinds": ["a"], "limit": 1}))
        );
        assert_ne!(
            base,
            once("worker-1", "task.claim", json!({"limit": 2, "kinds": ["a"]}))
        );
        assert_ne!(
            base,
            once("worker-1", "task.heartbeat", json!({"limit": 1, "kinds": ["a"]}))
        );
        assert_ne!(
            base,
            once("worker-2", "task.claim", json!({"limit": 1, "kinds": ["a"]}))
        );
    }
}
