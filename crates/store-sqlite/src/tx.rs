//! The writer's transaction: appends, projection rows, positions, shadows.
//!
//! Every method is a direct call into SQLite on the writer thread's own
//! connection (`writer_connection.rs`): the `async fn`s the store traits ask
//! for finish without ever waiting, so the writer polls a piece of work to
//! completion in one go. Writes run at once, so every read sees the piece's
//! own writes.
//!
//! *The `_now` methods:* a trait method whose body is more than one call
//! has that body written as a plain method of the same name with `_now`
//! appended (`append_now`, `advance_positions_now`, …), and the `async fn`
//! only calls it. The name and the plain signature say what the trait's
//! signature cannot: the work is done when the call returns. What each
//! backend shares of that work (the append plan, the position check) is in
//! `opledger_store`; what is left here is SQLite's statements.

use crate::ddl::{self, Copy, SHADOW_SUFFIX};
use crate::writer_connection;
use opledger_domain::projections::{all_specs, Cell, ProjectionSpec, Row, RowChange, TableSpec};
use opledger_domain::{EventEnvelope, Timestamp};
use opledger_store::append::LogHead;
use opledger_store::positions::{self, Positions};
use opledger_store::{
    append, ClaimQuery, CommandRecord, Lease, RowTarget, StoreError, StreamAppend, TableSet, TimeSource, Verification,
    WriteTx,
};
use rusqlite::Connection;
use std::collections::BTreeMap;

/// The writer connection while it holds a transaction.
pub struct SqliteTx {
    pub(crate) connection: Connection,
    /// The log head, its chain link and time as of this transaction, once read.
    head: Option<LogHead>,
    /// Every projection's (version, position) as of this transaction, once
    /// read. Safe to cache: the writer holds the write lock, so only this
    /// transaction can change them until it commits.
    positions: Option<Positions>,
    tables: TableSet,
    /// The first failed write of the current piece of work. The piece fails
    /// with it even if the work went on regardless, as it did when writes
    /// were gathered and sent at the end of the piece.
    failed: Option<StoreError>,
}

/// What `restore` needs to undo a rolled-back piece of work's cached state.
pub(crate) struct Checkpoint {
    head: Option<LogHead>,
    positions: Option<Positions>,
}

impl SqliteTx {
    pub(crate) fn new(connection: Connection) -> Self {
        SqliteTx {
            connection,
            head: None,
            positions: None,
            tables: TableSet::Live,
            failed: None,
        }
    }

    /// Runs one parameterless statement: the writer's transaction and
    /// savepoint control.
    pub(crate) fn execute(&self, sql: &str) -> Result<(), StoreError> {
        writer_connection::execute(&self.connection, sql)
    }

    /// Rolls back whatever transaction is open; errors are moot, the
    /// transaction is being abandoned either way.
    pub(crate) fn rollback_quietly(&self) {
        if !self.connection.is_autocommit() {
            let _ = self.execute("ROLLBACK");
        }
    }

    /// Forgets cached state at the start of a transaction: another process
    /// may have appended since.
    pub(crate) fn begin_transaction(&mut self) {
        self.head = None;
        self.positions = None;
        self.tables = TableSet::Live;
        self.failed = None;
    }

    pub(crate) fn checkpoint(&mut self) -> Checkpoint {
        self.tables = TableSet::Live;
        self.failed = None;
        Checkpoint {
            head: self.head,
            positions: self.positions.clone(),
        }
    }

    pub(crate) fn restore(&mut self, checkpoint: Checkpoint) {
        self.head = checkpoint.head;
        self.positions = checkpoint.positions;
        self.tables = TableSet::Live;
        self.failed = None;
    }

