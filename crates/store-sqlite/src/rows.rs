//! Generic projection-row SQL: any table described by a [`TableSpec`] is
//! loaded, upserted, deleted and compared the same way, so a new projection
//! needs DDL but no new store code.

use crate::ddl::{self, Copy};
use crate::error::map;
use opledger_domain::events::Event;
use opledger_domain::projections::{Cell, ColumnType, Row, RowKey, TableSpec};
use opledger_domain::{EventEnvelope, StreamId, Timestamp};
use opledger_store::StoreError;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{query::Query, Row as _, Sqlite, SqliteConnection, ValueRef};
use uuid::Uuid;

/// SQLite allows 32766 bound parameters; staying far below keeps statements
/// small enough to be cached and reused.
const MAX_PARAMS: usize = 900;

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

fn key_column(table: &TableSpec) -> &'static str {
    assert_eq!(
        table.key_columns, 1,
        "{} has a composite key; extend rows.rs",
        table.name
    );
    table.columns[0].name
}

/// Binds a key given as text in the key column's stored form.
fn key_cell(table: &TableSpec, key: &str) -> Cell {
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
        let placeholders = vec!["?"; chunk.len()].join(", ");
        let sql = format!(
            "SELECT {} FROM {name} WHERE {} IN ({placeholders})",
            column_list(table),
            key_column(table)
        );
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

/// Rows of one copy of a table whose columns equal the given cells.
pub async fn find(
    conn: &mut SqliteConnection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    filters: &[(&'static str, Cell)],
    limit: usize,
) -> Result<Vec<Row>, StoreError> {
    let name = ddl::table_name(table.name, copy);
    for (column, _) in filters {
        if !table.column_names().any(|known| known == *column) {
            return Err(StoreError::constraint(format!("{} has no column {column}", table.name)));
        }
    }
    let conditions: Vec<String> = filters.iter().map(|(column, _)| format!("{column} = ?")).collect();
    let sql = format!(
        "SELECT {} FROM {name}{}{} ORDER BY {} LIMIT ?",
        column_list(table),
        if conditions.is_empty() { "" } else { " WHERE " },
        conditions.join(" AND "),
        key_column(table)
    );
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

/// Rows of one copy of a table whose `column` is one of `values`.
pub async fn find_in(
    conn: &mut SqliteConnection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    column: &'static str,
    values: &[Cell],
) -> Result<Vec<Row>, StoreError> {
    if !table.column_names().any(|known| known == column) {
        return Err(StoreError::constraint(format!("{} has no column {column}", table.name)));
    }
    let name = ddl::table_name(table.name, copy);
    let mut found = Vec::new();
    for chunk in values.chunks(MAX_PARAMS) {
        let sql = format!(
            "SELECT {} FROM {name} WHERE {column} IN ({}) ORDER BY {}",
            column_list(table),
            vec!["?"; chunk.len()].join(", "),
            key_column(table)
        );
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

/// Statements gathered to run in one round trip to the driver. sqlx hands
/// each statement to SQLite's worker thread and back; on a small machine that
/// handoff costs more than the statement, so the writer gathers a piece of
/// work's writes and sends them together, binding parameters in order.
#[derive(Default)]
pub struct Batch {
    sql: String,
    args: SqliteArguments<'static>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.sql.is_empty()
    }

    /// Adds one statement; `bind` adds its parameters in order.
    pub fn push(&mut self, sql: &str, bind: impl FnOnce(&mut SqliteArguments<'static>)) {
        self.sql.push_str(sql);
        self.sql.push_str(";\n");
        bind(&mut self.args);
    }

    /// Runs and empties the batch.
    pub async fn run(&mut self, conn: &mut SqliteConnection, context: &str) -> Result<(), StoreError> {
        if self.sql.is_empty() {
            return Ok(());
        }
        let sql = std::mem::take(&mut self.sql);
        let args = std::mem::take(&mut self.args);
        sqlx::query_with(&sql, args)
            .execute(&mut *conn)
            .await
            .map(|_| ())
            .map_err(|error| map(error, context))
    }

    /// Forgets everything gathered (the work that gathered it failed).
    pub fn clear(&mut self) {
        self.sql.clear();
        self.args = SqliteArguments::default();
    }
}

pub fn add_cell(args: &mut SqliteArguments<'static>, cell: &Cell) {
    use sqlx::Arguments;
    // Adding a plain value to SQLite arguments cannot fail.
    let added = match cell {
        Cell::Null => args.add(None::<String>),
        Cell::Integer(value) => args.add(*value),
        Cell::Real(value) => args.add(*value),
        Cell::Text(value) | Cell::Json(value) => args.add(value.clone()),
        Cell::Bool(value) => args.add(i64::from(*value)),
        Cell::Timestamp(value) => args.add(value.to_rfc3339()),
        Cell::Uuid(value) => args.add(value.hyphenated().to_string()),
    };
    added.expect("binding a plain value to SQLite arguments");
}

/// Gathers the statements that write changed rows to one copy: upserts in
/// `table_order` (parents first), then deletes in reverse order (children
/// first).
pub fn gather_writes(
    batch: &mut Batch,
    table_order: &[&'static TableSpec],
    copy: Copy<'_>,
    changes: &[(RowKey, Option<Row>)],
) {
    for table in table_order {
        let upserts: Vec<&Row> = changes
            .iter()
            .filter(|(key, _)| key.table == table.name)
            .filter_map(|(_, row)| row.as_ref())
            .collect();
        if !upserts.is_empty() {
            gather_upserts(batch, table, copy, &upserts);
        }
    }
    for table in table_order.iter().rev() {
        let deletes: Vec<&str> = changes
            .iter()
            .filter(|(key, row)| key.table == table.name && row.is_none())
            .map(|(key, _)| key.key.as_str())
            .collect();
        if !deletes.is_empty() {
            gather_deletes(batch, table, copy, &deletes);
        }
    }
}

fn gather_upserts(batch: &mut Batch, table: &TableSpec, copy: Copy<'_>, rows: &[&Row]) {
    let name = ddl::table_name(table.name, copy);
    let width = table.columns.len();
    let row_placeholder = format!("({})", vec!["?"; width].join(", "));
    let updates: Vec<String> = table
        .columns
        .iter()
        .skip(table.key_columns)
        .map(|column| format!("{0} = excluded.{0}", column.name))
        .collect();
    let per_statement = (MAX_PARAMS / width).max(1);
    for chunk in rows.chunks(per_statement) {
        let sql = format!(
            "INSERT INTO {name} ({}) VALUES {} ON CONFLICT ({}) DO UPDATE SET {}",
            column_list(table),
            vec![row_placeholder.as_str(); chunk.len()].join(", "),
            key_column(table),
            updates.join(", ")
        );
        batch.push(&sql, |args| {
            for row in chunk {
                for cell in row.to_cells() {
                    add_cell(args, &cell);
                }
            }
        });
    }
}

fn gather_deletes(batch: &mut Batch, table: &TableSpec, copy: Copy<'_>, keys: &[&str]) {
    let name = ddl::table_name(table.name, copy);
    for chunk in keys.chunks(MAX_PARAMS) {
        let sql = format!(
            "DELETE FROM {name} WHERE {} IN ({})",
            key_column(table),
            vec!["?"; chunk.len()].join(", ")
        );
        batch.push(&sql, |args| {
            for key in chunk {
                add_cell(args, &key_cell(table, key));
            }
        });
    }
}

/// The columns of the event log, in the order [`decode_event`] reads them.
pub const EVENT_COLUMNS: &str =
    "seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id, causation_id";

/// Decodes one log row. Anything that does not decode is Corrupt, naming the seq.
pub fn decode_event(row: &SqliteRow) -> Result<EventEnvelope, StoreError> {
    let seq: i64 = row.try_get(0).map_err(|error| map(error, "reading seq"))?;
    let corrupt = |what: String| StoreError::corrupt_at(seq, what);
    let column = |error: sqlx::Error| corrupt(error.to_string());
    let stream_id: String = row.try_get(1).map_err(column)?;
    let stream_version: i64 = row.try_get(2).map_err(column)?;
    let event_type: &str = row.try_get(3).map_err(column)?;
    let schema_version: i64 = row.try_get(4).map_err(column)?;
    let payload: &str = row.try_get(5).map_err(column)?;
    let recorded_at: &str = row.try_get(6).map_err(column)?;
    let schema_version = u32::try_from(schema_version).map_err(|error| corrupt(error.to_string()))?;
    let event = Event::decode(event_type, schema_version, payload).map_err(|error| corrupt(error.to_string()))?;
    Ok(EventEnvelope {
        seq,
        stream_id: StreamId::from_stored(stream_id),
        stream_version,
        schema_version,
        recorded_at: Timestamp::parse(recorded_at).map_err(corrupt)?,
        actor: row.try_get(7).map_err(column)?,
        correlation_id: row.try_get(8).map_err(column)?,
        causation_id: row.try_get(9).map_err(column)?,
        event,
    })
}

/// Reads up to `limit` events after `after` on `conn`, stepping SQLite
/// directly (see `raw.rs`).
pub async fn read_events(
    conn: &mut SqliteConnection,
    after: i64,
    limit: usize,
) -> Result<Vec<EventEnvelope>, StoreError> {
    crate::raw::read_events(conn, after, limit).await
}

/// Runs one or more SQL statements without binding anything. (sqlx's
/// `raw_sql` future is not `Send` in every context these run in; the
/// `Executor` path is.)
pub async fn script(connection: &mut SqliteConnection, sql: &str) -> Result<(), sqlx::Error> {
    sqlx::Executor::execute(&mut *connection, sql).await.map(|_| ())
}
