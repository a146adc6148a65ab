//! One column's values, typed for binding as a scalar or as one array
//! parameter, and a cell bound as a parameter of its column's native type:
//! what the rows' SQL (`rows`, `page`) and the gathered statement
//! (`batch`) both bind.

use chrono::{DateTime, Utc};
use opledger_domain::projections::{Cell, ColumnType, TableSpec};
use opledger_domain::Timestamp;
use opledger_store::StoreError;
use sqlx::postgres::PgArguments;
use sqlx::Postgres;
use uuid::Uuid;

pub(crate) type PgQuery<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

/// One column's values, typed for binding as a scalar or an array.
pub(crate) enum Values {
    Integer(Vec<Option<i64>>),
    Real(Vec<Option<f64>>),
    Text(Vec<Option<String>>),
    Bool(Vec<Option<bool>>),
    Timestamp(Vec<Option<DateTime<Utc>>>),
    Uuid(Vec<Option<Uuid>>),
}

impl Values {
    pub(crate) fn new(ty: ColumnType, capacity: usize) -> Self {
        match ty {
            ColumnType::Integer => Values::Integer(Vec::with_capacity(capacity)),
            ColumnType::Real => Values::Real(Vec::with_capacity(capacity)),
            ColumnType::Text | ColumnType::Json => Values::Text(Vec::with_capacity(capacity)),
            ColumnType::Bool => Values::Bool(Vec::with_capacity(capacity)),
            ColumnType::Timestamp => Values::Timestamp(Vec::with_capacity(capacity)),
            ColumnType::Uuid => Values::Uuid(Vec::with_capacity(capacity)),
        }
    }

    /// Appends a cell converted to this column's type. A cell that cannot be
    /// (text in an integer column, a malformed uuid) is refused as the
    /// database would refuse it: Constraint.
    pub(crate) fn push(&mut self, cell: &Cell) -> Result<(), String> {
        let wrong = |expected: &str| format!("expected {expected}, found {cell}");
        match self {
            Values::Integer(values) => values.push(match cell {
                Cell::Null => None,
                Cell::Integer(value) => Some(*value),
                Cell::Bool(value) => Some(i64::from(*value)),
                _ => return Err(wrong("an integer")),
            }),
            Values::Real(values) => values.push(match cell {
                Cell::Null => None,
                Cell::Real(value) => Some(*value),
                Cell::Integer(value) => Some(*value as f64),
                _ => return Err(wrong("a number")),
            }),
            Values::Text(values) => values.push(match cell {
                Cell::Null => None,
                Cell::Text(value) | Cell::Json(value) => Some(value.clone()),
                Cell::Uuid(value) => Some(value.hyphenated().to_string()),
                Cell::Timestamp(value) => Some(value.to_rfc3339()),
                _ => return Err(wrong("text")),
            }),
            Values::Bool(values) => values.push(match cell {
                Cell::Null => None,
                Cell::Bool(value) => Some(*value),
                Cell::Integer(0) => Some(false),
                Cell::Integer(1) => Some(true),
                _ => return Err(wrong("a boolean")),
            }),
            Values::Timestamp(values) => values.push(match cell {
                Cell::Null => None,
                Cell::Timestamp(value) => Some(value.to_datetime()),
                Cell::Text(text) => Some(Timestamp::parse(text)?.to_datetime()),
                _ => return Err(wrong("a timestamp")),
            }),
            Values::Uuid(values) => values.push(match cell {
                Cell::Null => None,
                Cell::Uuid(value) => Some(*value),
                Cell::Text(text) => Some(Uuid::parse_str(text).map_err(|error| format!("{text:?}: {error}"))?),
                _ => return Err(wrong("a uuid")),
            }),
        }
        Ok(())
    }

    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Values::Integer(values) => values.is_empty(),
            Values::Real(values) => values.is_empty(),
            Values::Text(values) => values.is_empty(),
            Values::Bool(values) => values.is_empty(),
            Values::Timestamp(values) => values.is_empty(),
            Values::Uuid(values) => values.is_empty(),
        }
    }

    /// Binds every value as one array parameter.
    pub(crate) fn bind_array(self, query: PgQuery<'_>) -> PgQuery<'_> {
        match self {
            Values::Integer(values) => query.bind(values),
            Values::Real(values) => query.bind(values),
            Values::Text(values) => query.bind(values),
            Values::Bool(values) => query.bind(values),
            Values::Timestamp(values) => query.bind(values),
            Values::Uuid(values) => query.bind(values),
        }
    }

    /// Binds the first value as a scalar parameter.
    fn bind_first(self, query: PgQuery<'_>) -> PgQuery<'_> {
        fn first<T>(values: Vec<Option<T>>) -> Option<T> {
            values.into_iter().next().flatten()
        }
        match self {
            Values::Integer(values) => query.bind(first(values)),
            Values::Real(values) => query.bind(first(values)),
            Values::Text(values) => query.bind(first(values)),
            Values::Bool(values) => query.bind(first(values)),
            Values::Timestamp(values) => query.bind(first(values)),
            Values::Uuid(values) => query.bind(first(values)),
        }
    }
}

/// Binds one cell as a parameter of the column's native type.
pub(crate) fn bind_cell<'q>(
    query: PgQuery<'q>,
    table: &TableSpec,
    column: &str,
    ty: ColumnType,
    cell: &Cell,
) -> Result<PgQuery<'q>, StoreError> {
    let mut values = Values::new(ty, 1);
    values
        .push(cell)
        .map_err(|error| StoreError::constraint(format!("{} column {column}: {error}", table.name)))?;
    Ok(values.bind_first(query))
}
