//! The work protocol's queries: claimable processing states, expired
//! claims, and the lease table (claim liveness, not rebuilt by replay).

use crate::batch::{Bind, Statement};
use crate::ddl::{self, Copy};
use crate::error::map;
use crate::rows::{column_list, decode_row};
use crate::values::Values;
use chrono::{DateTime, Utc};
use opledger_domain::projections::{state_table, Row, TableSpec, MEDIA_STATES_TABLE, REGION_STATES_TABLE};
use opledger_domain::{OperationId, Timestamp};
use opledger_store::{
    AheadQuery, ClaimQuery, ClaimQueue, ClaimableAhead, ExpiredClaim, Lease, StoreError, MAX_QUEUED_VERSIONS,
};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row as _};
use uuid::Uuid;

const STATE_TABLES: [&TableSpec; 2] = [&MEDIA_STATES_TABLE, &REGION_STATES_TABLE];

/// Claimable rows of both state tables, in claim order, locked for this
/// transaction.
///
/// The statuses are written into the statement as literals, not bound: the
/// planner uses a partial index only when it can prove the query implies
/// the index's predicate, which a parameter never does once PostgreSQL
/// switches a prepared statement to its generic plan. `FOR UPDATE SKIP
/// LOCKED` takes the rows this claim will rewrite and passes over rows
/// another open transaction holds, so concurrent claimers never wait for
/// each other or take the same task.
pub async fn claimable(conn: &mut PgConnection, copy: Copy<'_>, query: &ClaimQuery) -> Result<Vec<Row>, StoreError> {
    if query.limit == 0 || query.statuses.is_empty() {
        return Ok(Vec::new());
    }
    let statuses = status_literals(query.statuses);
    let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
    let mut found: Vec<Row> = Vec::new();
    for table in STATE_TABLES {
        let name = ddl::table_name(table.name, copy);
        let select = |terms: &str| {
            format!(
                "SELECT {} FROM {name} WHERE status IN ({statuses}) AND available_at <= $1{terms} \
                 ORDER BY priority DESC, available_at, operation_id LIMIT $2 FOR UPDATE SKIP LOCKED",
                column_list(table),
            )
        };
        if query.kinds.is_empty() {
            let fetched = sqlx::query(&select(""))
                .bind(query.now.to_datetime())
                .bind(limit)
                .fetch_all(&mut *conn)
                .await
                .map_err(|error| map(error, "finding claimable tasks"))?;
            for row in &fetched {
                found.push(decode_row(row, table)?);
            }
        }
        // Each kind once, one range of the claimable index (kind, version,
        // claim order) per version: read in order, never sorted.
        let kinds: std::collections::BTreeSet<&String> = query.kinds.iter().collect();
        for kind in kinds {
            let versions: Vec<Option<String>> = match query.versions.get(kind) {
                Some(stated) => stated.iter().cloned().map(Some).collect(),
                None => queued_versions(&mut *conn, &name, &statuses, kind).await?,
            };
            for version in versions {
                let statement = match &version {
                    Some(_) => select(" AND task_kind = $3 AND task_version = $4"),
                    None => select(" AND task_kind = $3 AND task_version IS NULL"),
                };
                let mut statement = sqlx::query(&statement)
                    .bind(query.now.to_datetime())
                    .bind(limit)
                    .bind(kind.as_str());
                if let Some(version) = &version {
                    statement = statement.bind(version.as_str());
                }
                let fetched = statement
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(|error| map(error, "finding claimable tasks"))?;
                for row in &fetched {
                    found.push(decode_row(row, table)?);
                }
            }
        }
    }
    found.sort_by_key(claim_order);
    found.truncate(query.limit);
    Ok(found)
}

