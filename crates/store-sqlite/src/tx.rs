//! The writer's transaction: appends, projection rows, positions, shadows.

use crate::ddl::{self, Copy, SHADOW_SUFFIX};
use crate::error::map;
use crate::rows;
use opledger_domain::projections::{all_specs, Cell, ProjectionSpec, Row, RowKey, TableSpec};
use opledger_domain::EventEnvelope;
use opledger_store::{ClaimQuery, ExpectedVersion, Lease, RowTarget, StoreError, StreamAppend, TableSet, WriteTx};
use sqlx::{Row as _, SqliteConnection};
use std::collections::BTreeMap;

/// Rows per multi-row INSERT into the log (10 parameters each).
const EVENTS_PER_STATEMENT: usize = 90;

/// The writer connection while it holds a transaction.
pub struct SqliteTx {
    connection: SqliteConnection,
    /// The log head as of this transaction, once read.
    head: Option<i64>,
    /// Every projection's (version, position) as of this transaction, once
    /// read. Safe to cache: the writer holds the write lock, so only this
    /// transaction can change them until it commits.
    positions: Option<BTreeMap<String, (i64, i64)>>,
    tables: TableSet,
    /// Writes gathered since the last read, sent in one round trip before
    /// the next read, the position update, or the end of the piece of work.
    pending: rows::Batch,
}

/// What `restore` needs to undo a rolled-back piece of work's cached state.
pub(crate) struct Checkpoint {
    head: Option<i64>,
    positions: Option<BTreeMap<String, (i64, i64)>>,
}

impl SqliteTx {
    pub(crate) fn new(connection: SqliteConnection) -> Self {
        SqliteTx {
            connection,
            head: None,
            positions: None,
            tables: TableSet::Live,
            pending: rows::Batch::default(),
        }
    }

    pub(crate) fn connection(&mut self) -> &mut SqliteConnection {
        &mut self.connection
    }

    pub(crate) fn into_connection(self) -> SqliteConnection {
        self.connection
    }

    /// Forgets cached state at the start of a transaction: another process
    /// may have appended since.
    pub(crate) fn begin_transaction(&mut self) {
        self.head = None;
        self.positions = None;
        self.tables = TableSet::Live;
    }

    pub(crate) fn checkpoint(&mut self) -> Checkpoint {
        self.tables = TableSet::Live;
        Checkpoint {
            head: self.head,
            positions: self.positions.clone(),
        }
    }

    pub(crate) fn restore(&mut self, checkpoint: Checkpoint) {
        self.head = checkpoint.head;
        self.positions = checkpoint.positions;
        self.tables = TableSet::Live;
        self.pending.clear();
    }

    /// Adds a parameterless statement to the gathered writes (savepoint
    /// bookkeeping rides along with a piece's last flush).
    pub(crate) fn defer(&mut self, sql: &str) {
        self.pending.push(sql, |_| {});
    }

