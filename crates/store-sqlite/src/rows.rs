//! Generic projection-row SQL: any table described by a [`TableSpec`] is
//! loaded, upserted, deleted and compared the same way, so a new projection
//! needs DDL but no new store code.
//!
//! The statement text is built here once for both drivers: the read pool and
//! the scratch copy run it through sqlx (below), the writer thread through
//! rusqlite (`writer_connection.rs`).

use crate::ddl::{self, Copy};
use crate::error::map;
use opledger_domain::projections::{Cell, ColumnType, Row, TableSpec};
use opledger_domain::{EventEnvelope, Timestamp};
use opledger_store::log::{self, RecordedAt, StoredEvent};
use opledger_store::StoreError;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{query::Query, Row as _, Sqlite, SqliteConnection, ValueRef};
use uuid::Uuid;

/// SQLite allows 32766 bound parameters; staying far below keeps statements
/// small enough to be cached and reused.
pub(crate) const MAX_PARAMS: usize = 900;

pub fn bind_cell<'q>(
    query: Query<'q, Sqlite, SqliteArguments<'q>>,
    cell: &Cell,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    match cell {
        Cell::Null => query.bind(None::<String>),
        Cell::Integer(value) => query.bind(*value),
        Cell::Real(value) => query.bind(*value),
        Cell::Text(value) | Cell::Json(value) => query.bind(value.clone()),
        Cell::Bool(value) => query.bind(i64::from(*value)),
        Cell::Timestamp(value) => query.bind(value.to_rfc3339()),
        Cell::Uuid(value) => query.bind(value.hyphenated().to_string()),
    }
}

/// Decodes column `index` of `row` as `ty`.
pub fn decode_cell(row: &SqliteRow, index: usize, ty: ColumnType, table: &str) -> Result<Cell, StoreError> {
    let raw = row
        .try_get_raw(index)
        .map_err(|error| map(error, &format!("reading {table}")))?;
    if raw.is_null() {
        return Ok(Cell::Null);
    }
    let bad = |what: String| StoreError::corrupt(format!("{table} column {index}: {what}"));
    let decode_error = |error: sqlx::Error| bad(error.to_string());
    Ok(match ty {
        ColumnType::Integer => Cell::Integer(row.try_get::<i64, _>(index).map_err(decode_error)?),
        ColumnType::Real => Cell::Real(row.try_get::<f64, _>(index).map_err(decode_error)?),
        ColumnType::Text => Cell::Text(row.try_get::<String, _>(index).map_err(decode_error)?),
        ColumnType::Json => Cell::Json(row.try_get::<String, _>(index).map_err(decode_error)?),
        ColumnType::Bool => Cell::Bool(row.try_get::<i64, _>(index).map_err(decode_error)? != 0),
        ColumnType::Timestamp => {
            let text = row.try_get::<String, _>(index).map_err(decode_error)?;
            Cell::Timestamp(Timestamp::parse(&text).map_err(bad)?)
        }
        ColumnType::Uuid => {
            let text = row.try_get::<String, _>(index).map_err(decode_error)?;
            Cell::Uuid(Uuid::parse_str(&text).map_err(|error| bad(error.to_string()))?)
        }
    })
}

pub fn decode_cells(row: &SqliteRow, table: &TableSpec) -> Result<Vec<Cell>, StoreError> {
    table
        .columns
        .iter()
        .enumerate()
        .map(|(index, column)| decode_cell(row, index, column.ty, table.name))
        .collect()
}

pub(crate) fn column_list(table: &TableSpec) -> String {
    table.column_names().collect::<Vec<_>>().join(", ")
}

pub(crate) fn key_column(table: &TableSpec) -> &'static str {
    assert_eq!(
        table.key_columns, 1,
        "{} has a composite key; extend rows.rs",
        table.name
    );
    table.columns[0].name
}

/// Binds a key given as text in the key column's stored form.
pub(crate) fn key_cell(table: &TableSpec, key: impl std::fmt::Display) -> Cell {
    Cell::Text(match table.columns[0].ty {
        // UUID keys are stored hyphenated lower-case, which is how RowKey renders them.
        ColumnType::Uuid | ColumnType::Text => key.to_string(),
        other => panic!("{}: key type {other:?} not supported", table.name),
    })
}

