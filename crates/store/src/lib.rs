//! Storage contracts of opledger: the traits every backend implements, the
//! neutral error kinds they map their native errors to, and the parts of a
//! backend that are the same on every database: the append plan (the log's
//! expected-version check and numbering), the projection-position check,
//! what a page of a paged walk is (`page`), the pieces of work a
//! group-committing writer queues, the naming of the projection tables'
//! copies, the log's decoding and paging, what a ledger's named locks
//! are (`lock`), and how a backend embeds its migration files
//! (`migrations`).
//!
//! This crate must not know any particular database: no SQL, no driver, no
//! SQLSTATE (`tests/it/architecture/sources.rs` checks that its code holds no
//! SQL).
//! Backends (opledger-store-sqlite, opledger-store-postgres) keep their
//! statements and translate their native errors into [`ErrorKind`] inside
//! their own crate, so the engine and the CLI never look at a backend's
//! error codes. It must not know business rules either: it persists events
//! and projection rows that the domain's folds computed, and enforces only
//! what a log must (append-only, versions). The conformance suite that
//! proves a backend keeps these contracts is a crate of its own
//! (opledger-store-conformance), since it probes the database with SQL.

pub mod append;
mod error;
pub mod group_commit;
pub mod ledger;
pub mod lock;
pub mod log;
pub mod migrations;
pub mod page;
pub mod positions;
mod requests;
pub mod tables;
mod traits;

pub use error::{ErrorKind, StoreError};
pub use lock::LedgerLock;
pub use page::{Direction, Page, PageQuery};
pub use requests::CommandRecord;
pub use traits::{
    AheadQuery, ClaimQuery, ClaimQueue, ClaimableAhead, ExpectedVersion, ExpiredClaim, Lease, ProjectionState, RowDiff,
    RowTarget, ScratchTarget, Store, StreamAppend, TableDiff, TableSet, TimeSource, Verification, WriteTx,
    MAX_QUEUED_VERSIONS,
};

/// A boxed future, the shape `Store::write` work closures return.
pub type BoxFuture<'a, T> = futures::future::BoxFuture<'a, T>;
