//! The write transaction: appends, projection rows, positions, shadows.
//!
//! Every write transaction begins by taking one transaction-level advisory
//! lock ([`APPEND_LOCK`]), so write transactions run one at a time per
//! database, across every connection, process and host, as SQLite's single
//! writer does. That is what makes `seq` gap-free and in commit order as
//! readers see it, and lets the work read, decide and write on state no
//! other writer can change before it commits (see the crate docs).

use crate::batch::{Bind, Statement};
use crate::ddl::{self, Copy, SHADOW_SUFFIX};
use crate::error::map;
use crate::values::Values;
use crate::{chain, rows, work};
use opledger_domain::projections::{all_specs, Cell, ProjectionSpec, Row, RowChange, TableSpec};
use opledger_domain::{EventEnvelope, Timestamp};
use opledger_store::append::LogHead;
use opledger_store::positions::{self, Positions};
use opledger_store::{
    append, ClaimQuery, CommandRecord, Lease, RowTarget, StoreError, StreamAppend, TableSet, TimeSource, Verification,
    WriteTx,
};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres, Row as _};
use std::collections::BTreeMap;
use std::time::Instant;

/// The advisory lock key every write transaction holds (the bytes of
/// "opledger"). Advisory locks are per database, so databases on one server
/// do not contend.
pub const APPEND_LOCK: i64 = 0x6f70_6c65_6467_6572;

/// How long a write waits for the lock (or any other lock) before it
/// reports the database unavailable, as SQLite's busy timeout does.
const LOCK_TIMEOUT: &str = "30s";

/// The caches of a [`PostgresTx`] as a piece of a group found them.
pub(crate) struct Checkpoint {
    head: Option<LogHead>,
    positions: Option<Positions>,
    tables: TableSet,
}

/// A pooled connection while it holds a write transaction.
pub struct PostgresTx {
    /// Some until the transaction ends; a transaction dropped while open
    /// (its task cancelled) closes its connection, so the server rolls it
    /// back, instead of returning it to the pool mid-transaction.
    connection: Option<PoolConnection<Postgres>>,
    /// The log head and its chain link as of this transaction, once read.
    /// Safe to cache: the advisory lock keeps every other store writer out
    /// until we commit, so each append links to its true predecessor by
    /// seq (a piece undone restores the head it started from). With the
    /// head's time, which no append may go back before.
    head: Option<LogHead>,
    /// The server's clock as first read in this transaction (under the
    /// append lock), and when: later pieces of a group add the time passed
    /// since on this process's monotonic clock instead of another round
    /// trip.
    server_clock: Option<(Timestamp, Instant)>,
    /// Every projection's (version, position), once read (same reason).
    positions: Option<Positions>,
    tables: TableSet,
    /// Writes gathered and not sent yet: sent as one statement before a
    /// statement that could see them (`conn_reading`), at the end of each
    /// piece of a group and before COMMIT, so the work always reads its own
    /// writes.
    pending: Pending,
}

/// What a statement reads, for [`PostgresTx::conn_reading`].
#[derive(Clone, Copy)]
enum Reads {
    /// Projection rows only.
    Rows,
    /// Lease rows only.
    Leases,
    /// The event log only.
    Log,
    Everything,
}

/// What a [`PostgresTx`] has gathered to send as one statement (see
/// [`crate::batch`]).
#[derive(Default)]
struct Pending {
    /// The log inserts, as parts of the statement.
    events: Statement,
    /// Lease writes by claim token (None: delete), as of the last call for
    /// each token.
    leases: BTreeMap<String, Option<Lease>>,
    /// Projection row changes, and the copy of the tables they address.
    rows: Vec<RowChange>,
    rows_tables: Option<TableSet>,
    /// Every projection's position move (from, to) not written yet.
    positions: Option<(i64, i64)>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.events.is_empty() && self.leases.is_empty() && self.rows.is_empty() && self.positions.is_none()
    }

    /// The one statement that writes everything gathered.
    fn into_statement(self) -> Result<Statement, StoreError> {
        let Pending {
            mut events,
            leases,
            rows,
            rows_tables,
            positions,
        } = self;
        let statement = &mut events;
        let puts: Vec<&Lease> = leases.values().flatten().collect();
        let deletes: Vec<&str> = leases
            .iter()
            .filter(|(_, lease)| lease.is_none())
            .map(|(token, _)| token.as_str())
            .collect();
        work::push_leases(statement, &puts, &deletes);
        if !rows.is_empty() {
            let copy = match rows_tables {
                Some(TableSet::Shadow) => Copy::Shadow,
                _ => Copy::Live,
            };
            rows::push_row_changes(statement, &table_order(), copy, &rows)?;
        }
        if let Some((from, to)) = positions {
            let to = statement.param(Bind::Integer(to), "bigint");
            let from = statement.param(Bind::Integer(from), "bigint");
            let names = Values::Text(all_specs().iter().map(|spec| Some(spec.name.to_string())).collect());
            let names = statement.param(Bind::Array(names), "text[]");
            statement.push(format!(
                "UPDATE projection_positions SET position = {to} WHERE position = {from} AND name = ANY({names})"
            ));
        }
        Ok(events)
    }
}

