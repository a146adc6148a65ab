//! Paged walks of a projection table in index order (`Store::page_rows`):
//! the statements behind one page. What a page is, from what they read, is
//! decided in `opledger_store::page::finish`.
//!
//! A walk without filters is one statement: the rows past the position in
//! order, one more than the page holds. A filtering walk first reads where
//! its window ends (the order values at the window's last offset and the
//! next, from the index), then the matching rows up to that end, both in
//! one REPEATABLE READ transaction so they see one snapshot. Positions
//! compare as row values (`(a, b) < ($1, $2)`), which a B-tree on the same
//! columns walks. Text order columns compare with `COLLATE "C"`, bytewise,
//! as SQLite's BINARY does, whatever the database's default collation; the
//! projections declare such columns `COLLATE "C"` so their indexes serve
//! these comparisons.

use crate::ddl::{self, Copy};
use crate::error::map;
use crate::rows::{check_column, column_list, decode_cell, decode_row, sql_type};
use crate::values::{bind_cell, PgQuery, Values};
use opledger_domain::projections::{Cell, ColumnType, Row};
use opledger_store::page::{self, Direction, Page, PageQuery, Read};
use opledger_store::StoreError;
use sqlx::{Connection, PgConnection};

/// Builds one statement's conditions, numbering parameters as it goes and
/// remembering what to bind to each.
struct Conditions<'q> {
    query: &'q PageQuery,
    text: Vec<String>,
    binds: Vec<Bind<'q>>,
}

enum Bind<'q> {
    One(&'static str, &'q Cell),
    Many(&'static str, &'q [Cell]),
}

impl<'q> Conditions<'q> {
    fn new(query: &'q PageQuery) -> Self {
        Conditions {
            query,
            text: Vec::new(),
            binds: Vec::new(),
        }
    }

    fn parameter(&mut self, column: &'static str, cell: &'q Cell) -> String {
        self.binds.push(Bind::One(column, cell));
        format!("${}", self.binds.len())
    }

    /// A column as it is compared and ordered: text bytewise.
    fn ordered(&self, column: &str) -> Result<String, StoreError> {
        Ok(match check_column(self.query.table, column)? {
            ColumnType::Text | ColumnType::Json => format!("{column} COLLATE \"C\""),
            _ => column.to_string(),
        })
    }

    /// `(a, b) OP ($n, $m)` over the order columns.
    fn position(&mut self, operator: &str, cells: &'q [Cell]) -> Result<(), StoreError> {
        let columns = self
            .query
            .order
            .iter()
            .map(|column| self.ordered(column))
            .collect::<Result<Vec<_>, _>>()?;
        let parameters: Vec<String> = self
            .query
            .order
            .iter()
            .zip(cells)
            .map(|(column, cell)| self.parameter(column, cell))
            .collect();
        self.text.push(format!(
            "({}) {operator} ({})",
            columns.join(", "),
            parameters.join(", ")
        ));
        Ok(())
    }

    /// Equalities, bounds and the position to start after.
    fn walk(&mut self) -> Result<(), StoreError> {
        let query = self.query;
        for (column, cell) in &query.equal {
            let parameter = self.parameter(column, cell);
            self.text.push(format!("{column} = {parameter}"));
        }
        let first = query.order[0];
        if let Some(from) = &query.from {
            let column = self.ordered(first)?;
            let parameter = self.parameter(first, from);
            self.text.push(format!("{column} >= {parameter}"));
        }
        if let Some(to) = &query.to {
            let column = self.ordered(first)?;
            let parameter = self.parameter(first, to);
            self.text.push(format!("{column} < {parameter}"));
        }
        if let Some(after) = &query.after {
            let past = match query.direction {
                Direction::Ascending => ">",
                Direction::Descending => "<",
            };
            self.position(past, after)?;
        }
        Ok(())
    }

    fn filters(&mut self) -> Result<(), StoreError> {
        for (column, values) in &self.query.any_of {
            let ty = check_column(self.query.table, column)?;
            self.binds.push(Bind::Many(column, values));
            self.text
                .push(format!("{column} = ANY(${}::{}[])", self.binds.len(), sql_type(ty)));
        }
        Ok(())
    }