    /// The failed write of the piece that just ran, if any.
    pub(crate) fn take_failure(&mut self) -> Result<(), StoreError> {
        match self.failed.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Passes a write's result on, remembering a failure for the end of the piece.
    fn wrote(&mut self, result: Result<(), StoreError>) -> Result<(), StoreError> {
        if let Err(error) = &result {
            self.failed.get_or_insert_with(|| error.clone());
        }
        result
    }

    fn copy(&self) -> Copy<'static> {
        self.tables.into()
    }

    /// The last event and its link. Cached for the transaction: the writer
    /// holds the write lock, and each piece of a group appends after the
    /// head the piece before it left (a rolled-back piece's head is
    /// restored with its checkpoint), so every event links to its true
    /// predecessor by seq.
    fn current_head(&mut self) -> Result<LogHead, StoreError> {
        if let Some(head) = self.head {
            return Ok(head);
        }
        let head = crate::chain::head(&self.connection)?;
        self.head = Some(head);
        Ok(head)
    }

    /// Every projection's (version, position), from the cache or the database.
    fn projection_positions(&mut self) -> Result<&Positions, StoreError> {
        if self.positions.is_none() {
            let mut positions = BTreeMap::new();
            writer_connection::select(
                &self.connection,
                "SELECT name, version, position FROM projection_positions",
                &[],
                "reading projection positions",
                |row| {
                    let read = (|| Ok::<_, rusqlite::Error>((row.get(0)?, (row.get(1)?, row.get(2)?))))();
                    let (name, entry) =
                        read.map_err(|error| crate::error::map_rusqlite(error, "reading projection positions"))?;
                    positions.insert(name, entry);
                    Ok(())
                },
            )?;
            self.positions = Some(positions);
        }
        Ok(self.positions.get_or_insert_with(BTreeMap::new))
    }

    /// The current version of each stream that exists (absent: 0): one
    /// statement for all of them, each stream one indexed look-up (the
    /// subquery keeps SQLite's min/max seek, where `GROUP BY` would read a
    /// long stream's every entry). *Why one statement:* an append of a
    /// hundred events names about twenty streams; one statement instead of
    /// twenty took the writer's statement time for 1,000 such appends from
    /// 439–464 ms to 437–452 ms.
    fn stream_versions(&mut self, streams: &[&str]) -> Result<BTreeMap<String, i64>, StoreError> {
        let unique: Vec<&str> = streams
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<&str>>()
            .into_iter()
            .collect();
        let mut versions = BTreeMap::new();
        for chunk in unique.chunks(crate::rows::MAX_PARAMS) {
            let sql = format!(
                "SELECT v.column1, (SELECT MAX(stream_version) FROM media_operation_events \
                 WHERE stream_id = v.column1) FROM (VALUES {}) AS v",
                vec!["(?)"; chunk.len()].join(", ")
            );
            let cells: Vec<Cell> = chunk.iter().map(|stream| Cell::Text(stream.to_string())).collect();
            let context = "reading stream versions";
            writer_connection::select(&self.connection, &sql, &cells, context, |row| {
                let read = |error| crate::error::map_rusqlite(error, context);
                let stream: String = row.get(0).map_err(read)?;
                if let Some(version) = row.get::<_, Option<i64>>(1).map_err(read)? {
                    versions.insert(stream, version);
                }
                Ok(())
            })?;
        }
        Ok(versions)
    }

    fn append_now(&mut self, appends: Vec<StreamAppend>) -> Result<Vec<EventEnvelope>, StoreError> {
        let streams: Vec<&str> = appends.iter().map(|append| append.stream_id.as_str()).collect();
        let versions = self.stream_versions(&streams)?;
        let head = self.current_head()?;
        let planned = append::plan(head, versions, appends)?;
        let inserted = writer_connection::insert_events(&self.connection, &planned);
        self.wrote(inserted)?;
        self.head = Some(planned.head);
        Ok(planned.envelopes)
    }