/// Every projection table, parents before children.
fn table_order() -> Vec<&'static TableSpec> {
    all_specs()
        .iter()
        .flat_map(|spec| spec.tables.iter().copied())
        .collect()
}

impl Drop for PostgresTx {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            // Detached, the connection is closed on drop instead of pooled:
            // the server sees the socket end and rolls the transaction back.
            drop(connection.detach());
        }
    }
}

impl PostgresTx {
    /// Starts a write transaction on a pooled connection: BEGIN, the lock
    /// timeout and the advisory lock go in one round trip.
    pub(crate) async fn begin(pool: &PgPool) -> Result<Self, StoreError> {
        let connection = pool
            .acquire()
            .await
            .map_err(|error| map(error, "acquiring a write connection"))?;
        let mut tx = PostgresTx {
            connection: Some(connection),
            head: None,
            server_clock: None,
            positions: None,
            tables: TableSet::Live,
            pending: Pending::default(),
        };
        let begin = format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'; \
             SET LOCAL plan_cache_mode = force_generic_plan; SELECT pg_advisory_xact_lock({APPEND_LOCK})"
        );
        if let Err(error) = rows::script(tx.raw_conn(), &begin).await {
            // A lock timeout leaves a healthy connection in a failed
            // transaction: roll back and pool it (a broken one is closed).
            tx.rollback().await;
            return Err(map(error, "starting a write transaction"));
        }
        Ok(tx)
    }

    fn raw_conn(&mut self) -> &mut PgConnection {
        self.connection
            .as_deref_mut()
            .expect("the write transaction is open until commit or rollback")
    }

    /// The connection, once the gathered writes have been sent.
    pub(crate) async fn conn(&mut self) -> Result<&mut PgConnection, StoreError> {
        self.conn_reading(Reads::Everything).await
    }

    /// The connection for a statement that reads only `reads`: the
    /// gathered writes are sent first if that statement could see them
    /// (all of them together), and stay gathered otherwise, so a piece's
    /// reads of other tables do not split its writes into several round
    /// trips.
    async fn conn_reading(&mut self, reads: Reads) -> Result<&mut PgConnection, StoreError> {
        let pending = &self.pending;
        let send = match reads {
            Reads::Rows => !pending.rows.is_empty(),
            Reads::Leases => !pending.leases.is_empty(),
            Reads::Log => !pending.events.is_empty(),
            Reads::Everything => !pending.is_empty(),
        };
        if send {
            let statement = std::mem::take(&mut self.pending).into_statement()?;
            statement.execute(self.raw_conn(), "writing gathered changes").await?;
        }
        Ok(self.raw_conn())
    }

    /// The log head as this transaction last knew it (after its appends).
    pub(crate) fn known_head(&self) -> Option<i64> {
        self.head.map(|head| head.seq())
    }

    /// Opens the savepoint the first piece of a group runs in, after
    /// sending anything gathered before.
    pub(crate) async fn open_savepoint(&mut self) -> Result<(), StoreError> {
        let connection = self.conn().await?;
        rows::script(connection, "SAVEPOINT piece")
            .await
            .map_err(|error| map(error, "opening a savepoint"))
    }

    /// What a piece may change in this transaction's caches, as it starts.
    pub(crate) fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            head: self.head,
            positions: self.positions.clone(),
            tables: self.tables,
        }
    }

    /// Keeps a piece that succeeded: sends what it gathered (a refusal
    /// fails this piece, which can still be rolled back), then releases its
    /// savepoint and opens the next piece's in the same round trip. The
    /// last piece's savepoint is left to COMMIT.
    pub(crate) async fn keep_piece(&mut self, another_follows: bool) -> Result<(), StoreError> {
        let connection = self.conn().await?;
        if another_follows {
            rows::script(connection, "RELEASE SAVEPOINT piece; SAVEPOINT piece")
                .await
                .map_err(|error| map(error, "releasing a savepoint"))?;
        }
        Ok(())
    }

    /// Undoes a piece that failed: back to its savepoint in the database
    /// (which also clears a statement error that aborted the transaction)
    /// and in the caches. The savepoint stays, for the next piece.
    pub(crate) async fn undo_piece(&mut self, checkpoint: Checkpoint) -> Result<(), StoreError> {
        self.pending = Pending::default();
        self.head = checkpoint.head;
        self.positions = checkpoint.positions;
        self.tables = checkpoint.tables;
        rows::script(self.raw_conn(), "ROLLBACK TO SAVEPOINT piece")
            .await
            .map_err(|error| map(error, "rolling back to a savepoint"))
    }

    /// Sends the gathered writes and commits. The connection goes back to
    /// the pool only if the commit went through.
    pub(crate) async fn commit(mut self) -> Result<(), StoreError> {
        // A gathered write the database refuses fails the whole work.
        let flushed = self.conn().await.map(|_| ());
        if let Err(error) = flushed {
            self.rollback().await;
            return Err(error);
        }
        let result = rows::script(self.raw_conn(), "COMMIT").await;
        match result {
            Ok(()) => {
                // Returned to the pool only now that it holds no transaction.
                drop(self.connection.take());
                Ok(())
            }
            // Whether the commit happened is unknown when the connection
            // broke; Drop closes it rather than pooling it.
            Err(error) => Err(map(error, "committing")),
        }
    }

    /// Rolls back; a connection that cannot is closed instead of pooled.
    pub(crate) async fn rollback(mut self) {
        self.pending = Pending::default();
        if rows::script(self.raw_conn(), "ROLLBACK").await.is_ok() {
            drop(self.connection.take());
        }
    }

    fn copy(&self) -> Copy<'static> {
        self.tables.into()
    }

    async fn current_head(&mut self) -> Result<LogHead, StoreError> {
        if let Some(head) = self.head {
            return Ok(head);
        }
        type HeadRow = (i64, Option<String>, chrono::DateTime<chrono::Utc>);
        let row: Option<HeadRow> =
            sqlx::query_as("SELECT seq, chain_hash, recorded_at FROM media_operation_events ORDER BY seq DESC LIMIT 1")
                .fetch_optional(self.conn_reading(Reads::Log).await?)
                .await
                .map_err(|error| map(error, "reading the log head"))?;
        let head = row.map_or(LogHead::START, |(seq, hash, recorded_at)| LogHead {
            point: crate::chain::point(seq, hash.as_deref()),
            recorded_at: Some(Timestamp::from_datetime(recorded_at)),
        });
        self.head = Some(head);
        Ok(head)
    }

    /// The server's clock now: read once per transaction, under the append
    /// lock, and carried on by this process's monotonic clock for the
    /// pieces after the first.
    async fn server_time(&mut self) -> Result<Timestamp, StoreError> {
        if let Some((base, read)) = self.server_clock {
            let passed = i64::try_from(read.elapsed().as_micros()).unwrap_or(i64::MAX);
            return Ok(Timestamp::from_micros(base.as_micros().saturating_add(passed)));
        }
        let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(self.raw_conn())
            .await
            .map_err(|error| map(error, "reading the server's clock"))?;
        let now = Timestamp::from_datetime(now);
        self.server_clock = Some((now, Instant::now()));
        Ok(now)
    }

    /// Every projection's (version, position), from the cache or the database.
    async fn projection_positions(&mut self) -> Result<Positions, StoreError> {
        if let Some(positions) = &self.positions {
            return Ok(positions.clone());
        }
        let rows: Vec<(String, i64, i64)> = sqlx::query_as("SELECT name, version, position FROM projection_positions")
            .fetch_all(self.conn().await?)
            .await
            .map_err(|error| map(error, "reading projection positions"))?;
        let positions: Positions = rows
            .into_iter()
            .map(|(name, version, position)| (name, (version, position)))
            .collect();
        self.positions = Some(positions.clone());
        Ok(positions)
    }

    /// The current version of each stream (absent: 0), read together with
    /// the log head and the projection positions when those are not known
    /// yet: the first query of a transaction is one round trip, not three.
    async fn stream_versions(&mut self, streams: &[&str]) -> Result<BTreeMap<String, i64>, StoreError> {
        // The head's row carries its chain hash in the text column.
        let head_part = if self.head.is_none() {
            " UNION ALL SELECT (SELECT chain_hash FROM media_operation_events ORDER BY seq DESC LIMIT 1), \
             COALESCE(MAX(seq), 0), -1, \
             (SELECT recorded_at FROM media_operation_events ORDER BY seq DESC LIMIT 1) FROM media_operation_events"
        } else {
            ""
        };
        let positions_part = if self.positions.is_none() {
            self.positions = Some(BTreeMap::new());
            " UNION ALL SELECT name, position, version + 1, NULL FROM projection_positions"
        } else {
            ""
        };
        let sql = format!(
            "SELECT stream_id::text, MAX(stream_version), 0::bigint, NULL::timestamptz FROM media_operation_events \
             WHERE stream_id = ANY($1::text[]) GROUP BY stream_id{head_part}{positions_part}"
        );
        let streams: Vec<String> = streams.iter().map(|stream| (*stream).to_string()).collect();
        // Positions gathered but not sent would be missed by the read of
        // them; the log part needs only the gathered events.
        let reads = if positions_part.is_empty() {
            Reads::Log
        } else {
            Reads::Everything
        };
        let fetched = sqlx::query(&sql)
            .bind(streams)
            .fetch_all(self.conn_reading(reads).await?)
            .await
            .map_err(|error| map(error, "reading stream versions"))?;
        let mut versions = BTreeMap::new();
        for row in fetched {
            // The third column tells the parts apart: 0 for streams, -1 for
            // the head, version + 1 (always > 0) for projection positions.
            let tag: i64 = row.get(2);
            match (row.get::<Option<String>, _>(0), tag) {
                (hash, -1) => {
                    let seq = row.get::<i64, _>(1);
                    let recorded_at = row.get::<Option<chrono::DateTime<chrono::Utc>>, _>(3);
                    self.head = Some(if seq == 0 {
                        LogHead::START
                    } else {
                        LogHead {
                            point: crate::chain::point(seq, hash.as_deref()),
                            recorded_at: recorded_at.map(Timestamp::from_datetime),
                        }
                    });
                }
                (Some(name), tag) if tag > 0 => {
                    if let Some(positions) = self.positions.as_mut() {
                        positions.insert(name, (tag - 1, row.get::<i64, _>(1)));
                    }
                }
                (Some(stream), _) => {
                    versions.insert(stream, row.get::<i64, _>(1));
                }
                (None, _) => {}
            }
        }
        Ok(versions)
    }
}