    /// Sends the gathered writes. Every read calls this first, so a piece of
    /// work always reads its own writes.
    pub(crate) async fn flush(&mut self) -> Result<(), StoreError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.pending.run(&mut self.connection, "writing to the database").await
    }

    fn copy(&self) -> Copy<'static> {
        match self.tables {
            TableSet::Live => Copy::Live,
            TableSet::Shadow => Copy::Shadow,
        }
    }

    async fn current_head(&mut self) -> Result<i64, StoreError> {
        if let Some(head) = self.head {
            return Ok(head);
        }
        self.flush().await?;
        let head = sqlx::query_scalar::<_, i64>("SELECT COALESCE(MAX(seq), 0) FROM media_operation_events")
            .fetch_one(&mut self.connection)
            .await
            .map_err(|error| map(error, "reading the log head"))?;
        self.head = Some(head);
        Ok(head)
    }

    /// Every projection's (version, position), from the cache or the database.
    async fn projection_positions(&mut self) -> Result<BTreeMap<String, (i64, i64)>, StoreError> {
        if let Some(positions) = &self.positions {
            return Ok(positions.clone());
        }
        self.flush().await?;
        let rows: Vec<(String, i64, i64)> = sqlx::query_as("SELECT name, version, position FROM projection_positions")
            .fetch_all(&mut self.connection)
            .await
            .map_err(|error| map(error, "reading projection positions"))?;
        let positions: BTreeMap<String, (i64, i64)> = rows
            .into_iter()
            .map(|(name, version, position)| (name, (version, position)))
            .collect();
        self.positions = Some(positions.clone());
        Ok(positions)
    }

    /// The current version of each stream (absent: 0), and the log head,
    /// read together in as few round trips as possible.
    async fn stream_versions(&mut self, streams: &[&str]) -> Result<BTreeMap<String, i64>, StoreError> {
        self.flush().await?;
        let mut versions = BTreeMap::new();
        for chunk in streams.chunks(500) {
            // The head and the projection positions ride along with the
            // first query of the transaction: one round trip instead of three.
            let head_part = if self.head.is_none() {
                " UNION ALL SELECT NULL, COALESCE(MAX(seq), 0), 0 FROM media_operation_events"
            } else {
                ""
            };
            let positions_part = if self.positions.is_none() {
                self.positions = Some(BTreeMap::new());
                " UNION ALL SELECT name, position, version + 1 FROM projection_positions"
            } else {
                ""
            };
            let sql = format!(
                "SELECT stream_id, MAX(stream_version), 0 FROM media_operation_events \
                 WHERE stream_id IN ({}) GROUP BY stream_id{head_part}{positions_part}",
                vec!["?"; chunk.len()].join(", ")
            );
            let mut query = sqlx::query(&sql);
            for stream in chunk {
                query = query.bind(*stream);
            }
            for row in query
                .fetch_all(&mut self.connection)
                .await
                .map_err(|error| map(error, "reading stream versions"))?
            {
                // The third column tells the parts apart: 0 for streams and
                // the head, version + 1 (always > 0) for projection positions.
                let tag: i64 = row.get(2);
                match (row.get::<Option<String>, _>(0), tag) {
                    (Some(name), tag) if tag > 0 => {
                        if let Some(positions) = self.positions.as_mut() {
                            positions.insert(name, (tag - 1, row.get::<i64, _>(1)));
                        }
                    }
                    (Some(stream), _) => {
                        versions.insert(stream, row.get::<i64, _>(1));
                    }
                    (None, _) => self.head = Some(row.get::<i64, _>(1)),
                }
            }
        }
        Ok(versions)
    }
}

impl RowTarget for SqliteTx {
    async fn load_rows(&mut self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        self.flush().await?;
        let copy = self.copy();
        rows::load(&mut self.connection, table, copy, keys).await
    }

    async fn write_rows(&mut self, changes: &[(RowKey, Option<Row>)]) -> Result<(), StoreError> {
        let order: Vec<&'static TableSpec> = all_specs()
            .iter()
            .flat_map(|spec| spec.tables.iter().copied())
            .collect();
        let copy = self.copy();
        rows::gather_writes(&mut self.pending, &order, copy, changes);
        Ok(())
    }
}

