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
        // `+column`: checked on the rows the walk passes, never a way in.
        // Without statistics the planner would rather take an index of the
        // filter's column (a batch's status) and sort what it finds.
        conditions.push(format!("+{column} IN {}", placeholders(values.len())));
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

/// Binds [`rows_sql`]'s parameters.
fn bind_rows<'q>(
    statement: Query<'q, Sqlite, SqliteArguments<'q>>,
    query: &PageQuery,
    window_end: Option<&[Cell]>,
) -> Query<'q, Sqlite, SqliteArguments<'q>> {
    let mut statement = bind_walk(statement, query);
    for cell in window_end.into_iter().flatten() {
        statement = bind_cell(statement, cell);
    }
    for (_, values) in &query.any_of {
        for cell in values {
            statement = bind_cell(statement, cell);
        }
    }
    statement.bind(i64::try_from(query.read_limit()).unwrap_or(i64::MAX))
}

async fn matching_rows(
    connection: &mut SqliteConnection,
    query: &PageQuery,
    window_end: Option<&[Cell]>,
) -> Result<Vec<(Row, Vec<Cell>)>, StoreError> {
    let sql = rows_sql(query, window_end.is_some());
    let fetched = bind_rows(sqlx::query(&sql), query, window_end)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SqliteConfig;
    use opledger_domain::projections::{
        TableSpec, BATCHES_TABLE, BATCH_ITEMS_TABLE, MEDIA_TABLE, OPERATIONS_TABLE, REVIEW_TABLE,
    };
    use opledger_domain::Timestamp;
    use sqlx::Row as _;
    use uuid::Uuid;

    /// The plan of one page's reads, as EXPLAIN QUERY PLAN details.
    async fn plans(connection: &mut SqliteConnection, query: &PageQuery) -> Vec<String> {
        let mut details = Vec::new();
        let end: Vec<Cell> = query.after.clone().unwrap_or_default();
        let mut reads = vec![(format!("EXPLAIN QUERY PLAN {}", rows_sql(query, query.filters())), true)];
        if query.filters() {
            reads.push((format!("EXPLAIN QUERY PLAN {}", window_sql(query)), false));
        }
        for (sql, rows) in reads {
            let statement = if rows {
                bind_rows(sqlx::query(&sql), query, query.filters().then_some(end.as_slice()))
            } else {
                bind_walk(sqlx::query(&sql), query).bind(query.window_end_offset() as i64)
            };
            for row in statement.fetch_all(&mut *connection).await.unwrap() {
                details.push(row.get::<String, _>("detail"));
            }
        }
        details
    }

    fn walk(
        table: &'static TableSpec,
        order: &[&'static str],
        direction: Direction,
        equal: Vec<(&'static str, Cell)>,
        after: Vec<Cell>,
    ) -> PageQuery {
        let mut query = PageQuery::new(table, order, direction, 50);
        query.equal = equal;
        query.after = Some(after);
        query
    }

    /// Every listing the query layer pages through walks its index in
    /// order: no sort of the table, no scan of it, whatever it filters.
    #[tokio::test]
    async fn every_listing_walks_its_index_in_order_without_sorting() {
        let folder = tempfile::tempdir().unwrap();
        let config = SqliteConfig::at(folder.path().join("plans.db"));
        let store = crate::SqliteStore::open(config.clone()).await.unwrap();
        let mut connection = crate::connect(&config, false).await.unwrap();
        let at = Cell::Timestamp(Timestamp::from_micros(1_780_000_000_000_000));
        let id = Cell::Uuid(Uuid::from_u128(1));
        let text = |value: &str| Cell::Text(value.to_string());
        let operations = walk(
            &OPERATIONS_TABLE,
            &["created_at", "id"],
            Direction::Descending,
            Vec::new(),
            vec![at.clone(), id.clone()],
        );
        let mut by_status = operations.clone();
        by_status
            .any_of
            .push(("status", vec![text("failed_terminal"), text("blocked")]));
        by_status.any_of.push(("worker", vec![text("w-1")]));
        by_status.walk = 2_000;
        let mut in_time = by_status.clone();
        in_time.from = Some(at.clone());
        in_time.to = Some(at.clone());
        let mut of_kind = operations.clone();
        of_kind.equal.push(("kind", text("thumbnail")));
        let mut of_kind_by_status = by_status.clone();
        of_kind_by_status.equal.push(("kind", text("thumbnail")));
        let mut of_media = operations.clone();
        of_media.equal.push(("media_id", id.clone()));
        let mut media = walk(
            &MEDIA_TABLE,
            &["path", "id"],
            Direction::Ascending,
            Vec::new(),
            vec![text("/a"), id.clone()],
        );
        media.from = Some(text("/photos/"));
        media.to = Some(text("/photos0"));
        let mut media_of_kind = media.clone();
        media_of_kind.equal.push(("media_kind", text("image")));
        let review = walk(
            &REVIEW_TABLE,
            &["entry_id"],
            Direction::Ascending,
            vec![("state", text("open"))],
            vec![Cell::Integer(3)],
        );
        let mut active_batches = walk(
            &BATCHES_TABLE,
            &["created_at", "batch_id"],
            Direction::Descending,
            Vec::new(),
            vec![at.clone(), id.clone()],
        );
        active_batches
            .any_of
            .push(("status", vec![text("running"), text("cancelling")]));
        active_batches.walk = 2_000;
        let items = walk(
            &BATCH_ITEMS_TABLE,
            &["position"],
            Direction::Descending,
            vec![("batch_id", id.clone())],
            vec![Cell::Integer(10)],
        );
        for (query, index) in [
            (&operations, "media_operations_by_created"),
            (&by_status, "media_operations_by_created"),
            (&in_time, "media_operations_by_created"),
            (&of_kind, "media_operations_by_kind"),
            (&of_kind_by_status, "media_operations_by_kind"),
            (&of_media, "media_operations_by_media"),
            (&media, "media_by_path"),
            (&media_of_kind, "media_by_kind"),
            (&review, "review_queue_by_state"),
            (&active_batches, "batches_by_created"),
            (&items, "sqlite_autoindex_batch_items"),
        ] {
            let details = plans(&mut connection, query).await;
            for detail in &details {
                assert!(
                    !detail.contains("TEMP B-TREE"),
                    "{}: sorts: {details:?}",
                    query.table.name
                );
                assert!(
                    detail.contains(index),
                    "{}: expected a walk of {index}: {details:?}",
                    query.table.name
                );
            }
        }
        crate::close_quietly(connection).await;
        drop(store);
    }
}
