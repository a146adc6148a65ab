//! The SQLite backend of opledger, the embedded default: one database file,
//! WAL, durable commits (`synchronous=FULL` unless the URL opts out).
//!
//! All writes of a process go through one writer connection, owned by a
//! dedicated OS thread (rusqlite) that groups whatever work is waiting into
//! one transaction (group commit): each piece runs in its own savepoint and
//! succeeds or fails on its own, and every piece is acknowledged only after
//! the shared COMMIT is durable. Each piece runs on that thread, calling
//! SQLite directly, so a statement costs no handoff between threads; the
//! only handoffs are the work going in and the answer coming out (see
//! `writer.rs`). Reads use a separate sqlx pool, which WAL never blocks; the
//! migrations and replay's scratch copy stay on sqlx too. Writers in other
//! processes are waited for (`BEGIN IMMEDIATE` with a long busy timeout)
//! rather than surfacing "database is locked".
//!
//! This crate must not know business rules: it stores events and the rows
//! that the domain's folds computed, and maps SQLite's error codes, from
//! either driver, to the neutral kinds of `opledger-store` (see `error.rs`,
//! the only place that knows them).

mod chain;
mod config;
mod ddl;
mod error;
mod lock;
pub mod migrations;
mod open;
mod page;
mod requests;
mod rows;
mod scratch;
mod sqlx_handle;
mod tx;
mod work;
mod writer;
mod writer_connection;

pub use config::{SqliteConfig, Synchronous};
pub use lock::SqliteLock;
pub use scratch::SqliteScratch;
pub use tx::SqliteTx;

use futures::stream::BoxStream;
use opledger_domain::chain::ChainEntry;
use opledger_domain::projections::{Cell, Row, TableSpec};
use opledger_domain::{EventEnvelope, StreamId, Timestamp};
use opledger_store::group_commit::WorkPiece;
use opledger_store::{
    log, positions, AheadQuery, BoxFuture, ClaimQueue, ClaimableAhead, ExpiredClaim, Lease, Page, PageQuery,
    ProjectionState, Store, StoreError, Verification,
};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{ConnectOptions, Connection, Row as _, SqliteConnection};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long a connection waits for another process's write lock before
/// reporting the database unavailable.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// A handle to one SQLite database. Cheap to clone; the writer thread lives
/// until the last clone is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: SqliteConfig,
    /// The writer thread's queue; `None` for a store opened read-only.
    writer: Option<mpsc::Sender<writer::QueuedPiece>>,
    readers: SqlitePool,
    /// How a read-only store reaches its file; `None` when writable.
    read_only: Option<open::ReadOnly>,
}

impl SqliteStore {
    /// Queues one piece of work for the writer thread and waits for its
    /// answer (sent after its group's COMMIT).
    fn send_to_writer<R, E>(
        &self,
        piece: writer::QueuedPiece,
        receiver: oneshot::Receiver<Result<R, E>>,
    ) -> impl std::future::Future<Output = Result<R, E>> + Send
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let writer = self.inner.writer.clone();
        async move {
            let writer = writer.ok_or_else(|| {
                E::from(StoreError::unavailable(
                    "this SQLite store was opened read-only: it writes nothing",
                ))
            })?;
            writer
                .send(piece)
                .await
                .map_err(|_| E::from(StoreError::unavailable("the SQLite writer has stopped")))?;
            receiver.await.map_err(|_| {
                E::from(StoreError::unavailable(
                    "the SQLite writer dropped the work (it panicked)",
                ))
            })?
        }
    }

    /// Opens (creating when missing) the database, migrates it, creates the
    /// tables of projections it does not have yet, and starts the writer.
    /// A file that holds another application's tables is refused
    /// (Unavailable), untouched.
    pub async fn open(config: SqliteConfig) -> Result<Self, StoreError> {
        if let Some(parent) = config.path.parent() {
            if !parent.as_os_str().is_empty() && !parent.exists() {
                return Err(StoreError::unavailable(format!(
                    "cannot create database {}: folder {} does not exist",
                    config.path.display(),
                    parent.display()
                )));
            }
        }
        without_memory_statistics();
        open::check_before_writing(&config).await?;
        migrate(&config).await?;
        // The writer thread opens its connection and creates missing
        // projection tables before it takes work; waiting for it here keeps
        // a failure to open a failure of `open`.
        let (sender, receiver) = mpsc::channel(4096);
        let writer_config = config.clone();
        let ready = writer::start(move || open_writer(&writer_config), config.synchronous, receiver)?;
        ready
            .await
            .map_err(|_| StoreError::unavailable("the SQLite writer thread stopped while opening"))??;

        let readers = SqlitePoolOptions::new()
            .max_connections(config.read_connections)
            .min_connections(0)
            .acquire_timeout(BUSY_TIMEOUT)
            .connect_with(connect_options(&config, false))
            .await
            .map_err(|error| error::map(error, "opening the read pool"))?;

        Ok(SqliteStore {
            inner: Arc::new(Inner {
                config,
                writer: Some(sender),
                readers,
                read_only: None,
            }),
        })
    }

    /// Opens an existing ledger for reading only: nothing is created,
    /// migrated or written (no writer thread; every write is refused as
    /// Unavailable), so a read-only file, folder or mount serves. A missing
    /// file or an empty database is NotFound; another application's
    /// database, or a ledger whose schema is older than this build's,
    /// Unavailable. Replay's scratch copy goes to the system's temporary
    /// folder, since the ledger's own folder may not be writable.
    pub async fn open_read_only(config: SqliteConfig) -> Result<Self, StoreError> {
        without_memory_statistics();
        let (readers, mode) = open::open_read_only(&config, config.read_connections).await?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                config,
                writer: None,
                readers,
                read_only: Some(mode),
            }),
        })
    }

    /// Whether this store was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only.is_some()
    }

    pub fn config(&self) -> &SqliteConfig {
        &self.inner.config
    }

    /// A fresh connection of the writer's kind, outside the store's writer:
    /// for tests and benchmarks that need to bypass the store.
    pub async fn raw_connection(&self) -> Result<SqliteConnection, StoreError> {
        connect(&self.inner.config, true).await
    }
}

