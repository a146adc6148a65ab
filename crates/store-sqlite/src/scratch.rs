//! A scratch copy of every projection table in a separate file attached to
//! a dedicated connection. Replay folds into it; `compare` checks it against
//! the live tables inside one read snapshot of the main database.

use crate::ddl::{self, Copy};
use crate::error::map;
use crate::rows;
use opledger_domain::projections::{all_specs, Cell, Row, RowChange, TableSpec};
use opledger_domain::EventEnvelope;
use opledger_store::{BoxFuture, RowDiff, RowTarget, ScratchTarget, StoreError, TableDiff};
use sqlx::SqliteConnection;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

const SCHEMA: &str = "scratch";
/// Differing rows shown per table; enough to read, not a flood.
const SHOWN_DIFFERENCES: i64 = 10;

pub struct SqliteScratch {
    connection: SqliteConnection,
    file: PathBuf,
}

/// Removes the scratch file when the scratch copy goes away, whether by
/// `discard` or by an early return on an error.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Boxed so the futures of the trait methods that call it stay `Send`
/// without tripping the compiler's higher-ranked lifetime inference.
fn run<'a>(connection: &'a mut SqliteConnection, sql: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
    Box::pin(async move {
        crate::rows::script(&mut *connection, sql)
            .await
            .map_err(|error| map(error, sql))
    })
}

impl SqliteScratch {
    pub(crate) async fn open(mut connection: SqliteConnection, database: &Path) -> Result<Self, StoreError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut name = database.file_name().unwrap_or_default().to_os_string();
        name.push(format!(
            ".scratch-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = database.with_file_name(name);
        let _ = std::fs::remove_file(&file);
        sqlx::query("ATTACH DATABASE ? AS scratch")
            .bind(file.to_string_lossy().to_string())
            .execute(&mut connection)
            .await
            .map_err(|error| map(error, "attaching the scratch database"))?;
        // The scratch copy is thrown away after use: no journal, no fsync.
        run(
            &mut connection,
            "PRAGMA scratch.journal_mode = OFF; PRAGMA scratch.synchronous = OFF",
        )
        .await?;
        for spec in all_specs() {
            // Tables only: the scratch copy is read by primary key and
            // compared whole, so secondary indexes would only slow replay.
            let tables_only = ddl::without_indexes(&ddl::render(spec, Copy::Scratch(SCHEMA)));
            run(&mut connection, &tables_only).await?;
        }
        run(&mut connection, "BEGIN").await?;
        Ok(SqliteScratch { connection, file })
    }

    /// Rows only in `left` (by full-row comparison), keys first, limited.
    async fn one_sided(&mut self, table: &TableSpec, left: &str, right: &str) -> Result<Vec<String>, StoreError> {
        let columns = table.column_names().collect::<Vec<_>>().join(", ");
        let key = table.columns[0].name;
        let sql = format!(
            "SELECT {key} FROM (SELECT {columns} FROM {left}.{name} EXCEPT SELECT {columns} FROM {right}.{name}) \
             ORDER BY {key} LIMIT {SHOWN_DIFFERENCES}",
            name = table.name
        );
        sqlx::query_scalar::<_, String>(&sql)
            .fetch_all(&mut self.connection)
            .await
            .map_err(|error| map(error, &format!("comparing {}", table.name)))
    }

    async fn count(&mut self, schema: &str, table: &TableSpec) -> Result<i64, StoreError> {
        sqlx::query_scalar::<_, i64>(&format!("SELECT COUNT(*) FROM {schema}.{}", table.name))
            .fetch_one(&mut self.connection)
            .await
            .map_err(|error| map(error, &format!("counting {}", table.name)))
    }
}

impl RowTarget for SqliteScratch {
    async fn load_rows(&mut self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        rows::load(&mut self.connection, table, Copy::Scratch(SCHEMA), keys).await
    }

    async fn load_rows_where(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        value: &Cell,
    ) -> Result<Vec<Row>, StoreError> {
        let filters = [(column, value.clone())];
        rows::find(&mut self.connection, table, Copy::Scratch(SCHEMA), &filters, usize::MAX).await
    }

    async fn write_rows(&mut self, changes: &[RowChange]) -> Result<(), StoreError> {
        let order: Vec<&'static TableSpec> = all_specs()
            .iter()
            .flat_map(|spec| spec.tables.iter().copied())
            .collect();
        crate::raw::write_rows(&mut self.connection, &order, Copy::Scratch(SCHEMA), changes).await
    }
}

impl ScratchTarget for SqliteScratch {
    async fn read_events(&mut self, after: i64, limit: usize) -> Result<Vec<EventEnvelope>, StoreError> {
        rows::read_events(&mut self.connection, after, limit).await
    }

    async fn commit_chunk(&mut self) -> Result<(), StoreError> {
        run(&mut self.connection, "COMMIT; BEGIN").await
    }

    async fn begin_snapshot(&mut self) -> Result<i64, StoreError> {
        run(&mut self.connection, "COMMIT; BEGIN").await?;
        // The first read of main in this transaction fixes its snapshot.
        let positions: Vec<(String, i64)> =
            sqlx::query_as("SELECT name, position FROM main.projection_positions ORDER BY name")
                .fetch_all(&mut self.connection)
                .await
                .map_err(|error| map(error, "reading projection positions"))?;
        let live: Vec<&(String, i64)> = positions
            .iter()
            .filter(|(name, _)| all_specs().iter().any(|spec| spec.name == name))
            .collect();
        let Some((_, position)) = live.first() else {
            return Err(StoreError::not_found("no live projections to compare"));
        };
        if live.iter().any(|(_, other)| other != position) {
            return Err(StoreError::conflict(format!(
                "live projections are at different positions ({live:?}); restart to catch them up"
            )));
        }
        Ok(*position)
    }

    async fn compare(&mut self) -> Result<Vec<TableDiff>, StoreError> {
        let mut diffs = Vec::new();
        for spec in all_specs() {
            for table in spec.tables {
                let live_rows = self.count("main", table).await?;
                let replayed_rows = self.count(SCHEMA, table).await?;
                let mut keys = self.one_sided(table, "main", SCHEMA).await?;
                keys.extend(self.one_sided(table, SCHEMA, "main").await?);
                keys.sort();
                keys.dedup();
                keys.truncate(SHOWN_DIFFERENCES as usize);
                if keys.is_empty() && live_rows == replayed_rows {
                    continue;
                }
                let live = rows::load(&mut self.connection, table, Copy::Live, &keys).await?;
                let replayed = rows::load(&mut self.connection, table, Copy::Scratch(SCHEMA), &keys).await?;
                let find =
                    |rows: &[Row], key: &str| rows.iter().find(|row| row.key().key == key).map(|row| row.to_cells());
                let shown = keys
                    .iter()
                    .map(|key| RowDiff {
                        key: key.clone(),
                        live: find(&live, key),
                        replayed: find(&replayed, key),
                    })
                    .collect();
                diffs.push(TableDiff {
                    table,
                    live_rows,
                    replayed_rows,
                    rows: shown,
                });
            }
        }
        Ok(diffs)
    }

    async fn discard(mut self) -> Result<(), StoreError> {
        let _ = run(&mut self.connection, "ROLLBACK").await;
        let detached = run(&mut self.connection, "DETACH DATABASE scratch").await;
        let _remove = RemoveOnDrop(self.file);
        crate::close_quietly(self.connection).await;
        detached
    }
}
