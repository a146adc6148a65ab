//! How a database is opened: for writing (migrated first), or for reading
//! only (nothing migrated or written, so a role granted only SELECT
//! serves reading commands), and the checks both make first: the server
//! answers within the configured time, and the database is an opledger
//! ledger (`opledger_store::ledger`).

use crate::config::PostgresConfig;
use crate::error;
use opledger_store::ledger::{self, Contents};
use opledger_store::StoreError;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgConnection};

/// One connection, within the configured connect timeout; a server that
/// does not answer in time is Unavailable, naming host and port.
pub(crate) async fn connect(options: &PgConnectOptions, config: &PostgresConfig) -> Result<PgConnection, StoreError> {
    match tokio::time::timeout(config.connect_timeout, options.connect()).await {
        Ok(connected) => connected.map_err(|error| error::map(error, &format!("connecting to {}", config.describe()))),
        Err(_) => Err(StoreError::unavailable(format!(
            "the PostgreSQL server at {} did not answer within {} s (raise connect_timeout=SECONDS in the URL \
             if it is only slow)",
            config.server(),
            config.connect_timeout.as_secs_f64()
        ))),
    }
}

/// The names of the tables and views in the schema the store writes into
/// (the connection's current schema), from the catalog, which lists them
/// whatever the role may read.
async fn tables(connection: &mut PgConnection, described: &str) -> Result<Vec<String>, StoreError> {
    sqlx::query_scalar::<_, String>(
        "SELECT c.relname::text FROM pg_catalog.pg_class c \
         WHERE c.relnamespace = (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = current_schema()) \
           AND c.relkind IN ('r', 'p', 'v', 'm', 'f') \
         ORDER BY c.relname",
    )
    .fetch_all(connection)
    .await
    .map_err(|error| error::map(error, &format!("reading the tables of {described}")))
}

/// Before a store migrates anything: refuses a database that holds
/// another application's tables. An empty database is a new ledger.
pub(crate) async fn check_before_writing(
    connection: &mut PgConnection,
    config: &PostgresConfig,
) -> Result<(), StoreError> {
    let described = config.describe();
    ledger::recognize(&described, &tables(connection, &described).await?).map(|_| ())
}

/// Before a read-only store reads: the database is a ledger (not empty,
/// not another application's) at this build's schema.
pub(crate) async fn check_for_reading(
    connection: &mut PgConnection,
    config: &PostgresConfig,
) -> Result<(), StoreError> {
    let described = config.describe();
    match ledger::recognize(&described, &tables(connection, &described).await?)? {
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
    ledger::check_schema(&described, applied, crate::migrations::last_version())
}