impl WriteTx for SqliteTx {
    async fn append(&mut self, appends: Vec<StreamAppend>) -> Result<Vec<EventEnvelope>, StoreError> {
        let streams: Vec<&str> = appends.iter().map(|append| append.stream_id.as_str()).collect();
        let mut versions = self.stream_versions(&streams).await?;
        // Check every expectation before writing anything, so a refusal
        // leaves the log untouched.
        for append in &appends {
            let current = versions.get(append.stream_id.as_str()).copied().unwrap_or(0);
            let expected_ok = match append.expected {
                ExpectedVersion::Any => true,
                ExpectedVersion::NoStream => current == 0,
                ExpectedVersion::Exactly(version) => current == version,
            };
            if !expected_ok {
                return Err(StoreError::conflict(format!(
                    "stream {} is at version {current}, the append expected {:?}",
                    append.stream_id, append.expected
                )));
            }
        }
        let head = self.current_head().await?;
        let mut envelopes = Vec::new();
        let mut seq = head;
        for append in appends {
            let version = versions.entry(append.stream_id.as_str().to_string()).or_insert(0);
            for new_event in append.events {
                seq += 1;
                *version += 1;
                envelopes.push(EventEnvelope {
                    seq,
                    stream_id: append.stream_id.clone(),
                    stream_version: *version,
                    schema_version: new_event.event.schema_version(),
                    recorded_at: new_event.recorded_at,
                    actor: new_event.actor,
                    correlation_id: new_event.correlation_id,
                    causation_id: new_event.causation_id,
                    event: new_event.event,
                });
            }
        }
        for chunk in envelopes.chunks(EVENTS_PER_STATEMENT) {
            let sql = format!(
                "INSERT INTO media_operation_events ({}) VALUES {}",
                rows::EVENT_COLUMNS,
                vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ")
            );
            self.pending.push(&sql, |args| {
                for envelope in chunk {
                    let cells = [
                        Cell::Integer(envelope.seq),
                        Cell::Text(envelope.stream_id.as_str().to_string()),
                        Cell::Integer(envelope.stream_version),
                        Cell::Text(envelope.event.event_type().to_string()),
                        Cell::Integer(i64::from(envelope.schema_version)),
                        Cell::Json(envelope.event.payload_json()),
                        Cell::Timestamp(envelope.recorded_at),
                        Cell::Text(envelope.actor.clone()),
                        Cell::Text(envelope.correlation_id.clone()),
                        envelope.causation_id.clone().map_or(Cell::Null, Cell::Text),
                    ];
                    for cell in &cells {
                        rows::add_cell(args, cell);
                    }
                }
            });
        }
        self.head = Some(seq);
        Ok(envelopes)
    }

    async fn advance_positions(&mut self, from: i64, to: i64) -> Result<(), StoreError> {
        let positions = self.projection_positions().await?;
        for spec in all_specs() {
            match positions.get(spec.name) {
                Some((version, position)) if *version == i64::from(spec.version) && *position == from => {}
                found => {
                    return Err(StoreError::conflict(format!(
                        "projection {} is at {found:?} (version, seq), not at seq {from} at version {}; \
                         the database was changed by another version of opledger or needs catching up (restart)",
                        spec.name, spec.version
                    )))
                }
            }
        }
        // Checked under the write lock, so the update cannot miss: it joins
        // the gathered writes instead of costing a round trip of its own.
        let specs = all_specs();
        let sql = format!(
            "UPDATE projection_positions SET position = ? WHERE position = ? AND name IN ({})",
            vec!["?"; specs.len()].join(", ")
        );
        self.pending.push(&sql, |args| {
            rows::add_cell(args, &Cell::Integer(to));
            rows::add_cell(args, &Cell::Integer(from));
            for spec in &specs {
                rows::add_cell(args, &Cell::Text(spec.name.to_string()));
            }
        });
        if let Some(positions) = self.positions.as_mut() {
            for spec in all_specs() {
                if let Some(entry) = positions.get_mut(spec.name) {
                    entry.1 = to;
                }
            }
        }
        Ok(())
    }

    async fn advance_position(&mut self, spec: &'static ProjectionSpec, from: i64, to: i64) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        self.flush().await?;
        let updated =
            sqlx::query("UPDATE projection_positions SET position = ? WHERE name = ? AND version = ? AND position = ?")
                .bind(to)
                .bind(spec.name)
                .bind(i64::from(spec.version))
                .bind(from)
                .execute(&mut self.connection)
                .await
                .map_err(|error| map(error, "advancing a projection position"))?
                .rows_affected();
        if updated != 1 {
            return Err(StoreError::conflict(format!(
                "projection {} is not at seq {from} at version {}",
                spec.name, spec.version
            )));
        }
        Ok(())
    }

    async fn projection_position(&mut self, spec: &'static ProjectionSpec) -> Result<Option<i64>, StoreError> {
        self.flush().await?;
        sqlx::query_scalar::<_, i64>("SELECT position FROM projection_positions WHERE name = ? AND version = ?")
            .bind(spec.name)
            .bind(i64::from(spec.version))
            .fetch_optional(&mut self.connection)
            .await
            .map_err(|error| map(error, "reading a projection position"))
    }