    fn where_clause(&self) -> String {
        if self.text.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", self.text.join(" AND "))
        }
    }

    fn order_by(&self) -> Result<String, StoreError> {
        let direction = match self.query.direction {
            Direction::Ascending => "ASC",
            Direction::Descending => "DESC",
        };
        Ok(self
            .query
            .order
            .iter()
            .map(|column| Ok(format!("{} {direction}", self.ordered(column)?)))
            .collect::<Result<Vec<_>, StoreError>>()?
            .join(", "))
    }

    fn bind(&self, mut statement: PgQuery<'q>) -> Result<PgQuery<'q>, StoreError> {
        let table = self.query.table;
        for bind in &self.binds {
            match bind {
                Bind::One(column, cell) => {
                    let ty = check_column(table, column)?;
                    statement = bind_cell(statement, table, column, ty, cell)?;
                }
                Bind::Many(column, cells) => {
                    let ty = check_column(table, column)?;
                    let mut values = Values::new(ty, cells.len());
                    for cell in cells.iter() {
                        values.push(cell).map_err(|error| {
                            StoreError::constraint(format!("{} column {column}: {error}", table.name))
                        })?;
                    }
                    statement = values.bind_array(statement);
                }
            }
        }
        Ok(statement)
    }
}

/// One page of `query`'s walk on a read connection.
pub async fn page_rows(connection: &mut PgConnection, query: &PageQuery) -> Result<Page, StoreError> {
    query.check()?;
    let name = query.table.name;
    if !query.filters() {
        let rows = matching_rows(connection, query, None).await?;
        return Ok(page::finish(
            query,
            Read {
                rows,
                window_end: None,
                past_window_end: false,
            },
        ));
    }
    // One snapshot for both reads: a row written between them could
    // otherwise move the window under the rows already read.
    let mut snapshot = connection
        .begin()
        .await
        .map_err(|error| map(error, &format!("reading {name}")))?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *snapshot)
        .await
        .map_err(|error| map(error, &format!("reading {name}")))?;
    let mut conditions = Conditions::new(query);
    conditions.walk()?;
    let order_columns = query
        .order
        .iter()
        .map(|column| Ok((*column, check_column(query.table, column)?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    let sql = format!(
        "SELECT {} FROM {}{} ORDER BY {} LIMIT 2 OFFSET ${}",
        query.order.join(", "),
        ddl::table_name(name, Copy::Live),
        conditions.where_clause(),
        conditions.order_by()?,
        conditions.binds.len() + 1
    );
    let ends = conditions
        .bind(sqlx::query(&sql))?
        .bind(query.window_end_offset() as i64)
        .fetch_all(&mut *snapshot)
        .await
        .map_err(|error| map(error, &format!("walking {name}")))?;
    let mut ends = ends.iter().map(|row| {
        order_columns
            .iter()
            .enumerate()
            .map(|(index, (_, ty))| decode_cell(row, index, *ty, name))
            .collect::<Result<Vec<Cell>, StoreError>>()
    });
    let window_end = ends.next().transpose()?;
    let past_window_end = ends.next().is_some();
    let rows = matching_rows(&mut snapshot, query, window_end.as_deref()).await?;
    snapshot
        .commit()
        .await
        .map_err(|error| map(error, &format!("reading {name}")))?;
    Ok(page::finish(
        query,
        Read {
            rows,
            window_end,
            past_window_end,
        },
    ))
}

/// The matching rows in order, up to the window's end when given, one more
/// than the page holds.
async fn matching_rows(
    connection: &mut PgConnection,
    query: &PageQuery,
    window_end: Option<&[Cell]>,
) -> Result<Vec<(Row, Vec<Cell>)>, StoreError> {
    let mut conditions = Conditions::new(query);
    conditions.walk()?;
    if let Some(end) = window_end {
        let within = match query.direction {
            Direction::Ascending => "<=",
            Direction::Descending => ">=",
        };
        conditions.position(within, end)?;
    }
    conditions.filters()?;
    let sql = format!(
        "SELECT {} FROM {}{} ORDER BY {} LIMIT ${}",
        column_list(query.table),
        ddl::table_name(query.table.name, Copy::Live),
        conditions.where_clause(),
        conditions.order_by()?,
        conditions.binds.len() + 1
    );
    let fetched = conditions
        .bind(sqlx::query(&sql))?
        .bind(i64::try_from(query.read_limit()).unwrap_or(i64::MAX))
        .fetch_all(&mut *connection)
        .await
        .map_err(|error| map(error, &format!("walking {}", query.table.name)))?;
    fetched
        .iter()
        .map(|row| {
            let row = decode_row(row, query.table)?;
            let position = page::position_of(&row, &query.order);
            Ok((row, position))
        })
        .collect()
}
