//! Databases of their own on a server: created for a benchmark run or a test
//! and dropped after it. The product never calls these (it opens the
//! database it is given); they live here, beside the driver and its error
//! mapping, so that the benchmarks (`opledger-bench`) and the test backends
//! (`opledger-testkit`) share one way to make and remove them without
//! either depending on the other.

use crate::error::map;
use crate::PostgresConfig;
use opledger_store::StoreError;
use sqlx::{ConnectOptions, Connection, Executor, PgConnection};

/// Creates database `name` (dropping any leftover of that name first) on the
/// server of `server`, connecting through the database `server` names.
/// Returns the configuration of the new database. `name` must be a plain
/// identifier: it is written into the statement as it is.
pub async fn create_database(server: &PostgresConfig, name: &str) -> Result<PostgresConfig, StoreError> {
    let mut connection = admin_connection(server).await?;
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        connection
            .execute(sql.as_str())
            .await
            .map_err(|error| map(error, &format!("creating database {name}")))?;
    }
    let _ = connection.close().await;
    Ok(server.clone().with_database(name))
}

/// Drops database `name`, forcing off connections still open to it (pools
/// of dropped stores, killed processes).
pub async fn drop_database(server: &PostgresConfig, name: &str) -> Result<(), StoreError> {
    let mut connection = admin_connection(server).await?;
    let result = connection
        .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
        .await
        .map(|_| ())
        .map_err(|error| map(error, &format!("dropping database {name}")));
    let _ = connection.close().await;
    result
}

/// A connection for CREATE and DROP DATABASE, which take a while and would
/// otherwise be logged as slow statements.
async fn admin_connection(server: &PostgresConfig) -> Result<PgConnection, StoreError> {
    server
        .options
        .clone()
        .disable_statement_logging()
        .connect()
        .await
        .map_err(|error| map(error, &format!("connecting to {}", server.describe())))
}
