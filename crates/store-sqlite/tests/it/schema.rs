//! A database migrated step by step, as one kept through every release
//! would be, has exactly the schema of a freshly migrated one: every
//! table's columns (type, nullability, default, key position, hidden),
//! indexes (columns, uniqueness, partial WHERE), foreign keys, triggers and
//! views; and the step-by-step migration history is accepted by the full
//! migrator. (The PostgreSQL half is `crates/store-postgres/tests/it/schema.rs`.)

use opledger_store_conformance::Harness;
use opledger_store_sqlite::migrations::{migrator, MIGRATIONS};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{Connection, SqliteConnection};
use std::path::Path;

/// A row of `pragma_table_xinfo`: cid, name, type, notnull, default, pk, hidden.
type ColumnInfo = (i64, String, String, i64, Option<String>, i64, i64);
/// A row of `pragma_foreign_key_list`: id, seq, table, from, to, on_update, on_delete, match.
type ForeignKeyInfo = (i64, i64, String, String, Option<String>, String, String, String);

async fn connect(path: &Path) -> SqliteConnection {
    SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path).create_if_missing(true))
        .await
        .expect("open the database")
}

/// Everything that makes up the schema, one line per object, sorted. Table
/// and index shapes come from the pragmas, not from the stored CREATE text,
/// which ALTER TABLE edits in ways that do not change the schema.
async fn schema(connection: &mut SqliteConnection) -> Vec<String> {
    let objects: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT type, name, tbl_name, sql FROM sqlite_schema \
         WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND tbl_name <> '_sqlx_migrations' ORDER BY type, name",
    )
    .fetch_all(&mut *connection)
    .await
    .unwrap();
    let mut lines = Vec::new();
    for (kind, name, table, sql) in &objects {
        match kind.as_str() {
            "table" => {
                let columns: Vec<ColumnInfo> = sqlx::query_as(&format!("SELECT * FROM pragma_table_xinfo('{name}')"))
                    .fetch_all(&mut *connection)
                    .await
                    .unwrap();
                for (cid, column, ty, not_null, default, pk, hidden) in columns {
                    lines.push(format!(
                        "column {name}.{column} #{cid} {ty} notnull={not_null} default={default:?} pk={pk} hidden={hidden}"
                    ));
                }
                let keys: Vec<ForeignKeyInfo> =
                    sqlx::query_as(&format!("SELECT * FROM pragma_foreign_key_list('{name}')"))
                        .fetch_all(&mut *connection)
                        .await
                        .unwrap();
                for (id, seq, parent, from, to, on_update, on_delete, matching) in keys {
                    lines.push(format!(
                        "foreign key {name} #{id}.{seq} {from} -> {parent}({to:?}) update={on_update} delete={on_delete} match={matching}"
                    ));
                }
            }
            "index" => {
                let columns: Vec<(i64, i64, Option<String>, i64, String, i64)> =
                    sqlx::query_as(&format!("SELECT * FROM pragma_index_xinfo('{name}')"))
                        .fetch_all(&mut *connection)
                        .await
                        .unwrap();
                let columns: Vec<String> = columns
                    .into_iter()
                    .map(|(seqno, cid, column, desc, collation, key)| {
                        format!("{seqno}:{cid}:{column:?}:desc={desc}:{collation}:key={key}")
                    })
                    .collect();
                let (unique, origin, partial): (i64, String, i64) = sqlx::query_as(&format!(
                    "SELECT \"unique\", origin, partial FROM pragma_index_list('{table}') WHERE name = '{name}'"
                ))
                .fetch_one(&mut *connection)
                .await
                .unwrap();
                // A partial index's WHERE is only in its CREATE text.
                let text = sql
                    .as_deref()
                    .unwrap_or_default()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                let predicate = text.split_once(" WHERE ").map(|(_, predicate)| predicate.to_string());
                lines.push(format!(
                    "index {name} on {table} unique={unique} origin={origin} partial={partial} [{}] where={predicate:?}",
                    columns.join(", ")
                ));
            }
            // Triggers and views have no pragma: their text is their definition.
            _ => lines.push(format!(
                "{kind} {name} on {table}: {}",
                sql.as_deref()
                    .unwrap_or_default()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            )),
        }
    }
    lines.sort();
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_step_by_step_has_the_schema_of_a_fresh_one() {
    let fresh = opledger_testkit::sqlite::backend().await;
    let stepped = opledger_testkit::sqlite::backend().await;

    let mut connection = connect(fresh.path()).await;
    migrator().await.run(&mut connection).await.expect("fresh migration");
    let fresh_schema = schema(&mut connection).await;
    let _ = connection.close().await;

    // One release at a time: a migrator that knows only the first k files,
    // run against the database the previous one left.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations/sqlite");
    let mut files: Vec<_> = std::fs::read_dir(&source)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "sql"))
        .collect();
    files.sort();
    assert_eq!(files.len(), MIGRATIONS.len(), "every file is embedded");
    let folder = tempfile::tempdir().unwrap();
    let mut connection = connect(stepped.path()).await;
    for file in &files {
        std::fs::copy(file, folder.path().join(file.file_name().unwrap())).unwrap();
        let migrator = sqlx::migrate::Migrator::new(folder.path()).await.unwrap();
        migrator
            .run(&mut connection)
            .await
            .unwrap_or_else(|error| panic!("migrating up to {}: {error}", file.display()));
    }
    // The history the steps wrote is the one the full migrator expects
    // (same versions, same checksums): it has nothing left to do.
    migrator()
        .await
        .run(&mut connection)
        .await
        .expect("the full migrator accepts the stepped history");
    let stepped_schema = schema(&mut connection).await;
    let _ = connection.close().await;
    assert!(fresh_schema.len() > 15, "{fresh_schema:#?}");
    assert_eq!(stepped_schema, fresh_schema);

    // And the projection tables a store creates on top are the same too.
    drop(fresh.open().await);
    drop(stepped.open().await);
    let mut left = connect(fresh.path()).await;
    let mut right = connect(stepped.path()).await;
    let (left_schema, right_schema) = (schema(&mut left).await, schema(&mut right).await);
    assert!(
        left_schema
            .iter()
            .any(|line| line.contains("index media_processing_states_claimable ") && line.contains("where=Some(")),
        "{left_schema:#?}"
    );
    assert_eq!(left_schema, right_schema);
}
