//! The log's hash chain on PostgreSQL: the head's link an append goes on
//! from, the fill of a log written before the chain existed, the chain
//! check's read, and the record of the last integrity check (mirrors
//! `opledger-store-sqlite`'s `chain.rs`). The rule itself is
//! `opledger_domain::chain`; the checks of it are `opledger_store`'s.

use crate::error::map;
use chrono::{DateTime, Utc};
use opledger_domain::chain::{self, ChainEntry, ChainHash, ChainPoint, GENESIS};
use opledger_domain::Timestamp;
use opledger_store::log::{self, RecordedAt, StoredEvent};
use opledger_store::{StoreError, Verification};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row as _};

/// The log's columns and the stored link, in the order [`entry`] reads them.
const CHAIN_COLUMNS: &str = "seq, stream_id, stream_version, event_type, schema_version, payload, recorded_at, \
                             actor, correlation_id, causation_id, chain_hash";

/// Rows the fill reads and writes per round trip.
const FILL_CHUNK: i64 = 10_000;

/// The head at `seq` with its stored link. A link that is missing or not a
/// hash is taken as the genesis hash: the append goes on (a tampered row
/// must not stop the ledger), and the check names the row where the chain
/// breaks.
pub(crate) fn point(seq: i64, hash: Option<&str>) -> ChainPoint {
    ChainPoint {
        seq,
        hash: hash.and_then(|text| ChainHash::from_hex(text).ok()).unwrap_or(GENESIS),
    }
}

/// One row of [`CHAIN_COLUMNS`].
fn entry(row: &PgRow) -> Result<ChainEntry, StoreError> {
    let seq: i64 = row.try_get(0).map_err(|error| map(error, "reading seq"))?;
    let column = |error: sqlx::Error| StoreError::corrupt_at(seq, error.to_string());
    let schema_version: i32 = row.try_get(4).map_err(column)?;
    let recorded_at: DateTime<Utc> = row.try_get(6).map_err(column)?;
    let chain_hash: Option<&str> = row.try_get(10).map_err(column)?;
    log::chain_entry(
        &StoredEvent {
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
        },
        chain_hash,
    )
}

/// Links the events of a log written before the chain existed (migration
/// 0004), in seq order, inside the write transaction `conn` holds (one,
/// under the writers' advisory lock, before the store takes any work:
/// `tx::fill_unchained`). Only a log whose first event has no link is
/// filled, and only its unlinked prefix: a row without a link after a
/// linked one was not written by opledger, and stays a break for the check
/// to name.
pub(crate) async fn fill_in(conn: &mut PgConnection) -> Result<(), StoreError> {
    let unchained: Option<bool> =
        sqlx::query_scalar("SELECT chain_hash IS NULL FROM media_operation_events WHERE seq = 1")
            .fetch_optional(&mut *conn)
            .await
            .map_err(|error| map(error, "reading the log's first link"))?;
    if unchained != Some(true) {
        return Ok(());
    }
    let mut point = ChainPoint::START;
    loop {
        let sql = format!(
            "SELECT {CHAIN_COLUMNS} FROM media_operation_events WHERE seq > $1 AND chain_hash IS NULL \
             ORDER BY seq LIMIT $2"
        );
        let fetched = sqlx::query(&sql)
            .bind(point.seq)
            .bind(FILL_CHUNK)
            .fetch_all(&mut *conn)
            .await
            .map_err(|error| map(error, "reading events to link"))?;
        let mut seqs = Vec::with_capacity(fetched.len());
        let mut hashes = Vec::with_capacity(fetched.len());
        let mut contiguous = true;
        for row in &fetched {
            let entry = entry(row)?;
            if entry.seq != point.seq + 1 {
                contiguous = false;
                break;
            }
            let hash = chain::link(&point.hash, &entry.digest);
            seqs.push(entry.seq);
            hashes.push(hash.to_hex());
            point = ChainPoint { seq: entry.seq, hash };
        }
        if !seqs.is_empty() {
            sqlx::query(
                "UPDATE media_operation_events AS e SET chain_hash = v.hash \
                 FROM UNNEST($1::bigint[], $2::text[]) AS v(seq, hash) WHERE e.seq = v.seq",
            )
            .bind(&seqs)
            .bind(&hashes)
            .execute(&mut *conn)
            .await
            .map_err(|error| map(error, "linking events written before the chain"))?;
        }
        if !contiguous || (fetched.len() as i64) < FILL_CHUNK {
            return Ok(());
        }
    }
}

/// Up to `limit` events after `after` as the chain check reads them.
pub(crate) async fn read_chain(readers: &PgPool, after: i64, limit: usize) -> Result<Vec<ChainEntry>, StoreError> {
    let sql = format!("SELECT {CHAIN_COLUMNS} FROM media_operation_events WHERE seq > $1 ORDER BY seq LIMIT $2");
    let fetched = sqlx::query(&sql)
        .bind(after)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(readers)
        .await
        .map_err(|error| map(error, "reading the log's chain"))?;
    fetched.iter().map(entry).collect()
}

/// A `log_verification` row: when, position, head hash, broken at, differing tables.
type StoredVerification = (DateTime<Utc>, i64, Option<String>, Option<i64>, i64);

pub(crate) async fn last_verification(readers: &PgPool) -> Result<Option<Verification>, StoreError> {
    let row: Option<StoredVerification> = sqlx::query_as(
        "SELECT verified_at, position, head_hash, broken_at, differing_tables FROM log_verification WHERE id = 1",
    )
    .fetch_optional(readers)
    .await
    .map_err(|error| map(error, "reading the last integrity check"))?;
    row.map(|(verified_at, position, head_hash, broken_at, differing_tables)| {
        Ok(Verification {
            verified_at: Timestamp::from_datetime(verified_at),
            position,
            head_hash: head_hash
                .map(|text| ChainHash::from_hex(&text).map_err(StoreError::corrupt))
                .transpose()?,
            broken_at,
            differing_tables,
        })
    })
    .transpose()
}

pub(crate) async fn record_verification(
    conn: &mut PgConnection,
    verification: &Verification,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO log_verification (id, verified_at, position, head_hash, broken_at, differing_tables) \
         VALUES (1, $1, $2, $3, $4, $5) ON CONFLICT (id) DO UPDATE SET verified_at = EXCLUDED.verified_at, \
         position = EXCLUDED.position, head_hash = EXCLUDED.head_hash, broken_at = EXCLUDED.broken_at, \
         differing_tables = EXCLUDED.differing_tables",
    )
    .bind(verification.verified_at.to_datetime())
    .bind(verification.position)
    .bind(verification.head_hash.map(|hash| hash.to_hex()))
    .bind(verification.broken_at)
    .bind(verification.differing_tables)
    .execute(conn)
    .await
    .map(|_| ())
    .map_err(|error| map(error, "recording an integrity check"))
}
