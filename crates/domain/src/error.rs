//! Domain errors: the caller asked for something the rules do not allow.
//! These are 4xx answers (exit code 2 or 3), never storage trouble. A move
//! the transition table lacks is refused by the table itself
//! ([`TransitionError`], beside it in `transitions`).

pub use crate::transitions::TransitionError;
use thiserror::Error;

/// What a command may be refused for.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DomainError {
    #[error(transparent)]
    IllegalTransition(#[from] TransitionError),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("{what} {} not found", crate::quote::quote(id))]
    NotFound { what: &'static str, id: String },
    #[error("conflict: {0}")]
    Conflict(String),
}

/// An event in the log that cannot be turned back into a typed event.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("unknown event type {event_type:?}")]
    UnknownType { event_type: String },
    #[error("{event_type} schema version {schema_version} is not supported (newest known is {newest})")]
    UnknownVersion {
        event_type: String,
        schema_version: u32,
        newest: u32,
    },
    #[error("malformed {event_type} payload: {reason}")]
    Malformed { event_type: String, reason: String },
}

/// An event a projector cannot fold. In a log written through the engine this
/// never happens; when it does, the log (or a hand edit) is corrupt.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("cannot fold {event_type} at seq {seq}: {reason}")]
pub struct FoldError {
    pub seq: i64,
    pub event_type: &'static str,
    pub reason: String,
}