    fn advance_positions_now(&mut self, from: i64, to: i64) -> Result<(), StoreError> {
        positions::check_all_at(self.projection_positions()?, from)?;
        // Checked under the write lock, so the update cannot miss.
        let specs = all_specs();
        let sql = format!(
            "UPDATE projection_positions SET position = ? WHERE position = ? AND name IN ({})",
            vec!["?"; specs.len()].join(", ")
        );
        let mut cells = vec![Cell::Integer(to), Cell::Integer(from)];
        cells.extend(specs.iter().map(|spec| Cell::Text(spec.name.to_string())));
        let updated = writer_connection::execute_with(&self.connection, &sql, &cells, "advancing projection positions");
        self.wrote(updated.map(|_| ()))?;
        if let Some(cached) = self.positions.as_mut() {
            positions::move_all(cached, to);
        }
        Ok(())
    }

    fn advance_position_now(&mut self, spec: &'static ProjectionSpec, from: i64, to: i64) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        let updated = writer_connection::execute_with(
            &self.connection,
            "UPDATE projection_positions SET position = ? WHERE name = ? AND version = ? AND position = ?",
            &[
                Cell::Integer(to),
                Cell::Text(spec.name.to_string()),
                Cell::Integer(i64::from(spec.version)),
                Cell::Integer(from),
            ],
            "advancing a projection position",
        )?;
        if updated != 1 {
            return Err(StoreError::conflict(format!(
                "projection {} is not at seq {from} at version {}",
                spec.name, spec.version
            )));
        }
        Ok(())
    }

    /// The stored position of `name` at `version`, if any.
    fn position_of(&self, name: String, version: u32, context: &str) -> Result<Option<i64>, StoreError> {
        writer_connection::select_optional::<i64>(
            &self.connection,
            "SELECT position FROM projection_positions WHERE name = ? AND version = ?",
            &[Cell::Text(name), Cell::Integer(i64::from(version))],
            context,
        )
    }

    fn create_shadow_now(&mut self, spec: &'static ProjectionSpec) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        for table in spec.tables.iter().rev() {
            let sql = format!("DROP TABLE IF EXISTS {}", ddl::table_name(table.name, Copy::Shadow));
            writer_connection::script(&self.connection, &sql, "dropping an old shadow")?;
        }
        writer_connection::script(
            &self.connection,
            &ddl::render(spec, Copy::Shadow),
            &format!("creating the shadow of {}", spec.name),
        )?;
        writer_connection::execute_with(
            &self.connection,
            "INSERT INTO projection_positions (name, version, position) VALUES (?, ?, 0) \
             ON CONFLICT (name) DO UPDATE SET version = excluded.version, position = 0",
            &[
                Cell::Text(format!("{}{SHADOW_SUFFIX}", spec.name)),
                Cell::Integer(i64::from(spec.version)),
            ],
            "recording the shadow position",
        )?;
        Ok(())
    }

    fn set_shadow_position_now(&mut self, spec: &'static ProjectionSpec, position: i64) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        writer_connection::execute_with(
            &self.connection,
            "UPDATE projection_positions SET position = ? WHERE name = ?",
            &[
                Cell::Integer(position),
                Cell::Text(format!("{}{SHADOW_SUFFIX}", spec.name)),
            ],
            "recording the shadow position",
        )?;
        Ok(())
    }

    fn swap_shadows_now(&mut self, specs: &[&'static ProjectionSpec]) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        let mut shadow_positions = Vec::new();
        for spec in specs {
            let position = self
                .position_of(
                    format!("{}{SHADOW_SUFFIX}", spec.name),
                    spec.version,
                    "reading the shadow position",
                )?
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
            writer_connection::script(&self.connection, &sql, &format!("swapping in shadows: {sql}"))?;
        }
        // Indexes keep their shadow names through a rename; recreate them
        // under their live names so the next shadow can use the old ones.
        for table in &tables {
            let mut indexes: Vec<(String, String)> = Vec::new();
            writer_connection::select(
                &self.connection,
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL",
                &[Cell::Text(table.name.to_string())],
                "listing shadow indexes",
                |row| {
                    let read = (|| Ok::<_, rusqlite::Error>((row.get(0)?, row.get(1)?)))();
                    indexes.push(read.map_err(|error| crate::error::map_rusqlite(error, "listing shadow indexes"))?);
                    Ok(())
                },
            )?;
            for (name, sql) in indexes {
                if let Some(live_name) = name.strip_prefix(&format!("{}{SHADOW_SUFFIX}", table.name)) {
                    let live_name = format!("{}{live_name}", table.name);
                    let create = sql.replacen(&name, &live_name, 1);
                    writer_connection::script(
                        &self.connection,
                        &format!("DROP INDEX {name}; {create}"),
                        "renaming a shadow index",
                    )?;
                }
            }
        }
        for (spec, position) in shadow_positions {
            writer_connection::execute_with(
                &self.connection,
                "DELETE FROM projection_positions WHERE name = ?",
                &[Cell::Text(format!("{}{SHADOW_SUFFIX}", spec.name))],
                "dropping the shadow position",
            )?;
            writer_connection::execute_with(
                &self.connection,
                "INSERT INTO projection_positions (name, version, position) VALUES (?, ?, ?) \
                 ON CONFLICT (name) DO UPDATE SET version = excluded.version, position = excluded.position",
                &[
                    Cell::Text(spec.name.to_string()),
                    Cell::Integer(i64::from(spec.version)),
                    Cell::Integer(position),
                ],
                "recording the swapped projection",
            )?;
        }
        Ok(())
    }
}

