//! Resolving review entries in bulk: every open entry a filter matches
//! (by kind, reason code, batch), oldest first and at most a limit, each
//! resolved as its own recorded action through [`Engine::resolve_review`]
//! (one `review_resolved` event each, actor and reason kept), so the bulk
//! action is exactly the single ones, side by side. An entry that can no
//! longer be resolved when its turn comes (resolved or superseded
//! meanwhile, a retry its work refuses) is reported as skipped with the
//! reason; a storage failure stops the run (the entries resolved before it
//! stay resolved, each having committed on its own). A dry run reads and
//! reports the entries and appends nothing.

use crate::error::EngineError;
use crate::tx::CommandContext;
use crate::Engine;
use futures::stream::{self, StreamExt};
use opledger_domain::projections::{
    batch_key, media_key, Cell, ReviewRow, Row, BATCHES_TABLE, BATCH_ITEMS_TABLE, MEDIA_TABLE, REVIEW_TABLE,
};
use opledger_domain::review::{EntryState, ReasonCode, ReviewAction};
use opledger_domain::{BatchId, DomainError, MediaId, OperationId};
use opledger_store::{ErrorKind, Store};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// Entries resolved at once: each is its own command, and commands that
/// queue together share a commit (group commit), so a bulk run does not
/// wait for one fsync per entry.
const CONCURRENT_RESOLUTIONS: usize = 8;

/// The longest quote of a refusal in a skipped entry's reason.
const REASON_QUOTE_BYTES: usize = 200;

/// Which open review entries a bulk resolution takes; every given part
/// must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReviewFilter {
    /// The operation's kind (a task kind, or `ingestion.file`).
    pub kind: Option<String>,
    pub reason_code: Option<ReasonCode>,
    /// Only entries of operations that are items of this batch.
    pub batch: Option<BatchId>,
}

/// An entry that was not resolved, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedEntry {
    pub entry_id: i64,
    pub reason: String,
}

/// What a bulk resolution did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq)]
pub struct BulkResolution {
    /// Open entries the filter matched.
    pub matched: usize,
    /// The entries taken, oldest first (at most the limit); an entry of a
    /// task carries its media item's path.
    pub entries: Vec<ReviewRow>,
    /// Entries resolved by this run (none in a dry run).
    pub resolved: usize,
    /// Entries taken but not resolved, with the reason.
    pub skipped: Vec<SkippedEntry>,
    pub dry_run: bool,
}

impl BulkResolution {
    /// Matched entries left open because of the limit.
    pub fn remaining(&self) -> usize {
        self.matched - self.entries.len()
    }
}

/// Whether an error refuses one entry (the run goes on) rather than the
/// storage failing (the run stops).
fn refuses_the_entry(error: &EngineError) -> bool {
    match error {
        EngineError::Domain(_) => true,
        EngineError::Store(store) => store.kind == ErrorKind::Conflict,
    }
}

