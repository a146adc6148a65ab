//! The writer's statements, stepped directly on its own rusqlite connection.
//!
//! The writer thread owns its connection, so a statement here is a call into
//! SQLite on the same thread: no handoff to a driver thread and back, which
//! on a small machine cost more than the statement itself. Statements are
//! prepared once and kept in the connection's cache (`prepare_cached`);
//! their text comes from `rows.rs` and `work.rs`, shared with the sqlx side,
//! so both drivers run the same SQL.

use crate::ddl::Copy;
use crate::error::map_rusqlite;
use crate::rows::{self, MAX_PARAMS};
use crate::work::{self, StoredLease};
use opledger_domain::chain::ChainHash;
use opledger_domain::projections::{Cell, ColumnType, Key, Row, RowChange, TableSpec};
use opledger_domain::{EventEnvelope, Timestamp};
use opledger_store::append::Planned;
use opledger_store::log::{self, RecordedAt, StoredEvent};
use opledger_store::{ClaimQuery, Lease, StoreError, MAX_QUEUED_VERSIONS};
use rusqlite::types::{Null, ValueRef};
use rusqlite::{CachedStatement, Connection};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use uuid::Uuid;

/// The log scan inside the writer's transaction (catch-up and shadow
/// rebuilds), the same statement `sqlx_handle.rs` steps for readers.
const READ_EVENTS: &str = "SELECT seq, stream_id, stream_version, event_type, schema_version, payload, \
     recorded_at, actor, correlation_id, causation_id \
     FROM main.media_operation_events WHERE seq > ?1 ORDER BY seq LIMIT ?2";

/// Rows per multi-row INSERT into the log (11 parameters each).
const EVENTS_PER_STATEMENT: usize = 90;

pub(crate) fn prepare<'c>(
    connection: &'c Connection,
    sql: &str,
    context: &str,
) -> Result<CachedStatement<'c>, StoreError> {
    connection
        .prepare_cached(sql)
        .map_err(|error| map_rusqlite(error, context))
}

/// Binds one cell as parameter `index` (1-based), in the stored form the
/// sqlx side binds too (times as RFC 3339 text, UUIDs hyphenated).
fn bind(statement: &mut CachedStatement<'_>, index: usize, cell: &Cell) -> rusqlite::Result<()> {
    match cell {
        Cell::Null => statement.raw_bind_parameter(index, Null),
        Cell::Integer(value) => statement.raw_bind_parameter(index, *value),
        Cell::Real(value) => statement.raw_bind_parameter(index, *value),
        Cell::Text(value) | Cell::Json(value) => statement.raw_bind_parameter(index, value.as_str()),
        Cell::Bool(value) => statement.raw_bind_parameter(index, i64::from(*value)),
        Cell::Timestamp(value) => statement.raw_bind_parameter(index, value.to_rfc3339()),
        Cell::Uuid(value) => {
            let mut buffer = Uuid::encode_buffer();
            let text: &str = value.hyphenated().encode_lower(&mut buffer);
            statement.raw_bind_parameter(index, text)
        }
    }
}

fn bind_all<'a>(
    statement: &mut CachedStatement<'_>,
    cells: impl IntoIterator<Item = &'a Cell>,
    context: &str,
) -> Result<(), StoreError> {
    for (index, cell) in cells.into_iter().enumerate() {
        bind(statement, index + 1, cell).map_err(|error| map_rusqlite(error, context))?;
    }
    Ok(())
}

/// Runs one parameterless statement (transaction and savepoint control).
pub(crate) fn execute(connection: &Connection, sql: &str) -> Result<(), StoreError> {
    prepare(connection, sql, sql)?
        .raw_execute()
        .map(|_| ())
        .map_err(|error| map_rusqlite(error, sql))
}

/// Runs one statement with `cells` as its parameters; returns the rows changed.
pub(crate) fn execute_with(
    connection: &Connection,
    sql: &str,
    cells: &[Cell],
    context: &str,
) -> Result<usize, StoreError> {
    let mut statement = prepare(connection, sql, context)?;
    bind_all(&mut statement, cells, context)?;
    statement.raw_execute().map_err(|error| map_rusqlite(error, context))
}