impl RowTarget for SqliteTx {
    async fn load_rows(&mut self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        writer_connection::load(&self.connection, table, self.copy(), keys)
    }

    async fn load_rows_where(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        value: &Cell,
    ) -> Result<Vec<Row>, StoreError> {
        writer_connection::find(
            &self.connection,
            table,
            self.copy(),
            &[(column, value.clone())],
            usize::MAX,
        )
    }

    async fn write_rows(&mut self, changes: &[RowChange]) -> Result<(), StoreError> {
        let order: Vec<&'static TableSpec> = all_specs()
            .iter()
            .flat_map(|spec| spec.tables.iter().copied())
            .collect();
        let written = writer_connection::write_rows(&self.connection, &order, self.copy(), changes);
        self.wrote(written)
    }
}

impl WriteTx for SqliteTx {
    async fn append(&mut self, appends: Vec<StreamAppend>) -> Result<Vec<EventEnvelope>, StoreError> {
        self.append_now(appends)
    }

    async fn advance_positions(&mut self, from: i64, to: i64) -> Result<(), StoreError> {
        self.advance_positions_now(from, to)
    }

    async fn advance_position(&mut self, spec: &'static ProjectionSpec, from: i64, to: i64) -> Result<(), StoreError> {
        self.advance_position_now(spec, from, to)
    }

    async fn projection_position(&mut self, spec: &'static ProjectionSpec) -> Result<Option<i64>, StoreError> {
        self.position_of(spec.name.to_string(), spec.version, "reading a projection position")
    }

    fn use_tables(&mut self, set: TableSet) {
        self.tables = set;
    }

    async fn read_events(&mut self, after: i64, limit: usize) -> Result<Vec<EventEnvelope>, StoreError> {
        writer_connection::read_events(&self.connection, after, limit)
    }

    async fn head(&mut self) -> Result<i64, StoreError> {
        self.current_head().map(|head| head.seq())
    }

    async fn command_time(&mut self, caller: Timestamp, _source: TimeSource) -> Result<Timestamp, StoreError> {
        // Embedded in one process: the caller's clock is the ledger's.
        let head = self.current_head()?;
        Ok(append::command_time(&head, caller))
    }

    async fn create_shadow(&mut self, spec: &'static ProjectionSpec) -> Result<(), StoreError> {
        self.create_shadow_now(spec)
    }

