//! The store contracts.
//!
//! Writes go through [`Store::write`]: the caller's work runs inside the
//! backend's write transaction, where it can read projection rows, append
//! events and write the rows its folds changed, all committed together (so a
//! command reads its own writes and a refused command leaves nothing behind).
//! A backend may group several callers' work into one durable commit; each
//! piece still succeeds or fails on its own.

use crate::error::StoreError;
use crate::lock::LedgerLock;
use crate::page::{Page, PageQuery};
use crate::requests::CommandRecord;
use crate::BoxFuture;
use futures::stream::BoxStream;
use opledger_domain::chain::{ChainEntry, ChainHash};
use opledger_domain::envelope::{EventEnvelope, NewEvent, StreamId};
use opledger_domain::projections::{Cell, ProjectionSpec, Row, RowChange, TableSpec};
use opledger_domain::tasks::TargetType;
use opledger_domain::{OperationId, OperationStatus, Timestamp};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

/// The stream version an append expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedVersion {
    /// Append whatever the stream holds.
    Any,
    /// The stream must not exist yet.
    NoStream,
    /// The stream must be at exactly this version (0 = does not exist).
    Exactly(i64),
}

/// Events for one stream, appended atomically with others of the same call.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamAppend {
    pub stream_id: StreamId,
    pub expected: ExpectedVersion,
    pub events: Vec<NewEvent>,
}

/// Where one projection stands in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionState {
    pub name: String,
    pub version: u32,
    /// The last `seq` folded in.
    pub position: i64,
}

/// Which copy of the projection tables row operations address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSet {
    /// The tables readers use.
    Live,
    /// A projection's shadow copy, built while the live one keeps serving.
    Shadow,
}

/// How the live and replayed copies of one table differ.
#[derive(Debug, Clone, PartialEq)]
pub struct TableDiff {
    pub table: &'static TableSpec,
    pub live_rows: i64,
    pub replayed_rows: i64,
    /// Up to a handful of differing rows.
    pub rows: Vec<RowDiff>,
}

/// One row that differs: its key, and its cells in each copy (None: absent).
#[derive(Debug, Clone, PartialEq)]
pub struct RowDiff {
    pub key: String,
    pub live: Option<Vec<Cell>>,
    pub replayed: Option<Vec<Cell>>,
}

/// The liveness of one claim: what heartbeats and progress reports change
/// between events. Kept beside the projections, keyed by claim token, and
/// never rebuilt by replay (it is not derived from the log); a claim's
/// lease row exists from its claim until its outcome is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub claim_token: String,
    pub operation_id: OperationId,
    pub worker: String,
    pub heartbeat_at: Timestamp,
    /// Never earlier than the lease the claim event granted.
    pub lease_expires_at: Timestamp,
    pub phase: Option<String>,
    pub processed: Option<i64>,
    pub total: Option<i64>,
    pub progressed_at: Option<Timestamp>,
    /// Counters changed since the last progress event: the outcome records
    /// them on the timeline as the final counts.
    pub progress_unrecorded: bool,
    /// The authenticated principal that took the claim (the HTTP service's
    /// token name), when one did: only it may report on the claim there.
    /// `None` for claims taken where callers are not told apart (the CLI,
    /// the library).
    pub principal: Option<String>,
}

/// What the last check of the log's integrity (`opledger replay --verify`)
/// found, kept beside the projection positions: not a projection (nothing
/// in the log derives it) and not an event (a check is a read; recording
/// it as an event would move the head it just checked, and a check run
/// where only reading is allowed could not record itself at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    pub verified_at: Timestamp,
    /// The seq the check reached (the projections were compared there).
    pub position: i64,
    /// The chain hash at `position` when the chain held up to it: whoever
    /// keeps it elsewhere can tell later that no event up to there changed.
    pub head_hash: Option<ChainHash>,
    /// The first seq where the chain breaks, if it does.
    pub broken_at: Option<i64>,
    /// How many projection tables differed from the log's replay.
    pub differing_tables: i64,
}

impl Verification {
    pub fn is_intact(&self) -> bool {
        self.broken_at.is_none() && self.differing_tables == 0
    }
}