/// Runs one or more statements without parameters (DDL).
pub(crate) fn script(connection: &Connection, sql: &str, context: &str) -> Result<(), StoreError> {
    connection
        .execute_batch(sql)
        .map_err(|error| map_rusqlite(error, context))
}

/// Runs a query with `cells` as its parameters and calls `each` per row.
pub(crate) fn select(
    connection: &Connection,
    sql: &str,
    cells: &[Cell],
    context: &str,
    mut each: impl FnMut(&rusqlite::Row<'_>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut statement = prepare(connection, sql, context)?;
    bind_all(&mut statement, cells, context)?;
    let mut rows = statement.raw_query();
    while let Some(row) = rows.next().map_err(|error| map_rusqlite(error, context))? {
        each(row)?;
    }
    Ok(())
}

/// The first column of the first row, if any.
pub(crate) fn select_optional<T: rusqlite::types::FromSql>(
    connection: &Connection,
    sql: &str,
    cells: &[Cell],
    context: &str,
) -> Result<Option<T>, StoreError> {
    let mut found = None;
    select(connection, sql, cells, context, |row| {
        if found.is_none() {
            found = Some(row.get::<_, T>(0).map_err(|error| map_rusqlite(error, context))?);
        }
        Ok(())
    })?;
    Ok(found)
}

/// Decodes column `index` as `ty`: the same values, and the same refusals
/// (Corrupt), as the sqlx side's `rows::decode_cell`.
fn decode_cell(value: ValueRef<'_>, index: usize, ty: ColumnType, table: &str) -> Result<Cell, StoreError> {
    let bad = |what: String| StoreError::corrupt(format!("{table} column {index}: {what}"));
    let text = |value: ValueRef<'_>| -> Result<String, StoreError> {
        value
            .as_str()
            .map(str::to_string)
            .map_err(|error| bad(format!("expected {ty:?}: {error}")))
    };
    Ok(match (ty, value) {
        (_, ValueRef::Null) => Cell::Null,
        (ColumnType::Integer, ValueRef::Integer(value)) => Cell::Integer(value),
        (ColumnType::Real, ValueRef::Real(value)) => Cell::Real(value),
        // REAL affinity may hand back a whole number as stored.
        (ColumnType::Real, ValueRef::Integer(value)) => Cell::Real(value as f64),
        (ColumnType::Bool, ValueRef::Integer(value)) => Cell::Bool(value != 0),
        (ColumnType::Text, value) => Cell::Text(text(value)?),
        (ColumnType::Json, value) => Cell::Json(text(value)?),
        (ColumnType::Timestamp, value) => Cell::Timestamp(Timestamp::parse(&text(value)?).map_err(bad)?),
        (ColumnType::Uuid, value) => {
            Cell::Uuid(Uuid::parse_str(&text(value)?).map_err(|error| bad(error.to_string()))?)
        }
        (ty, value) => return Err(bad(format!("expected {ty:?}, found {}", value.data_type()))),
    })
}

