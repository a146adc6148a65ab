//! The log's integrity: the walk of its hash chain that `replay --verify`
//! runs beside the replay (`opledger_domain::chain` is the rule), and the
//! record of the last check that `status` shows.
//!
//! *Why the record is not an event:* a check only reads; an event would
//! move the head it just checked, and a check run where only reading is
//! allowed (a read-only file, a SELECT-only role) could not record itself.
//! *Why not a projection:* nothing in the log derives it, and replay must
//! not rebuild it. So it is kept beside the projection positions, in a
//! table of its own (`log_verification`, migration 0004), written by
//! [`Engine::record_verification`] (beside the verification it records,
//! in `replay`) when the ledger can be written.

use crate::error::EngineError;
use crate::Engine;
use opledger_domain::chain::{self, ChainBreak, ChainPoint};
use opledger_domain::Timestamp;
use opledger_store::{Store, StoreError, Verification};
use serde::Serialize;

/// Events read per page of the chain walk.
const CHAIN_PAGE: usize = 10_000;

/// The last integrity check, as `status` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IntegrityCheck {
    pub verified_at: Timestamp,
    /// The seq the check reached.
    pub position: i64,
    /// The chain hash at `position`, when the chain held up to it.
    pub head_hash: Option<String>,
    /// The first seq where the chain broke.
    pub broken_at: Option<i64>,
    /// Projection tables that differed from the replay.
    pub differing_tables: i64,
    /// The chain held and every projection equalled the replay.
    pub intact: bool,
}

impl From<Verification> for IntegrityCheck {
    fn from(verification: Verification) -> Self {
        IntegrityCheck {
            intact: verification.is_intact(),
            verified_at: verification.verified_at,
            position: verification.position,
            head_hash: verification.head_hash.map(|hash| hash.to_hex()),
            broken_at: verification.broken_at,
            differing_tables: verification.differing_tables,
        }
    }
}

/// Walks the chain from the first event up to `up_to`: where it reached,
/// or the first event where it breaks.
pub(crate) async fn check_chain<S: Store>(store: &S, up_to: i64) -> Result<Result<ChainPoint, ChainBreak>, StoreError> {
    let mut point = ChainPoint::START;
    while point.seq < up_to {
        let left = usize::try_from(up_to - point.seq).unwrap_or(usize::MAX);
        let entries = store.read_chain(point.seq, CHAIN_PAGE.min(left)).await?;
        if entries.is_empty() {
            break;
        }
        match chain::check(point, entries) {
            Ok(reached) => point = reached,
            Err(broken) => return Ok(Err(broken)),
        }
    }
    Ok(Ok(point))
}

impl<S: Store> Engine<S> {
    /// The last recorded integrity check, if any.
    pub async fn last_verification(&self) -> Result<Option<IntegrityCheck>, EngineError> {
        Ok(self.store.last_verification().await?.map(IntegrityCheck::from))
    }
}
