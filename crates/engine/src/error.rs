//! The engine's two error layers, kept apart: the caller asked for something
//! the rules do not allow (domain), or storage failed (store).

use opledger_domain::{DomainError, FoldError, TransitionError};
use opledger_store::{ErrorKind, StoreError};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum EngineError {
    /// Refused by the rules; nothing was written.
    #[error(transparent)]
    Domain(#[from] DomainError),
    /// Storage failed; nothing of the command was committed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<TransitionError> for EngineError {
    fn from(error: TransitionError) -> Self {
        EngineError::Domain(DomainError::IllegalTransition(error))
    }
}

impl From<FoldError> for EngineError {
    /// A fold that fails on an event is corrupt data (or a bug) at that seq.
    fn from(error: FoldError) -> Self {
        EngineError::Store(StoreError::corrupt_at(error.seq, error.to_string()))
    }
}

impl EngineError {
    pub fn invalid(message: impl Into<String>) -> Self {
        EngineError::Domain(DomainError::InvalidInput(message.into()))
    }

    pub fn not_found(what: &'static str, id: impl ToString) -> Self {
        EngineError::Domain(DomainError::NotFound {
            what,
            id: id.to_string(),
        })
    }

    /// Whether storage reported this kind.
    pub fn is_store(&self, kind: ErrorKind) -> bool {
        matches!(self, EngineError::Store(error) if error.kind == kind)
    }
}