    fn use_tables(&mut self, set: TableSet) {
        self.tables = set;
    }

    async fn read_events(&mut self, after: i64, limit: usize) -> Result<Vec<EventEnvelope>, StoreError> {
        self.flush().await?;
        rows::read_events(&mut self.connection, after, limit).await
    }

    async fn head(&mut self) -> Result<i64, StoreError> {
        self.current_head().await
    }

    async fn create_shadow(&mut self, spec: &'static ProjectionSpec) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        self.flush().await?;
        for table in spec.tables.iter().rev() {
            let sql = format!("DROP TABLE IF EXISTS {}", ddl::table_name(table.name, Copy::Shadow));
            crate::rows::script(&mut self.connection, &sql)
                .await
                .map_err(|error| map(error, "dropping an old shadow"))?;
        }
        crate::rows::script(&mut self.connection, &ddl::render(spec, Copy::Shadow))
            .await
            .map_err(|error| map(error, &format!("creating the shadow of {}", spec.name)))?;
        sqlx::query(
            "INSERT INTO projection_positions (name, version, position) VALUES (?, ?, 0) \
             ON CONFLICT (name) DO UPDATE SET version = excluded.version, position = 0",
        )
        .bind(format!("{}{SHADOW_SUFFIX}", spec.name))
        .bind(i64::from(spec.version))
        .execute(&mut self.connection)
        .await
        .map_err(|error| map(error, "recording the shadow position"))?;
        Ok(())
    }

    async fn shadow_position(&mut self, spec: &'static ProjectionSpec) -> Result<Option<i64>, StoreError> {
        self.flush().await?;
        sqlx::query_scalar::<_, i64>("SELECT position FROM projection_positions WHERE name = ? AND version = ?")
            .bind(format!("{}{SHADOW_SUFFIX}", spec.name))
            .bind(i64::from(spec.version))
            .fetch_optional(&mut self.connection)
            .await
            .map_err(|error| map(error, "reading the shadow position"))
    }

    async fn set_shadow_position(&mut self, spec: &'static ProjectionSpec, position: i64) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        self.flush().await?;
        sqlx::query("UPDATE projection_positions SET position = ? WHERE name = ?")
            .bind(position)
            .bind(format!("{}{SHADOW_SUFFIX}", spec.name))
            .execute(&mut self.connection)
            .await
            .map_err(|error| map(error, "recording the shadow position"))?;
        Ok(())
    }

