//! A scratch copy of every projection table in a separate file attached to
//! a dedicated connection. Replay folds into it; `compare` checks it against
//! the live tables inside one read snapshot of the main database.
//!
//! Rows are written behind: `write_rows` and `commit_chunk` hand the work
//! to a blocking thread and return, so the fold of the next chunk overlaps
//! the write of the last one (writing was a quarter of a replay's time, on
//! the fold's core while the other idled). The work runs in the order it
//! was handed over, and every other call waits for it first, so a load
//! sees every row written before it; the first failure of a write behind
//! is the answer of the next call.

use crate::ddl::{self, Copy};
use crate::error::map;
use crate::rows;
use opledger_domain::projections::{all_specs, Cell, Row, RowChange, TableSpec};
use opledger_domain::EventEnvelope;
use opledger_store::{BoxFuture, RowDiff, RowTarget, ScratchTarget, StoreError, TableDiff};
use sqlx::SqliteConnection;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::task::JoinHandle;

const SCHEMA: &str = "scratch";
/// Differing rows shown per table; enough to read, not a flood.
const SHOWN_DIFFERENCES: i64 = 10;

pub struct SqliteScratch {
    link: Link,
    file: PathBuf,
}

/// Where the scratch connection is.
enum Link {
    /// Here, with nothing behind.
    Ready(SqliteConnection),
    /// With work behind on a blocking thread, which hands it back with the
    /// first failure of that work (None: a task panicked and the
    /// connection went with it).
    Behind(JoinHandle<Handed>),
    /// Gone with a panicked task.
    Lost,
}

type Handed = (Option<SqliteConnection>, Result<(), StoreError>);

/// Work a scratch copy does behind the caller.
enum Behind {
    Write(Vec<RowChange>),
    Commit,
}

impl Behind {
    async fn run(self, connection: &mut SqliteConnection) -> Result<(), StoreError> {
        match self {
            Behind::Write(changes) => {
                let order: Vec<&'static TableSpec> = all_specs()
                    .iter()
                    .flat_map(|spec| spec.tables.iter().copied())
                    .collect();
                crate::sqlx_handle::write_rows(connection, &order, Copy::Scratch(SCHEMA), &changes).await
            }
            Behind::Commit => run(connection, "COMMIT; BEGIN").await,
        }
    }
}

/// What a panicked write-behind hands back: no connection, and why.
fn stopped(error: tokio::task::JoinError) -> Handed {
    (
        None,
        Err(StoreError::unavailable(format!(
            "the scratch copy's write-behind stopped: {error}"
        ))),
    )
}

fn lost() -> StoreError {
    StoreError::unavailable("the scratch copy's connection was lost when its write-behind panicked")
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
    /// A scratch copy in a file of its own in `folder` (beside the ledger,
    /// or a temporary folder for a ledger opened read-only), named after
    /// the ledger's file.
    pub(crate) async fn open(
        mut connection: SqliteConnection,
        database: &Path,
        folder: &Path,
    ) -> Result<Self, StoreError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut name = database.file_name().unwrap_or_default().to_os_string();
        name.push(format!(
            ".scratch-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = folder.join(name);
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
        Ok(SqliteScratch {
            link: Link::Ready(connection),
            file,
        })
    }

    /// The connection, once all work behind has landed; the first failure
    /// of that work is returned instead.
    async fn connection(&mut self) -> Result<&mut SqliteConnection, StoreError> {
        if let Link::Behind(handle) = &mut self.link {
            let (connection, result) = handle.await.unwrap_or_else(stopped);
            self.link = connection.map_or(Link::Lost, Link::Ready);
            result?;
        }
        match &mut self.link {
            Link::Ready(connection) => Ok(connection),
            Link::Behind(_) | Link::Lost => Err(lost()),
        }
    }

    /// Hands `work` to a blocking thread, after the work already behind;
    /// once some work failed, what follows it is skipped.
    fn hand_over(&mut self, work: Behind) {
        let runtime = tokio::runtime::Handle::current();
        let previous = std::mem::replace(&mut self.link, Link::Lost);
        let handle = tokio::task::spawn_blocking(move || {
            runtime.block_on(async move {
                let (connection, result) = match previous {
                    Link::Ready(connection) => (Some(connection), Ok(())),
                    Link::Lost => (None, Err(lost())),
                    Link::Behind(handle) => handle.await.unwrap_or_else(stopped),
                };
                match (connection, result) {
                    (Some(mut connection), Ok(())) => {
                        let result = work.run(&mut connection).await;
                        (Some(connection), result)
                    }
                    failed => failed,
                }
            })
        });
        self.link = Link::Behind(handle);
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
            .fetch_all(self.connection().await?)
            .await
            .map_err(|error| map(error, &format!("comparing {}", table.name)))
    }

    async fn count(&mut self, schema: &str, table: &TableSpec) -> Result<i64, StoreError> {
        sqlx::query_scalar::<_, i64>(&format!("SELECT COUNT(*) FROM {schema}.{}", table.name))
            .fetch_one(self.connection().await?)
            .await
            .map_err(|error| map(error, &format!("counting {}", table.name)))
    }
}

impl RowTarget for SqliteScratch {
    async fn load_rows(&mut self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        rows::load(self.connection().await?, table, Copy::Scratch(SCHEMA), keys).await
    }

    async fn load_rows_where(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        value: &Cell,
    ) -> Result<Vec<Row>, StoreError> {
        let filters = [(column, value.clone())];
        rows::find(
            self.connection().await?,
            table,
            Copy::Scratch(SCHEMA),
            &filters,
            usize::MAX,
        )
        .await
    }

    /// Written behind (see the module documentation): a failure is the
    /// answer of a later call.
    async fn write_rows(&mut self, changes: &[RowChange]) -> Result<(), StoreError> {
        self.hand_over(Behind::Write(changes.to_vec()));
        Ok(())
    }
}

impl ScratchTarget for SqliteScratch {
    async fn read_events(&mut self, after: i64, limit: usize) -> Result<Vec<EventEnvelope>, StoreError> {
        rows::read_events(self.connection().await?, after, limit).await
    }

    /// Committed behind, after the writes before it.
    async fn commit_chunk(&mut self) -> Result<(), StoreError> {
        self.hand_over(Behind::Commit);
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), StoreError> {
        self.connection().await.map(|_| ())
    }

    async fn begin_snapshot(&mut self) -> Result<i64, StoreError> {
        run(self.connection().await?, "COMMIT; BEGIN").await?;
        // The first read of main in this transaction fixes its snapshot.
        let positions: Vec<(String, i64)> =
            sqlx::query_as("SELECT name, position FROM main.projection_positions ORDER BY name")
                .fetch_all(self.connection().await?)
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
                let connection = self.connection().await?;
                let live = rows::load(&mut *connection, table, Copy::Live, &keys).await?;
                let replayed = rows::load(connection, table, Copy::Scratch(SCHEMA), &keys).await?;
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

    /// Reports a failure of work still behind, after removing the copy.
    async fn discard(mut self) -> Result<(), StoreError> {
        let _remove = RemoveOnDrop(self.file.clone());
        let behind = self.connection().await.map(|_| ());
        let Link::Ready(mut connection) = std::mem::replace(&mut self.link, Link::Lost) else {
            return behind;
        };
        let _ = run(&mut connection, "ROLLBACK").await;
        let detached = run(&mut connection, "DETACH DATABASE scratch").await;
        crate::close_quietly(connection).await;
        behind.and(detached)
    }
}
