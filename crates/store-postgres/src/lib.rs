//! The PostgreSQL backend of opledger, for deployments whose workers span
//! many hosts: the same contract as the SQLite backend, proven by the same
//! conformance suite.
//!
//! **Ordering.** Every write transaction takes one transaction-level
//! advisory lock (`pg_advisory_xact_lock`, [`tx::APPEND_LOCK`]) right after
//! BEGIN, in the same round trip, and holds it until COMMIT or ROLLBACK.
//! Write transactions on a database therefore run one at a time, whichever
//! connection, process or host they come from, exactly as SQLite's single
//! writer runs them: each reads the head only after the previous writer has
//! committed, so `seq` is gap-free and in commit order as readers see it (a
//! reader can never see N+1 while N may still commit), inline projections
//! fold events in seq order (the order replay uses), and a command decides
//! on state no other writer can change before it commits (lease rows, which
//! no stream version guards, included). The log's insert trigger backs this
//! up in the database itself: seq N+1 can only be inserted once N is
//! visible. *Cost:* one write transaction at a time per database. The lock
//! is held across the work's round trips and the commit's WAL flush (it is
//! released after the commit record is durable), so write throughput is
//! about one over the length of a transaction; readers never wait (MVCC).
//! Batching (claims of many tasks, batched requests and completions) is how
//! a fleet gets throughput. The alternative, overlapping appends with a
//! high-water mark readers must not pass (Marten's), would let writers
//! overlap, but every reader of the log would have to track gaps, every
//! inline fold would still wait for its predecessors, and decisions on
//! unversioned state (leases) would need locks of their own.
//!
//! **Claims** read partial indexes of claimable rows (per kind, and in claim
//! order across kinds) and of held claims (recovery), so their cost follows
//! the live queue, not the finished history. They take their rows with
//! `FOR UPDATE SKIP LOCKED`: under the append lock no other store writer is
//! open at the same time, so today this only passes over rows some other
//! client holds; it keeps claims correct and non-blocking if the lock is
//! ever narrowed to the append alone.
//!
//! **Round trips.** The append lock is held across every round trip of a
//! write transaction, so round trips are what a fleet's throughput pays
//! for. Key sets and row batches travel as one array parameter per column,
//! so a statement's text is fixed per table and prepared once per
//! connection. A piece of work's writes (its events, projection rows,
//! leases and the projections' new position) are gathered and sent as one
//! statement of data-modifying `WITH` parts at the end of the piece, or
//! before a read that could see them (`batch.rs`), and the rows a fold
//! needs from several tables come in one statement as JSON
//! (`rows::load_many`): a claim of 32 tasks went from about twenty round
//! trips to five (savepoint, claim query, stream versions, rows, writes).
//! Write transactions plan with
//! generic plans (`plan_cache_mode`), so a prepared statement is not
//! re-planned at every execution. The planner's statistics are kept in
//! step with a growing log even where autovacuum is off (see `Statistics`).
//!
//! **Types.** Ids are `uuid`, times `timestamptz` (exact to the microsecond,
//! as `Timestamp` is), JSON is `text` (jsonb would reorder keys; verify
//! compares stored text).
//!
//! **Group commit** (`writer.rs`): one writer task per store runs whatever
//! work is queued in one transaction, each piece in its own savepoint (a
//! caller that stops waiting does not cut it short), and `Err` or a panic
//! in a piece rolls back everything it did, including writes it gathered
//! (a refusal of those by the database is that piece's answer). Unlike
//! SQLite, a failed statement aborts the whole PostgreSQL transaction: work
//! that caught a store error and went on would get Unavailable from its
//! next statement.
//!
//! This crate must not know business rules: it stores events and the rows
//! that the domain's folds computed, and maps PostgreSQL's SQLSTATEs to the
//! neutral kinds of `opledger-store` (see `error.rs`, the only place that
//! knows them). Nothing above the store sees a driver type or a SQLSTATE.

mod batch;
mod chain;
mod config;
pub mod databases;
mod ddl;
mod error;
mod lock;
pub mod migrations;
mod open;
mod page;
mod requests;
mod rows;
mod scratch;
pub mod tx;
mod values;
mod work;
mod writer;