/// Turns off SQLite's memory statistics for the process, once, before its
/// first connection. With them on, every allocation and free inside SQLite
/// takes one global mutex to count bytes (profiled: 4-5% of the writer's
/// time, lock and unlock), and nothing here reads the counts. SQLite
/// accepts the setting only before it initializes; if something else in
/// the process opened a database first, the call is refused and the
/// statistics simply stay on.
fn without_memory_statistics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_config is called before this process's first
        // connection through this crate, with the argument
        // SQLITE_CONFIG_MEMSTATUS takes (an int); once SQLite is
        // initialized it only returns SQLITE_MISUSE.
        let rc = unsafe {
            libsqlite3_sys::sqlite3_config(libsqlite3_sys::SQLITE_CONFIG_MEMSTATUS, 0 as std::os::raw::c_int)
        };
        if rc != libsqlite3_sys::SQLITE_OK {
            tracing::debug!(rc, "SQLite was initialized already; its memory statistics stay on");
        }
    });
}

fn connect_options(config: &SqliteConfig, writable: bool) -> SqliteConnectOptions {
    let options = SqliteConnectOptions::new()
        .filename(&config.path)
        .create_if_missing(writable)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(config.synchronous.into())
        .foreign_keys(true)
        .busy_timeout(BUSY_TIMEOUT)
        .statement_cache_capacity(1024)
        .disable_statement_logging()
        // Statement journals (a savepoint's copies of the pages it changes)
        // stay in memory instead of spilling to short-lived temporary files,
        // whose creation and deletion cost the writer more than its inserts.
        .pragma("temp_store", "MEMORY");
    if writable {
        options
    } else {
        // Readers must never write; the pragma makes a stray write an error.
        options.pragma("query_only", "ON")
    }
}

/// Opens the writer's own connection (rusqlite, on the writer thread) with
/// exactly what [`connect_options`] gives a writable sqlx connection: the
/// same open flags, busy timeout, and pragmas in sqlx's order. Then creates
/// the tables of projections the database does not have yet.
fn open_writer(config: &SqliteConfig) -> Result<rusqlite::Connection, StoreError> {
    use rusqlite::OpenFlags;
    let opening = format!("opening {}", config.path.display());
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_PRIVATE_CACHE;
    let connection = rusqlite::Connection::open_with_flags(&config.path, flags)
        .map_err(|error| error::map_rusqlite(error, &opening))?;
    enlarge_lookaside(&connection);
    connection
        .busy_timeout(BUSY_TIMEOUT)
        .map_err(|error| error::map_rusqlite(error, &opening))?;
    // Every statement the writer runs is kept prepared; the set is small
    // but varies with the number of rows per statement.
    connection.set_prepared_statement_cache_capacity(1024);
    connection
        .execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON; PRAGMA synchronous = {}; PRAGMA temp_store = MEMORY;",
            config.synchronous.pragma_value()
        ))
        .map_err(|error| error::map_rusqlite(error, &opening))?;
    tx::ensure_projection_tables(&connection)?;
    chain::fill_unchained(&connection)?;
    Ok(connection)
}

