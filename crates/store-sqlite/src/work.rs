//! The work protocol's queries: claimable processing states, expired
//! claims, and the lease table (claim liveness, not rebuilt by replay).

use crate::ddl::{self, Copy};
use crate::error::map;
use crate::rows::column_list;
use opledger_domain::projections::{state_table, Cell, Row, TableSpec, MEDIA_STATES_TABLE, REGION_STATES_TABLE};
use opledger_domain::{OperationId, Timestamp};
use opledger_store::{AheadQuery, ClaimQueue, ClaimableAhead, ExpiredClaim, Lease, StoreError};
use sqlx::sqlite::SqliteRow;
use sqlx::Row as _;

/// The two processing-state tables a claim reads.
pub(crate) const STATE_TABLES: [&TableSpec; 2] = [&MEDIA_STATES_TABLE, &REGION_STATES_TABLE];

/// Which of a kind's claimable rows one claim query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Range {
    /// Every kind's (parameters `now`, the limit).
    Any,
    /// One kind at one version (parameters `now`, the kind, the version,
    /// the limit).
    Version,
    /// One kind's rows of unknown version (parameters `now`, the kind, the
    /// limit).
    UnknownVersion,
}

/// Claimable rows of one state table, read in claim order from a partial
/// index of claimable rows so the read stops at the limit instead of
/// sorting the whole queue: of one kind at one version (the index is
/// keyed by kind, then version, then claim order), or of any kind. A claim
/// for several kinds or versions runs one query per kind and version. The
/// statuses are written into the text as literals: SQLite uses a partial
/// index only when the query's own terms imply the index's WHERE, which
/// bound parameters never do (and they are the domain's vocabulary, not
/// input). The writer reads both tables and merges them in [`claim_order`].
pub(crate) fn claimable_sql(
    table: &TableSpec,
    copy: Copy<'_>,
    statuses: &[opledger_domain::OperationStatus],
    range: Range,
) -> String {
    let name = ddl::table_name(table.name, copy);
    // The planner, without statistics, prefers the status index and a sort;
    // on the live tables name the index that yields claim order.
    let (index, terms) = match range {
        Range::Any => ("_claimable_any", ""),
        Range::Version => ("_claimable", " AND task_kind = ? AND task_version = ?"),
        Range::UnknownVersion => ("_claimable", " AND task_kind = ? AND task_version IS NULL"),
    };
    let index = match copy {
        Copy::Live => format!(" INDEXED BY {}{index}", table.name),
        _ => String::new(),
    };
    format!(
        "SELECT {} FROM {name}{index} WHERE status IN ({}) AND available_at <= ?{terms} \
         ORDER BY priority DESC, available_at, operation_id LIMIT ?",
        column_list(table),
        status_literals(statuses)
    )
}

/// The next version above `?2` among one kind's claimable rows (parameters
/// the kind, the version to look above: `''` first), read from the
/// claimable index: a claim that states no version walks the versions
/// queued one index probe at a time instead of sorting the kind's queue.
pub(crate) fn next_version_sql(
    table: &TableSpec,
    copy: Copy<'_>,
    statuses: &[opledger_domain::OperationStatus],
) -> String {
    let name = ddl::table_name(table.name, copy);
    let index = match copy {
        Copy::Live => format!(" INDEXED BY {}_claimable", table.name),
        _ => String::new(),
    };
    format!(
        "SELECT task_version FROM {name}{index} WHERE status IN ({}) AND task_kind = ?1 AND task_version > ?2 \
         ORDER BY task_version LIMIT 1",
        status_literals(statuses)
    )
}

fn status_literals(statuses: &[opledger_domain::OperationStatus]) -> String {
    let statuses: Vec<String> = statuses.iter().map(|status| format!("'{}'", status.as_str())).collect();
    statuses.join(", ")
}

pub(crate) fn claim_order(row: &Row) -> (i64, Timestamp, String) {
    match row {
        Row::ProcessingState(state) => (-state.priority, state.available_at, state.operation_id.to_string()),
        _ => (0, Timestamp::from_micros(0), String::new()),
    }
}

/// How many claimable tasks of one kind a claim would take before the one
/// `query` describes, counting at most `query.limit`. It reads the kind's
/// range of the claimable index (named, as claims name it) from its
/// highest priority down to the task's own, and stops at the limit.
pub async fn claimable_ahead<'c, E>(executor: E, query: &AheadQuery) -> Result<ClaimableAhead, StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    if query.limit == 0 || query.statuses.is_empty() {
        return Ok(ClaimableAhead::default());
    }
    let table = state_table(query.target);
    let statuses: Vec<String> = query
        .statuses
        .iter()
        .map(|status| format!("'{}'", status.as_str()))
        .collect();
    let sql = format!(
        "SELECT COUNT(*), COALESCE(SUM(priority > ?1), 0) FROM (\
           SELECT priority FROM {name} INDEXED BY {name}_claimable \
           WHERE status IN ({statuses}) AND task_kind = ?2 AND task_version IS ?7 AND priority >= ?1 \
             AND available_at <= ?3 \
             AND (priority > ?1 OR available_at < ?4 OR (available_at = ?4 AND operation_id < ?5)) \
           LIMIT ?6)",
        name = table.name,
        statuses = statuses.join(", ")
    );
    let (ahead, higher): (i64, i64) = sqlx::query_as(&sql)
        .bind(query.priority)
        .bind(&query.kind)
        .bind(query.now.to_rfc3339())
        .bind(query.available_at.to_rfc3339())
        .bind(query.operation_id.0.hyphenated().to_string())
        .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
        .bind(query.task_version.as_deref())
        .fetch_one(executor)
        .await
        .map_err(|error| map(error, "counting the claimable tasks ahead"))?;
    Ok(ClaimableAhead {
        ahead: u64::try_from(ahead).unwrap_or(0),
        higher_priority: u64::try_from(higher).unwrap_or(0),
    })
}

