//! Generic projection-row SQL: any table described by a [`TableSpec`] is
//! loaded, upserted, deleted and compared the same way, so a new projection
//! needs DDL but no new store code.
//!
//! Sets of keys and rows travel as one array parameter per column
//! (`= ANY($1)`, `UNNEST($1, $2, …)`), so each statement's text is fixed per
//! table: it is prepared once per connection whatever the batch size, and
//! no batch ever meets a parameter limit.

use crate::batch::{Bind, Statement};
use crate::ddl::{self, Copy};
use crate::error::map;
use crate::values::{bind_cell, Values};
use chrono::{DateTime, Utc};
use opledger_domain::projections::{Cell, ColumnType, Key, Row, RowChange, TableSpec};
use opledger_domain::{EventEnvelope, Timestamp};
use opledger_store::append::Planned;
use opledger_store::log::{self, RecordedAt, StoredEvent};
use opledger_store::StoreError;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres, Row as _};
use std::collections::BTreeMap;
use uuid::Uuid;

/// The native type a neutral column type is stored as.
pub(crate) fn sql_type(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Integer => "bigint",
        ColumnType::Real => "double precision",
        // JSON stays text: the stored text must be exactly what was written
        // (jsonb would reorder keys), and verify compares it as text.
        ColumnType::Text | ColumnType::Json => "text",
        ColumnType::Bool => "boolean",
        ColumnType::Timestamp => "timestamptz",
        ColumnType::Uuid => "uuid",
    }
}

/// Decodes column `index` of `row` as `ty`.
pub fn decode_cell(row: &PgRow, index: usize, ty: ColumnType, table: &str) -> Result<Cell, StoreError> {
    let bad = |error: sqlx::Error| StoreError::corrupt(format!("{table} column {index}: {error}"));
    Ok(match ty {
        ColumnType::Integer => row.try_get::<Option<i64>, _>(index).map_err(bad)?.map(Cell::Integer),
        ColumnType::Real => row.try_get::<Option<f64>, _>(index).map_err(bad)?.map(Cell::Real),
        ColumnType::Text => row.try_get::<Option<String>, _>(index).map_err(bad)?.map(Cell::Text),
        ColumnType::Json => row.try_get::<Option<String>, _>(index).map_err(bad)?.map(Cell::Json),
        ColumnType::Bool => row.try_get::<Option<bool>, _>(index).map_err(bad)?.map(Cell::Bool),
        ColumnType::Timestamp => row
            .try_get::<Option<DateTime<Utc>>, _>(index)
            .map_err(bad)?
            .map(|at| Cell::Timestamp(Timestamp::from_datetime(at))),
        ColumnType::Uuid => row.try_get::<Option<Uuid>, _>(index).map_err(bad)?.map(Cell::Uuid),
    }
    .unwrap_or(Cell::Null))
}

pub fn decode_cells(row: &PgRow, table: &TableSpec) -> Result<Vec<Cell>, StoreError> {
    table
        .columns
        .iter()
        .enumerate()
        .map(|(index, column)| decode_cell(row, index, column.ty, table.name))
        .collect()
}

