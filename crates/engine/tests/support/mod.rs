//! Backends for engine behaviour tests: each scenario is a generic async fn
//! over a [`Backend`], and `backends!` instantiates it once per backend, so
//! one source proves the behaviour everywhere.

#![allow(dead_code)]

use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use std::future::Future;
use std::path::PathBuf;

/// A database a scenario can open (and open again, as a restarted process
/// would).
pub trait Backend: Send + Sync {
    type Store: Store;
    fn open(&self) -> impl Future<Output = Self::Store> + Send;
}

/// A fresh SQLite file in a temporary folder.
pub struct SqliteBackend {
    _folder: tempfile::TempDir,
    path: PathBuf,
}

impl SqliteBackend {
    pub fn new() -> Self {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("ledger.db");
        SqliteBackend { _folder: folder, path }
    }
}

impl Backend for SqliteBackend {
    type Store = SqliteStore;
    async fn open(&self) -> SqliteStore {
        SqliteStore::open(SqliteConfig::at(&self.path)).await.unwrap()
    }
}

/// One `#[tokio::test]` per scenario and backend, named
/// `<scenario>_on_sqlite`.
#[macro_export]
macro_rules! backends {
    ($($scenario:ident),+ $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(super::support::SqliteBackend::new()).await;
                }
            )+
        }
    };
}