impl RowTarget for PostgresTx {
    async fn load_rows(&mut self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        let copy = self.copy();
        rows::load(self.conn_reading(Reads::Rows).await?, table, copy, keys).await
    }

    async fn load_rows_of_tables(
        &mut self,
        requests: &[(&'static TableSpec, Vec<String>)],
    ) -> Result<Vec<Row>, StoreError> {
        let copy = self.copy();
        rows::load_many(self.conn_reading(Reads::Rows).await?, requests, copy).await
    }

    async fn load_rows_where(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        value: &Cell,
    ) -> Result<Vec<Row>, StoreError> {
        let copy = self.copy();
        let filters = [(column, value.clone())];
        rows::find(self.conn_reading(Reads::Rows).await?, table, copy, &filters, usize::MAX).await
    }

    async fn write_rows(&mut self, changes: &[RowChange]) -> Result<(), StoreError> {
        // Gathered rows address one copy of the tables; a change of copy
        // sends the ones gathered for the other first.
        if self.pending.rows_tables.is_some_and(|tables| tables != self.tables) {
            self.conn().await?;
        }
        self.pending.rows_tables = Some(self.tables);
        self.pending.rows.extend_from_slice(changes);
        Ok(())
    }
}

impl WriteTx for PostgresTx {
    async fn append(&mut self, appends: Vec<StreamAppend>) -> Result<Vec<EventEnvelope>, StoreError> {
        let streams: Vec<&str> = appends.iter().map(|append| append.stream_id.as_str()).collect();
        let versions = self.stream_versions(&streams).await?;
        let head = self.current_head().await?;
        let planned = append::plan(head, versions, appends)?;
        rows::push_events(&mut self.pending.events, &planned)?;
        self.head = Some(planned.head);
        Ok(planned.envelopes)
    }

    async fn advance_positions(&mut self, from: i64, to: i64) -> Result<(), StoreError> {
        positions::check_all_at(&self.projection_positions().await?, from)?;
        // Gathered: sent with the piece's other writes, in one statement.
        let first = self.pending.positions.map_or(from, |(first, _)| first);
        self.pending.positions = Some((first, to));
        if let Some(cached) = self.positions.as_mut() {
            positions::move_all(cached, to);
        }
        Ok(())
    }

    async fn advance_position(&mut self, spec: &'static ProjectionSpec, from: i64, to: i64) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        let updated = sqlx::query(
            "UPDATE projection_positions SET position = $1 WHERE name = $2 AND version = $3 AND position = $4",
        )
        .bind(to)
        .bind(spec.name)
        .bind(i64::from(spec.version))
        .bind(from)
        .execute(self.conn().await?)
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
        sqlx::query_scalar::<_, i64>("SELECT position FROM projection_positions WHERE name = $1 AND version = $2")
            .bind(spec.name)
            .bind(i64::from(spec.version))
            .fetch_optional(self.conn().await?)
            .await
            .map_err(|error| map(error, "reading a projection position"))
    }

    fn use_tables(&mut self, set: TableSet) {
        self.tables = set;
    }

    async fn read_events(&mut self, after: i64, limit: usize) -> Result<Vec<EventEnvelope>, StoreError> {
        rows::read_events(self.conn_reading(Reads::Log).await?, after, limit).await
    }

    async fn head(&mut self) -> Result<i64, StoreError> {
        self.current_head().await.map(|head| head.seq())
    }

    async fn command_time(&mut self, caller: Timestamp, source: TimeSource) -> Result<Timestamp, StoreError> {
        let now = match source {
            TimeSource::Caller => caller,
            // Every host's commands decide by the server's clock, so one
            // host's wrong clock expires no one's lease and misses no task.
            TimeSource::Shared => self.server_time().await?,
        };
        let head = self.current_head().await?;
        Ok(append::command_time(&head, now))
    }

    async fn create_shadow(&mut self, spec: &'static ProjectionSpec) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        for table in spec.tables.iter().rev() {
            // CASCADE: a leftover shadow of a dependent projection may hold
            // a foreign key into this one; only that constraint goes (the
            // dependent's shadow is recreated with its family right after).
            let sql = format!(
                "DROP TABLE IF EXISTS {} CASCADE",
                ddl::table_name(table.name, Copy::Shadow)
            );
            rows::script(self.conn().await?, &sql)
                .await
                .map_err(|error| map(error, "dropping an old shadow"))?;
        }
        rows::script(self.conn().await?, &ddl::render(spec, Copy::Shadow))
            .await
            .map_err(|error| map(error, &format!("creating the shadow of {}", spec.name)))?;
        sqlx::query(
            "INSERT INTO projection_positions (name, version, position) VALUES ($1, $2, 0) \
             ON CONFLICT (name) DO UPDATE SET version = EXCLUDED.version, position = 0",
        )
        .bind(format!("{}{SHADOW_SUFFIX}", spec.name))
        .bind(i64::from(spec.version))
        .execute(self.conn().await?)
        .await
        .map_err(|error| map(error, "recording the shadow position"))?;
        Ok(())
    }