pub(crate) fn decode_row(row: &PgRow, table: &TableSpec) -> Result<Row, StoreError> {
    let cells = decode_cells(row, table)?;
    Row::from_cells(table, cells).map_err(|error| StoreError::corrupt(error.to_string()))
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

/// A column that `table` must have, or Constraint: the caller named a
/// column the projection does not define. Also what makes it safe to put
/// the name into SQL text.
pub(crate) fn check_column(table: &TableSpec, column: &str) -> Result<ColumnType, StoreError> {
    table
        .columns
        .iter()
        .find(|known| known.name == column)
        .map(|known| known.ty)
        .ok_or_else(|| StoreError::constraint(format!("{} has no column {column}", table.name)))
}

/// Keys given as text (how `RowKey` renders them), typed for the key
/// column. A key that is not of the column's type cannot name a stored row,
/// so it is left out: absent keys are simply missing from answers.
fn key_values(table: &TableSpec, keys: &[&str]) -> Values {
    let ty = table.columns[0].ty;
    assert!(
        matches!(ty, ColumnType::Uuid | ColumnType::Text),
        "{}: key type {ty:?} not supported",
        table.name
    );
    let mut values = Values::new(ty, keys.len());
    for key in keys {
        let _ = values.push(&Cell::Text((*key).to_string()));
    }
    values
}

fn fetch_error(name: &str, what: &str) -> impl Fn(sqlx::Error) -> StoreError {
    let context = format!("{what} {name}");
    move |error| map(error, &context)
}

/// Loads rows by key from one copy of a table.
pub async fn load(
    conn: &mut PgConnection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    keys: &[String],
) -> Result<Vec<Row>, StoreError> {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let values = key_values(table, &keys);
    if values.is_empty() {
        return Ok(Vec::new());
    }
    let name = ddl::table_name(table.name, copy);
    let sql = format!(
        "SELECT {} FROM {name} WHERE {} = ANY($1::{}[])",
        column_list(table),
        key_column(table),
        sql_type(table.columns[0].ty)
    );
    let fetched = values
        .bind_array(sqlx::query(&sql))
        .fetch_all(&mut *conn)
        .await
        .map_err(fetch_error(&name, "loading"))?;
    fetched.iter().map(|row| decode_row(row, table)).collect()
}

/// Loads rows by key from several tables of one copy in one statement:
/// each table's rows as JSON arrays of their columns in order
/// (`json_build_array`: no column names to parse), told apart by the
/// table's place in `requests`. One table alone is read with its typed
/// columns.
pub async fn load_many(
    conn: &mut PgConnection,
    requests: &[(&'static TableSpec, Vec<String>)],
    copy: Copy<'_>,
) -> Result<Vec<Row>, StoreError> {
    let requests: Vec<&(&'static TableSpec, Vec<String>)> =
        requests.iter().filter(|(_, keys)| !keys.is_empty()).collect();
    if let [(table, keys)] = requests.as_slice() {
        return load(conn, table, copy, keys).await;
    }
    let mut selects = Vec::with_capacity(requests.len());
    let mut binds = Vec::with_capacity(requests.len());
    for (index, (table, keys)) in requests.iter().enumerate() {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = key_values(table, &keys);
        if values.is_empty() {
            continue;
        }
        binds.push(values);
        selects.push(format!(
            "SELECT {index}::integer, json_build_array({})::text FROM {} WHERE {} = ANY(${}::{}[])",
            column_list(table),
            ddl::table_name(table.name, copy),
            key_column(table),
            binds.len(),
            sql_type(table.columns[0].ty)
        ));
    }
    if selects.is_empty() {
        return Ok(Vec::new());
    }
    let sql = selects.join(" UNION ALL ");
    let mut query = sqlx::query(&sql);
    for values in binds {
        query = values.bind_array(query);
    }
    let fetched = query
        .fetch_all(&mut *conn)
        .await
        .map_err(|error| map(error, "loading projection rows"))?;
    let mut rows = Vec::with_capacity(fetched.len());
    for row in &fetched {
        let index: i32 = row.try_get(0).map_err(|error| map(error, "loading projection rows"))?;
        let json: &str = row.try_get(1).map_err(|error| map(error, "loading projection rows"))?;
        let (table, _) = usize::try_from(index)
            .ok()
            .and_then(|index| requests.get(index))
            .ok_or_else(|| StoreError::corrupt(format!("a loaded row of unknown table {index}")))?;
        rows.push(decode_json_row(json, table)?);
    }
    Ok(rows)
}

/// Decodes a row of `table` from the JSON array of its columns: numbers,
/// booleans, strings for text, uuids and times (ISO 8601 with an offset,
/// exact to the microsecond), null for NULL.
pub(crate) fn decode_json_row(json: &str, table: &TableSpec) -> Result<Row, StoreError> {
    let bad = |what: String| StoreError::corrupt(format!("a loaded row of {}: {what}", table.name));
    let values: Vec<serde_json::Value> = serde_json::from_str(json).map_err(|error| bad(error.to_string()))?;
    if values.len() != table.columns.len() {
        return Err(bad(format!("{} columns, not {}", values.len(), table.columns.len())));
    }
    let mut cells = Vec::with_capacity(table.columns.len());
    for (column, value) in table.columns.iter().zip(&values) {
        let wrong = || bad(format!("column {}: {value} is not {:?}", column.name, column.ty));
        let cell = match (column.ty, value) {
            (_, serde_json::Value::Null) => Cell::Null,
            (ColumnType::Integer, value) => Cell::Integer(value.as_i64().ok_or_else(wrong)?),
            (ColumnType::Real, serde_json::Value::String(text)) => {
                Cell::Real(text.parse::<f64>().map_err(|_| wrong())?)
            }
            (ColumnType::Real, value) => Cell::Real(value.as_f64().ok_or_else(wrong)?),
            (ColumnType::Text, serde_json::Value::String(text)) => Cell::Text(text.clone()),
            (ColumnType::Json, serde_json::Value::String(text)) => Cell::Json(text.clone()),
            (ColumnType::Bool, serde_json::Value::Bool(flag)) => Cell::Bool(*flag),
            (ColumnType::Timestamp, serde_json::Value::String(text)) => {
                let at = DateTime::parse_from_rfc3339(text).map_err(|error| bad(format!("{text:?}: {error}")))?;
                Cell::Timestamp(Timestamp::from_datetime(at.with_timezone(&Utc)))
            }
            (ColumnType::Uuid, serde_json::Value::String(text)) => {
                Cell::Uuid(Uuid::parse_str(text).map_err(|error| bad(format!("{text:?}: {error}")))?)
            }
            _ => return Err(wrong()),
        };
        cells.push(cell);
    }
    Row::from_cells(table, cells).map_err(|error| StoreError::corrupt(error.to_string()))
}

/// Rows of one copy of a table whose columns equal the given cells.
pub async fn find(
    conn: &mut PgConnection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    filters: &[(&'static str, Cell)],
    limit: usize,
) -> Result<Vec<Row>, StoreError> {
    let mut conditions = Vec::with_capacity(filters.len());
    for (index, (column, _)) in filters.iter().enumerate() {
        check_column(table, column)?;
        conditions.push(format!("{column} = ${}", index + 1));
    }
    let name = ddl::table_name(table.name, copy);
    let sql = format!(
        "SELECT {} FROM {name}{}{} ORDER BY {} LIMIT ${}",
        column_list(table),
        if conditions.is_empty() { "" } else { " WHERE " },
        conditions.join(" AND "),
        key_column(table),
        filters.len() + 1
    );
    let mut query = sqlx::query(&sql);
    for (column, cell) in filters {
        query = bind_cell(query, table, column, check_column(table, column)?, cell)?;
    }
    let fetched = query
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *conn)
        .await
        .map_err(fetch_error(&name, "searching"))?;
    fetched.iter().map(|row| decode_row(row, table)).collect()
}

/// Rows of one copy of a table whose `column` is one of `values`, in
/// primary-key order.
pub async fn find_in(
    conn: &mut PgConnection,
    table: &'static TableSpec,
    copy: Copy<'_>,
    column: &'static str,
    values: &[Cell],
) -> Result<Vec<Row>, StoreError> {
    let ty = check_column(table, column)?;
    if values.is_empty() {
        return Ok(Vec::new());
    }
    let mut typed = Values::new(ty, values.len());
    for cell in values {
        typed
            .push(cell)
            .map_err(|error| StoreError::constraint(format!("{} column {column}: {error}", table.name)))?;
    }
    let name = ddl::table_name(table.name, copy);
    let sql = format!(
        "SELECT {} FROM {name} WHERE {column} = ANY($1::{}[]) ORDER BY {}",
        column_list(table),
        sql_type(ty),
        key_column(table)
    );
    let fetched = typed
        .bind_array(sqlx::query(&sql))
        .fetch_all(&mut *conn)
        .await
        .map_err(fetch_error(&name, "searching"))?;
    fetched.iter().map(|row| decode_row(row, table)).collect()
}

/// Writes projection changes in one statement (see [`crate::batch`]).
pub async fn write_rows(
    conn: &mut PgConnection,
    table_order: &[&'static TableSpec],
    copy: Copy<'_>,
    changes: &[RowChange],
) -> Result<(), StoreError> {
    let mut statement = Statement::default();
    push_row_changes(&mut statement, table_order, copy, changes)?;
    statement.execute(conn, "writing projection rows").await
}

/// Adds projection changes to `statement`: one upsert per table written
/// and one delete per table deleted from. A key given more than once keeps
/// its last change, as successive writes would (one `INSERT … ON CONFLICT`
/// may not touch a row twice, and a row may not be both written and
/// deleted by one statement).
pub(crate) fn push_row_changes(
    statement: &mut Statement,
    table_order: &[&'static TableSpec],
    copy: Copy<'_>,
    changes: &[RowChange],
) -> Result<(), StoreError> {
    for table in table_order {
        let mut last: BTreeMap<&Key, Option<&Row>> = BTreeMap::new();
        for change in changes.iter().filter(|change| change.key.table == table.name) {
            last.insert(&change.key.key, change.after.as_deref());
        }
        if last.is_empty() {
            continue;
        }
        let upserts: Vec<&Row> = last.values().filter_map(|row| *row).collect();
        let deletes: Vec<String> = last
            .iter()
            .filter(|(_, row)| row.is_none())
            .map(|(key, _)| key.to_string())
            .collect();
        if !upserts.is_empty() {
            push_upsert(statement, table, copy, &upserts)?;
        }
        if !deletes.is_empty() {
            let deletes: Vec<&str> = deletes.iter().map(String::as_str).collect();
            push_delete(statement, table, copy, &deletes);
        }
    }
    Ok(())
}

fn push_upsert(statement: &mut Statement, table: &TableSpec, copy: Copy<'_>, rows: &[&Row]) -> Result<(), StoreError> {
    let mut columns: Vec<Values> = table
        .columns
        .iter()
        .map(|column| Values::new(column.ty, rows.len()))
        .collect();
    for row in rows {
        let cells = row.to_cells();
        if cells.len() != table.columns.len() {
            return Err(StoreError::constraint(format!(
                "a row of {} with {} cells, not {}",
                table.name,
                cells.len(),
                table.columns.len()
            )));
        }
        for ((values, cell), column) in columns.iter_mut().zip(&cells).zip(table.columns) {
            values
                .push(cell)
                .map_err(|error| StoreError::constraint(format!("{} column {}: {error}", table.name, column.name)))?;
        }
    }
    let name = ddl::table_name(table.name, copy);
    let arrays: Vec<String> = columns
        .into_iter()
        .zip(table.columns)
        .map(|(values, column)| statement.param(Bind::Array(values), &format!("{}[]", sql_type(column.ty))))
        .collect();
    let updates: Vec<String> = table
        .columns
        .iter()
        .skip(table.key_columns)
        .map(|column| format!("{0} = EXCLUDED.{0}", column.name))
        .collect();
    statement.push(format!(
        "INSERT INTO {name} ({}) SELECT * FROM UNNEST({}) ON CONFLICT ({}) DO UPDATE SET {}",
        column_list(table),
        arrays.join(", "),
        key_column(table),
        updates.join(", ")
    ));
    Ok(())
}

fn push_delete(statement: &mut Statement, table: &TableSpec, copy: Copy<'_>, keys: &[&str]) {
    let values = key_values(table, keys);
    if values.is_empty() {
        return;
    }
    let name = ddl::table_name(table.name, copy);
    let keys = statement.param(Bind::Array(values), &format!("{}[]", sql_type(table.columns[0].ty)));
    statement.push(format!("DELETE FROM {name} WHERE {} = ANY({keys})", key_column(table)));
}

/// The columns of the event log, in the order [`decode_event`] reads them.
pub const EVENT_COLUMNS: &str =
    "seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, actor, correlation_id, causation_id";

/// Decodes one log row. Anything that does not decode is Corrupt, naming the seq.
pub fn decode_event(row: &PgRow) -> Result<EventEnvelope, StoreError> {
    let seq: i64 = row.try_get(0).map_err(|error| map(error, "reading seq"))?;
    let column = |error: sqlx::Error| StoreError::corrupt_at(seq, error.to_string());
    let schema_version: i32 = row.try_get(4).map_err(column)?;
    let recorded_at: DateTime<Utc> = row.try_get(6).map_err(column)?;
    log::decode(StoredEvent {
        seq,
        stream_id: row.try_get(1).map_err(column)?,
        stream_version: row.try_get(2).map_err(column)?,
        event_type: row.try_get(3).map_err(column)?,
        schema_version: i64::from(schema_version),
        payload: row.try_get(5).map_err(column)?,
        recorded_at: RecordedAt::Time(Timestamp::from_datetime(recorded_at)),
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
    E: sqlx::Executor<'c, Database = Postgres>,
{
    let sql = format!(
        "SELECT {EVENT_COLUMNS} FROM media_operation_events WHERE stream_id = $1 AND stream_version > $2 \
         ORDER BY stream_version LIMIT $3"
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

/// Reads up to `limit` events after `after`, in seq order.
pub async fn read_events(conn: &mut PgConnection, after: i64, limit: usize) -> Result<Vec<EventEnvelope>, StoreError> {
    let sql = format!("SELECT {EVENT_COLUMNS} FROM media_operation_events WHERE seq > $1 ORDER BY seq LIMIT $2");
    let fetched = sqlx::query(&sql)
        .bind(after)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *conn)
        .await
        .map_err(|error| map(error, "reading the event log"))?;
    fetched.iter().map(decode_event).collect()
}

/// Adds the insert of planned events (numbered and linked) to `statement`.
pub(crate) fn push_events(statement: &mut Statement, planned: &Planned) -> Result<(), StoreError> {
    let envelopes = &planned.envelopes;
    if envelopes.is_empty() {
        return Ok(());
    }
    let count = envelopes.len();
    let mut seqs = Vec::with_capacity(count);
    let mut streams = Vec::with_capacity(count);
    let mut versions = Vec::with_capacity(count);
    let mut types = Vec::with_capacity(count);
    let mut schema_versions = Vec::with_capacity(count);
    let mut payloads = Vec::with_capacity(count);
    let mut times = Vec::with_capacity(count);
    let mut actors = Vec::with_capacity(count);
    let mut correlations = Vec::with_capacity(count);
    let mut causations = Vec::with_capacity(count);
    let hashes: Vec<Option<String>> = planned.hashes.iter().map(|hash| Some(hash.to_hex())).collect();
    for (envelope, payload) in envelopes.iter().zip(&planned.payloads) {
        seqs.push(Some(envelope.seq));
        streams.push(Some(envelope.stream_id.as_str().to_string()));
        versions.push(Some(envelope.stream_version));
        types.push(Some(envelope.event.event_type().to_string()));
        if i32::try_from(envelope.schema_version).is_err() {
            return Err(StoreError::constraint(format!(
                "schema version {} too large",
                envelope.schema_version
            )));
        }
        schema_versions.push(Some(i64::from(envelope.schema_version)));
        payloads.push(Some(payload.clone()));
        times.push(Some(envelope.recorded_at.to_datetime()));
        actors.push(Some(envelope.actor.clone()));
        correlations.push(Some(envelope.correlation_id.clone()));
        causations.push(envelope.causation_id.clone());
    }
    let arrays = [
        statement.param(Bind::Array(Values::Integer(seqs)), "bigint[]"),
        statement.param(Bind::Array(Values::Text(streams)), "text[]"),
        statement.param(Bind::Array(Values::Integer(versions)), "bigint[]"),
        statement.param(Bind::Array(Values::Text(types)), "text[]"),
        statement.param(Bind::Array(Values::Integer(schema_versions)), "bigint[]"),
        statement.param(Bind::Array(Values::Text(payloads)), "text[]"),
        statement.param(Bind::Array(Values::Timestamp(times)), "timestamptz[]"),
        statement.param(Bind::Array(Values::Text(actors)), "text[]"),
        statement.param(Bind::Array(Values::Text(correlations)), "text[]"),
        statement.param(Bind::Array(Values::Text(causations)), "text[]"),
        statement.param(Bind::Array(Values::Text(hashes)), "text[]"),
    ];
    // ORDER BY: rows arrive in seq order, as the log's gap-free check
    // expects of a statement's rows.
    statement.push(format!(
        "INSERT INTO media_operation_events ({EVENT_COLUMNS}, chain_hash) SELECT * FROM UNNEST({}) ORDER BY 1",
        arrays.join(", ")
    ));
    Ok(())
}

/// Runs one or more SQL statements without parameters (the simple query
/// protocol, so several statements may go in one round trip).
pub async fn script(connection: &mut PgConnection, sql: &str) -> Result<(), sqlx::Error> {
    sqlx::Executor::execute(&mut *connection, sql).await.map(|_| ())
}
