//! How a database file is opened: for writing (created when missing, then
//! migrated), or for reading only (nothing created, migrated or written,
//! so a read-only file, folder or mount serves reading commands), and the
//! check both make first, that the file is an opledger ledger
//! (`opledger_store::ledger`).

use crate::config::SqliteConfig;
use crate::error;
use opledger_store::ledger::{self, Contents};
use opledger_store::StoreError;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use std::time::Duration;

/// How a read-only store reaches its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadOnly {
    /// Opened with SQLite's `immutable` flag: the file's folder is not
    /// writable and the WAL's shared-memory file does not exist, so SQLite
    /// cannot coordinate with writers and reads the file as it is. No
    /// writer can run there either (it could not create the WAL).
    pub(crate) immutable: bool,
}

/// The names of the tables a connection's main database holds.
async fn tables(connection: &mut SqliteConnection, described: &str) -> Result<Vec<String>, StoreError> {
    sqlx::query_scalar::<_, String>(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )
    .fetch_all(connection)
    .await
    .map_err(|error| error::map(error, &format!("reading the tables of {described}")))
}

/// Before a store creates or migrates anything: refuses a file that holds
/// another application's tables. A missing or empty file is a new ledger.
pub(crate) async fn check_before_writing(config: &SqliteConfig) -> Result<(), StoreError> {
    let empty = std::fs::metadata(&config.path).map_or(true, |metadata| metadata.len() == 0);
    if empty {
        return Ok(());
    }
    let described = config.path.display().to_string();
    let mut connection = read_only_options(config, false)
        .connect()
        .await
        .map_err(|error| error::map(error, &format!("opening {described}")))?;
    let found = tables(&mut connection, &described).await;
    let _ = connection.close().await;
    ledger::recognize(&described, &found?).map(|_| ())
}

/// Options of a read-only connection: SQLite opens the file read-only and
/// creates nothing (the `-wal` and `-shm` files of a WAL database excepted,
/// when the folder allows: SQLite needs them to read beside writers).
pub(crate) fn read_only_options(config: &SqliteConfig, immutable: bool) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(&config.path)
        .read_only(true)
        .immutable(immutable)
        .create_if_missing(false)
        .foreign_keys(true)
        .busy_timeout(crate::BUSY_TIMEOUT)
        .statement_cache_capacity(256)
        .disable_statement_logging()
}

/// Opens the read pool of a read-only store, and checks that the file is
/// a ledger at this build's schema. A file whose folder is read-only and
/// whose WAL files are absent cannot be read beside writers; it is opened
/// immutable (see [`ReadOnly`]).
pub(crate) async fn open_read_only(
    config: &SqliteConfig,
    read_connections: u32,
) -> Result<(SqlitePool, ReadOnly), StoreError> {
    let described = config.path.display().to_string();
    if !config.path.exists() {
        return Err(StoreError::not_found(format!(
            "no ledger at {described}: a reading command creates none (a command that writes does)"
        )));
    }
    let mode = match probe(config, false, &described).await {
        Ok(()) => ReadOnly { immutable: false },
        Err(error) if error.kind == opledger_store::ErrorKind::Unavailable => {
            // SQLite could neither open nor create the WAL's shared memory.
            match probe(config, true, &described).await {
                Ok(()) => {
                    tracing::debug!(%error, "{described} opened immutable");
                    ReadOnly { immutable: true }
                }
                Err(_) => return Err(error),
            }
        }
        Err(error) => return Err(error),
    };
    let pool = SqlitePoolOptions::new()
        .max_connections(read_connections.max(1))
        .min_connections(0)
        .acquire_timeout(crate::BUSY_TIMEOUT)
        .idle_timeout(Duration::from_secs(60))
        .connect_with(read_only_options(config, mode.immutable))
        .await
        .map_err(|error| error::map(error, &format!("opening {described}")))?;
    Ok((pool, mode))
}

/// One read-only connection: the file is a ledger at this build's schema.
async fn probe(config: &SqliteConfig, immutable: bool, described: &str) -> Result<(), StoreError> {
    let mut connection = read_only_options(config, immutable)
        .connect()
        .await
        .map_err(|error| error::map(error, &format!("opening {described}")))?;
    let checked = check_ledger(&mut connection, described).await;
    let _ = connection.close().await;
    checked
}

/// A ledger (not an empty or foreign database) whose migrations are this
/// build's.
async fn check_ledger(connection: &mut SqliteConnection, described: &str) -> Result<(), StoreError> {
    match ledger::recognize(described, &tables(connection, described).await?)? {
        Contents::Ledger => {}
        Contents::Empty => {
            return Err(StoreError::not_found(format!(
                "{described} holds no ledger yet: a reading command creates none (a command that writes does)"
            )))
        }
    }
    let applied: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations WHERE success")
        .fetch_one(&mut *connection)
        .await
        .map_err(|error| error::map(error, &format!("reading the migrations of {described}")))?;
    ledger::check_schema(described, applied, crate::migrations::last_version())
}

/// Characters a `file:` URI cannot hold as they are (SQLite decodes `%XX`).
const URI_ESCAPED: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b'?').add(b'#').add(b'"');

/// Options of the connection a read-only store's replay uses: the ledger
/// attached read-only as its main database (`mode=ro` in a `file:` URI),
/// while the connection itself may still create and write the scratch
/// file it attaches (SQLite gives attached files the connection's flags,
/// not the main file's URI mode).
pub(crate) fn scratch_options(config: &SqliteConfig, mode: ReadOnly) -> Result<SqliteConnectOptions, StoreError> {
    let path = std::path::absolute(&config.path)
        .map_err(|error| StoreError::unavailable(format!("locating {}: {error}", config.path.display())))?;
    let text = path
        .to_str()
        .ok_or_else(|| StoreError::unavailable(format!("{} is not a UTF-8 path", path.display())))?;
    let immutable = if mode.immutable { "&immutable=1" } else { "" };
    let uri = format!("file:{}?mode=ro{immutable}", utf8_percent_encode(text, URI_ESCAPED));
    Ok(SqliteConnectOptions::new()
        .filename(uri)
        .create_if_missing(true)
        .foreign_keys(true)
        .busy_timeout(crate::BUSY_TIMEOUT)
        .statement_cache_capacity(1024)
        .disable_statement_logging()
        .pragma("temp_store", "MEMORY"))
}