pub use config::{without_password, PostgresConfig, DEFAULT_CONNECT_TIMEOUT};
pub use lock::{key as ledger_lock_key, PostgresLock};
pub use scratch::PostgresScratch;
pub use tx::PostgresTx;

use futures::stream::BoxStream;
use opledger_domain::chain::ChainEntry;
use opledger_domain::projections::{all_specs, Cell, ColumnType, Row, TableSpec};
use opledger_domain::{EventEnvelope, StreamId, Timestamp};
use opledger_store::group_commit::WorkPiece;
use opledger_store::{
    log, positions, AheadQuery, BoxFuture, ClaimQueue, ClaimableAhead, ExpiredClaim, Lease, Page, PageQuery,
    ProjectionState, Store, StoreError, Verification,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgConnection, PgPool, Row as _};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A handle to one PostgreSQL database. Cheap to clone; the pools live
/// until the last clone is dropped.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: PostgresConfig,
    /// Work for the writer task (group commit, `writer.rs`); `None` for a
    /// store opened read-only.
    writer: Option<tokio::sync::mpsc::Sender<writer::QueuedPiece>>,
    readers: PgPool,
    statistics: Statistics,
}

/// Keeps the planner's statistics in step with a growing log.
///
/// PostgreSQL plans lookups from statistics that ANALYZE gathers, and
/// autovacuum runs ANALYZE as tables grow; a new ANALYZE also makes every
/// connection re-plan its prepared statements. Where autovacuum is off (as
/// on the server CI runs against) or lags behind a log growing from empty,
/// the planner goes on believing a table is nearly empty, and plans made
/// then scan it sequentially for every lookup: each command's cost grows
/// with the history (measured: a 32-task claim batch fell from ~600 to
/// ~130 tasks/s by 30,000 tasks). So whenever the log head passes twice the size
/// this process last checked at, a background task compares the log's
/// row estimate (`pg_class.reltuples`) with the head and analyzes the
/// store's tables if the estimate is missing or less than half of it.
/// Where autovacuum keeps up this finds nothing to do; otherwise it costs
/// one sampled ANALYZE per doubling of the log.
struct Statistics {
    /// The head at which to check next.
    next_check: AtomicI64,
    checking: AtomicBool,
}

/// The log size below which statistics do not matter yet.
const FIRST_STATISTICS_CHECK: i64 = 1_000;

impl PostgresStore {
    /// Connects, migrates the database, and creates the tables of
    /// projections it does not have yet. A database that holds another
    /// application's tables is refused (Unavailable), untouched; a server
    /// that does not answer within the connect timeout is Unavailable.
    pub async fn open(config: PostgresConfig) -> Result<Self, StoreError> {
        let options = connect_options(&config);
        migrate(&options, &config).await?;
        let writers = pool(&options, config.write_connections, config.connect_timeout);
        let readers = pool(&options, config.read_connections, config.connect_timeout);
        tx::ensure_projection_tables(&writers).await?;
        tx::fill_unchained(&writers).await?;
        let (queue, pieces) = tokio::sync::mpsc::channel(1024);
        let inner = Arc::new(Inner {
            config,
            writer: Some(queue),
            readers,
            statistics: Statistics {
                next_check: AtomicI64::new(0),
                checking: AtomicBool::new(false),
            },
        });
        // The writer task holds the store weakly: it ends once every handle
        // (and with them every sender) is dropped.
        let weak = Arc::downgrade(&inner);
        tokio::spawn(writer::run(writers, pieces, move |head| {
            if let Some(inner) = weak.upgrade() {
                check_statistics(&inner, head);
            }
        }));
        let store = PostgresStore { inner };
        // An existing database may never have been analyzed.
        let head = store.head().await?;
        check_statistics(&store.inner, head);
        Ok(store)
    }

