//! The work protocol's queries: claimable processing states, expired
//! claims, and the lease table (claim liveness, not rebuilt by replay).

use crate::ddl::{self, Copy};
use crate::error::map;
use crate::rows::{add_cell, column_list, decode_cells, Batch};
use opledger_domain::projections::{Cell, Row, TableSpec, MEDIA_STATES_TABLE, REGION_STATES_TABLE};
use opledger_domain::{OperationId, Timestamp};
use opledger_store::{ClaimQuery, ExpiredClaim, Lease, StoreError};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row as _, SqliteConnection};

const STATE_TABLES: [&TableSpec; 2] = [&MEDIA_STATES_TABLE, &REGION_STATES_TABLE];

/// Claimable rows of both state tables, in claim order. Each table is read
/// through its partial index of claimable rows; the two answers are merged.
pub async fn claimable(
    conn: &mut SqliteConnection,
    copy: Copy<'_>,
    query: &ClaimQuery,
) -> Result<Vec<Row>, StoreError> {
    if query.limit == 0 || query.statuses.is_empty() {
        return Ok(Vec::new());
    }
    let mut found: Vec<Row> = Vec::new();
    for table in STATE_TABLES {
        let name = ddl::table_name(table.name, copy);
        let statuses = vec!["?"; query.statuses.len()].join(", ");
        let kinds = if query.kinds.is_empty() {
            String::new()
        } else {
            format!(" AND task_kind IN ({})", vec!["?"; query.kinds.len()].join(", "))
        };
        let sql = format!(
            "SELECT {} FROM {name} WHERE status IN ({statuses}) AND available_at <= ?{kinds} \
             ORDER BY priority DESC, available_at, operation_id LIMIT ?",
            column_list(table)
        );
        let mut statement = sqlx::query(&sql);
        for status in query.statuses {
            statement = statement.bind(status.as_str());
        }
        statement = statement.bind(query.now.to_rfc3339());
        for kind in &query.kinds {
            statement = statement.bind(kind.as_str());
        }
        statement = statement.bind(i64::try_from(query.limit).unwrap_or(i64::MAX));
        let fetched = statement
            .fetch_all(&mut *conn)
            .await
            .map_err(|error| map(error, "finding claimable tasks"))?;
        for row in &fetched {
            let cells = decode_cells(row, table)?;
            found.push(Row::from_cells(table, cells).map_err(|error| StoreError::corrupt(error.to_string()))?);
        }
    }
    found.sort_by_key(claim_order);
    found.truncate(query.limit);
    Ok(found)
}

fn claim_order(row: &Row) -> (i64, Timestamp, String) {
    match row {
        Row::ProcessingState(state) => (-state.priority, state.available_at, state.operation_id.to_string()),
        _ => (0, Timestamp::from_micros(0), String::new()),
    }
}

/// Held claims whose effective lease (the claim's, extended by the lease
/// table) ended before `now`. A heartbeat only ever extends a lease, so the
/// claim's own lease bounds the search and its partial index serves it.
pub async fn expired_claims<'c, E>(executor: E, now: Timestamp, limit: usize) -> Result<Vec<ExpiredClaim>, StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    let part = |table: &str| {
        format!(
            "SELECT s.operation_id, s.claim_token, MAX(s.lease_expires_at, COALESCE(l.lease_expires_at, '')) AS ends \
             FROM {table} s LEFT JOIN task_leases l ON l.claim_token = s.claim_token \
             WHERE s.claim_token IS NOT NULL AND s.lease_expires_at < ?1 \
               AND (l.lease_expires_at IS NULL OR l.lease_expires_at < ?1)"
        )
    };
    let sql = format!(
        "{} UNION ALL {} ORDER BY 3, 1 LIMIT ?2",
        part(MEDIA_STATES_TABLE.name),
        part(REGION_STATES_TABLE.name)
    );
    let fetched = sqlx::query(&sql)
        .bind(now.to_rfc3339())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(executor)
        .await
        .map_err(|error| map(error, "finding expired claims"))?;
    fetched
        .iter()
        .map(|row| {
            let operation_id: String = row.get(0);
            let ends: String = row.get(2);
            Ok(ExpiredClaim {
                operation_id: operation_id.parse().map_err(StoreError::corrupt)?,
                claim_token: row.get(1),
                lease_expires_at: Timestamp::parse(&ends).map_err(StoreError::corrupt)?,
            })
        })
        .collect()
}

