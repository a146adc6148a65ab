//! A fresh database per test on the server the environment names.

#![allow(dead_code)]

use opledger_store::conformance::Harness;
use opledger_store::{ErrorKind, StoreError};
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

pub struct PostgresHarness {
    server: PostgresConfig,
    database: String,
    config: PostgresConfig,
}

/// Why the server could not be reached, once a test has found out: the
/// other tests of this process skip at once instead of probing again.
static UNREACHABLE: OnceLock<String> = OnceLock::new();

/// Connects to the server, or explains loudly why the tests cannot run:
/// None (skip) when nothing answers there, a panic under `CI=true`.
async fn server() -> Option<(PostgresConfig, PgConnection)> {
    let url = server_url();
    let server = PostgresConfig::from_url(&url).unwrap_or_else(|error| panic!("{error}"));
    if UNREACHABLE.get().is_none() {
        let attempt = tokio::time::timeout(Duration::from_secs(5), PgConnection::connect_with(&server.options)).await;
        let reason = match attempt {
            Ok(Ok(connection)) => return Some((server, connection)),
            // Nothing listening, or not answering: the server is not there.
            Ok(Err(sqlx::Error::Io(error))) => error.to_string(),
            Ok(Err(sqlx::Error::PoolTimedOut)) => "timed out".to_string(),
            Err(_) => "no answer within 5 s".to_string(),
            // A server that answers but refuses us is a broken setup, not a skip.
            Ok(Err(error)) => panic!("PostgreSQL at {url} refused the test connection: {error}"),
        };
        if std::env::var("CI").as_deref() == Ok("true") {
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
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("no PostgreSQL at {url}, and CI=true: the PostgreSQL tests must run in CI");
    }
    None
}

/// A harness on a new, empty database; None when the test is skipped.
pub async fn harness() -> Option<PostgresHarness> {
    let (server, mut connection) = server().await?;
    let database = format!("opledger_test_{}", uuid::Uuid::new_v4().simple());
    connection
        .execute(format!("CREATE DATABASE {database}").as_str())
        .await
        .unwrap_or_else(|error| panic!("creating {database}: {error}"));
    let _ = connection.close().await;
    let config = server.clone().with_database(&database);
    Some(PostgresHarness {
        server,
        database,
        config,
    })
}

impl PostgresHarness {
    pub fn config(&self) -> PostgresConfig {
        self.config.clone()
    }

    /// A connection to this harness's database outside any store.
    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect_with(&self.config.options)
            .await
            .expect("connecting to the test database")
    }
}

impl Drop for PostgresHarness {
    /// Drops the database, best effort: on a thread of its own (Drop runs
    /// inside the test's runtime, which must not be blocked on), forcing
    /// off connections that pools of dropped stores may still hold.
    fn drop(&mut self) {
        let options = self.server.options.clone();
        let database = self.database.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut connection = PgConnection::connect_with(&options).await.ok()?;
                let sql = format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)");
                let result = connection.execute(sql.as_str()).await;
                let _ = connection.close().await;
                result.ok().map(|_| ())
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop test database {}; drop it by hand", self.database);
        }
    }
}

impl Harness for PostgresHarness {
    type Store = PostgresStore;

    async fn open(&self) -> PostgresStore {
        PostgresStore::open(self.config()).await.expect("open store")
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