/// Bytes per lookaside slot of the writer connection, and slots: 2 MiB.
const WRITER_LOOKASIDE_SLOT_BYTES: i32 = 512;
const WRITER_LOOKASIDE_SLOTS: i32 = 4096;

/// Gives the writer connection a lookaside allocator of 2 MiB instead of
/// SQLite's default 120 KiB (1,200-byte slots, 100 of them).
///
/// *Why:* SQLite copies every bound text and builds every record in
/// memory it allocates; a statement of 90 log rows binds 900 values at
/// once, far beyond the default slots, so most of those allocations went
/// to the system allocator (5–7% of the writer's samples in `malloc`
/// under `sqlite3MemMalloc`). With the larger lookaside the writer's
/// statement time fell by about 9% in the task lifecycle (benchmarks.md).
/// Called right after opening, before any statement holds lookaside
/// memory, which is when SQLite accepts the change; if it refuses, the
/// default stays and only speed is lost.
fn enlarge_lookaside(connection: &rusqlite::Connection) {
    // SAFETY: the handle belongs to this open connection, used on this
    // thread only; SQLITE_DBCONFIG_LOOKASIDE takes (void *buffer, int slot
    // size, int slot count), and a null buffer makes SQLite allocate (and
    // later free) the memory itself.
    let rc = unsafe {
        libsqlite3_sys::sqlite3_db_config(
            connection.handle(),
            libsqlite3_sys::SQLITE_DBCONFIG_LOOKASIDE,
            std::ptr::null_mut::<std::os::raw::c_void>(),
            WRITER_LOOKASIDE_SLOT_BYTES as std::os::raw::c_int,
            WRITER_LOOKASIDE_SLOTS as std::os::raw::c_int,
        )
    };
    if rc != libsqlite3_sys::SQLITE_OK {
        tracing::debug!(rc, "SQLite kept the writer's default lookaside");
    }
}

async fn connect(config: &SqliteConfig, writable: bool) -> Result<SqliteConnection, StoreError> {
    connect_options(config, writable)
        .connect()
        .await
        .map_err(|error| error::map(error, &format!("opening {}", config.path.display())))
}

/// Migrates through a one-connection pool: sqlx's migrator future is `Send`
/// with a pool but not with a borrowed connection.
async fn migrate(config: &SqliteConfig) -> Result<(), StoreError> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(connect_options(config, true))
        .await
        .map_err(|error| error::map(error, &format!("opening {}", config.path.display())))?;
    // Two processes opening a new database at once may race to migrate it;
    // the loser sees the winner's tables and succeeds on a retry.
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

impl Store for SqliteStore {
    type Tx = SqliteTx;
    type Scratch = SqliteScratch;
    type Lock = SqliteLock;

    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn write<R, E, F>(&self, work: F) -> impl std::future::Future<Output = Result<R, E>> + Send
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<R, E>> + Send + 'static,
    {
        let (sender, receiver) = oneshot::channel();
        self.send_to_writer(Box::new(WorkPiece::new(work, sender)), receiver)
    }

