use thiserror::Error;

/// What went wrong in storage, independent of the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Someone else won: a stream version was taken, a uniqueness rule held,
    /// or a projection moved under us. Retrying with fresh state may succeed.
    Conflict,
    /// The thing asked for does not exist.
    NotFound,
    /// The database cannot be reached or refused service (locked for too
    /// long, connection lost, disk full). Retrying later may succeed.
    Unavailable,
    /// Stored data cannot be read back: an unknown event type, a malformed
    /// payload, a row that does not map. Never retried; needs an operator.
    Corrupt,
    /// The database refused a write for breaking a constraint (foreign key,
    /// check). Above the store this is a bug or invalid input, not a race.
    Constraint,
}

/// A storage failure: its neutral kind, a message for humans, and the log
/// position it concerns when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct StoreError {
    pub kind: ErrorKind,
    pub message: String,
    /// The `seq` of the event involved, for corrupt log entries.
    pub seq: Option<i64>,
}

impl StoreError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
            seq: None,
        }
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    pub fn corrupt_at(seq: i64, message: impl Into<String>) -> Self {
        StoreError {
            kind: ErrorKind::Corrupt,
            message: format!("corrupt event at seq {seq}: {}", message.into()),
            seq: Some(seq),
        }
    }

    pub fn constraint(message: impl Into<String>) -> Self {
        StoreError::new(ErrorKind::Constraint, message)
    }

    pub fn corrupt(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupt, message)
    }

    pub fn is(&self, kind: ErrorKind) -> bool {
        self.kind == kind
    }
}
