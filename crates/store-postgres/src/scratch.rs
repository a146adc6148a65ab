//! A scratch copy of every projection table in a schema of its own
//! (`opledger_scratch_<random>`), on a dedicated connection. Replay folds
//! into it; `compare` checks it against the live tables inside one
//! REPEATABLE READ snapshot. `discard` drops the schema; a scratch copy
//! dropped without `discard` (an early return on an error) drops it in the
//! background.

use crate::ddl::{self, Copy};
use crate::error::map;
use crate::rows;
use opledger_domain::projections::{all_specs, Cell, Row, RowChange, TableSpec};
use opledger_domain::EventEnvelope;
use opledger_store::{BoxFuture, RowDiff, RowTarget, ScratchTarget, StoreError, TableDiff};
use sqlx::{Connection, PgConnection};

/// Differing rows shown per table; enough to read, not a flood.
const SHOWN_DIFFERENCES: i64 = 10;

pub struct PostgresScratch {
    /// Some until `discard` (or Drop) takes it.
    connection: Option<PgConnection>,
    schema: String,
    /// The tables are the connection's temporary tables (`pg_temp`), which
    /// go with the connection: for a store opened read-only, whose role
    /// may create no schema.
    temporary: bool,
}

/// Boxed so the futures of the trait methods that call it stay `Send`
/// without tripping the compiler's higher-ranked lifetime inference.
fn run<'a>(connection: &'a mut PgConnection, sql: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
    Box::pin(async move { rows::script(connection, sql).await.map_err(|error| map(error, sql)) })
}

impl PostgresScratch {
    pub(crate) async fn open(connection: PgConnection) -> Result<Self, StoreError> {
        let mut scratch = PostgresScratch {
            connection: Some(connection),
            schema: format!("opledger_scratch_{}", uuid::Uuid::new_v4().simple()),
            temporary: false,
        };
        let mut setup = vec![format!("CREATE SCHEMA {}", scratch.schema)];
        for spec in all_specs() {
            setup.push(ddl::render_scratch(spec, &scratch.schema));
        }
        setup.push("BEGIN".to_string());
        let setup = setup.join(";\n");
        run(scratch.conn(), &setup).await?;
        Ok(scratch)
    }

    /// A scratch copy in the connection's temporary tables: what a role
    /// allowed only to read (and, as every role by default, to make
    /// temporary tables) can use. They are dropped with the connection.
    pub(crate) async fn open_temporary(connection: PgConnection) -> Result<Self, StoreError> {
        let mut scratch = PostgresScratch {
            connection: Some(connection),
            schema: "pg_temp".to_string(),
            temporary: true,
        };
        // Unqualified names are the live tables: PostgreSQL searches the
        // temporary schema first unless the path lists it, so it is listed
        // last, or the live tables' names would find the scratch copies.
        let mut setup =
            vec!["SELECT set_config('search_path', current_setting('search_path') || ', pg_temp', false)".to_string()];
        for spec in all_specs() {
            // Temporary tables are never logged; PostgreSQL refuses the word.
            setup.push(ddl::render_scratch(spec, &scratch.schema).replace("CREATE UNLOGGED TABLE ", "CREATE TABLE "));
        }
        setup.push("BEGIN".to_string());
        let setup = setup.join(";\n");
        run(scratch.conn(), &setup).await?;
        Ok(scratch)
    }

    fn conn(&mut self) -> &mut PgConnection {
        self.connection
            .as_mut()
            .expect("the scratch connection lives until discard")
    }

    fn copy(&self) -> Copy<'_> {
        Copy::Scratch(&self.schema)
    }

    /// Keys of rows only in `left` (by full-row comparison), limited.
    async fn one_sided(&mut self, table: &TableSpec, left: &str, right: &str) -> Result<Vec<String>, StoreError> {
        let columns = rows::column_list(table);
        let key = rows::key_column(table);
        let sql = format!(
            "SELECT {key}::text FROM (SELECT {columns} FROM {left} EXCEPT SELECT {columns} FROM {right}) AS only_left \
             ORDER BY {key} LIMIT {SHOWN_DIFFERENCES}"
        );
        sqlx::query_scalar::<_, String>(&sql)
            .fetch_all(self.conn())
            .await
            .map_err(|error| map(error, &format!("comparing {}", table.name)))
    }

    async fn count(&mut self, name: &str) -> Result<i64, StoreError> {
        sqlx::query_scalar::<_, i64>(&format!("SELECT COUNT(*) FROM {name}"))
            .fetch_one(self.conn())
            .await
            .map_err(|error| map(error, &format!("counting {name}")))
    }
}