/// The versions of `kind` among the claimable rows of table `name`, `None`
/// (rows of unknown version) first, walked through the claimable index one
/// probe per version, at most [`MAX_QUEUED_VERSIONS`]: a claim that
/// states no version reads each version's range in claim order instead of
/// sorting the kind's whole queue.
async fn queued_versions(
    conn: &mut PgConnection,
    name: &str,
    statuses: &str,
    kind: &str,
) -> Result<Vec<Option<String>>, StoreError> {
    let next = format!(
        "SELECT task_version FROM {name} WHERE status IN ({statuses}) AND task_kind = $1 AND task_version > $2 \
         ORDER BY task_version LIMIT 1"
    );
    let mut versions = vec![None];
    let mut after = String::new();
    while versions.len() <= MAX_QUEUED_VERSIONS {
        let found: Option<(String,)> = sqlx::query_as(&next)
            .bind(kind)
            .bind(&after)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|error| map(error, "finding claimable versions"))?;
        let Some((version,)) = found else { break };
        after = version.clone();
        versions.push(Some(version));
    }
    Ok(versions)
}

/// The statuses as SQL literals (vocabulary words only; nothing else may
/// become SQL text), for the partial indexes' predicates.
fn status_literals(statuses: &[opledger_domain::OperationStatus]) -> String {
    let literals: Vec<String> = statuses
        .iter()
        .map(|status| {
            let text = status.as_str();
            assert!(
                text.bytes().all(|byte| byte.is_ascii_lowercase() || byte == b'_'),
                "status {text:?} is not a plain word"
            );
            format!("'{text}'")
        })
        .collect();
    literals.join(", ")
}

fn claim_order(row: &Row) -> (i64, Timestamp, Uuid) {
    match row {
        Row::ProcessingState(state) => (-state.priority, state.available_at, state.operation_id.0),
        _ => (0, Timestamp::from_micros(0), Uuid::nil()),
    }
}

/// How many claimable tasks of one kind a claim would take before the one
/// `query` describes, counting at most `query.limit`: the kind's range of
/// the claimable partial index, from its highest priority down to the
/// task's own, stopping at the limit. The statuses are literals for the
/// partial index, as in [`claimable`].
pub async fn claimable_ahead<'c, E>(executor: E, query: &AheadQuery) -> Result<ClaimableAhead, StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    if query.limit == 0 || query.statuses.is_empty() {
        return Ok(ClaimableAhead::default());
    }
    let statuses = status_literals(query.statuses);
    let sql = format!(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE priority > $1) FROM (\
           SELECT priority FROM {} \
           WHERE status IN ({}) AND task_kind = $2 AND {} AND priority >= $1 AND available_at <= $3 \
             AND (priority > $1 OR available_at < $4 OR (available_at = $4 AND operation_id < $5)) \
           LIMIT $6) ahead",
        state_table(query.target).name,
        statuses,
        // Equality (or IS NULL) so the version's range of the index is read.
        if query.task_version.is_some() {
            "task_version = $7"
        } else {
            "task_version IS NULL"
        }
    );
    let mut statement = sqlx::query_as(&sql)
        .bind(query.priority)
        .bind(&query.kind)
        .bind(query.now.to_datetime())
        .bind(query.available_at.to_datetime())
        .bind(query.operation_id.0)
        .bind(i64::try_from(query.limit).unwrap_or(i64::MAX));
    if let Some(version) = &query.task_version {
        statement = statement.bind(version.as_str());
    }
    let (ahead, higher): (i64, i64) = statement
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
/// literals for the claimable partial index, as in [`claimable`].
pub async fn claim_queues<'c, E>(
    executor: E,
    statuses: &[opledger_domain::OperationStatus],
    now: Timestamp,
) -> Result<Vec<ClaimQueue>, StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    if statuses.is_empty() {
        return Ok(Vec::new());
    }
    let statuses: Vec<String> = statuses
        .iter()
        .map(|status| {
            let text = status.as_str();
            assert!(
                text.bytes().all(|byte| byte.is_ascii_lowercase() || byte == b'_'),
                "status {text:?} is not a plain word"
            );
            format!("'{text}'")
        })
        .collect();
    let part = |table: &str| {
        format!(
            "SELECT task_kind, COUNT(*), MIN(available_at) FROM {table} \
             WHERE status IN ({}) AND available_at <= $1 GROUP BY task_kind",
            statuses.join(", ")
        )
    };
    let sql = format!(
        "{} UNION ALL {}",
        part(MEDIA_STATES_TABLE.name),
        part(REGION_STATES_TABLE.name)
    );
    let fetched: Vec<(String, i64, DateTime<Utc>)> = sqlx::query_as(&sql)
        .bind(now.to_datetime())
        .fetch_all(executor)
        .await
        .map_err(|error| map(error, "reading the claim queues"))?;
    let mut queues: Vec<ClaimQueue> = Vec::new();
    for (kind, count, oldest) in fetched {
        let oldest = Timestamp::from_datetime(oldest);
        let claimable = u64::try_from(count).unwrap_or(0);
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
    queues.sort_by(|a, b| a.kind.cmp(&b.kind));
    Ok(queues)
}

