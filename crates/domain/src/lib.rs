//! The pure domain of opledger: event types and their schema versions, the
//! status vocabularies, the operation transition table, and the projector
//! folds that turn events into read-model rows.
//!
//! This crate must not know about async runtimes, databases, files, the clock
//! or randomness. Time and identifiers arrive inside commands and event
//! envelopes; everything here is a function of its arguments, which is what
//! makes replay deterministic. The rule is enforced mechanically: the
//! dependency list is checked by `tests/it/architecture/dependencies.rs` at
//! the workspace root, and `clippy.toml` in this crate disallows the clock
//! and random sources.

pub mod batches;
pub mod capabilities;
pub mod chain;
pub mod claims;
pub mod decide;
pub mod digest;
pub mod envelope;
pub mod error;
pub mod events;
pub mod ids;
pub mod ingestion;
pub mod kinds;
pub mod lease;
pub mod projections;
pub mod quote;
pub mod recovery;
pub mod requests;
pub mod review;
pub mod revision;
pub mod status;
pub mod tasks;
pub mod time;
pub mod transitions;
pub mod versions;
pub mod work;

pub use envelope::{EventEnvelope, NewEvent, StreamId};
pub use error::{DecodeError, DomainError, FoldError, TransitionError};
pub use events::Event;
pub use ids::{BatchId, MediaId, OperationId, RegionId};
pub use lease::{LeaseMs, MAX_LEASE_MS};
pub use quote::{quote, quoted};
pub use revision::{canonical_json, compute_revision, RevisionError};
pub use status::{CapabilityStatus, IngestionStage, OperationStatus};
pub use time::Timestamp;
pub use transitions::Cause;