fn decode_row(row: &rusqlite::Row<'_>, table: &'static TableSpec) -> Result<Row, StoreError> {
    let cells = table
        .columns
        .iter()
        .enumerate()
        .map(|(index, column)| {
            let value = row
                .get_ref(index)
                .map_err(|error| map_rusqlite(error, &format!("reading {}", table.name)))?;
            decode_cell(value, index, column.ty, table.name)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Row::from_cells(table, cells).map_err(|error| StoreError::corrupt(error.to_string()))
}

fn select_rows(
    connection: &Connection,
    table: &'static TableSpec,
    sql: &str,
    cells: &[Cell],
    context: &str,
    into: &mut Vec<Row>,
) -> Result<(), StoreError> {
    select(connection, sql, cells, context, |row| {
        into.push(decode_row(row, table)?);
        Ok(())
    })
}

/// Loads rows by key from one copy of a table.
pub(crate) fn load(
    connection: &Connection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    keys: &[String],
) -> Result<Vec<Row>, StoreError> {
    let mut found = Vec::with_capacity(keys.len());
    let context = format!("loading {}", crate::ddl::table_name(table.name, copy));
    for chunk in keys.chunks(MAX_PARAMS) {
        let cells: Vec<Cell> = chunk.iter().map(|key| rows::key_cell(table, key)).collect();
        select_rows(
            connection,
            table,
            &rows::load_sql(table, copy, chunk.len()),
            &cells,
            &context,
            &mut found,
        )?;
    }
    Ok(found)
}

/// Rows of one copy of a table whose columns equal the given cells.
pub(crate) fn find(
    connection: &Connection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    filters: &[(&'static str, Cell)],
    limit: usize,
) -> Result<Vec<Row>, StoreError> {
    let sql = rows::find_sql(table, copy, filters)?;
    let mut cells: Vec<Cell> = filters.iter().map(|(_, cell)| cell.clone()).collect();
    cells.push(Cell::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
    let mut found = Vec::new();
    let context = format!("searching {}", crate::ddl::table_name(table.name, copy));
    select_rows(connection, table, &sql, &cells, &context, &mut found)?;
    Ok(found)
}

/// Rows of one copy of a table whose `column` is one of `values`.
pub(crate) fn find_in(
    connection: &Connection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    column: &'static str,
    values: &[Cell],
) -> Result<Vec<Row>, StoreError> {
    let mut found = Vec::new();
    let context = format!("searching {}", crate::ddl::table_name(table.name, copy));
    // Validate the column even when there is nothing to look up.
    rows::find_in_sql(table, copy, column, 1)?;
    for chunk in values.chunks(MAX_PARAMS) {
        let sql = rows::find_in_sql(table, copy, column, chunk.len())?;
        select_rows(connection, table, &sql, chunk, &context, &mut found)?;
    }
    Ok(found)
}

/// Writes changed rows to one copy: multi-row upserts in `table_order`
/// (parents first), then deletes in reverse order (children first).
pub(crate) fn write_rows(
    connection: &Connection,
    table_order: &[&'static TableSpec],
    copy: Copy<'_>,
    changes: &[RowChange],
) -> Result<(), StoreError> {
    for table in table_order {
        let mut whole: Vec<&Row> = Vec::new();
        for change in changes.iter().filter(|change| change.key.table == table.name) {
            let Some(after) = change.after.as_deref() else { continue };
            match change.changed_cells() {
                // The store holds exactly this row already.
                Some(changed) if changed.is_empty() => {}
                // An UPDATE of the changed columns leaves the indexes and
                // foreign keys over the others alone, which an upsert of
                // every column does not (measured: about half the cost of
                // rewriting a processing-state row). A row the store turns
                // out not to hold is written whole below.
                Some(changed) => {
                    if update_columns(connection, table, copy, &change.key.key, &changed)? == 0 {
                        whole.push(after);
                    }
                }
                None => whole.push(after),
            }
        }
        if whole.is_empty() {
            continue;
        }
        let context = format!("writing {}", crate::ddl::table_name(table.name, copy));
        for chunk in whole.chunks(rows::upserts_per_statement(table)) {
            let mut statement = prepare(connection, &rows::upsert_sql(table, copy, chunk.len()), &context)?;
            let mut index = 0;
            for row in chunk {
                for cell in row.to_cells() {
                    index += 1;
                    bind(&mut statement, index, &cell).map_err(|error| map_rusqlite(error, &context))?;
                }
            }
            statement.raw_execute().map_err(|error| map_rusqlite(error, &context))?;
        }
    }
    for table in table_order.iter().rev() {
        let deletes: Vec<Cell> = changes
            .iter()
            .filter(|change| change.key.table == table.name && change.after.is_none())
            .map(|change| rows::key_cell(table, &change.key.key))
            .collect();
        if deletes.is_empty() {
            continue;
        }
        let context = format!("deleting from {}", crate::ddl::table_name(table.name, copy));
        for chunk in deletes.chunks(MAX_PARAMS) {
            execute_with(connection, &rows::delete_sql(table, copy, chunk.len()), chunk, &context)?;
        }
    }
    Ok(())
}

/// Sets the `changed` columns (positions in the table's column list) of the
/// row keyed `key`; returns the rows changed (0 when there is no such row).
fn update_columns(
    connection: &Connection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    key: &Key,
    changed: &[(usize, Cell)],
) -> Result<usize, StoreError> {
    // The context is formatted only on failure: this runs for most rows a
    // command writes.
    let failed = |error| map_rusqlite(error, &format!("updating {}", crate::ddl::table_name(table.name, copy)));
    let positions: Vec<usize> = changed.iter().map(|(position, _)| *position).collect();
    let sql = update_sql_cached(table, copy, &positions);
    let mut statement = connection.prepare_cached(&sql).map_err(failed)?;
    for (index, (_, cell)) in changed.iter().enumerate() {
        bind(&mut statement, index + 1, cell).map_err(failed)?;
    }
    bind(&mut statement, changed.len() + 1, &rows::key_cell(table, key)).map_err(failed)?;
    statement.raw_execute().map_err(failed)
}

thread_local! {
    /// UPDATE texts by table, copy and changed-column set: the writer
    /// thread runs the same few shapes over and over, and formatting the
    /// text each time cost about a tenth of an update.
    static UPDATE_SQL: RefCell<UpdateTexts> = RefCell::new(UpdateTexts::default());
}

/// Keyed by table name, shadow copy or not, and the changed columns as bits.
type UpdateTexts = BTreeMap<(&'static str, bool, u64), Rc<str>>;

fn update_sql_cached(table: &'static TableSpec, copy: Copy<'_>, positions: &[usize]) -> Rc<str> {
    let shadow = match copy {
        Copy::Live => false,
        Copy::Shadow => true,
        Copy::Scratch(_) => return rows::update_sql(table, copy, positions).into(),
    };
    if positions.iter().any(|position| *position >= 64) {
        return rows::update_sql(table, copy, positions).into();
    }
    let mask = positions.iter().fold(0u64, |mask, position| mask | (1 << position));
    UPDATE_SQL.with(|texts| {
        texts
            .borrow_mut()
            .entry((table.name, shadow, mask))
            .or_insert_with(|| rows::update_sql(table, copy, positions).into())
            .clone()
    })
}

/// Inserts stored envelopes into the log, up to 90 rows per statement. The
/// log's triggers refuse anything but the next seq and stream version.
pub(crate) fn insert_events(connection: &Connection, planned: &Planned) -> Result<(), StoreError> {
    let context = "appending to the event log";
    let rows: Vec<(&EventEnvelope, (&String, &ChainHash))> = planned
        .envelopes
        .iter()
        .zip(planned.payloads.iter().zip(&planned.hashes))
        .collect();
    for chunk in rows.chunks(EVENTS_PER_STATEMENT) {
        let sql = format!(
            "INSERT INTO media_operation_events ({}, chain_hash) VALUES {}",
            rows::EVENT_COLUMNS,
            vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ")
        );
        let mut statement = prepare(connection, &sql, context)?;
        for (position, (envelope, (payload, hash))) in chunk.iter().enumerate() {
            bind_event(&mut statement, position * 11, envelope, payload, hash)
                .map_err(|error| map_rusqlite(error, context))?;
        }
        statement.raw_execute().map_err(|error| map_rusqlite(error, context))?;
    }
    Ok(())
}

/// Binds one envelope's eleven columns after parameter `base`, in
/// [`rows::EVENT_COLUMNS`] order and then its chain hash, without copying
/// its strings first. The payload is the plan's text, the one its hash covers.
fn bind_event(
    statement: &mut CachedStatement<'_>,
    base: usize,
    envelope: &EventEnvelope,
    payload: &str,
    hash: &ChainHash,
) -> rusqlite::Result<()> {
    statement.raw_bind_parameter(base + 1, envelope.seq)?;
    statement.raw_bind_parameter(base + 2, envelope.stream_id.as_str())?;
    statement.raw_bind_parameter(base + 3, envelope.stream_version)?;
    statement.raw_bind_parameter(base + 4, envelope.event.event_type())?;
    statement.raw_bind_parameter(base + 5, i64::from(envelope.schema_version))?;
    statement.raw_bind_parameter(base + 6, payload)?;
    statement.raw_bind_parameter(base + 7, envelope.recorded_at.to_rfc3339())?;
    statement.raw_bind_parameter(base + 8, envelope.actor.as_str())?;
    statement.raw_bind_parameter(base + 9, envelope.correlation_id.as_str())?;
    statement.raw_bind_parameter(base + 10, envelope.causation_id.as_deref())?;
    statement.raw_bind_parameter(base + 11, hash.to_hex())
}

/// Reads up to `limit` events after `after`, in seq order.
pub(crate) fn read_events(connection: &Connection, after: i64, limit: usize) -> Result<Vec<EventEnvelope>, StoreError> {
    let mut events = Vec::with_capacity(limit.min(100_000));
    let limit = Cell::Integer(i64::try_from(limit).unwrap_or(i64::MAX));
    select(
        connection,
        READ_EVENTS,
        &[Cell::Integer(after), limit],
        "scanning the event log",
        |row| {
            let seq = row
                .get::<_, i64>(0)
                .map_err(|error| map_rusqlite(error, "reading seq"))?;
            let column = |error: rusqlite::Error| StoreError::corrupt_at(seq, error.to_string());
            let text = |index: usize| -> Result<&str, StoreError> {
                let value = row.get_ref(index).map_err(column)?;
                value
                    .as_str()
                    .map_err(|error| StoreError::corrupt_at(seq, format!("column {index}: {error}")))
            };
            events.push(log::decode(StoredEvent {
                seq,
                stream_id: row.get(1).map_err(column)?,
                stream_version: row.get(2).map_err(column)?,
                event_type: text(3)?,
                schema_version: row.get(4).map_err(column)?,
                payload: text(5)?,
                recorded_at: RecordedAt::Text(text(6)?),
                actor: row.get(7).map_err(column)?,
                correlation_id: row.get(8).map_err(column)?,
                causation_id: row.get(9).map_err(column)?,
            })?);
            Ok(())
        },
    )?;
    Ok(events)
}

/// Claimable rows of both state tables, in claim order (see `work.rs`):
/// per kind, one read per version its worker states, or per version
/// queued when it states none.
pub(crate) fn claimable(connection: &Connection, copy: Copy<'_>, query: &ClaimQuery) -> Result<Vec<Row>, StoreError> {
    if query.limit == 0 || query.statuses.is_empty() {
        return Ok(Vec::new());
    }
    let limit = Cell::Integer(i64::try_from(query.limit).unwrap_or(i64::MAX));
    let now = Cell::Timestamp(query.now);
    let mut found = Vec::new();
    for table in work::STATE_TABLES {
        if query.kinds.is_empty() {
            let sql = work::claimable_sql(table, copy, query.statuses, work::Range::Any);
            select_rows(
                connection,
                table,
                &sql,
                &[now.clone(), limit.clone()],
                "finding claimable tasks",
                &mut found,
            )?;
        }
        // Each kind once: a kind named twice must not offer its rows twice.
        let kinds: std::collections::BTreeSet<&String> = query.kinds.iter().collect();
        for kind in kinds {
            let versions: Vec<Option<String>> = match query.versions.get(kind) {
                Some(stated) => stated.iter().cloned().map(Some).collect(),
                None => queued_versions(connection, table, copy, query, kind)?,
            };
            for version in versions {
                let kind = Cell::Text(kind.clone());
                let (range, cells) = match version {
                    Some(version) => (
                        work::Range::Version,
                        vec![now.clone(), kind, Cell::Text(version), limit.clone()],
                    ),
                    None => (work::Range::UnknownVersion, vec![now.clone(), kind, limit.clone()]),
                };
                let sql = work::claimable_sql(table, copy, query.statuses, range);
                select_rows(connection, table, &sql, &cells, "finding claimable tasks", &mut found)?;
            }
        }
    }
    found.sort_by_key(work::claim_order);
    found.truncate(query.limit);
    Ok(found)
}

/// The versions of `kind` among the claimable rows of `table` (`None` for
/// rows of unknown version), walked through the claimable index one probe
/// per version, at most [`MAX_QUEUED_VERSIONS`].
fn queued_versions(
    connection: &Connection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    query: &ClaimQuery,
    kind: &str,
) -> Result<Vec<Option<String>>, StoreError> {
    // Rows of unknown version are always looked for: one index probe.
    let mut versions = vec![None];
    let next = work::next_version_sql(table, copy, query.statuses);
    let mut after = String::new();
    while versions.len() <= MAX_QUEUED_VERSIONS {
        let mut found = None;
        let cells = [Cell::Text(kind.to_string()), Cell::Text(after.clone())];
        select(connection, &next, &cells, "finding claimable versions", |row| {
            found = row
                .get::<_, String>(0)
                .map_err(|error| map_rusqlite(error, "finding claimable versions"))
                .map(Some)?;
            Ok(())
        })?;
        let Some(version) = found else { break };
        after = version.clone();
        versions.push(Some(version));
    }
    Ok(versions)
}

fn decode_lease(row: &rusqlite::Row<'_>) -> Result<Lease, StoreError> {
    let stored = (|| {
        Ok::<_, rusqlite::Error>(StoredLease {
            claim_token: row.get(0)?,
            operation_id: row.get(1)?,
            worker: row.get(2)?,
            heartbeat_at: row.get(3)?,
            lease_expires_at: row.get(4)?,
            phase: row.get(5)?,
            processed: row.get(6)?,
            total: row.get(7)?,
            progressed_at: row.get(8)?,
            progress_unrecorded: row.get(9)?,
            principal: row.get(10)?,
        })
    })()
    .map_err(|error| map_rusqlite(error, "reading a lease"))?;
    work::lease_from(stored)
}

/// The lease rows of these claim tokens, in chunks below the parameter limit.
pub(crate) fn leases(connection: &Connection, claim_tokens: &[String]) -> Result<Vec<Lease>, StoreError> {
    let mut found = Vec::with_capacity(claim_tokens.len());
    for chunk in claim_tokens.chunks(500) {
        let sql = format!(
            "SELECT {} FROM task_leases WHERE claim_token IN ({})",
            work::LEASE_COLUMNS,
            vec!["?"; chunk.len()].join(", ")
        );
        let cells: Vec<Cell> = chunk.iter().map(|token| Cell::Text(token.clone())).collect();
        select(connection, &sql, &cells, "reading leases", |row| {
            found.push(decode_lease(row)?);
            Ok(())
        })?;
    }
    Ok(found)
}

pub(crate) fn lease(connection: &Connection, claim_token: &str) -> Result<Option<Lease>, StoreError> {
    let sql = format!("SELECT {} FROM task_leases WHERE claim_token = ?", work::LEASE_COLUMNS);
    let mut found = None;
    select(
        connection,
        &sql,
        &[Cell::Text(claim_token.to_string())],
        "reading a lease",
        |row| {
            found = Some(decode_lease(row)?);
            Ok(())
        },
    )?;
    Ok(found)
}

pub(crate) fn put_lease(connection: &Connection, lease: &Lease) -> Result<(), StoreError> {
    execute_with(
        connection,
        work::PUT_LEASE,
        &work::lease_cells(lease),
        "writing a lease",
    )
    .map(|_| ())
}

pub(crate) fn delete_lease(connection: &Connection, claim_token: &str) -> Result<(), StoreError> {
    execute_with(
        connection,
        work::DELETE_LEASE,
        &[Cell::Text(claim_token.to_string())],
        "deleting a lease",
    )
    .map(|_| ())
}
