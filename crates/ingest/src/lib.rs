//! The reference pipeline: `opledger ingest DIR`. Walks a folder, starts one
//! `ingestion.file` operation per new or changed file and a batch over the
//! folder's files, moves each file through its stages (settling, hashing,
//! parsing, registered, completed — each on the file's timeline), registers
//! the media item with its content digest and its media kind (by content:
//! `image`, `video`, `audio`, `other`), requests its tasks (the image
//! kinds on every file, where they apply to images only; a video's and a
//! sound's own kinds) and runs them with a pool of local workers, until
//! every file has settled. A task that cannot run here (ffmpeg not
//! installed, a HEIF photo in a build without HEIF support) is requested
//! `blocked` with the reason, and its file settles without it; a later run
//! that has what it lacked retries it and waits for it (`tools`).
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
//! Crash-resume: one ingest runs at a time per ledger (the ledger's own
//! lock, whatever path or folder reaches it), so an ingestion found claimed
//! is one whose process died: it is interrupted (on its timeline) and taken
//! over. Every run claims under a name of its own (`ingest-<run id>`), so
//! the next run knows every task claim held under another run's name is
//! dead and interrupts it at once instead of waiting for its lease to
//! expire.
//!
//! Stopping early ([`StopSignal`], what the command line's SIGINT and
//! SIGTERM ask for): the run stops reading files and claiming tasks, lets
//! running tasks finish within a grace (a second stop interrupts them at
//! once), finishes the files whose tasks settled, and releases everything
//! else it holds — ingestions and task claims interrupted and queued
//! again — so the next run resumes at once.
//!
//! Paths are recorded as text; a file name that is not UTF-8 is recorded
//! reversibly ([`opledger_media::path_text`]) and read by its real bytes.

mod begin;
mod discover;
mod drive;
mod finish;
mod lock;
mod options;
mod patience;
mod pipeline;
mod review;
mod run;
mod summary;
mod tools;
mod workers;

pub use lock::{is_run_worker, run_worker, IngestLock, INGEST_LOCK};
pub use options::{IngestOptions, IngestProgress, NoProgress, StopLevel, StopSignal};
pub use pipeline::ingest;
pub use summary::{IngestError, IngestSummary, Interrupted, ReviewEntry, SkippedFile};

/// The task kinds an ingest requests on every file: the image kinds, which
/// end `not_applicable` on a file that is not an image, so every file's
/// record says what the main job did with it.
pub const INGEST_TASK_KINDS: &[&str] = opledger_media::IMAGE_KINDS;

/// The task kinds an ingest requests on a file of `media_kind`: the image
/// kinds on every file, and a video's or a sound's own kinds on those
/// alone (a photo library's ledger holds no rows for kinds that could
/// never apply to its files).
pub fn task_kinds_for(media_kind: &str) -> &'static [&'static str] {
    match media_kind {
        "video" => &[
            "metadata",
            "thumbnail",
            "perceptual_hash",
            "video_metadata",
            "poster_frame",
        ],
        "audio" => &["metadata", "thumbnail", "perceptual_hash", "audio_metadata"],
        _ => INGEST_TASK_KINDS,
    }
}