/// Each kind's claimable queue: its depth and the earliest time one of
/// its tasks became claimable, over both state tables (merged here; a kind
/// targets one of them, but nothing depends on that). The statuses are
/// literals for the claimable index, as in [`claimable_sql`].
pub async fn claim_queues<'c, E>(
    executor: E,
    statuses: &[opledger_domain::OperationStatus],
    now: Timestamp,
) -> Result<Vec<ClaimQueue>, StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Sqlite>,
{
    if statuses.is_empty() {
        return Ok(Vec::new());
    }
    let statuses: Vec<String> = statuses.iter().map(|status| format!("'{}'", status.as_str())).collect();
    let part = |table: &str| {
        format!(
            "SELECT task_kind, COUNT(*), MIN(available_at) FROM {table} \
             WHERE status IN ({}) AND available_at <= ?1 GROUP BY task_kind",
            statuses.join(", ")
        )
    };
    let sql = format!(
        "{} UNION ALL {}",
        part(MEDIA_STATES_TABLE.name),
        part(REGION_STATES_TABLE.name)
    );
    let fetched: Vec<(String, i64, String)> = sqlx::query_as(&sql)
        .bind(now.to_rfc3339())
        .fetch_all(executor)
        .await
        .map_err(|error| map(error, "reading the claim queues"))?;
    let mut queues: Vec<ClaimQueue> = Vec::new();
    for (kind, count, oldest) in fetched {
        let oldest = Timestamp::parse(&oldest).map_err(StoreError::corrupt)?;
        merge_queue(&mut queues, kind, u64::try_from(count).unwrap_or(0), oldest);
    }
    queues.sort_by(|a, b| a.kind.cmp(&b.kind));
    Ok(queues)
}

fn merge_queue(queues: &mut Vec<ClaimQueue>, kind: String, claimable: u64, oldest: Timestamp) {
    match queues.iter_mut().find(|queue| queue.kind == kind) {
        Some(queue) => {
            queue.claimable += claimable;
            queue.oldest_available_at = queue.oldest_available_at.min(oldest);
        }
        None => queues.push(ClaimQueue {
            kind,
            claimable,
            oldest_available_at: oldest,
        }),
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
            "SELECT s.operation_id, s.claim_token, MAX(s.lease_expires_at, COALESCE(l.lease_expires_at, '')) AS ends, \
             s.worker \
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
                worker: row.get(3),
            })
        })
        .collect()
}

pub(crate) const LEASE_COLUMNS: &str =
    "claim_token, operation_id, worker, heartbeat_at, lease_expires_at, phase, processed, \
                             total, progressed_at, progress_unrecorded, principal";

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

fn decode_lease(row: &SqliteRow) -> Result<Lease, StoreError> {
    lease_from(StoredLease {
        claim_token: row.get(0),
        operation_id: row.get(1),
        worker: row.get(2),
        heartbeat_at: row.get(3),
        lease_expires_at: row.get(4),
        phase: row.get(5),
        processed: row.get(6),
        total: row.get(7),
        progressed_at: row.get(8),
        progress_unrecorded: row.get(9),
        principal: row.get(10),
    })
}

/// One lease row's columns as stored, in [`LEASE_COLUMNS`] order.
pub(crate) struct StoredLease {
    pub claim_token: String,
    pub operation_id: String,
    pub worker: String,
    pub heartbeat_at: Option<String>,
    pub lease_expires_at: Option<String>,
    pub phase: Option<String>,
    pub processed: Option<i64>,
    pub total: Option<i64>,
    pub progressed_at: Option<String>,
    pub progress_unrecorded: i64,
    pub principal: Option<String>,
}

pub(crate) fn lease_from(stored: StoredLease) -> Result<Lease, StoreError> {
    let timestamp = |text: Option<String>| -> Result<Option<Timestamp>, StoreError> {
        text.map(|text| Timestamp::parse(&text).map_err(StoreError::corrupt))
            .transpose()
    };
    Ok(Lease {
        claim_token: stored.claim_token,
        operation_id: stored
            .operation_id
            .parse::<OperationId>()
            .map_err(StoreError::corrupt)?,
        worker: stored.worker,
        heartbeat_at: timestamp(stored.heartbeat_at)?
            .ok_or_else(|| StoreError::corrupt("a lease without heartbeat_at"))?,
        lease_expires_at: timestamp(stored.lease_expires_at)?
            .ok_or_else(|| StoreError::corrupt("a lease without lease_expires_at"))?,
        phase: stored.phase,
        processed: stored.processed,
        total: stored.total,
        progressed_at: timestamp(stored.progressed_at)?,
        progress_unrecorded: stored.progress_unrecorded != 0,
        principal: stored.principal,
    })
}

/// Inserts or replaces one lease row ([`lease_cells`] are its parameters).
pub(crate) const PUT_LEASE: &str = "INSERT OR REPLACE INTO task_leases (claim_token, operation_id, worker, \
     heartbeat_at, lease_expires_at, phase, processed, total, progressed_at, progress_unrecorded, principal) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

pub(crate) const DELETE_LEASE: &str = "DELETE FROM task_leases WHERE claim_token = ?";

/// A lease's cells in [`LEASE_COLUMNS`] order.
pub(crate) fn lease_cells(lease: &Lease) -> [Cell; 11] {
    [
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
        lease.principal.clone().map_or(Cell::Null, Cell::Text),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_upsert_names_the_lease_columns_in_order() {
        assert!(PUT_LEASE.contains(&format!("({LEASE_COLUMNS})")), "{PUT_LEASE}");
    }
}
