//! Storage contracts of opledger: the traits every backend implements, the
//! neutral error kinds they map their native errors to, and the conformance
//! suite that proves a backend behaves like the others.
//!
//! This crate must not know any particular database: no SQL, no driver, no
//! SQLSTATE. Backends (opledger-store-sqlite, opledger-store-postgres) translate their
//! native errors into [`ErrorKind`] inside their own crate, so the engine and
//! the CLI never look at a backend's error codes. It must not know business
//! rules either: it persists events and projection rows that the domain's
//! folds computed, and enforces only what a log must (append-only, versions).

pub mod conformance;
mod error;
mod traits;

pub use error::{ErrorKind, StoreError};
pub use traits::{
    ClaimQuery, ExpectedVersion, ExpiredClaim, Lease, ProjectionState, RowDiff, RowTarget, ScratchTarget, Store,
    StreamAppend, TableDiff, TableSet, WriteTx,
};

/// A boxed future, the shape `Store::write` work closures return.
pub type BoxFuture<'a, T> = futures::future::BoxFuture<'a, T>;