fn short(text: &str) -> String {
    if text.len() <= REASON_QUOTE_BYTES {
        return text.to_string();
    }
    let mut end = REASON_QUOTE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

impl<S: Store> Engine<S> {
    /// Resolves every open entry `filter` matches by `action`, oldest first,
    /// at most `limit` of them, each as its own recorded action with
    /// `reason`; with `dry_run` only reports them. NotFound when the
    /// filter's batch does not exist.
    pub async fn resolve_reviews(
        &self,
        context: &CommandContext,
        filter: &ReviewFilter,
        action: ReviewAction,
        reason: &str,
        dry_run: bool,
        limit: Option<usize>,
    ) -> Result<BulkResolution, EngineError> {
        if limit == Some(0) {
            return Err(EngineError::invalid(
                "a bulk resolution takes at least 1 entry (--limit)",
            ));
        }
        let items = match filter.batch {
            Some(batch_id) => Some(self.batch_operation_ids(batch_id).await?),
            None => None,
        };
        let mut matching: Vec<ReviewRow> = self
            .store
            .find_rows(
                &REVIEW_TABLE,
                &[("state", Cell::Text(EntryState::Open.as_str().to_string()))],
                usize::MAX,
            )
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::Review(entry) => Some(entry),
                _ => None,
            })
            .filter(|entry| filter.kind.as_ref().is_none_or(|kind| &entry.kind == kind))
            .filter(|entry| filter.reason_code.is_none_or(|code| entry.reason_code == code.as_str()))
            .filter(|entry| items.as_ref().is_none_or(|items| items.contains(&entry.operation_id)))
            .collect();
        matching.sort_by_key(|entry| entry.entry_id);
        let matched = matching.len();
        matching.truncate(limit.unwrap_or(usize::MAX));
        self.fill_media_paths(&mut matching).await?;
        let mut report = BulkResolution {
            matched,
            entries: matching,
            resolved: 0,
            skipped: Vec::new(),
            dry_run,
        };
        if dry_run {
            return Ok(report);
        }
        let reason = if reason.trim().is_empty() {
            format!("{action} in bulk from the review queue")
        } else {
            reason.trim().to_string()
        };
        // The futures are made before they run, so no closure is held
        // across an await: that keeps this future `Send` (a closure there
        // trips rustc's higher-ranked lifetime check), which the HTTP
        // service's handlers need.
        let resolutions: Vec<_> = report
            .entries
            .iter()
            .map(|entry| self.resolve_one(context, entry.entry_id, action, reason.clone()))
            .collect();
        let outcomes: Vec<(i64, Result<ReviewRow, EngineError>)> = stream::iter(resolutions)
            .buffered(CONCURRENT_RESOLUTIONS)
            .collect()
            .await;
        for (entry_id, outcome) in outcomes {
            match outcome {
                Ok(_) => report.resolved += 1,
                Err(error) if refuses_the_entry(&error) => report.skipped.push(SkippedEntry {
                    entry_id,
                    reason: short(&error.to_string()),
                }),
                Err(error) => return Err(error),
            }
        }
        Ok(report)
    }

    async fn resolve_one(
        &self,
        context: &CommandContext,
        entry_id: i64,
        action: ReviewAction,
        reason: String,
    ) -> (i64, Result<ReviewRow, EngineError>) {
        // Each entry is its own command: under a request id, each is
        // recorded under the id's part for its entry, so a retry of the
        // whole resolution answers the entries it resolved from their
        // records.
        let context = match &context.request_id {
            Some(request_id) => context.clone().with_request_id(request_id.part(entry_id)),
            None => context.clone(),
        };
        (
            entry_id,
            self.resolve_review(&context, entry_id, action, None, &reason).await,
        )
    }

    /// Gives each entry without a path (a task's) its media item's path:
    /// what a person reads to know which file an entry is about.
    async fn fill_media_paths(&self, entries: &mut [ReviewRow]) -> Result<(), EngineError> {
        let keys: BTreeSet<String> = entries
            .iter()
            .filter(|entry| entry.path.is_none())
            .filter_map(|entry| entry.media_id)
            .map(|media_id| media_key(media_id).key.to_string())
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = keys.into_iter().collect();
        let paths: BTreeMap<MediaId, String> = self
            .store
            .load_rows(&MEDIA_TABLE, &keys)
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::Media(media) => Some((media.media_id, media.path)),
                _ => None,
            })
            .collect();
        for entry in entries.iter_mut().filter(|entry| entry.path.is_none()) {
            entry.path = entry.media_id.and_then(|media_id| paths.get(&media_id).cloned());
        }
        Ok(())
    }

    /// The operations a batch holds; NotFound for an unknown batch.
    async fn batch_operation_ids(&self, batch_id: BatchId) -> Result<BTreeSet<OperationId>, EngineError> {
        let key = batch_key(batch_id).key.to_string();
        if self.store.load_rows(&BATCHES_TABLE, &[key]).await?.is_empty() {
            return Err(EngineError::Domain(DomainError::NotFound {
                what: "batch",
                id: batch_id.to_string(),
            }));
        }
        Ok(self
            .store
            .find_rows(&BATCH_ITEMS_TABLE, &[("batch_id", Cell::Uuid(batch_id.0))], usize::MAX)
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::BatchItem(item) => Some(item.operation_id),
                _ => None,
            })
            .collect())
    }
}