    async fn shadow_position(&mut self, spec: &'static ProjectionSpec) -> Result<Option<i64>, StoreError> {
        sqlx::query_scalar::<_, i64>("SELECT position FROM projection_positions WHERE name = $1 AND version = $2")
            .bind(format!("{}{SHADOW_SUFFIX}", spec.name))
            .bind(i64::from(spec.version))
            .fetch_optional(self.conn().await?)
            .await
            .map_err(|error| map(error, "reading the shadow position"))
    }

    async fn set_shadow_position(&mut self, spec: &'static ProjectionSpec, position: i64) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        sqlx::query("UPDATE projection_positions SET position = $1 WHERE name = $2")
            .bind(position)
            .bind(format!("{}{SHADOW_SUFFIX}", spec.name))
            .execute(self.conn().await?)
            .await
            .map_err(|error| map(error, "recording the shadow position"))?;
        Ok(())
    }

    async fn swap_shadows(&mut self, specs: &[&'static ProjectionSpec]) -> Result<(), StoreError> {
        // Positions change below; forget the cached copy.
        self.positions = None;
        let mut shadow_positions = Vec::new();
        for spec in specs {
            let position = self
                .shadow_position(spec)
                .await?
                .ok_or_else(|| StoreError::not_found(format!("no shadow of {} to swap in", spec.name)))?;
            shadow_positions.push((*spec, position));
        }
        let tables: Vec<&'static TableSpec> = specs.iter().flat_map(|spec| spec.tables.iter().copied()).collect();
        let mut script = Vec::new();
        // Children first (the family's dependents, then each projection's
        // child tables). No CASCADE: a table outside the family that still
        // referenced one of these would be a bug, and must fail the swap
        // rather than silently lose its foreign key.
        for table in tables.iter().rev() {
            script.push(format!("DROP TABLE IF EXISTS {}", table.name));
        }
        // Foreign keys point at tables, not names, so a child's reference
        // follows its parent's rename; parents first all the same.
        for table in &tables {
            script.push(format!(
                "ALTER TABLE {} RENAME TO {}",
                ddl::table_name(table.name, Copy::Shadow),
                table.name
            ));
        }
        let script = script.join(";\n");
        rows::script(self.conn().await?, &script)
            .await
            .map_err(|error| map(error, "swapping in shadows"))?;
        // Constraints and indexes keep their shadow names through a table
        // rename; give them their live names so the next shadow's can be
        // created as the first one's were (renaming a key's constraint
        // renames its index too, so constraints go first).
        for table in &tables {
            let prefix = format!("{}{SHADOW_SUFFIX}", table.name);
            let constraints: Vec<String> = sqlx::query_scalar(
                "SELECT conname::text FROM pg_constraint \
                 WHERE conrelid = to_regclass($1) AND starts_with(conname::text, $2)",
            )
            .bind(table.name)
            .bind(&prefix)
            .fetch_all(self.conn().await?)
            .await
            .map_err(|error| map(error, "listing shadow constraints"))?;
            for name in constraints {
                let live = format!("{}{}", table.name, &name[prefix.len()..]);
                let sql = format!("ALTER TABLE {} RENAME CONSTRAINT {name} TO {live}", table.name);
                rows::script(self.conn().await?, &sql)
                    .await
                    .map_err(|error| map(error, "renaming a shadow constraint"))?;
            }
            let indexes: Vec<String> = sqlx::query_scalar(
                "SELECT c.relname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
                 WHERE i.indrelid = to_regclass($1) AND starts_with(c.relname::text, $2)",
            )
            .bind(table.name)
            .bind(&prefix)
            .fetch_all(self.conn().await?)
            .await
            .map_err(|error| map(error, "listing shadow indexes"))?;
            for name in indexes {
                let live = format!("{}{}", table.name, &name[prefix.len()..]);
                let sql = format!("ALTER INDEX {name} RENAME TO {live}");
                rows::script(self.conn().await?, &sql)
                    .await
                    .map_err(|error| map(error, "renaming a shadow index"))?;
            }
        }
        for (spec, position) in shadow_positions {
            sqlx::query("DELETE FROM projection_positions WHERE name = $1")
                .bind(format!("{}{SHADOW_SUFFIX}", spec.name))
                .execute(self.conn().await?)
                .await
                .map_err(|error| map(error, "dropping the shadow position"))?;
            sqlx::query(
                "INSERT INTO projection_positions (name, version, position) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET version = EXCLUDED.version, position = EXCLUDED.position",
            )
            .bind(spec.name)
            .bind(i64::from(spec.version))
            .bind(position)
            .execute(self.conn().await?)
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
        let copy = self.copy();
        rows::find(self.conn_reading(Reads::Rows).await?, table, copy, filters, limit).await
    }

    async fn claimable(&mut self, query: &ClaimQuery) -> Result<Vec<Row>, StoreError> {
        let copy = self.copy();
        work::claimable(self.conn_reading(Reads::Rows).await?, copy, query).await
    }

    async fn lease(&mut self, claim_token: &str) -> Result<Option<Lease>, StoreError> {
        work::lease(self.conn_reading(Reads::Leases).await?, claim_token).await
    }

    async fn leases(&mut self, claim_tokens: &[String]) -> Result<Vec<Lease>, StoreError> {
        work::leases(self.conn_reading(Reads::Leases).await?, claim_tokens).await
    }

    async fn find_rows_in(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        values: &[Cell],
    ) -> Result<Vec<Row>, StoreError> {
        let copy = self.copy();
        rows::find_in(self.conn_reading(Reads::Rows).await?, table, copy, column, values).await
    }

    async fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        self.pending
            .leases
            .insert(lease.claim_token.clone(), Some(lease.clone()));
        Ok(())
    }

    async fn delete_lease(&mut self, claim_token: &str) -> Result<(), StoreError> {
        self.pending.leases.insert(claim_token.to_string(), None);
        Ok(())
    }

    async fn record_verification(&mut self, verification: &Verification) -> Result<(), StoreError> {
        crate::chain::record_verification(self.conn().await?, verification).await
    }

    // The recorded commands are in no gathered write: their statements
    // need not send what is gathered first.
    async fn command_record(&mut self, request_id: &str) -> Result<Option<CommandRecord>, StoreError> {
        crate::requests::command_record(self.raw_conn(), request_id).await
    }

    async fn record_command(&mut self, record: &CommandRecord) -> Result<(), StoreError> {
        crate::requests::record_command(self.raw_conn(), record).await
    }

    async fn forget_commands(&mut self, recorded_before: Timestamp, limit: usize) -> Result<u64, StoreError> {
        crate::requests::forget_commands(self.raw_conn(), recorded_before, limit).await
    }
}

/// Creates the live tables of every projection the database has never had,
/// at this build's version and position 0 (startup catches them up).
/// Projections stored at another version are left for the shadow rebuild.
/// Runs under the append lock, so processes opening a new database at once
/// create each table exactly once.
pub(crate) async fn ensure_projection_tables(pool: &PgPool) -> Result<(), StoreError> {
    let mut tx = PostgresTx::begin(pool).await?;
    let result = async {
        for spec in all_specs() {
            let known: Option<i64> = sqlx::query_scalar("SELECT version FROM projection_positions WHERE name = $1")
                .bind(spec.name)
                .fetch_optional(tx.conn().await?)
                .await
                .map_err(|error| map(error, "reading projection versions"))?;
            if known.is_none() {
                rows::script(tx.conn().await?, &ddl::render(spec, Copy::Live))
                    .await
                    .map_err(|error| map(error, &format!("creating projection {}", spec.name)))?;
                sqlx::query("INSERT INTO projection_positions (name, version, position) VALUES ($1, $2, 0)")
                    .bind(spec.name)
                    .bind(i64::from(spec.version))
                    .execute(tx.conn().await?)
                    .await
                    .map_err(|error| map(error, "recording a new projection"))?;
            }
        }
        Ok::<_, StoreError>(())
    }
    .await;
    match result {
        Ok(()) => tx.commit().await,
        Err(error) => {
            tx.rollback().await;
            Err(error)
        }
    }
}

/// Links the events of a log written before the chain existed
/// ([`chain::fill_in`]) in one write transaction, under the writers'
/// advisory lock, before the store takes any work.
pub(crate) async fn fill_unchained(pool: &PgPool) -> Result<(), StoreError> {
    let mut tx = PostgresTx::begin(pool).await?;
    let result = chain::fill_in(tx.conn().await?).await;
    match result {
        Ok(()) => tx.commit().await,
        Err(error) => {
            tx.rollback().await;
            Err(error)
        }
    }
}
