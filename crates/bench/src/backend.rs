//! What a workload needs of a backend: fresh stores, and the raw floor
//! measured the plainest way that backend's driver allows. The workloads
//! are written once, generic over [`BenchBackend`]; the code is generic
//! over `Store`, never over a driver.

use crate::floor::{self, FloorRow};
use crate::BenchError;
use opledger_store::Store;
use opledger_store_postgres::databases::{create_database, drop_database};
use opledger_store_postgres::{PostgresConfig, PostgresStore};
use opledger_store_sqlite::{SqliteConfig, SqliteStore, Synchronous};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

pub(crate) trait BenchBackend: Sync {
    type Store: Store;

    /// `sqlite` or `postgres`.
    fn name(&self) -> &'static str;

    /// The durability setting the figures were measured with, as a key of
    /// the report and its value.
    fn durability(&self) -> (&'static str, &'static str);

    /// A new, empty store named `name` (any earlier one of that name is gone).
    async fn fresh_store(&self, name: &str) -> Result<Self::Store, BenchError>;

    /// Plain prepared single-row INSERTs of `rows`, `batch` per transaction.
    async fn plain_inserts(&self, store: &Self::Store, rows: &[FloorRow], batch: usize)
        -> Result<Duration, BenchError>;

    /// Multi-row INSERTs (up to 90 rows a statement), `batch` per transaction.
    async fn multi_row_inserts(
        &self,
        store: &Self::Store,
        rows: &[FloorRow],
        batch: usize,
    ) -> Result<Duration, BenchError>;

    /// One plain scan of the whole log, decoding every payload.
    async fn plain_scan(&self, store: &Self::Store) -> Result<(u64, Duration), BenchError>;

    /// How the floor was measured, for the report.
    fn floor_description(&self) -> &'static str;
}

/// Each fresh store is a file `<name>.db` in the benchmark's folder, with
/// the `synchronous` setting of the URL.
pub(crate) struct SqliteBench {
    pub template: SqliteConfig,
    pub dir: PathBuf,
}

impl BenchBackend for SqliteBench {
    type Store = SqliteStore;

    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn durability(&self) -> (&'static str, &'static str) {
        let setting = match self.template.synchronous {
            Synchronous::Full => "full",
            Synchronous::Normal => "normal",
        };
        ("synchronous", setting)
    }

    async fn fresh_store(&self, name: &str) -> Result<SqliteStore, BenchError> {
        let path = self.dir.join(format!("{name}.db"));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        let mut config = SqliteConfig::at(path);
        config.synchronous = self.template.synchronous;
        Ok(SqliteStore::open(config).await?)
    }

    async fn plain_inserts(
        &self,
        store: &SqliteStore,
        rows: &[FloorRow],
        batch: usize,
    ) -> Result<Duration, BenchError> {
        floor::sqlite::plain_inserts(store, rows, batch).await
    }

    async fn multi_row_inserts(
        &self,
        store: &SqliteStore,
        rows: &[FloorRow],
        batch: usize,
    ) -> Result<Duration, BenchError> {
        floor::sqlite::multi_row_inserts(store, rows, batch).await
    }

    async fn plain_scan(&self, store: &SqliteStore) -> Result<(u64, Duration), BenchError> {
        floor::sqlite::plain_scan(store).await
    }

    fn floor_description(&self) -> &'static str {
        "plain prepared INSERTs into a table with the log's columns and stream index, no triggers, no projections, same transaction sizes, same synchronous setting"
    }
}

/// A SQLite store at `path` with the settings of the URL's `template`
/// (the workloads that run on SQLite only).
pub(crate) async fn store_at(template: &SqliteConfig, path: PathBuf) -> Result<SqliteStore, BenchError> {
    let mut config = template.clone();
    config.path = path;
    Ok(SqliteStore::open(config).await?)
}

/// Each fresh store is a throwaway database of its own on the server the
/// URL names (`opledger_bench_<pid>_<name>`), dropped by
/// [`PostgresBench::drop_databases`] when the run ends: the benchmark never
/// touches the database the user named.
pub(crate) struct PostgresBench {
    server: PostgresConfig,
    prefix: String,
    created: Mutex<Vec<String>>,
}

impl PostgresBench {
    pub fn new(server: PostgresConfig) -> Self {
        PostgresBench {
            server,
            prefix: format!("opledger_bench_{}", std::process::id()),
            created: Mutex::new(Vec::new()),
        }
    }

    pub async fn drop_databases(&self) {
        let names = std::mem::take(&mut *self.created.lock().expect("bench database list"));
        for name in names {
            if let Err(error) = drop_database(&self.server, &name).await {
                eprintln!("could not drop benchmark database {name}: {error}");
            }
        }
    }
}

impl BenchBackend for PostgresBench {
    type Store = PostgresStore;

    fn name(&self) -> &'static str {
        "postgres"
    }

    fn durability(&self) -> (&'static str, &'static str) {
        // The server's own setting applies (on by default: every commit is
        // flushed before it is acknowledged); the benchmark does not change it.
        ("synchronous_commit", "server setting")
    }

    async fn fresh_store(&self, name: &str) -> Result<PostgresStore, BenchError> {
        let database = format!("{}_{}", self.prefix, name.replace('-', "_"));
        let mut config = create_database(&self.server, &database).await?;
        {
            let mut created = self.created.lock().expect("bench database list");
            if !created.contains(&database) {
                created.push(database);
            }
        }
        // The lifecycle's 16 workers each hold a write connection while
        // they wait for the append lock; the rest are readers.
        config.write_connections = config.write_connections.max(16);
        config.read_connections = config.read_connections.max(16);
        Ok(PostgresStore::open(config).await?)
    }

    async fn plain_inserts(
        &self,
        store: &PostgresStore,
        rows: &[FloorRow],
        batch: usize,
    ) -> Result<Duration, BenchError> {
        floor::postgres::plain_inserts(store, rows, batch).await
    }

    async fn multi_row_inserts(
        &self,
        store: &PostgresStore,
        rows: &[FloorRow],
        batch: usize,
    ) -> Result<Duration, BenchError> {
        floor::postgres::multi_row_inserts(store, rows, batch).await
    }

    async fn plain_scan(&self, store: &PostgresStore) -> Result<(u64, Duration), BenchError> {
        floor::postgres::plain_scan(store).await
    }

    fn floor_description(&self) -> &'static str {
        "plain prepared INSERTs (one round trip each) into a table with the log's columns and stream index, no triggers, no advisory lock, no projections, same transaction sizes, on the same server"
    }
}
