//! The reference pipeline: `opledger ingest DIR`. Walks a folder, starts one
//! `ingestion.file` operation per new or changed file and a batch over the
//! folder's files, moves each file through its stages (settling, hashing,
//! parsing, registered, completed — each on the file's timeline), registers
//! the media item with its content digest, requests its image tasks
//! (metadata, thumbnail, perceptual hash) and runs them with a pool of local
//! workers, until every file has settled.
//!
//! Everything it does goes through the engine, so the ledger knows exactly
//! what happened to every file; what it keeps in memory is only what one
//! run needs. It must not know SQL or which backend it runs on, and holds
//! no image code of its own (that is `opledger-media`). Progress is reported
//! through [`IngestProgress`]; how it is shown is the caller's business.
//!
//! Idempotence: a file whose last ingestion succeeded with the same size and
//! modification time is unchanged, and gets no operation and runs no task.
//! A changed file gets a new ingestion; its tasks get new revisions from the
//! new digest. A file gone from disk is recorded (`missing_confirmed`).
//! Crash-resume: one ingest runs at a time per database (a lock file), so an
//! ingestion found claimed is one whose process died: it is interrupted
//! (on its timeline) and taken over; the dead process's task claims are
//! interrupted by recovery once their short leases expire.

mod begin;
mod discover;
mod drive;
mod finish;
mod lock;
mod options;
mod pipeline;
mod review;
mod summary;
mod workers;

pub use lock::IngestLock;
pub use options::{IngestOptions, IngestProgress, NoProgress};
pub use pipeline::ingest;
pub use summary::{IngestError, IngestSummary, ReviewEntry};

/// The task kinds an ingest requests on every file.
pub const INGEST_TASK_KINDS: &[&str] = &["metadata", "thumbnail", "perceptual_hash"];