    /// Opens an existing ledger for reading only: nothing is migrated or
    /// written (no writer task; every write is refused as Unavailable), so
    /// a role granted only SELECT serves. An empty database is NotFound;
    /// another application's database, or a ledger whose schema is older
    /// than this build's, Unavailable. Replay's scratch copy is the
    /// connection's temporary tables.
    pub async fn open_read_only(config: PostgresConfig) -> Result<Self, StoreError> {
        let options = connect_options(&config);
        let mut connection = open::connect(&options, &config).await?;
        let checked = open::check_for_reading(&mut connection, &config).await;
        let _ = sqlx::Connection::close(connection).await;
        checked?;
        let readers = pool(&options, config.read_connections, config.connect_timeout);
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                config,
                writer: None,
                readers,
                // Never analyzed from here: ANALYZE is the owner's to run.
                statistics: Statistics {
                    next_check: AtomicI64::new(i64::MAX),
                    checking: AtomicBool::new(false),
                },
            }),
        })
    }

    /// Whether this store was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.inner.writer.is_none()
    }

    pub fn config(&self) -> &PostgresConfig {
        &self.inner.config
    }

    /// A fresh connection outside the store's pools: for tests and
    /// benchmarks that need to bypass the store.
    pub async fn raw_connection(&self) -> Result<PgConnection, StoreError> {
        open::connect(&connect_options(&self.inner.config), &self.inner.config).await
    }
}

/// Starts a statistics check in the background when the log has grown
/// past the next checkpoint (see [`Statistics`]).
fn check_statistics(inner: &Arc<Inner>, head: i64) {
    let statistics = &inner.statistics;
    if head < FIRST_STATISTICS_CHECK || head < statistics.next_check.load(Ordering::Relaxed) {
        return;
    }
    if statistics.checking.swap(true, Ordering::AcqRel) {
        return;
    }
    let inner = inner.clone();
    tokio::spawn(async move {
        if let Err(error) = analyze_if_stale(&inner.readers, head).await {
            tracing::warn!(%error, "refreshing planner statistics");
        }
        inner
            .statistics
            .next_check
            .store(head.saturating_mul(2), Ordering::Relaxed);
        inner.statistics.checking.store(false, Ordering::Release);
    });
}

fn connect_options(config: &PostgresConfig) -> PgConnectOptions {
    config
        .options
        .clone()
        .application_name("opledger")
        .statement_cache_capacity(256)
        .disable_statement_logging()
}

/// Pools connect lazily: opening a store costs one connection, not a pool's
/// worth. A caller waits the URL's `connect_timeout` at most for a
/// connection: a free one comes within milliseconds on a healthy server,
/// and a new one is a connection like any other, so a server that stopped
/// answering is reported unavailable (HTTP 503, exit 5) within the time the
/// user gave a connection rather than after a pool's own, longer, wait.
fn pool(options: &PgConnectOptions, size: u32, acquire_timeout: Duration) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size.max(1))
        .min_connections(0)
        .acquire_timeout(acquire_timeout)
        .connect_lazy_with(options.clone())
}

/// Runs the migrations. sqlx's migrator holds a session advisory lock while
/// it works, so processes opening a new database at once take turns; a
/// loser of the race to create the migrations table retries.
async fn migrate(options: &PgConnectOptions, config: &PostgresConfig) -> Result<(), StoreError> {
    // The first connection answers within the connect timeout (naming the
    // server when it does not) and finds the database a ledger or empty.
    let mut first = open::connect(options, config).await?;
    let checked = open::check_before_writing(&mut first, config).await;
    let _ = sqlx::Connection::close(first).await;
    checked?;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(config.connect_timeout)
        .connect_with(options.clone())
        .await
        .map_err(|error| error::map(error, &format!("connecting to {}", config.describe())))?;
    let mut attempt = 0;
    let result = loop {
        match migrations::migrator().await.run(&pool).await {
            Ok(()) => break Ok(()),
            Err(error) if attempt < 5 => {
                tracing::debug!(%error, attempt, "migration raced another process; retrying");
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
            }
            Err(error) => break Err(StoreError::unavailable(format!("migrating the database: {error}"))),
        }
    };
    pool.close().await;
    result
}

