//! The opledger engine: commands that decide, append and fold in one
//! transaction; startup (catching projections up, rebuilding changed ones
//! through a shadow); replay and verification; the read queries behind
//! `status` and `timeline`; the query layer (`query`: a media item's
//! detail, listings with typed filters and cursor pagination).
//!
//! The engine is generic over [`opledger_store::Store`] and must not know
//! which backend it runs on: no SQL, no driver types, no error codes. It must
//! not hold business rules either: those are the domain's (transition table,
//! folds); the engine loads state, asks the domain, and persists the answer.
//! It is the one place that reads the clock and makes ids, through [`Clock`]
//! and [`Ids`], which tests replace.

mod batches;
mod clock;
mod commands;
mod describe;
mod digest;
mod error;
mod fold;
mod idempotency;
mod ingestion;
mod integrity;
mod kinds;
mod load;
mod observe;
mod queries;
mod query;
mod reactions;
mod replay;
mod review;
mod review_bulk;
mod startup;
mod tx;
mod work;

pub use batches::{BatchCancelCounts, BatchRequest, BatchView, MAX_BATCH_ITEMS};
pub use clock::{
    Clock, FixedClock, FixedJitter, Ids, Jitter, RandomJitter, SequentialIds, SkewedClock, SystemClock, UuidV7Ids,
};
pub use commands::NewOperation;
pub use describe::{Description, QUEUE_COUNT_LIMIT};
pub use error::EngineError;
pub use fold::{fold_events, FOLD_CHUNK};
pub use idempotency::{RequestId, MAX_REQUEST_ID_BYTES, REQUEST_RETENTION_MS};
pub use ingestion::{FileObservation, IngestionClaim, Registered, Registration};
pub use integrity::IntegrityCheck;
pub use kinds::{
    parse_kinds, KindReport, KindStatus, KindsDocument, KindsReport, LocatedKind, ReprocessOutcome, APPLY_REASON,
    DEFAULT_MAX_KINDS, MAX_KINDS_FILE_BYTES,
};
pub use observe::{WriteKind, WriteObserver, WriteTimings};
pub use opledger_domain::lease::{LeaseMs, MAX_LEASE_MS};
pub use opledger_domain::work::{ClaimOutcome, Completion, Fence};
pub use queries::{BatchSummary, BlockedReason, ProjectionLag, StatusReport};
pub use query::{
    decode_cursor, encode_cursor, BatchItemView, BatchMembership, BatchPage, CapabilityItem, Listing, MediaDetail,
    MediaFilter, MediaItem, MediaRef, OperationItem, OpsFilter, Page, PageRequest, ReviewItem, ReviewView,
    DEFAULT_PAGE_LIMIT, JOINED_WALK_PER_PAGE, MAX_PAGE_LIMIT, THUMBNAIL_CAPABILITY, WALK_PER_PAGE,
};
pub use replay::{ReplayStats, VerifyReport};
pub use review_bulk::{BulkResolution, ReviewFilter, SkippedEntry};
pub use startup::{MaintenanceReport, ProjectionReadiness, Readiness, StartupReport};
pub use tx::CommandContext;
pub use work::{
    ClaimRequest, HeartbeatOutcome, OutcomeReport, Progress, RecoveryHook, RecoveryReport, RequestOutcome,
    RunningWhenGone, TaskClaim, TaskOutcome, TaskRequest, TaskTarget, TaskView, MAX_CLAIM_BATCH,
};

use opledger_store::Store;
use std::sync::Arc;

/// The engine over one store.
#[derive(Clone)]
pub struct Engine<S: Store> {
    store: S,
    clock: Arc<dyn Clock>,
    ids: Arc<dyn Ids>,
    /// Where retry jitter is drawn (recorded in the event, never redrawn).
    jitter: Arc<dyn Jitter>,
    /// Events per transaction in catch-up, shadow rebuilds and replay.
    fold_chunk: usize,
    /// Who learns the write timings, if anyone.
    observer: Option<Arc<dyn WriteObserver>>,
    /// The most task kinds the catalogue may hold.
    max_kinds: usize,
}

impl<S: Store> Engine<S> {
    /// An engine with the system clock and UUIDv7 ids. Call
    /// [`Engine::startup`] before serving commands.
    pub fn new(store: S) -> Self {
        Engine::with_clock(store, Arc::new(SystemClock), Arc::new(UuidV7Ids))
    }

    pub fn with_clock(store: S, clock: Arc<dyn Clock>, ids: Arc<dyn Ids>) -> Self {
        Engine {
            store,
            clock,
            ids,
            jitter: Arc::new(RandomJitter),
            fold_chunk: FOLD_CHUNK,
            observer: None,
            max_kinds: DEFAULT_MAX_KINDS,
        }
    }

    /// Opens an engine and runs startup: the usual way to begin.
    pub async fn open(store: S) -> Result<(Self, StartupReport), EngineError> {
        let engine = Engine::new(store);
        let report = engine.startup().await?;
        Ok((engine, report))
    }

    /// Sets how many events catch-up, rebuild and replay fold per
    /// transaction (tests use small chunks to interleave writers).
    pub fn with_fold_chunk(mut self, fold_chunk: usize) -> Self {
        self.fold_chunk = fold_chunk.max(1);
        self
    }

    /// Reports every write command's timings to `observer` (the HTTP
    /// service's latency histograms).
    pub fn with_write_observer(mut self, observer: Arc<dyn WriteObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Sets the most task kinds the catalogue may hold (declarations past
    /// it are refused; [`DEFAULT_MAX_KINDS`] unless set).
    pub fn with_max_kinds(mut self, max_kinds: usize) -> Self {
        self.max_kinds = max_kinds.max(1);
        self
    }

    /// Replaces the jitter source (tests pin it).
    pub fn with_jitter(mut self, jitter: Arc<dyn Jitter>) -> Self {
        self.jitter = jitter;
        self
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// The engine clock's time now.
    pub fn now(&self) -> opledger_domain::Timestamp {
        self.clock.now()
    }

    /// The engine's id source, for callers that name what they will hand
    /// to a command (an ingest run, the batch it creates): ids come from
    /// here, so a test's `SequentialIds` covers them too.
    pub fn ids(&self) -> &dyn Ids {
        self.ids.as_ref()
    }
}