/// Loads rows by key from one copy of a table.
pub async fn load(
    conn: &mut SqliteConnection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    keys: &[String],
) -> Result<Vec<Row>, StoreError> {
    let mut rows = Vec::with_capacity(keys.len());
    let name = ddl::table_name(table.name, copy);
    for chunk in keys.chunks(MAX_PARAMS) {
        let sql = load_sql(table, copy, chunk.len());
        let mut query = sqlx::query(&sql);
        for key in chunk {
            query = bind_cell(query, &key_cell(table, key));
        }
        let fetched = query
            .fetch_all(&mut *conn)
            .await
            .map_err(|error| map(error, &format!("loading {name}")))?;
        for row in &fetched {
            let cells = decode_cells(row, table)?;
            rows.push(Row::from_cells(table, cells).map_err(|error| StoreError::corrupt(error.to_string()))?);
        }
    }
    Ok(rows)
}

/// `SELECT` of the rows of one copy of a table with any of `keys` keys.
pub(crate) fn load_sql(table: &TableSpec, copy: Copy<'_>, keys: usize) -> String {
    format!(
        "SELECT {} FROM {} WHERE {} IN ({})",
        column_list(table),
        ddl::table_name(table.name, copy),
        key_column(table),
        vec!["?"; keys].join(", ")
    )
}

/// A column that `table` must have, or Constraint: the caller named a
/// column the projection does not define.
fn check_column(table: &TableSpec, column: &str) -> Result<(), StoreError> {
    if table.column_names().any(|known| known == column) {
        Ok(())
    } else {
        Err(StoreError::constraint(format!("{} has no column {column}", table.name)))
    }
}

