//! A fresh SQLite database file in a temporary folder of its own.

use crate::Backend;
use opledger_store::{ErrorKind, StoreError};
use opledger_store_conformance::Harness;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use std::path::{Path, PathBuf};

pub struct SqliteBackend {
    // Kept for its Drop: the folder and the database go when the test ends.
    _folder: tempfile::TempDir,
    path: PathBuf,
}

/// A new backend: an empty folder, the database file not created yet (the
/// first `open` creates it with its schema).
pub async fn backend() -> SqliteBackend {
    let folder = tempfile::tempdir().expect("a temporary folder");
    let path = folder.path().join("opledger.db");
    SqliteBackend { _folder: folder, path }
}

impl SqliteBackend {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn config(&self) -> SqliteConfig {
        SqliteConfig::at(&self.path)
    }
}

impl Harness for SqliteBackend {
    type Store = SqliteStore;

    async fn open(&self) -> SqliteStore {
        SqliteStore::open(self.config()).await.expect("open the SQLite store")
    }

    async fn execute_raw(&self, sql: &str) -> Result<(), StoreError> {
        let store = self.open().await;
        let mut connection = store.raw_connection().await?;
        sqlx::Executor::execute(&mut connection, sql)
            .await
            .map(|_| ())
            .map_err(|error| StoreError::new(ErrorKind::Constraint, error.to_string()))
    }
}

impl Backend for SqliteBackend {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn url(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }
}