const LEASE_COLUMNS: &str = "claim_token, operation_id, worker, heartbeat_at, lease_expires_at, phase, processed, \
                             total, progressed_at, progress_unrecorded";

pub async fn lease<'c, E>(executor: E, claim_token: &str) -> Result<Option<Lease>, StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    let row = sqlx::query(&format!(
        "SELECT {LEASE_COLUMNS} FROM task_leases WHERE claim_token = ?"
    ))
    .bind(claim_token)
    .fetch_optional(executor)
    .await
    .map_err(|error| map(error, "reading a lease"))?;
    row.as_ref().map(decode_lease).transpose()
}

/// The lease rows of many claim tokens, in chunks below the parameter limit.
pub async fn leases(conn: &mut SqliteConnection, claim_tokens: &[String]) -> Result<Vec<Lease>, StoreError> {
    let mut found = Vec::with_capacity(claim_tokens.len());
    for chunk in claim_tokens.chunks(500) {
        let sql = format!(
            "SELECT {LEASE_COLUMNS} FROM task_leases WHERE claim_token IN ({})",
            vec!["?"; chunk.len()].join(", ")
        );
        let mut query = sqlx::query(&sql);
        for token in chunk {
            query = query.bind(token.as_str());
        }
        let rows = query
            .fetch_all(&mut *conn)
            .await
            .map_err(|error| map(error, "reading leases"))?;
        for row in &rows {
            found.push(decode_lease(row)?);
        }
    }
    Ok(found)
}

fn decode_lease(row: &SqliteRow) -> Result<Lease, StoreError> {
    let timestamp = |index: usize| -> Result<Option<Timestamp>, StoreError> {
        row.get::<Option<String>, _>(index)
            .map(|text| Timestamp::parse(&text).map_err(StoreError::corrupt))
            .transpose()
    };
    let operation_id: String = row.get(1);
    Ok(Lease {
        claim_token: row.get(0),
        operation_id: operation_id.parse::<OperationId>().map_err(StoreError::corrupt)?,
        worker: row.get(2),
        heartbeat_at: timestamp(3)?.ok_or_else(|| StoreError::corrupt("a lease without heartbeat_at"))?,
        lease_expires_at: timestamp(4)?.ok_or_else(|| StoreError::corrupt("a lease without lease_expires_at"))?,
        phase: row.get(5),
        processed: row.get(6),
        total: row.get(7),
        progressed_at: timestamp(8)?,
        progress_unrecorded: row.get::<i64, _>(9) != 0,
    })
}

pub fn gather_put_lease(batch: &mut Batch, lease: &Lease) {
    let sql = format!("INSERT OR REPLACE INTO task_leases ({LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    batch.push(&sql, |args| {
        let cells = [
            Cell::Text(lease.claim_token.clone()),
            Cell::Uuid(lease.operation_id.0),
            Cell::Text(lease.worker.clone()),
            Cell::Timestamp(lease.heartbeat_at),
            Cell::Timestamp(lease.lease_expires_at),
            lease.phase.clone().map_or(Cell::Null, Cell::Text),
            lease.processed.map_or(Cell::Null, Cell::Integer),
            lease.total.map_or(Cell::Null, Cell::Integer),
            lease.progressed_at.map_or(Cell::Null, Cell::Timestamp),
            Cell::Bool(lease.progress_unrecorded),
        ];
        for cell in &cells {
            add_cell(args, cell);
        }
    });
}

pub fn gather_delete_lease(batch: &mut Batch, claim_token: &str) {
    batch.push("DELETE FROM task_leases WHERE claim_token = ?", |args| {
        add_cell(args, &Cell::Text(claim_token.to_string()));
    });
}