    async fn swap_shadows(&mut self, specs: &[&'static ProjectionSpec]) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        self.flush().await?;
        let mut shadow_positions = Vec::new();
        for spec in specs {
            let position = self
                .shadow_position(spec)
                .await?
                .ok_or_else(|| StoreError::not_found(format!("no shadow of {} to swap in", spec.name)))?;
            shadow_positions.push((*spec, position));
        }
        let tables: Vec<&'static TableSpec> = specs.iter().flat_map(|spec| spec.tables.iter().copied()).collect();
        let mut script = vec!["PRAGMA defer_foreign_keys = ON".to_string()];
        // Children first (the family's dependents, then each projection's
        // child tables), so dropping a parent cascades into nothing.
        for table in tables.iter().rev() {
            script.push(format!("DROP TABLE IF EXISTS {}", table.name));
        }
        // Parents first: renaming a parent rewrites its children's references.
        for table in &tables {
            script.push(format!(
                "ALTER TABLE {} RENAME TO {}",
                ddl::table_name(table.name, Copy::Shadow),
                table.name
            ));
        }
        for sql in script {
            crate::rows::script(&mut self.connection, &sql)
                .await
                .map_err(|error| map(error, &format!("swapping in shadows: {sql}")))?;
        }
        // Indexes keep their shadow names through a rename; recreate them
        // under their live names so the next shadow can use the old ones.
        for table in &tables {
            let indexes: Vec<(String, String)> = sqlx::query_as(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL",
            )
            .bind(table.name)
            .fetch_all(&mut self.connection)
            .await
            .map_err(|error| map(error, "listing shadow indexes"))?;
            for (name, sql) in indexes {
                if let Some(live_name) = name.strip_prefix(&format!("{}{SHADOW_SUFFIX}", table.name)) {
                    let live_name = format!("{}{live_name}", table.name);
                    let create = sql.replacen(&name, &live_name, 1);
                    crate::rows::script(&mut self.connection, &format!("DROP INDEX {name}; {create}"))
                        .await
                        .map_err(|error| map(error, "renaming a shadow index"))?;
                }
            }
        }
        for (spec, position) in shadow_positions {
            sqlx::query("DELETE FROM projection_positions WHERE name = ?")
                .bind(format!("{}{SHADOW_SUFFIX}", spec.name))
                .execute(&mut self.connection)
                .await
                .map_err(|error| map(error, "dropping the shadow position"))?;
            sqlx::query(
                "INSERT INTO projection_positions (name, version, position) VALUES (?, ?, ?) \
                 ON CONFLICT (name) DO UPDATE SET version = excluded.version, position = excluded.position",
            )
            .bind(spec.name)
            .bind(i64::from(spec.version))
            .bind(position)
            .execute(&mut self.connection)
            .await
            .map_err(|error| map(error, "recording the swapped projection"))?;
        }
        Ok(())
    }

    async fn find_rows(
        &mut self,
        table: &'static TableSpec,
        filters: &[(&'static str, Cell)],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        self.flush().await?;
        let copy = self.copy();
        rows::find(&mut self.connection, table, copy, filters, limit).await
    }

    async fn claimable(&mut self, query: &ClaimQuery) -> Result<Vec<Row>, StoreError> {
        self.flush().await?;
        let copy = self.copy();
        crate::work::claimable(&mut self.connection, copy, query).await
    }

    async fn lease(&mut self, claim_token: &str) -> Result<Option<Lease>, StoreError> {
        self.flush().await?;
        crate::work::lease(&mut self.connection, claim_token).await
    }

    async fn leases(&mut self, claim_tokens: &[String]) -> Result<Vec<Lease>, StoreError> {
        self.flush().await?;
        crate::work::leases(&mut self.connection, claim_tokens).await
    }

    async fn find_rows_in(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        values: &[Cell],
    ) -> Result<Vec<Row>, StoreError> {
        self.flush().await?;
        let copy = self.copy();
        rows::find_in(&mut self.connection, table, copy, column, values).await
    }

    async fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        crate::work::gather_put_lease(&mut self.pending, lease);
        Ok(())
    }

    async fn delete_lease(&mut self, claim_token: &str) -> Result<(), StoreError> {
        crate::work::gather_delete_lease(&mut self.pending, claim_token);
        Ok(())
    }
}

/// Creates the live tables of every projection the database has never had,
/// at this build's version and position 0 (startup catches them up).
/// Projections stored at another version are left for the shadow rebuild.
pub(crate) async fn ensure_projection_tables(connection: &mut SqliteConnection) -> Result<(), StoreError> {
    crate::rows::script(&mut *connection, "BEGIN IMMEDIATE")
        .await
        .map_err(|error| map(error, "starting schema setup"))?;
    let result = async {
        for spec in all_specs() {
            let known: Option<i64> = sqlx::query_scalar("SELECT version FROM projection_positions WHERE name = ?")
                .bind(spec.name)
                .fetch_optional(&mut *connection)
                .await
                .map_err(|error| map(error, "reading projection versions"))?;
            if known.is_none() {
                crate::rows::script(&mut *connection, &ddl::render(spec, Copy::Live))
                    .await
                    .map_err(|error| map(error, &format!("creating projection {}", spec.name)))?;
                sqlx::query("INSERT INTO projection_positions (name, version, position) VALUES (?, ?, 0)")
                    .bind(spec.name)
                    .bind(i64::from(spec.version))
                    .execute(&mut *connection)
                    .await
                    .map_err(|error| map(error, "recording a new projection"))?;
            }
        }
        Ok::<_, StoreError>(())
    }
    .await;
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    crate::rows::script(&mut *connection, end)
        .await
        .map_err(|error| map(error, "finishing schema setup"))?;
    result
}