    async fn shadow_position(&mut self, spec: &'static ProjectionSpec) -> Result<Option<i64>, StoreError> {
        self.position_of(
            format!("{}{SHADOW_SUFFIX}", spec.name),
            spec.version,
            "reading the shadow position",
        )
    }

    async fn set_shadow_position(&mut self, spec: &'static ProjectionSpec, position: i64) -> Result<(), StoreError> {
        self.set_shadow_position_now(spec, position)
    }

    async fn swap_shadows(&mut self, specs: &[&'static ProjectionSpec]) -> Result<(), StoreError> {
        self.swap_shadows_now(specs)
    }

    async fn find_rows(
        &mut self,
        table: &'static TableSpec,
        filters: &[(&'static str, Cell)],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        writer_connection::find(&self.connection, table, self.copy(), filters, limit)
    }

    async fn claimable(&mut self, query: &ClaimQuery) -> Result<Vec<Row>, StoreError> {
        writer_connection::claimable(&self.connection, self.copy(), query)
    }

    async fn lease(&mut self, claim_token: &str) -> Result<Option<Lease>, StoreError> {
        writer_connection::lease(&self.connection, claim_token)
    }

    async fn leases(&mut self, claim_tokens: &[String]) -> Result<Vec<Lease>, StoreError> {
        writer_connection::leases(&self.connection, claim_tokens)
    }

    async fn find_rows_in(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        values: &[Cell],
    ) -> Result<Vec<Row>, StoreError> {
        writer_connection::find_in(&self.connection, table, self.copy(), column, values)
    }

    async fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        let written = writer_connection::put_lease(&self.connection, lease);
        self.wrote(written)
    }

    async fn delete_lease(&mut self, claim_token: &str) -> Result<(), StoreError> {
        let written = writer_connection::delete_lease(&self.connection, claim_token);
        self.wrote(written)
    }

    async fn record_verification(&mut self, verification: &Verification) -> Result<(), StoreError> {
        let written = crate::chain::record_verification(&self.connection, verification);
        self.wrote(written)
    }

    async fn command_record(&mut self, request_id: &str) -> Result<Option<CommandRecord>, StoreError> {
        crate::requests::command_record(&self.connection, request_id)
    }

    async fn record_command(&mut self, record: &CommandRecord) -> Result<(), StoreError> {
        let written = crate::requests::record_command(&self.connection, record);
        self.wrote(written)
    }

    async fn forget_commands(&mut self, recorded_before: Timestamp, limit: usize) -> Result<u64, StoreError> {
        let forgotten = crate::requests::forget_commands(&self.connection, recorded_before, limit);
        if let Err(error) = &forgotten {
            self.failed.get_or_insert_with(|| error.clone());
        }
        forgotten
    }
}

/// Creates the live tables of every projection the database has never had,
/// at this build's version and position 0 (startup catches them up).
/// Projections stored at another version are left for the shadow rebuild.
/// Runs on the writer's connection before it takes any work.
pub(crate) fn ensure_projection_tables(connection: &Connection) -> Result<(), StoreError> {
    writer_connection::execute(connection, "BEGIN IMMEDIATE")?;
    let result = (|| {
        for spec in all_specs() {
            let known = writer_connection::select_optional::<i64>(
                connection,
                "SELECT version FROM projection_positions WHERE name = ?",
                &[Cell::Text(spec.name.to_string())],
                "reading projection versions",
            )?;
            if known.is_none() {
                writer_connection::script(
                    connection,
                    &ddl::render(spec, Copy::Live),
                    &format!("creating projection {}", spec.name),
                )?;
                writer_connection::execute_with(
                    connection,
                    "INSERT INTO projection_positions (name, version, position) VALUES (?, ?, 0)",
                    &[
                        Cell::Text(spec.name.to_string()),
                        Cell::Integer(i64::from(spec.version)),
                    ],
                    "recording a new projection",
                )?;
            }
        }
        Ok::<_, StoreError>(())
    })();
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    writer_connection::execute(connection, end)?;
    result
}
