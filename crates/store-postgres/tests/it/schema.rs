//! A database migrated step by step, as one kept through every release
//! would be, has exactly the schema of a freshly migrated one: columns,
//! constraints, indexes, triggers, functions and storage options; and the
//! step-by-step migration history is accepted by the full migrator.

use opledger_store_conformance::Harness;
use opledger_store_postgres::migrations::{migrator, MIGRATIONS};
use sqlx::{Connection, PgConnection};
use std::path::Path;

/// Everything that makes up the schema, one line per object, sorted.
async fn schema(connection: &mut PgConnection) -> Vec<String> {
    let queries = [
        "SELECT format('column %s.%s #%s %s null=%s default=%s collation=%s', table_name, column_name, \
         ordinal_position, data_type, is_nullable, column_default, collation_name) \
         FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name <> '_sqlx_migrations'",
        "SELECT format('constraint %s.%s %s', conrelid::regclass, conname, pg_get_constraintdef(oid)) \
         FROM pg_constraint WHERE connamespace = current_schema()::regnamespace \
         AND conrelid <> '_sqlx_migrations'::regclass",
        "SELECT format('index %s', indexdef) FROM pg_indexes \
         WHERE schemaname = current_schema() AND tablename <> '_sqlx_migrations'",
        "SELECT format('trigger %s', pg_get_triggerdef(oid)) FROM pg_trigger WHERE NOT tgisinternal",
        "SELECT format('function %s', pg_get_functiondef(oid)) FROM pg_proc \
         WHERE pronamespace = current_schema()::regnamespace",
        "SELECT format('relation %s kind=%s persistence=%s options=%s', relname, relkind, relpersistence, reloptions) \
         FROM pg_class WHERE relnamespace = current_schema()::regnamespace \
         AND relname NOT LIKE '\\_sqlx\\_migrations%'",
    ];
    let mut lines = Vec::new();
    for sql in queries {
        let rows: Vec<(String,)> = sqlx::query_as(sql)
            .fetch_all(&mut *connection)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
        lines.extend(rows.into_iter().map(|(line,)| line));
    }
    lines.sort();
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_step_by_step_has_the_schema_of_a_fresh_one() {
    let Some(fresh) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let Some(stepped) = opledger_testkit::postgres::backend().await else {
        return;
    };

    let mut connection = fresh.connect().await;
    migrator().await.run(&mut connection).await.expect("fresh migration");
    let fresh_schema = schema(&mut connection).await;
    let _ = connection.close().await;

    // One release at a time: a migrator that knows only the first k files,
    // run against the database the previous one left.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations/postgres");
    let mut files: Vec<_> = std::fs::read_dir(&source)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "sql"))
        .collect();
    files.sort();
    assert_eq!(files.len(), MIGRATIONS.len(), "every file is embedded");
    let folder = tempfile::tempdir().unwrap();
    let mut connection = stepped.connect().await;
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
    assert!(fresh_schema.len() > 20, "{fresh_schema:#?}");
    assert_eq!(stepped_schema, fresh_schema);

    // And the projection tables a store creates on top are the same too.
    drop(fresh.open().await);
    drop(stepped.open().await);
    let mut left = fresh.connect().await;
    let mut right = stepped.connect().await;
    let (left_schema, right_schema) = (schema(&mut left).await, schema(&mut right).await);
    assert!(left_schema
        .iter()
        .any(|line| line.contains("media_processing_states_claimable")));
    assert_eq!(left_schema, right_schema);
}
