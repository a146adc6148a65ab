//! Backend-neutral cells and table descriptions.

use crate::time::Timestamp;
use std::fmt;
use uuid::Uuid;

/// How a column is stored. Each backend picks its native type for it
/// (SQLite: INTEGER/REAL/TEXT; PostgreSQL: bigint/double/text/timestamptz/…).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Integer,
    Real,
    Text,
    Bool,
    Timestamp,
    Uuid,
    /// JSON text, compared as text.
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnSpec {
    pub name: &'static str,
    pub ty: ColumnType,
    pub nullable: bool,
}

impl ColumnSpec {
    pub const fn required(name: &'static str, ty: ColumnType) -> Self {
        ColumnSpec {
            name,
            ty,
            nullable: false,
        }
    }

    pub const fn optional(name: &'static str, ty: ColumnType) -> Self {
        ColumnSpec {
            name,
            ty,
            nullable: true,
        }
    }
}

/// A projection table: its name, its columns in order, and how many leading
/// columns form the primary key.
#[derive(Debug, PartialEq, Eq)]
pub struct TableSpec {
    pub name: &'static str,
    pub columns: &'static [ColumnSpec],
    pub key_columns: usize,
}

impl TableSpec {
    pub fn column_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.columns.iter().map(|column| column.name)
    }
}

/// One stored value.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Bool(bool),
    Timestamp(Timestamp),
    Uuid(Uuid),
    Json(String),
}

impl Cell {
    /// The value as JSON: NULL is null, JSON columns are embedded parsed
    /// (or as their text when they do not parse), times and ids are strings.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Cell::Null => Value::Null,
            Cell::Integer(value) => Value::from(*value),
            Cell::Real(value) => Value::from(*value),
            Cell::Text(value) => Value::from(value.as_str()),
            Cell::Json(value) => serde_json::from_str(value).unwrap_or_else(|_| Value::from(value.as_str())),
            Cell::Bool(value) => Value::from(*value),
            Cell::Timestamp(value) => Value::from(value.to_rfc3339()),
            Cell::Uuid(value) => Value::from(value.hyphenated().to_string()),
        }
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Null => f.write_str("NULL"),
            Cell::Integer(value) => write!(f, "{value}"),
            Cell::Real(value) => write!(f, "{value}"),
            Cell::Text(value) | Cell::Json(value) => write!(f, "{value:?}"),
            Cell::Bool(value) => write!(f, "{value}"),
            Cell::Timestamp(value) => write!(f, "{value}"),
            Cell::Uuid(value) => write!(f, "{value}"),
        }
    }
}

/// A stored row that does not map to its typed row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapError {
    pub table: String,
    pub reason: String,
}

impl MapError {
    pub fn new(table: &str, reason: String) -> Self {
        MapError {
            table: table.to_string(),
            reason,
        }
    }
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "row of {} does not map: {}", self.table, self.reason)
    }
}

impl std::error::Error for MapError {}

/// Reads typed values out of a row's cells, in column order, naming the
/// table and column in every error. Used by the explicit row mappers.
pub(crate) struct CellReader {
    table: &'static TableSpec,
    cells: std::vec::IntoIter<Cell>,
    index: usize,
}

impl CellReader {
    pub(crate) fn new(table: &'static TableSpec, cells: Vec<Cell>) -> Self {
        CellReader {
            table,
            cells: cells.into_iter(),
            index: 0,
        }
    }

    fn next(&mut self) -> Result<(Cell, &'static str), MapError> {
        let column = self
            .table
            .columns
            .get(self.index)
            .ok_or_else(|| MapError::new(self.table.name, "too many columns read".into()))?;
        self.index += 1;
        let cell = self
            .cells
            .next()
            .ok_or_else(|| MapError::new(self.table.name, format!("missing column {}", column.name)))?;
        Ok((cell, column.name))
    }

    fn wrong(&self, column: &str, expected: &str, cell: &Cell) -> MapError {
        MapError::new(
            self.table.name,
            format!("column {column}: expected {expected}, found {cell}"),
        )
    }

