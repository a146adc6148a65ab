//! The store conformance suite against SQLite: each test gets its own
//! database file in its own temporary folder.

use opledger_store::conformance::Harness;
use opledger_store::{conformance_tests, StoreError};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use std::path::PathBuf;

struct SqliteHarness {
    _folder: tempfile::TempDir,
    path: PathBuf,
}

async fn harness() -> SqliteHarness {
    let folder = tempfile::tempdir().expect("temporary folder");
    let path = folder.path().join("conformance.db");
    SqliteHarness { _folder: folder, path }
}

impl Harness for SqliteHarness {
    type Store = SqliteStore;

    async fn open(&self) -> SqliteStore {
        SqliteStore::open(SqliteConfig::at(&self.path))
            .await
            .expect("open store")
    }

    async fn execute_raw(&self, sql: &str) -> Result<(), StoreError> {
        let store = self.open().await;
        let mut connection = store.raw_connection().await?;
        sqlx::Executor::execute(&mut connection, sql)
            .await
            .map(|_| ())
            .map_err(|error| StoreError::new(opledger_store::ErrorKind::Constraint, error.to_string()))
    }
}

conformance_tests!(harness());
