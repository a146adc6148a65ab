//! Opening a store turns off SQLite's memory statistics before the process's
//! first connection, so allocations inside SQLite stop taking the global
//! mutex that counts them. Its own test binary: the setting is per process
//! and only takes before SQLite initializes.

use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};

fn memory_in_use() -> i64 {
    let (mut current, mut highest) = (0i64, 0i64);
    // SAFETY: both out-pointers are valid for the call.
    let rc = unsafe {
        libsqlite3_sys::sqlite3_status64(libsqlite3_sys::SQLITE_STATUS_MEMORY_USED, &mut current, &mut highest, 0)
    };
    assert_eq!(rc, libsqlite3_sys::SQLITE_OK);
    current
}

#[tokio::test]
async fn opening_a_store_turns_off_sqlite_memory_statistics() {
    let folder = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteConfig::at(folder.path().join("stats.db")))
        .await
        .unwrap();
    // The store is open with its writer and read pool: with statistics on,
    // SQLite would report the memory they hold (page caches, schemas).
    store.projection_states().await.unwrap();
    assert_eq!(memory_in_use(), 0, "SQLite still counts its memory");
}