    fn write_liveness<R, E, F>(&self, work: F) -> impl std::future::Future<Output = Result<R, E>> + Send
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<R, E>> + Send + 'static,
    {
        let (sender, receiver) = oneshot::channel();
        self.send_to_writer(Box::new(WorkPiece::new(work, sender).liveness()), receiver)
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

    async fn head(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar::<_, i64>("SELECT COALESCE(MAX(seq), 0) FROM media_operation_events")
            .fetch_one(&self.inner.readers)
            .await
            .map_err(|error| error::map(error, "reading the log head"))
    }

    async fn shared_time(&self) -> Result<Option<Timestamp>, StoreError> {
        // Embedded in one process: no clock but the caller's.
        Ok(None)
    }

    async fn read_chain(&self, after: i64, limit: usize) -> Result<Vec<ChainEntry>, StoreError> {
        chain::read_chain(&self.inner.readers, after, limit).await
    }

    async fn last_verification(&self) -> Result<Option<Verification>, StoreError> {
        chain::last_verification(&self.inner.readers).await
    }

    async fn load_rows(&self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        let mut connection = self
            .inner
            .readers
            .acquire()
            .await
            .map_err(|error| error::map(error, "reading projections"))?;
        rows::load(&mut connection, table, ddl::Copy::Live, keys).await
    }

    async fn scan_table(&self, table: &'static TableSpec) -> Result<Vec<Row>, StoreError> {
        let columns = table.column_names().collect::<Vec<_>>().join(", ");
        let sql = format!(
            "SELECT {columns} FROM {} ORDER BY {}",
            table.name, table.columns[0].name
        );
        let fetched = sqlx::query(&sql)
            .fetch_all(&self.inner.readers)
            .await
            .map_err(|error| error::map(error, &format!("scanning {}", table.name)))?;
        fetched
            .iter()
            .map(|row| {
                let cells = rows::decode_cells(row, table)?;
                Row::from_cells(table, cells).map_err(|error| StoreError::corrupt(error.to_string()))
            })
            .collect()
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
        assert!(
            table.column_names().any(|name| name == column),
            "{column} is not a column of {}",
            table.name
        );
        let sql = format!(
            "SELECT {column}, COUNT(*) FROM {} GROUP BY {column} ORDER BY {column}",
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
        let mut connection = self
            .inner
            .readers
            .acquire()
            .await
            .map_err(|error| error::map(error, "opening a read connection"))?;
        rows::find(&mut connection, table, ddl::Copy::Live, filters, limit).await
    }

    async fn find_rows_in(
        &self,
        table: &'static TableSpec,
        column: &'static str,
        values: &[Cell],
    ) -> Result<Vec<Row>, StoreError> {
        let mut connection = self
            .inner
            .readers
            .acquire()
            .await
            .map_err(|error| error::map(error, "opening a read connection"))?;
        rows::find_in(&mut connection, table, ddl::Copy::Live, column, values).await
    }

    async fn page_rows(&self, query: &PageQuery) -> Result<Page, StoreError> {
        let mut connection = self
            .inner
            .readers
            .acquire()
            .await
            .map_err(|error| error::map(error, "opening a read connection"))?;
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

    async fn open_scratch(&self) -> Result<SqliteScratch, StoreError> {
        let config = &self.inner.config;
        match self.inner.read_only {
            None => {
                let connection = connect(config, true).await?;
                let folder = config.path.parent().unwrap_or(std::path::Path::new(""));
                SqliteScratch::open(connection, &config.path, folder).await
            }
            Some(mode) => {
                let connection = open::scratch_options(config, mode)?
                    .connect()
                    .await
                    .map_err(|error| error::map(error, &format!("opening {}", config.path.display())))?;
                SqliteScratch::open(connection, &config.path, &std::env::temp_dir()).await
            }
        }
    }

    async fn try_lock_ledger(&self, name: &str) -> Result<Option<SqliteLock>, StoreError> {
        lock::try_lock(&self.inner.config.path, name)
    }

    async fn lock_ledger(&self, name: &str) -> Result<SqliteLock, StoreError> {
        lock::lock(&self.inner.config.path, name).await
    }
}

/// Closes a connection, ignoring errors: it is being dropped anyway.
pub(crate) async fn close_quietly(connection: SqliteConnection) {
    let _ = connection.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer's own connection is configured exactly as a writable sqlx
    /// connection would be: same journal, durability, foreign keys, timeout.
    #[tokio::test]
    async fn writer_connection_has_the_sqlx_writers_settings() {
        let folder = tempfile::tempdir().unwrap();
        for synchronous in [Synchronous::Full, Synchronous::Normal] {
            let mut config = SqliteConfig::at(folder.path().join("pragmas.db"));
            config.synchronous = synchronous;
            migrate(&config).await.unwrap();
            let mut through_sqlx = connect(&config, true).await.unwrap();
            let writer = open_writer(&config).unwrap();
            for pragma in [
                "journal_mode",
                "synchronous",
                "foreign_keys",
                "busy_timeout",
                "locking_mode",
                "temp_store",
            ] {
                let sql = format!("PRAGMA {pragma}");
                let row = sqlx::query(&sql).fetch_one(&mut through_sqlx).await.unwrap();
                let expected = match row.try_get::<i64, _>(0) {
                    Ok(number) => number.to_string(),
                    Err(_) => row.get::<String, _>(0),
                };
                let actual = writer
                    .query_row(&sql, [], |row| {
                        Ok(match row.get_ref(0)? {
                            rusqlite::types::ValueRef::Integer(number) => number.to_string(),
                            other => other.as_str()?.to_string(),
                        })
                    })
                    .unwrap();
                assert_eq!(actual, expected, "PRAGMA {pragma} with {synchronous:?}");
            }
            close_quietly(through_sqlx).await;
        }
    }

    /// Lookaside slots a connection used at most, by SQLite's own count.
    fn lookaside_high_water(connection: &rusqlite::Connection) -> i32 {
        let (mut current, mut high_water) = (0, 0);
        // SAFETY: an open connection's handle, used on this thread; the
        // out-parameters are valid ints.
        let rc = unsafe {
            libsqlite3_sys::sqlite3_db_status(
                connection.handle(),
                libsqlite3_sys::SQLITE_DBSTATUS_LOOKASIDE_USED,
                &mut current,
                &mut high_water,
                0,
            )
        };
        assert_eq!(rc, libsqlite3_sys::SQLITE_OK);
        high_water
    }

    /// Binds a 90-row statement of short texts, as a log insert does.
    fn bind_many_texts(connection: &rusqlite::Connection) {
        connection
            .execute_batch("CREATE TEMP TABLE texts (a, b, c, d)")
            .unwrap();
        let sql = format!("INSERT INTO texts VALUES {}", vec!["(?, ?, ?, ?)"; 90].join(", "));
        let values: Vec<String> = (0..360).map(|index| format!("value number {index}")).collect();
        connection
            .execute(&sql, rusqlite::params_from_iter(values.iter()))
            .unwrap();
    }

    /// The writer gets the larger lookaside: binding a log-sized statement
    /// uses more slots than a default connection has at all.
    #[tokio::test]
    async fn writer_connection_has_a_lookaside_beyond_sqlites_default() {
        let folder = tempfile::tempdir().unwrap();
        let config = SqliteConfig::at(folder.path().join("lookaside.db"));
        migrate(&config).await.unwrap();
        let plain = rusqlite::Connection::open(&config.path).unwrap();
        bind_many_texts(&plain);
        let default_slots = lookaside_high_water(&plain);
        let writer = open_writer(&config).unwrap();
        bind_many_texts(&writer);
        let writer_slots = lookaside_high_water(&writer);
        assert!(
            writer_slots > default_slots,
            "the writer used {writer_slots} lookaside slots at most, a default connection {default_slots}"
        );
    }

    /// The bundled SQLite is compiled without SQLITE_ENABLE_MEMORY_MANAGEMENT
    /// (`.cargo/config.toml`), so connections do not share one page-cache
    /// LRU behind one mutex. Fails when a build loses the setting, e.g. a
    /// `LIBSQLITE3_FLAGS` from the environment that replaces ours.
    #[test]
    fn bundled_sqlite_is_built_without_the_shared_page_cache_lru() {
        let connection = rusqlite::Connection::open_in_memory().unwrap();
        let used: i64 = connection
            .query_row(
                "SELECT sqlite_compileoption_used('ENABLE_MEMORY_MANAGEMENT')",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(used, 0, "SQLite was built with SQLITE_ENABLE_MEMORY_MANAGEMENT");
        // The library's other options are still there: the check reads the
        // real list, not an empty one.
        let threadsafe: i64 = connection
            .query_row("SELECT sqlite_compileoption_used('THREADSAFE=1')", [], |row| row.get(0))
            .unwrap();
        assert_eq!(threadsafe, 1);
    }

    /// The writer's `synchronous` level as a piece of work sees it.
    fn level_inside<'t>(tx: &'t mut SqliteTx) -> BoxFuture<'t, Result<i64, StoreError>> {
        Box::pin(async move {
            Ok(tx
                .connection
                .query_row("PRAGMA synchronous", [], |row| row.get::<_, i64>(0))
                .unwrap())
        })
    }

    /// Liveness work alone commits without an fsync of its own (NORMAL);
    /// every durable commit after it is FULL again, and a user who chose
    /// NORMAL keeps it.
    #[tokio::test]
    async fn liveness_writes_skip_the_fsync_and_durable_writes_keep_it() {
        let folder = tempfile::tempdir().unwrap();
        for (configured, durable_level) in [(Synchronous::Full, 2), (Synchronous::Normal, 1)] {
            let mut config = SqliteConfig::at(folder.path().join(format!("{configured:?}.db")));
            config.synchronous = configured;
            let store = SqliteStore::open(config).await.unwrap();
            for _ in 0..3 {
                assert_eq!(store.write_liveness(level_inside).await.unwrap(), 1, "{configured:?}");
                assert_eq!(
                    store.write(level_inside).await.unwrap(),
                    durable_level,
                    "{configured:?}"
                );
            }
            // Queued together, a liveness piece shares the durable commit.
            let (liveness, durable) = tokio::join!(store.write_liveness(level_inside), store.write(level_inside));
            assert!(durable.unwrap() == durable_level);
            assert!([1, durable_level].contains(&liveness.unwrap()));
        }
    }
}