/// Held claims whose effective lease (the claim's, extended by the lease
/// table) ended before `now`. A heartbeat only ever extends a lease, so the
/// claim's own lease bounds the search and its partial index serves it.
pub async fn expired_claims<'c, E>(executor: E, now: Timestamp, limit: usize) -> Result<Vec<ExpiredClaim>, StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    // GREATEST ignores NULL: a claim without a lease row ends with its own lease.
    let part = |table: &str| {
        format!(
            "SELECT s.operation_id, s.claim_token, GREATEST(s.lease_expires_at, l.lease_expires_at) AS ends, s.worker \
             FROM {table} s LEFT JOIN task_leases l ON l.claim_token = s.claim_token \
             WHERE s.claim_token IS NOT NULL AND s.lease_expires_at < $1 \
               AND (l.lease_expires_at IS NULL OR l.lease_expires_at < $1)"
        )
    };
    let sql = format!(
        "{} UNION ALL {} ORDER BY 3, 1 LIMIT $2",
        part(MEDIA_STATES_TABLE.name),
        part(REGION_STATES_TABLE.name)
    );
    let fetched = sqlx::query(&sql)
        .bind(now.to_datetime())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(executor)
        .await
        .map_err(|error| map(error, "finding expired claims"))?;
    fetched
        .iter()
        .map(|row| {
            let corrupt = |error: sqlx::Error| StoreError::corrupt(format!("an expired claim: {error}"));
            let operation_id: Uuid = row.try_get(0).map_err(corrupt)?;
            let ends: DateTime<Utc> = row.try_get(2).map_err(corrupt)?;
            Ok(ExpiredClaim {
                operation_id: OperationId(operation_id),
                claim_token: row.try_get(1).map_err(corrupt)?,
                lease_expires_at: Timestamp::from_datetime(ends),
                worker: row.try_get(3).map_err(corrupt)?,
            })
        })
        .collect()
}

const LEASE_COLUMNS: &str = "claim_token, operation_id, worker, heartbeat_at, lease_expires_at, phase, processed, \
                             total, progressed_at, progress_unrecorded, principal";

pub async fn lease<'c, E>(executor: E, claim_token: &str) -> Result<Option<Lease>, StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let row = sqlx::query(&format!(
        "SELECT {LEASE_COLUMNS} FROM task_leases WHERE claim_token = $1"
    ))
    .bind(claim_token)
    .fetch_optional(executor)
    .await
    .map_err(|error| map(error, "reading a lease"))?;
    row.as_ref().map(decode_lease).transpose()
}

/// The lease rows of many claim tokens, in one statement.
pub async fn leases(conn: &mut PgConnection, claim_tokens: &[String]) -> Result<Vec<Lease>, StoreError> {
    if claim_tokens.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(&format!(
        "SELECT {LEASE_COLUMNS} FROM task_leases WHERE claim_token = ANY($1::text[])"
    ))
    .bind(claim_tokens)
    .fetch_all(&mut *conn)
    .await
    .map_err(|error| map(error, "reading leases"))?;
    rows.iter().map(decode_lease).collect()
}