/// A claim whose lease ended before some time: recovery's candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredClaim {
    pub operation_id: OperationId,
    pub claim_token: String,
    pub lease_expires_at: Timestamp,
    /// The worker holding the claim.
    pub worker: String,
}

/// Whose clock a command's time comes from ([`WriteTx::command_time`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSource {
    /// The caller's clock, as given (a test's fixed clock).
    Caller,
    /// The clock every client of the store shares, where the backend has
    /// one (PostgreSQL's server); the caller's clock where it has none
    /// (SQLite, embedded in one host's process).
    Shared,
}

/// Which processing states a batch claim may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimQuery {
    /// Task kinds to take; empty means any.
    pub kinds: Vec<String>,
    /// For a kind of `kinds`, the versions of it to take (the ones its
    /// worker's code implements): only rows whose `task_version` is one
    /// of them. A kind without an entry is taken at any version.
    pub versions: BTreeMap<String, BTreeSet<String>>,
    /// Claimable statuses (the domain's `CLAIMABLE_STATUSES`).
    pub statuses: &'static [OperationStatus],
    /// Only rows with `available_at <= now`.
    pub now: Timestamp,
    pub limit: usize,
}

/// The most distinct versions of one kind a claim that states none looks
/// for in the queue (normally one: a new version re-targets the waiting
/// tasks of the old one).
pub const MAX_QUEUED_VERSIONS: usize = 64;

/// A claimable task's place in its kind's claim order: which tasks a
/// worker claiming that kind would take before it ([`Store::claimable_ahead`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AheadQuery {
    /// The processing-state table the kind's tasks are in.
    pub target: TargetType,
    pub kind: String,
    /// The task's version: a claim that states versions is offered its
    /// kind's tasks per version, so those ahead are of the same one.
    pub task_version: Option<String>,
    /// The task's own place: its priority, when it became available, its id.
    pub priority: i64,
    pub available_at: Timestamp,
    pub operation_id: OperationId,
    /// Claimable statuses (the domain's `CLAIMABLE_STATUSES`).
    pub statuses: &'static [OperationStatus],
    /// Only tasks with `available_at <= now` are claimable.
    pub now: Timestamp,
    /// Count at most this many: the read stays bounded however long the
    /// queue is.
    pub limit: usize,
}

/// How many claimable tasks come before one in claim order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClaimableAhead {
    /// Tasks ahead (at most the query's limit).
    pub ahead: u64,
    /// Of those, the ones of higher priority.
    pub higher_priority: u64,
}

/// One task kind's claimable queue ([`Store::claim_queues`]): what
/// dashboards and metrics show as its depth and its age.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimQueue {
    pub kind: String,
    /// Tasks a claim of the kind could take now.
    pub claimable: u64,
    /// Since when the longest-waiting of them is claimable.
    pub oldest_available_at: Timestamp,
}