/// `SELECT` of rows whose filter columns equal parameters, then the limit
/// as the last parameter.
pub(crate) fn find_sql(
    table: &TableSpec,
    copy: Copy<'_>,
    filters: &[(&'static str, Cell)],
) -> Result<String, StoreError> {
    for (column, _) in filters {
        check_column(table, column)?;
    }
    let conditions: Vec<String> = filters.iter().map(|(column, _)| format!("{column} = ?")).collect();
    Ok(format!(
        "SELECT {} FROM {}{}{} ORDER BY {} LIMIT ?",
        column_list(table),
        ddl::table_name(table.name, copy),
        if conditions.is_empty() { "" } else { " WHERE " },
        conditions.join(" AND "),
        key_column(table)
    ))
}

/// `SELECT` of rows whose `column` is one of `values` parameters.
pub(crate) fn find_in_sql(
    table: &TableSpec,
    copy: Copy<'_>,
    column: &str,
    values: usize,
) -> Result<String, StoreError> {
    check_column(table, column)?;
    Ok(format!(
        "SELECT {} FROM {} WHERE {column} IN ({}) ORDER BY {}",
        column_list(table),
        ddl::table_name(table.name, copy),
        vec!["?"; values].join(", "),
        key_column(table)
    ))
}

/// Rows per multi-row upsert of `table`, below the parameter limit.
pub(crate) fn upserts_per_statement(table: &TableSpec) -> usize {
    (MAX_PARAMS / table.columns.len()).max(1)
}

/// A multi-row upsert of `rows` rows into one copy of a table.
pub(crate) fn upsert_sql(table: &TableSpec, copy: Copy<'_>, rows: usize) -> String {
    let row_placeholder = format!("({})", vec!["?"; table.columns.len()].join(", "));
    let updates: Vec<String> = table
        .columns
        .iter()
        .skip(table.key_columns)
        .map(|column| format!("{0} = excluded.{0}", column.name))
        .collect();
    format!(
        "INSERT INTO {} ({}) VALUES {} ON CONFLICT ({}) DO UPDATE SET {}",
        ddl::table_name(table.name, copy),
        column_list(table),
        vec![row_placeholder.as_str(); rows].join(", "),
        key_column(table),
        updates.join(", ")
    )
}

/// An `UPDATE` of the columns at `positions` (in the table's column list)
/// of one row, by key: the values first, the key last.
pub(crate) fn update_sql(table: &TableSpec, copy: Copy<'_>, positions: &[usize]) -> String {
    let assignments: Vec<String> = positions
        .iter()
        .enumerate()
        .map(|(index, position)| format!("{} = ?{}", table.columns[*position].name, index + 1))
        .collect();
    format!(
        "UPDATE {} SET {} WHERE {} = ?{}",
        ddl::table_name(table.name, copy),
        assignments.join(", "),
        key_column(table),
        positions.len() + 1
    )
}

/// A `DELETE` of `keys` keys from one copy of a table.
pub(crate) fn delete_sql(table: &TableSpec, copy: Copy<'_>, keys: usize) -> String {
    format!(
        "DELETE FROM {} WHERE {} IN ({})",
        ddl::table_name(table.name, copy),
        key_column(table),
        vec!["?"; keys].join(", ")
    )
}

/// Rows of one copy of a table whose columns equal the given cells.
pub async fn find(
    conn: &mut SqliteConnection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    filters: &[(&'static str, Cell)],
    limit: usize,
) -> Result<Vec<Row>, StoreError> {
    let name = ddl::table_name(table.name, copy);
    let sql = find_sql(table, copy, filters)?;
    let mut query = sqlx::query(&sql);
    for (_, cell) in filters {
        query = bind_cell(query, cell);
    }
    query = query.bind(i64::try_from(limit).unwrap_or(i64::MAX));
    let fetched = query
        .fetch_all(&mut *conn)
        .await
        .map_err(|error| map(error, &format!("searching {name}")))?;
    fetched
        .iter()
        .map(|row| {
            let cells = decode_cells(row, table)?;
            Row::from_cells(table, cells).map_err(|error| StoreError::corrupt(error.to_string()))
        })
        .collect()
}

/// Rows of one copy of a table whose `column` is one of `values`, in key
/// order within each chunk of parameters (the write side's `find_in` on a
/// read connection).
pub async fn find_in(
    conn: &mut SqliteConnection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    column: &'static str,
    values: &[Cell],
) -> Result<Vec<Row>, StoreError> {
    let name = ddl::table_name(table.name, copy);
    // Validate the column even when there is nothing to look up.
    find_in_sql(table, copy, column, 1)?;
    let mut found = Vec::new();
    for chunk in values.chunks(MAX_PARAMS) {
        let sql = find_in_sql(table, copy, column, chunk.len())?;
        let mut query = sqlx::query(&sql);
        for cell in chunk {
            query = bind_cell(query, cell);
        }
        let fetched = query
            .fetch_all(&mut *conn)
            .await
            .map_err(|error| map(error, &format!("searching {name}")))?;
        for row in &fetched {
            let cells = decode_cells(row, table)?;
            found.push(Row::from_cells(table, cells).map_err(|error| StoreError::corrupt(error.to_string()))?);
        }
    }
    Ok(found)
}

/// The columns of the event log, in the order [`decode_event`] reads them.
pub const EVENT_COLUMNS: &str =
    "seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id, causation_id";

/// Decodes one log row. Anything that does not decode is Corrupt, naming the seq.
pub fn decode_event(row: &SqliteRow) -> Result<EventEnvelope, StoreError> {
    let seq: i64 = row.try_get(0).map_err(|error| map(error, "reading seq"))?;
    let column = |error: sqlx::Error| StoreError::corrupt_at(seq, error.to_string());
    log::decode(StoredEvent {
        seq,
        stream_id: row.try_get(1).map_err(column)?,
        stream_version: row.try_get(2).map_err(column)?,
        event_type: row.try_get(3).map_err(column)?,
        schema_version: row.try_get(4).map_err(column)?,
        payload: row.try_get(5).map_err(column)?,
        recorded_at: RecordedAt::Text(row.try_get(6).map_err(column)?),
        actor: row.try_get(7).map_err(column)?,
        correlation_id: row.try_get(8).map_err(column)?,
        causation_id: row.try_get(9).map_err(column)?,
    })
}

/// Up to `limit` events of one stream after stream version `after`, in
/// stream order: a range of the log's unique `(stream_id, stream_version)`
/// index.
pub async fn read_stream<'c, E>(
    executor: E,
    stream_id: &opledger_domain::StreamId,
    after: i64,
    limit: usize,
) -> Result<Vec<EventEnvelope>, StoreError>
where
    E: sqlx::Executor<'c, Database = Sqlite>,
{
    let sql = format!(
        "SELECT {EVENT_COLUMNS} FROM media_operation_events WHERE stream_id = ? AND stream_version > ? \
         ORDER BY stream_version LIMIT ?"
    );
    let fetched = sqlx::query(&sql)
        .bind(stream_id.as_str())
        .bind(after)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(executor)
        .await
        .map_err(|error| map(error, "reading a stream"))?;
    fetched.iter().map(decode_event).collect()
}

/// Reads up to `limit` events after `after` on `conn`, stepping SQLite
/// directly (see `sqlx_handle.rs`).
pub async fn read_events(
    conn: &mut SqliteConnection,
    after: i64,
    limit: usize,
) -> Result<Vec<EventEnvelope>, StoreError> {
    crate::sqlx_handle::read_events(conn, after, limit).await
}

/// Runs one or more SQL statements without binding anything. (sqlx's
/// `raw_sql` future is not `Send` in every context these run in; the
/// `Executor` path is.)
pub async fn script(connection: &mut SqliteConnection, sql: &str) -> Result<(), sqlx::Error> {
    sqlx::Executor::execute(&mut *connection, sql).await.map(|_| ())
}