fn decode_lease(row: &PgRow) -> Result<Lease, StoreError> {
    let corrupt = |error: sqlx::Error| StoreError::corrupt(format!("a lease row: {error}"));
    let timestamp = |index: usize| -> Result<Option<Timestamp>, StoreError> {
        Ok(row
            .try_get::<Option<DateTime<Utc>>, _>(index)
            .map_err(corrupt)?
            .map(Timestamp::from_datetime))
    };
    let required = |index: usize, what: &str| {
        timestamp(index)?.ok_or_else(|| StoreError::corrupt(format!("a lease without {what}")))
    };
    Ok(Lease {
        claim_token: row.try_get(0).map_err(corrupt)?,
        operation_id: OperationId(row.try_get::<Uuid, _>(1).map_err(corrupt)?),
        worker: row.try_get(2).map_err(corrupt)?,
        heartbeat_at: required(3, "heartbeat_at")?,
        lease_expires_at: required(4, "lease_expires_at")?,
        phase: row.try_get(5).map_err(corrupt)?,
        processed: row.try_get(6).map_err(corrupt)?,
        total: row.try_get(7).map_err(corrupt)?,
        progressed_at: timestamp(8)?,
        progress_unrecorded: row.try_get(9).map_err(corrupt)?,
        principal: row.try_get(10).map_err(corrupt)?,
    })
}

/// Adds lease writes to `statement`: inserts or replaces lease rows (every
/// column, as SQLite's `INSERT OR REPLACE`) and deletes others, two parts
/// at most whatever the number of claims. The tokens of `puts` must be
/// distinct (one `ON CONFLICT` may not touch a row twice) and apart from
/// `deletes`.
pub(crate) fn push_leases(statement: &mut Statement, puts: &[&Lease], deletes: &[&str]) {
    if !deletes.is_empty() {
        let tokens = deletes.iter().map(|token| Some((*token).to_string())).collect();
        let tokens = statement.param(Bind::Array(Values::Text(tokens)), "text[]");
        statement.push(format!("DELETE FROM task_leases WHERE claim_token = ANY({tokens})"));
    }
    if puts.is_empty() {
        return;
    }
    let updates = LEASE_COLUMNS
        .split(',')
        .map(str::trim)
        .skip(1)
        .map(|column| format!("{column} = EXCLUDED.{column}"))
        .collect::<Vec<_>>()
        .join(", ");
    let texts = |value: fn(&Lease) -> Option<String>| Values::Text(puts.iter().map(|lease| value(lease)).collect());
    let counts = |value: fn(&Lease) -> Option<i64>| Values::Integer(puts.iter().map(|lease| value(lease)).collect());
    let times = |value: fn(&Lease) -> Option<Timestamp>| {
        Values::Timestamp(
            puts.iter()
                .map(|lease| value(lease).map(Timestamp::to_datetime))
                .collect(),
        )
    };
    let arrays = [
        statement.param(Bind::Array(texts(|lease| Some(lease.claim_token.clone()))), "text[]"),
        statement.param(
            Bind::Array(Values::Uuid(
                puts.iter().map(|lease| Some(lease.operation_id.0)).collect(),
            )),
            "uuid[]",
        ),
        statement.param(Bind::Array(texts(|lease| Some(lease.worker.clone()))), "text[]"),
        statement.param(Bind::Array(times(|lease| Some(lease.heartbeat_at))), "timestamptz[]"),
        statement.param(
            Bind::Array(times(|lease| Some(lease.lease_expires_at))),
            "timestamptz[]",
        ),
        statement.param(Bind::Array(texts(|lease| lease.phase.clone())), "text[]"),
        statement.param(Bind::Array(counts(|lease| lease.processed)), "bigint[]"),
        statement.param(Bind::Array(counts(|lease| lease.total)), "bigint[]"),
        statement.param(Bind::Array(times(|lease| lease.progressed_at)), "timestamptz[]"),
        statement.param(
            Bind::Array(Values::Bool(
                puts.iter().map(|lease| Some(lease.progress_unrecorded)).collect(),
            )),
            "boolean[]",
        ),
        statement.param(Bind::Array(texts(|lease| lease.principal.clone())), "text[]"),
    ];
    statement.push(format!(
        "INSERT INTO task_leases ({LEASE_COLUMNS}) SELECT * FROM UNNEST({}) \
         ON CONFLICT (claim_token) DO UPDATE SET {updates}",
        arrays.join(", ")
    ));
}