    pub(crate) fn optional_text(&mut self) -> Result<Option<String>, MapError> {
        match self.next()? {
            (Cell::Null, _) => Ok(None),
            (Cell::Text(value) | Cell::Json(value), _) => Ok(Some(value)),
            (other, column) => Err(self.wrong(column, "text", &other)),
        }
    }

    pub(crate) fn text(&mut self) -> Result<String, MapError> {
        match self.next()? {
            (Cell::Text(value) | Cell::Json(value), _) => Ok(value),
            (other, column) => Err(self.wrong(column, "text", &other)),
        }
    }

    pub(crate) fn optional_integer(&mut self) -> Result<Option<i64>, MapError> {
        match self.next()? {
            (Cell::Null, _) => Ok(None),
            (Cell::Integer(value), _) => Ok(Some(value)),
            (other, column) => Err(self.wrong(column, "integer", &other)),
        }
    }

    pub(crate) fn integer(&mut self) -> Result<i64, MapError> {
        match self.next()? {
            (Cell::Integer(value), _) => Ok(value),
            (other, column) => Err(self.wrong(column, "integer", &other)),
        }
    }

    pub(crate) fn boolean(&mut self) -> Result<bool, MapError> {
        match self.next()? {
            (Cell::Bool(value), _) => Ok(value),
            (Cell::Integer(value @ (0 | 1)), _) => Ok(value == 1),
            (other, column) => Err(self.wrong(column, "bool", &other)),
        }
    }

    pub(crate) fn optional_timestamp(&mut self) -> Result<Option<Timestamp>, MapError> {
        match self.next()? {
            (Cell::Null, _) => Ok(None),
            (Cell::Timestamp(value), _) => Ok(Some(value)),
            (other, column) => Err(self.wrong(column, "timestamp", &other)),
        }
    }

    pub(crate) fn timestamp(&mut self) -> Result<Timestamp, MapError> {
        match self.optional_timestamp()? {
            Some(value) => Ok(value),
            None => Err(MapError::new(self.table.name, "a required timestamp is NULL".into())),
        }
    }

    pub(crate) fn optional_uuid(&mut self) -> Result<Option<Uuid>, MapError> {
        match self.next()? {
            (Cell::Null, _) => Ok(None),
            (Cell::Uuid(value), _) => Ok(Some(value)),
            (other, column) => Err(self.wrong(column, "uuid", &other)),
        }
    }

    pub(crate) fn uuid(&mut self) -> Result<Uuid, MapError> {
        match self.optional_uuid()? {
            Some(value) => Ok(value),
            None => Err(MapError::new(self.table.name, "a required uuid is NULL".into())),
        }
    }

    /// Parses a text column with `FromStr` (status vocabularies).
    pub(crate) fn parsed<T: std::str::FromStr<Err = String>>(&mut self) -> Result<T, MapError> {
        let text = self.text()?;
        text.parse().map_err(|reason| MapError::new(self.table.name, reason))
    }

    pub(crate) fn optional_parsed<T: std::str::FromStr<Err = String>>(&mut self) -> Result<Option<T>, MapError> {
        match self.optional_text()? {
            None => Ok(None),
            Some(text) => text
                .parse()
                .map(Some)
                .map_err(|reason| MapError::new(self.table.name, reason)),
        }
    }
}

pub(crate) fn text_or_null(value: &Option<String>) -> Cell {
    value.as_ref().map_or(Cell::Null, |text| Cell::Text(text.clone()))
}

pub(crate) fn integer_or_null(value: Option<i64>) -> Cell {
    value.map_or(Cell::Null, Cell::Integer)
}

pub(crate) fn timestamp_or_null(value: Option<Timestamp>) -> Cell {
    value.map_or(Cell::Null, Cell::Timestamp)
}

pub(crate) fn uuid_or_null(value: Option<Uuid>) -> Cell {
    value.map_or(Cell::Null, Cell::Uuid)
}