impl Drop for PostgresScratch {
    fn drop(&mut self) {
        let Some(mut connection) = self.connection.take() else {
            return;
        };
        // Temporary tables go with their connection.
        let sql = if self.temporary {
            "ROLLBACK".to_string()
        } else {
            format!("ROLLBACK; DROP SCHEMA IF EXISTS {} CASCADE", self.schema)
        };
        // Best effort, off the caller's path: without a runtime the schema
        // stays behind (its name says what it is; dropping it is safe).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = rows::script(&mut connection, &sql).await {
                    tracing::warn!(%error, "dropping an abandoned scratch schema");
                }
                let _ = connection.close().await;
            });
        }
    }
}

impl RowTarget for PostgresScratch {
    async fn load_rows(&mut self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        let schema = self.schema.clone();
        rows::load(self.conn(), table, Copy::Scratch(&schema), keys).await
    }

    async fn load_rows_where(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        value: &Cell,
    ) -> Result<Vec<Row>, StoreError> {
        let schema = self.schema.clone();
        let filters = [(column, value.clone())];
        rows::find(self.conn(), table, Copy::Scratch(&schema), &filters, usize::MAX).await
    }

    async fn write_rows(&mut self, changes: &[RowChange]) -> Result<(), StoreError> {
        let order: Vec<&'static TableSpec> = all_specs()
            .iter()
            .flat_map(|spec| spec.tables.iter().copied())
            .collect();
        let schema = self.schema.clone();
        rows::write_rows(self.conn(), &order, Copy::Scratch(&schema), changes).await
    }
}

impl ScratchTarget for PostgresScratch {
    async fn read_events(&mut self, after: i64, limit: usize) -> Result<Vec<EventEnvelope>, StoreError> {
        rows::read_events(self.conn(), after, limit).await
    }

    async fn commit_chunk(&mut self) -> Result<(), StoreError> {
        run(self.conn(), "COMMIT; BEGIN").await
    }

    /// Writes here are done when `write_rows` returns: nothing is behind.
    async fn flush(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn begin_snapshot(&mut self) -> Result<i64, StoreError> {
        // The first query after BEGIN fixes the snapshot every later read
        // of this transaction (events, live tables) sees.
        run(self.conn(), "COMMIT; BEGIN ISOLATION LEVEL REPEATABLE READ").await?;
        let positions: Vec<(String, i64)> =
            sqlx::query_as("SELECT name, position FROM projection_positions ORDER BY name")
                .fetch_all(self.conn())
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
                let live_name = ddl::table_name(table.name, Copy::Live);
                let scratch_name = ddl::table_name(table.name, self.copy());
                let live_rows = self.count(&live_name).await?;
                let replayed_rows = self.count(&scratch_name).await?;
                let mut keys = self.one_sided(table, &live_name, &scratch_name).await?;
                keys.extend(self.one_sided(table, &scratch_name, &live_name).await?);
                keys.sort();
                keys.dedup();
                keys.truncate(SHOWN_DIFFERENCES as usize);
                if keys.is_empty() && live_rows == replayed_rows {
                    continue;
                }
                let schema = self.schema.clone();
                let live = rows::load(self.conn(), table, Copy::Live, &keys).await?;
                let replayed = rows::load(self.conn(), table, Copy::Scratch(&schema), &keys).await?;
                let find = |rows: &[Row], key: &str| {
                    rows.iter()
                        .find(|row| row.key().key.to_string() == key)
                        .map(|row| row.to_cells())
                };
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
        let mut connection = self.connection.take().expect("discard runs once");
        let _ = run(&mut connection, "ROLLBACK").await;
        let dropped = if self.temporary {
            Ok(())
        } else {
            let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
            run(&mut connection, &sql).await
        };
        let _ = connection.close().await;
        dropped
    }
}
