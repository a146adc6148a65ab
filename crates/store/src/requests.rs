//! What a backend keeps of a command issued with a caller-chosen request
//! id, so a retry of it is answered without being applied twice.
//!
//! The engine decides what a record holds (the fingerprint, the answer's
//! JSON) and when it is written: inside the command's own write
//! transaction, beside its events, so a record exists exactly when the
//! command's events do. A backend stores and returns it as given.

use opledger_domain::Timestamp;

/// One command recorded under its request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRecord {
    /// The caller's id (1 to 200 bytes).
    pub request_id: String,
    /// Which command it was (`task.claim`, `batch.create`, …): named in
    /// the conflict a reuse of the id for another command gets.
    pub command: String,
    /// 64 lowercase hex digits: a digest of what the command asked.
    pub fingerprint: String,
    /// The command's answer as JSON text, handed back to its retries.
    pub answer: String,
    /// The first and last `seq` the command appended; None when it
    /// appended nothing.
    pub seqs: Option<(i64, i64)>,
    /// When the command ran; records older than the retention are swept.
    pub recorded_at: Timestamp,
}
