//! How SQLite lays out the projection tables. Entity tables (one row per
//! media item, operation, processing state, capability, batch, batch item,
//! review entry) are rowid tables whose text key is a unique index; the
//! running-counts tables (a few rows by name) stay `WITHOUT ROWID`.
//!
//! *Why:* entity rows are hundreds of bytes, a handful per page. Appending
//! to a `WITHOUT ROWID` tree splits its full rightmost leaf by rebalancing it
//! with two siblings (three pages and their parent rewritten), where a rowid
//! table appends by SQLite's quick path (one new page); the key index's
//! entries are small, so it splits a tenth as often. Measured: lifecycle
//! +2–7%, single-client batched appends +2–10% (docs/benchmarks.md).

use opledger_store_sqlite::{SqliteConfig, SqliteStore};

const ENTITY_TABLES: [&str; 9] = [
    "media",
    "media_regions",
    "media_operations",
    "media_processing_states",
    "region_processing_states",
    "entity_capability_states",
    "batches",
    "batch_items",
    "review_queue",
];

#[tokio::test]
async fn entity_tables_are_rowid_tables_and_counts_tables_are_not() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("layout.db");
    drop(SqliteStore::open(SqliteConfig::at(&path)).await.unwrap());
    let connection = rusqlite::Connection::open(&path).unwrap();
    let tables: Vec<String> = connection
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // Only a rowid table has the `rowid` column to select.
    let has_rowid = |table: &str| {
        connection
            .prepare(&format!("SELECT rowid FROM {table} LIMIT 0"))
            .is_ok()
    };
    for table in ENTITY_TABLES {
        assert!(tables.iter().any(|name| name == table), "{table} is missing");
        assert!(has_rowid(table), "{table} should be a rowid table");
    }
    let counts: Vec<&String> = tables.iter().filter(|name| name.ends_with("_counts")).collect();
    assert_eq!(counts.len(), 4, "{counts:?}");
    for table in counts {
        assert!(!has_rowid(table), "{table} should stay WITHOUT ROWID");
    }
}
