//! A fresh PostgreSQL database per test on the server the environment names,
//! dropped afterwards; a loud skip when no server answers (a failure under
//! `CI=true`).

use crate::Backend;
use opledger_store::{ErrorKind, StoreError};
use opledger_store_conformance::Harness;
use opledger_store_postgres::databases::{create_database, drop_database};
use opledger_store_postgres::{PostgresConfig, PostgresStore};
use sqlx::{Connection, Executor, PgConnection};
use std::io::Write;
use std::sync::OnceLock;
use std::time::Duration;

pub const DEFAULT_URL: &str = "postgres://root@127.0.0.1:5432/test";

/// The server URL: `OPLEDGER_TEST_POSTGRES_URL`, or the local default.
pub fn server_url() -> String {
    std::env::var("OPLEDGER_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

/// The URL of another database on the same server (libpq URL syntax: the
/// database is the path; user, host, port and query options are kept).
pub fn url_with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let authority_start = base.find("://").map(|scheme| scheme + 3).unwrap_or(0);
    let authority_end = base[authority_start..]
        .find('/')
        .map(|slash| authority_start + slash)
        .unwrap_or(base.len());
    format!("{}/{database}{query}", &base[..authority_end])
}

pub struct PostgresBackend {
    server: PostgresConfig,
    server_url: String,
    database: String,
    config: PostgresConfig,
}

/// Why the server could not be reached, once a test has found out: the
/// other tests of this process skip at once instead of probing again.
static UNREACHABLE: OnceLock<String> = OnceLock::new();

fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Connects to the server, or explains loudly why the tests cannot run:
/// None (skip) when nothing answers there, a panic under `CI=true`.
async fn server() -> Option<(String, PostgresConfig)> {
    let url = server_url();
    let server = PostgresConfig::server_from_url(&url).unwrap_or_else(|error| panic!("{error}"));
    if UNREACHABLE.get().is_none() {
        let attempt = tokio::time::timeout(Duration::from_secs(5), PgConnection::connect_with(&server.options)).await;
        let reason = match attempt {
            Ok(Ok(connection)) => {
                let _ = connection.close().await;
                return Some((url, server));
            }
            // Nothing listening, or not answering: the server is not there.
            Ok(Err(sqlx::Error::Io(error))) => error.to_string(),
            Ok(Err(sqlx::Error::PoolTimedOut)) => "timed out".to_string(),
            Err(_) => "no answer within 5 s".to_string(),
            // A server that answers but refuses us is a broken setup, not a skip.
            Ok(Err(error)) => panic!("PostgreSQL at {url} refused the test connection: {error}"),
        };
        if under_ci() {
            panic!("no PostgreSQL at {url} ({reason}), and CI=true: the PostgreSQL tests must run in CI");
        }
        if UNREACHABLE.set(reason.clone()).is_ok() {
            // Straight to the process's stderr: the test harness captures
            // eprintln! of passing tests, and a skip must not go unseen.
            let _ = writeln!(
                std::io::stderr(),
                "\n**********************************************************************\n\
                 SKIPPED: no PostgreSQL at {url} ({reason})\n\
                 Every PostgreSQL test of this binary passes without running. Start a server or\n\
                 set OPLEDGER_TEST_POSTGRES_URL; under CI=true they fail instead.\n\
                 **********************************************************************"
            );
        }
    }
    if under_ci() {
        panic!("no PostgreSQL at {url}, and CI=true: the PostgreSQL tests must run in CI");
    }
    None
}

/// A backend on a new, empty database; None when the test is skipped.
pub async fn backend() -> Option<PostgresBackend> {
    let (server_url, server) = server().await?;
    let database = format!("opledger_test_{}", uuid::Uuid::new_v4().simple());
    let mut config = create_database(&server, &database)
        .await
        .unwrap_or_else(|error| panic!("creating {database}: {error}"));
    // Many tests share one server (max_connections is 100 by default), and
    // some open a store per simulated worker: small pools keep a parallel
    // test run under the limit. Writes take turns on the append lock anyway.
    config.write_connections = 2;
    config.read_connections = 2;
    Some(PostgresBackend {
        server,
        server_url,
        database,
        config,
    })
}

impl PostgresBackend {
    /// The configuration `open` uses (this database, small pools).
    pub fn config(&self) -> PostgresConfig {
        self.config.clone()
    }

    pub fn database(&self) -> &str {
        &self.database
    }

    /// A connection to this database outside any store.
    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect_with(&self.config.options)
            .await
            .expect("connecting to the test database")
    }
}

impl Drop for PostgresBackend {
    /// Drops the database, best effort: on a thread of its own (Drop runs
    /// inside the test's runtime, which must not be blocked on), forcing
    /// off connections that pools of dropped stores (or killed processes)
    /// may still hold.
    fn drop(&mut self) {
        let server = self.server.clone();
        let database = self.database.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(drop_database(&server, &database)).ok()
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop test database {}; drop it by hand", self.database);
        }
    }
}

impl Harness for PostgresBackend {
    type Store = PostgresStore;

    async fn open(&self) -> PostgresStore {
        PostgresStore::open(self.config())
            .await
            .expect("open the PostgreSQL store")
    }

    async fn execute_raw(&self, sql: &str) -> Result<(), StoreError> {
        let mut connection = self.connect().await;
        let result = connection
            .execute(sql)
            .await
            .map(|_| ())
            .map_err(|error| StoreError::new(ErrorKind::Constraint, error.to_string()));
        let _ = connection.close().await;
        result
    }
}

impl Backend for PostgresBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn url(&self) -> String {
        url_with_database(&self.server_url, &self.database)
    }
}

#[cfg(test)]
mod tests {
    use super::url_with_database;

    #[test]
    fn another_database_keeps_user_host_port_and_options() {
        assert_eq!(
            url_with_database("postgres://root@127.0.0.1:5432/test", "x"),
            "postgres://root@127.0.0.1:5432/x"
        );
        assert_eq!(
            url_with_database("postgresql://u:p@h/test?sslmode=disable", "x"),
            "postgresql://u:p@h/x?sslmode=disable"
        );
        assert_eq!(url_with_database("postgres://h:1", "x"), "postgres://h:1/x");
    }
}