/// Projection rows that folds load and write back.
pub trait RowTarget: Send {
    /// Loads the rows of `table` with these primary keys (absent keys are
    /// simply missing from the answer).
    fn load_rows(
        &mut self,
        table: &'static TableSpec,
        keys: &[String],
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// Loads rows of several tables by primary key at once: what a fold
    /// needs before it applies a chunk of events. The stored rows found, in
    /// no particular order. A backend where every statement is a round trip
    /// answers with one; the default asks [`RowTarget::load_rows`] per table.
    fn load_rows_of_tables(
        &mut self,
        requests: &[(&'static TableSpec, Vec<String>)],
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send {
        async move {
            let mut rows = Vec::new();
            for (table, keys) in requests {
                rows.extend(self.load_rows(table, keys).await?);
            }
            Ok(rows)
        }
    }

    /// Every row of `table` whose `column` equals `value`: what a fold's
    /// [`opledger_domain::projections::RowQuery`] asks for (the children a
    /// deletion is about to cascade to).
    fn load_rows_where(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        value: &Cell,
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// Writes each change: a row whose `after` is None is deleted, others
    /// are written, parents before children for writes. A change whose
    /// `before` is a row the store holds may be written as an update of the
    /// columns that differ (a store must still land the whole row if it
    /// finds the row missing); the rest are written whole.
    fn write_rows(&mut self, changes: &[RowChange]) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The write transaction handed to [`Store::write`] work.
pub trait WriteTx: RowTarget {
    /// Appends events atomically: all of them or none. Each stream's
    /// expectation is checked; a mismatch is a Conflict and nothing of this
    /// call is appended. Returns the stored envelopes in `seq` order.
    fn append(
        &mut self,
        appends: Vec<StreamAppend>,
    ) -> impl Future<Output = Result<Vec<EventEnvelope>, StoreError>> + Send;

    /// Records that every live projection has folded the log up to `to`.
    /// Fails with Conflict unless each was exactly at `from` at this
    /// build's version: inline folding must never skip an event.
    fn advance_positions(&mut self, from: i64, to: i64) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Moves one live projection from `from` to `to` (startup catch-up).
    /// Conflict unless it was at `from` at this build's version.
    fn advance_position(
        &mut self,
        spec: &'static ProjectionSpec,
        from: i64,
        to: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// A live projection's position, if it is stored at `spec`'s version.
    fn projection_position(
        &mut self,
        spec: &'static ProjectionSpec,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;

    /// Selects the tables that `RowTarget` operations address from now on
    /// in this piece of work (live by default).
    fn use_tables(&mut self, set: TableSet);

    /// Reads up to `limit` events after `after`, in seq order, inside this
    /// transaction.
    fn read_events(
        &mut self,
        after: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<EventEnvelope>, StoreError>> + Send;

    /// The highest `seq` in the log (0 when empty).
    fn head(&mut self) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// The time a command decides and records at, read in this
    /// transaction: `caller` (the caller's clock), or with
    /// [`TimeSource::Shared`] the clock every client shares where the
    /// backend has one (read under the write lock, so one host's wrong
    /// clock decides nothing for the others); never earlier than the last
    /// event's `recorded_at` ([`crate::append::command_time`]). The time
    /// goes into the command's events, so a replay reads it back instead
    /// of asking any clock.
    fn command_time(
        &mut self,
        caller: Timestamp,
        source: TimeSource,
    ) -> impl Future<Output = Result<Timestamp, StoreError>> + Send;

    /// Creates empty shadow tables for `spec` (dropping leftovers of an
    /// earlier, unfinished rebuild) with its shadow position at 0.
    fn create_shadow(&mut self, spec: &'static ProjectionSpec) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The shadow's position (None when no shadow exists).
    fn shadow_position(
        &mut self,
        spec: &'static ProjectionSpec,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;

    fn set_shadow_position(
        &mut self,
        spec: &'static ProjectionSpec,
        position: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Replaces the live tables of a family of projections (parents
    /// first) with their shadows, and records each spec's version at its
    /// shadow's position. Atomic with the rest of this transaction.
    fn swap_shadows(
        &mut self,
        specs: &[&'static ProjectionSpec],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rows of `table` whose columns equal the given cells (a lookup by a
    /// unique key other than the primary key), at most `limit`.
    fn find_rows(
        &mut self,
        table: &'static TableSpec,
        filters: &[(&'static str, Cell)],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// Processing states (both target types) a worker may claim: status in
    /// `query.statuses`, `available_at <= query.now`, kind in `query.kinds`,
    /// highest priority first, then longest waiting, then operation id.
    fn claimable(&mut self, query: &ClaimQuery) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    fn lease(&mut self, claim_token: &str) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;

    /// The lease rows of these claim tokens (absent ones are missing).
    fn leases(&mut self, claim_tokens: &[String]) -> impl Future<Output = Result<Vec<Lease>, StoreError>> + Send;

    /// Rows of `table` whose `column` is one of `values` (a batched lookup
    /// by a non-key column), in primary-key order.
    fn find_rows_in(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        values: &[Cell],
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// Inserts or replaces a claim's lease row.
    fn put_lease(&mut self, lease: &Lease) -> impl Future<Output = Result<(), StoreError>> + Send;

    fn delete_lease(&mut self, claim_token: &str) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Replaces the record of the last integrity check.
    fn record_verification(
        &mut self,
        verification: &Verification,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The command recorded under `request_id`, if any (see
    /// [`CommandRecord`]), read inside this transaction.
    fn command_record(
        &mut self,
        request_id: &str,
    ) -> impl Future<Output = Result<Option<CommandRecord>, StoreError>> + Send;

    /// Records a command under its request id, in this transaction. An id
    /// recorded already is a Conflict.
    fn record_command(&mut self, record: &CommandRecord) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Forgets up to `limit` commands recorded before `recorded_before`,
    /// oldest first; answers how many it forgot.
    fn forget_commands(
        &mut self,
        recorded_before: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A private copy of every projection table that replay folds into, and
/// that can be compared with the live tables.
pub trait ScratchTarget: RowTarget {
    /// Reads up to `limit` events after `after`, in seq order.
    fn read_events(
        &mut self,
        after: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<EventEnvelope>, StoreError>> + Send;

    /// Makes the rows written so far durable in the scratch copy.
    ///
    /// A scratch copy may write behind: `write_rows` and `commit_chunk` may
    /// return before the work is done. Such work runs in the order it was
    /// handed over, every other call waits for it first (a load sees every
    /// row written before it), and its first failure is the answer of the
    /// next call.
    fn commit_chunk(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Waits until every write and commit handed over so far is done, and
    /// reports the first that failed.
    fn flush(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Starts a consistent read of the live tables and returns the position
    /// they are at (every live projection must agree). Until `compare`
    /// finishes, `read_events` sees the same snapshot.
    fn begin_snapshot(&mut self) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Compares every projection table, live against scratch, within the
    /// snapshot. Returns only tables that differ.
    fn compare(&mut self) -> impl Future<Output = Result<Vec<TableDiff>, StoreError>> + Send;

    /// Removes the scratch copy.
    fn discard(self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A backend: an event log with projection tables beside it.
pub trait Store: Clone + Send + Sync + 'static {
    type Tx: WriteTx;
    type Scratch: ScratchTarget;
    type Lock: LedgerLock;

    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;

    /// Runs `work` in a write transaction. `Ok` commits it (durably, before
    /// this returns); `Err` rolls back everything `work` did.
    fn write<R, E, F>(&self, work: F) -> impl Future<Output = Result<R, E>> + Send
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<R, E>> + Send + 'static;

    /// Like [`Store::write`], for work that changes only liveness — lease
    /// rows a heartbeat extends, never the log or a projection. A backend
    /// may commit such work without waiting for it to reach the disk when
    /// nothing durable shares its commit: losing the last lease extensions
    /// to a power failure only lets recovery interrupt claims sooner, and
    /// the workers holding them died with the machine (a worker on another
    /// host is still fenced: its late completion is refused). The default
    /// is the durable [`Store::write`].
    fn write_liveness<R, E, F>(&self, work: F) -> impl Future<Output = Result<R, E>> + Send
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<R, E>> + Send + 'static,
    {
        self.write(work)
    }

    /// Every event of one stream, in stream order.
    fn read_stream(&self, stream_id: &StreamId) -> impl Future<Output = Result<Vec<EventEnvelope>, StoreError>> + Send;

    /// Up to `limit` events of one stream after stream version `after`, in
    /// stream order: what a reader following a stream reads each time,
    /// from where it stopped.
    fn read_stream_after(
        &self,
        stream_id: &StreamId,
        after: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<EventEnvelope>, StoreError>> + Send;

    /// Every event after `after`, in seq order, in pages of `page_size`:
    /// memory stays constant whatever the log size.
    fn read_all(&self, after: i64, page_size: usize) -> BoxStream<'static, Result<EventEnvelope, StoreError>>;

    /// The highest `seq` in the log (0 when empty).
    fn head(&self) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// The clock every client of the store shares, read from a read
    /// connection, where the backend has one (PostgreSQL's server: None on
    /// SQLite). For reads that choose what a write then checks again at
    /// [`WriteTx::command_time`] (recovery's expired claims).
    fn shared_time(&self) -> impl Future<Output = Result<Option<Timestamp>, StoreError>> + Send;

    /// Up to `limit` events after `after`, in seq order, as the chain check
    /// reads them: each one's digest of what is stored and its stored
    /// chain hash ([`crate::log::chain_entry`]), from a read connection.
    /// Payloads are not decoded: an event that no longer decodes can still
    /// be checked.
    fn read_chain(&self, after: i64, limit: usize) -> impl Future<Output = Result<Vec<ChainEntry>, StoreError>> + Send;

    /// The record of the last integrity check, if any was recorded.
    fn last_verification(&self) -> impl Future<Output = Result<Option<Verification>, StoreError>> + Send;

    /// Rows of a live projection table by primary key, from a read connection.
    fn load_rows(
        &self,
        table: &'static TableSpec,
        keys: &[String],
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// Every live row of a projection table, in primary-key order. For
    /// tests, fixtures and small tables: it holds the whole table in memory.
    fn scan_table(&self, table: &'static TableSpec) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// The stored state of every projection this build knows.
    fn projection_states(&self) -> impl Future<Output = Result<Vec<ProjectionState>, StoreError>> + Send;

    /// Counts live rows of `table` grouped by `column` (dashboards).
    fn count_by(
        &self,
        table: &'static TableSpec,
        column: &'static str,
    ) -> impl Future<Output = Result<Vec<(Option<String>, i64)>, StoreError>> + Send;

    /// Counts the live rows of a table.
    fn count_rows(&self, table: &'static TableSpec) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Like [`WriteTx::find_rows`], from a read connection.
    fn find_rows(
        &self,
        table: &'static TableSpec,
        filters: &[(&'static str, Cell)],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// Like [`WriteTx::find_rows_in`], from a read connection: a batched
    /// lookup by a non-key column that takes no write transaction.
    fn find_rows_in(
        &self,
        table: &'static TableSpec,
        column: &'static str,
        values: &[Cell],
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send;

    /// One page of a walk of a live projection table in index order (see
    /// [`crate::page`]), from a read connection. The reads behind one page
    /// see one snapshot, so a page never holds a row twice nor misses one
    /// between its rows and its resume position.
    fn page_rows(&self, query: &PageQuery) -> impl Future<Output = Result<Page, StoreError>> + Send;

    /// A claim's lease row, from a read connection.
    fn lease(&self, claim_token: &str) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;

    /// Claims (both target types) whose lease, extended by heartbeats,
    /// ended before `now`; oldest first, at most `limit`.
    fn expired_claims(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ExpiredClaim>, StoreError>> + Send;

    /// How many claimable tasks of `query.kind` a claim would take before
    /// the task `query` describes (higher priority first, then longest
    /// waiting, then operation id, as [`WriteTx::claimable`] orders them),
    /// counting at most `query.limit`: a read of the kind's part of the
    /// claimable index, from a read connection.
    fn claimable_ahead(&self, query: &AheadQuery) -> impl Future<Output = Result<ClaimableAhead, StoreError>> + Send;

    /// Every task kind with claimable tasks now (status in `statuses`,
    /// `available_at <= now`, both target types): how many, and the
    /// earliest `available_at`, in kind order; kinds with none are left
    /// out. A read of the claimable rows from a read connection, meant for
    /// a metrics scrape, not for every request.
    fn claim_queues(
        &self,
        statuses: &'static [OperationStatus],
        now: Timestamp,
    ) -> impl Future<Output = Result<Vec<ClaimQueue>, StoreError>> + Send;

    /// Opens an empty scratch copy of every projection table.
    fn open_scratch(&self) -> impl Future<Output = Result<Self::Scratch, StoreError>> + Send;

    /// Takes the ledger's exclusive lock `name` (a short lowercase word) if
    /// no one holds it, else answers `None`. The lock is the ledger's, not
    /// the path's or URL's it was reached by (see [`crate::lock`]), and is
    /// held until the handle is dropped or the process ends.
    fn try_lock_ledger(&self, name: &str) -> impl Future<Output = Result<Option<Self::Lock>, StoreError>> + Send;

    /// Like [`Store::try_lock_ledger`], waiting for the holder to let go.
    fn lock_ledger(&self, name: &str) -> impl Future<Output = Result<Self::Lock, StoreError>> + Send;
}
