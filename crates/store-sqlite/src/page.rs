//! Paged walks of a projection table in index order (`Store::page_rows`):
//! the statements behind one page. What a page is, from what they read, is
//! decided in `opledger_store::page::finish`.
//!
//! A walk without filters is one statement: the rows past the position in
//! order, one more than the page holds. A filtering walk first reads where
//! its window ends (the order values at the window's last offset and the
//! next, from the index alone), then the matching rows up to that end, both
//! in one read transaction so they see one snapshot. Positions compare as
//! row values (`(a, b) < (?, ?)`), which SQLite walks in the index. Text
//! compares bytewise: SQLite's default BINARY collation.

use crate::ddl::{self, Copy};
use crate::error::map;
use crate::rows::{bind_cell, column_list, decode_cell, decode_cells};
use opledger_domain::projections::{Cell, Row};
use opledger_store::page::{self, Direction, Page, PageQuery, Read};
use opledger_store::StoreError;
use sqlx::sqlite::SqliteArguments;
use sqlx::{query::Query, Connection, Sqlite, SqliteConnection};

/// The order columns as a row value: `(a, b)`.
fn order_tuple(query: &PageQuery) -> String {
    format!("({})", query.order.join(", "))
}

fn placeholders(count: usize) -> String {
    format!("({})", vec!["?"; count].join(", "))
}

/// The conditions every read of a walk shares: equalities, bounds and the
/// position to start after. Parameters in this order.
fn walk_conditions(query: &PageQuery) -> Vec<String> {
    let mut conditions: Vec<String> = query.equal.iter().map(|(column, _)| format!("{column} = ?")).collect();
    let first = query.order[0];
    if query.from.is_some() {
        conditions.push(format!("{first} >= ?"));
    }
    if query.to.is_some() {
        conditions.push(format!("{first} < ?"));
    }
    if query.after.is_some() {
        let past = match query.direction {
            Direction::Ascending => ">",
            Direction::Descending => "<",
        };
        conditions.push(format!(
            "{} {past} {}",
            order_tuple(query),
            placeholders(query.order.len())
        ));
    }
    conditions
}

fn bind_walk<'q>(
    mut statement: Query<'q, Sqlite, SqliteArguments<'q>>,
    query: &PageQuery,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    for (_, cell) in &query.equal {
        statement = bind_cell(statement, cell);
    }
    for bound in [&query.from, &query.to].into_iter().flatten() {
        statement = bind_cell(statement, bound);
    }
    for cell in query.after.iter().flatten() {
        statement = bind_cell(statement, cell);
    }
    statement
}

fn order_by(query: &PageQuery) -> String {
    let direction = match query.direction {
        Direction::Ascending => "ASC",
        Direction::Descending => "DESC",
    };
    query
        .order
        .iter()
        .map(|column| format!("{column} {direction}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn where_clause(conditions: &[String]) -> String {
    if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    }
}

/// The order values at the window's last offset and the next one.
/// Parameters: the walk's, then the offset.
pub(crate) fn window_sql(query: &PageQuery) -> String {
    format!(
        "SELECT {} FROM {}{} ORDER BY {} LIMIT 2 OFFSET ?",
        query.order.join(", "),
        ddl::table_name(query.table.name, Copy::Live),
        where_clause(&walk_conditions(query)),
        order_by(query)
    )
}

/// The matching rows in order, up to the window's end when `window_end`.
/// Parameters: the walk's, the window end's values, each filter's values,
/// then the limit.
pub(crate) fn rows_sql(query: &PageQuery, window_end: bool) -> String {
    let mut conditions = walk_conditions(query);
    if window_end {
        let within = match query.direction {
            Direction::Ascending => "<=",
            Direction::Descending => ">=",
        };
        conditions.push(format!(
            "{} {within} {}",
            order_tuple(query),
            placeholders(query.order.len())
        ));
    }
    for (column, values) in &query.any_of {
        conditions.push(format!("{column} IN {}", placeholders(values.len())));
    }
    format!(
        "SELECT {} FROM {}{} ORDER BY {} LIMIT ?",
        column_list(query.table),
        ddl::table_name(query.table.name, Copy::Live),
        where_clause(&conditions),
        order_by(query)
    )
}

/// One page of `query`'s walk on a read connection.
pub async fn page_rows(connection: &mut SqliteConnection, query: &PageQuery) -> Result<Page, StoreError> {
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
    let sql = window_sql(query);
    let statement = bind_walk(sqlx::query(&sql), query).bind(query.window_end_offset() as i64);
    let ends = statement
        .fetch_all(&mut *snapshot)
        .await
        .map_err(|error| map(error, &format!("walking {name}")))?;
    let mut ends = ends.iter().map(|row| {
        query
            .order
            .iter()
            .enumerate()
            .map(|(index, column)| {
                let ty = query
                    .table
                    .columns
                    .iter()
                    .find(|known| known.name == *column)
                    .map(|known| known.ty)
                    .expect("checked: the order's columns exist");
                decode_cell(row, index, ty, name)
            })
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

async fn matching_rows(
    connection: &mut SqliteConnection,
    query: &PageQuery,
    window_end: Option<&[Cell]>,
) -> Result<Vec<(Row, Vec<Cell>)>, StoreError> {
    let sql = rows_sql(query, window_end.is_some());
    let mut statement = bind_walk(sqlx::query(&sql), query);
    for cell in window_end.into_iter().flatten() {
        statement = bind_cell(statement, cell);
    }
    for (_, values) in &query.any_of {
        for cell in values {
            statement = bind_cell(statement, cell);
        }
    }
    statement = statement.bind(i64::try_from(query.read_limit()).unwrap_or(i64::MAX));
    let fetched = statement
        .fetch_all(&mut *connection)
        .await
        .map_err(|error| map(error, &format!("walking {}", query.table.name)))?;
    fetched
        .iter()
        .map(|row| {
            let cells = decode_cells(row, query.table)?;
            let row = Row::from_cells(query.table, cells).map_err(|error| StoreError::corrupt(error.to_string()))?;
            let position = page::position_of(&row, &query.order);
            Ok((row, position))
        })
        .collect()
}