/// Analyzes the store's tables if the log's row estimate is missing or
/// less than half of `head`.
async fn analyze_if_stale(pool: &PgPool, head: i64) -> Result<(), StoreError> {
    let estimate: Option<f32> =
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = to_regclass('media_operation_events')")
            .fetch_optional(pool)
            .await
            .map_err(|error| error::map(error, "reading planner statistics"))?;
    let estimate = estimate.unwrap_or(-1.0);
    if estimate >= 0.0 && f64::from(estimate) * 2.0 >= head as f64 {
        return Ok(());
    }
    let mut tables = vec!["media_operation_events", "task_leases", "projection_positions"];
    tables.extend(
        all_specs()
            .iter()
            .flat_map(|spec| spec.tables.iter().map(|table| table.name)),
    );
    let started = std::time::Instant::now();
    sqlx::query(&format!("ANALYZE {}", tables.join(", ")))
        .execute(pool)
        .await
        .map_err(|error| error::map(error, "analyzing the store's tables"))?;
    tracing::debug!(
        head,
        estimate,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "analyzed"
    );
    Ok(())
}

impl Store for PostgresStore {
    type Tx = PostgresTx;
    type Scratch = PostgresScratch;
    type Lock = PostgresLock;

    fn backend(&self) -> &'static str {
        "postgres"
    }

    fn write<R, E, F>(&self, work: F) -> impl std::future::Future<Output = Result<R, E>> + Send
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<R, E>> + Send + 'static,
    {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let piece: writer::QueuedPiece = Box::new(WorkPiece::new(work, sender));
        let queue = self.inner.writer.clone();
        async move {
            let Some(queue) = queue else {
                return Err(E::from(StoreError::unavailable(
                    "this PostgreSQL store was opened read-only: it writes nothing",
                )));
            };
            // Queued for the writer task: once started, the piece runs to its
            // group's commit or rollback even if the caller stops waiting.
            if queue.send(piece).await.is_err() {
                return Err(E::from(StoreError::unavailable("the PostgreSQL writer has stopped")));
            }
            receiver.await.unwrap_or_else(|_| {
                Err(E::from(StoreError::unavailable(
                    "the write work panicked (or the writer stopped); everything it did was rolled back",
                )))
            })
        }
    }

    async fn read_stream(&self, stream_id: &StreamId) -> Result<Vec<EventEnvelope>, StoreError> {
        rows::read_stream(&self.inner.readers, stream_id, 0, usize::MAX).await
    }

    async fn read_stream_after(
        &self,
        stream_id: &StreamId,
        after: i64,
        limit: usize,
    ) -> Result<Vec<EventEnvelope>, StoreError> {
        rows::read_stream(&self.inner.readers, stream_id, after, limit).await
    }

    fn read_all(&self, after: i64, page_size: usize) -> BoxStream<'static, Result<EventEnvelope, StoreError>> {
        let pool = self.inner.readers.clone();
        log::paged(after, page_size, move |position, limit| {
            let pool = pool.clone();
            async move {
                let mut connection = pool
                    .acquire()
                    .await
                    .map_err(|error| error::map(error, "reading the event log"))?;
                rows::read_events(&mut connection, position, limit).await
            }
        })
    }

    async fn read_chain(&self, after: i64, limit: usize) -> Result<Vec<ChainEntry>, StoreError> {
        chain::read_chain(&self.inner.readers, after, limit).await
    }

    async fn last_verification(&self) -> Result<Option<Verification>, StoreError> {
        chain::last_verification(&self.inner.readers).await
    }

    async fn head(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar::<_, i64>("SELECT COALESCE(MAX(seq), 0) FROM media_operation_events")
            .fetch_one(&self.inner.readers)
            .await
            .map_err(|error| error::map(error, "reading the log head"))
    }

    async fn shared_time(&self) -> Result<Option<Timestamp>, StoreError> {
        let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&self.inner.readers)
            .await
            .map_err(|error| error::map(error, "reading the server's clock"))?;
        Ok(Some(Timestamp::from_datetime(now)))
    }

    async fn load_rows(&self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        let mut connection = self.read_connection().await?;
        rows::load(&mut connection, table, ddl::Copy::Live, keys).await
    }

    async fn scan_table(&self, table: &'static TableSpec) -> Result<Vec<Row>, StoreError> {
        let sql = format!(
            "SELECT {} FROM {} ORDER BY {}",
            rows::column_list(table),
            table.name,
            rows::key_column(table)
        );
        let fetched = sqlx::query(&sql)
            .fetch_all(&self.inner.readers)
            .await
            .map_err(|error| error::map(error, &format!("scanning {}", table.name)))?;
        fetched.iter().map(|row| rows::decode_row(row, table)).collect()
    }

    async fn projection_states(&self) -> Result<Vec<ProjectionState>, StoreError> {
        let fetched = sqlx::query("SELECT name, version, position FROM projection_positions ORDER BY name")
            .fetch_all(&self.inner.readers)
            .await
            .map_err(|error| error::map(error, "reading projection positions"))?;
        positions::live_states(fetched.iter().map(|row| (row.get(0), row.get(1), row.get(2))))
    }

    async fn count_by(
        &self,
        table: &'static TableSpec,
        column: &'static str,
    ) -> Result<Vec<(Option<String>, i64)>, StoreError> {
        let ty = rows::check_column(table, column)?;
        // SQLite's order: bytewise for text, NULL first.
        let order = match ty {
            ColumnType::Text | ColumnType::Json => format!("{column} COLLATE \"C\" NULLS FIRST"),
            _ => format!("{column} NULLS FIRST"),
        };
        let sql = format!(
            "SELECT {column}::text, COUNT(*) FROM {} GROUP BY {column} ORDER BY {order}",
            table.name
        );
        let fetched = sqlx::query(&sql)
            .fetch_all(&self.inner.readers)
            .await
            .map_err(|error| error::map(error, &format!("counting {}", table.name)))?;
        Ok(fetched
            .iter()
            .map(|row| (row.get::<Option<String>, _>(0), row.get::<i64, _>(1)))
            .collect())
    }

    async fn count_rows(&self, table: &'static TableSpec) -> Result<i64, StoreError> {
        sqlx::query_scalar::<_, i64>(&format!("SELECT COUNT(*) FROM {}", table.name))
            .fetch_one(&self.inner.readers)
            .await
            .map_err(|error| error::map(error, &format!("counting {}", table.name)))
    }

    async fn find_rows(
        &self,
        table: &'static TableSpec,
        filters: &[(&'static str, Cell)],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        let mut connection = self.read_connection().await?;
        rows::find(&mut connection, table, ddl::Copy::Live, filters, limit).await
    }

    async fn find_rows_in(
        &self,
        table: &'static TableSpec,
        column: &'static str,
        values: &[Cell],
    ) -> Result<Vec<Row>, StoreError> {
        let mut connection = self.read_connection().await?;
        rows::find_in(&mut connection, table, ddl::Copy::Live, column, values).await
    }

    async fn page_rows(&self, query: &PageQuery) -> Result<Page, StoreError> {
        let mut connection = self.read_connection().await?;
        page::page_rows(&mut connection, query).await
    }

    async fn lease(&self, claim_token: &str) -> Result<Option<Lease>, StoreError> {
        work::lease(&self.inner.readers, claim_token).await
    }

    async fn expired_claims(&self, now: Timestamp, limit: usize) -> Result<Vec<ExpiredClaim>, StoreError> {
        work::expired_claims(&self.inner.readers, now, limit).await
    }

    async fn claimable_ahead(&self, query: &AheadQuery) -> Result<ClaimableAhead, StoreError> {
        work::claimable_ahead(&self.inner.readers, query).await
    }

    async fn claim_queues(
        &self,
        statuses: &'static [opledger_domain::OperationStatus],
        now: Timestamp,
    ) -> Result<Vec<ClaimQueue>, StoreError> {
        work::claim_queues(&self.inner.readers, statuses, now).await
    }

    async fn open_scratch(&self) -> Result<PostgresScratch, StoreError> {
        // A connection of its own, outside the pools: a replay may hold it
        // for minutes.
        let connection = self.raw_connection().await?;
        if self.is_read_only() {
            PostgresScratch::open_temporary(connection).await
        } else {
            PostgresScratch::open(connection).await
        }
    }

    async fn try_lock_ledger(&self, name: &str) -> Result<Option<PostgresLock>, StoreError> {
        // A session of its own, held for as long as the lock is.
        lock::try_lock(self.raw_connection().await?, name).await
    }

    async fn lock_ledger(&self, name: &str) -> Result<PostgresLock, StoreError> {
        lock::lock(self.raw_connection().await?, name).await
    }
}

impl PostgresStore {
    async fn read_connection(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, StoreError> {
        self.inner
            .readers
            .acquire()
            .await
            .map_err(|error| error::map(error, "opening a read connection"))
    }
}
