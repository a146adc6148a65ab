//! Replay: rebuild every projection from the log into a scratch copy, and
//! verification: compare that copy with the live tables, row by row.
//!
//! Replay never reads the clock: every time a fold needs is in an event.
//! Memory is bounded whatever the log size: events are read a chunk at a
//! time and the row cache is dropped whenever it outgrows its limit (rows
//! are always written back before that, so a dropped row is re-read).

use crate::error::EngineError;
use crate::fold::fold_events;
use crate::integrity::IntegrityCheck;
use crate::Engine;
use futures::StreamExt;
use opledger_domain::chain::{ChainBreak, ChainPoint};
use opledger_domain::projections::Cell;
use opledger_domain::projections::{all_projectors, WorkingSet};
use opledger_domain::EventEnvelope;
use opledger_store::{ScratchTarget, Store, StoreError, TableDiff, Verification, WriteTx};
use std::fmt::Write;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Rows kept in the replay cache before it is dropped.
const CACHE_ROWS: usize = 25_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayStats {
    /// Events folded.
    pub events: u64,
    /// The seq replay reached.
    pub position: i64,
    pub elapsed: Duration,
}

/// The outcome of `replay --verify`.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyReport {
    /// The position both copies were compared at.
    pub position: i64,
    pub events: u64,
    pub diffs: Vec<TableDiff>,
    /// The log's hash chain up to `position`: the link it reached, or the
    /// first event where it breaks.
    pub chain: Result<ChainPoint, ChainBreak>,
}

impl VerifyReport {
    /// The log's chain holds and every projection equals its replay.
    pub fn is_identical(&self) -> bool {
        self.diffs.is_empty() && self.chain.is_ok()
    }

    /// A readable account of every difference: per table, the row counts and
    /// for each differing row the columns whose values differ.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Err(broken) = &self.chain {
            let _ = writeln!(text, "{broken}");
        }
        for diff in &self.diffs {
            let _ = writeln!(
                text,
                "table {}: {} live rows, {} replayed rows",
                diff.table.name, diff.live_rows, diff.replayed_rows
            );
            for row in &diff.rows {
                let key = &row.key;
                match (&row.live, &row.replayed) {
                    (Some(_), None) => {
                        let _ = writeln!(text, "  {key}: only in the live table");
                    }
                    (None, Some(_)) => {
                        let _ = writeln!(text, "  {key}: missing from the live table");
                    }
                    (Some(live), Some(replayed)) => {
                        let _ = writeln!(text, "  {key}:");
                        for (column, (live, replayed)) in diff.table.columns.iter().zip(live.iter().zip(replayed)) {
                            if live != replayed {
                                let _ = writeln!(
                                    text,
                                    "    {}: live {} != replayed {}",
                                    column.name,
                                    show(live),
                                    show(replayed)
                                );
                            }
                        }
                    }
                    (None, None) => {}
                }
            }
        }
        text
    }
}

fn show(cell: &Cell) -> String {
    cell.to_string()
}

/// Where a replay pass takes its chunks of events from.
enum EventSource {
    /// The scratch copy's own connection, inside its snapshot (verify's
    /// catch-up to the live tables' position).
    Scratch,
    /// A task of its own reading ahead from the store's readers (the
    /// rebuild from empty).
    ReadAhead(mpsc::Receiver<Result<Vec<EventEnvelope>, StoreError>>),
}

/// Reads the log after `after` in chunks of `chunk` events on a task of
/// its own, at most two chunks ahead of the fold. Reading and decoding a
/// chunk was about a fifth of a replay's time (the rest folding and
/// writing), one core's work while the machine's other core idled; read
/// ahead, it overlaps the fold. The log is append-only and each read sees
/// a gap-free prefix of it, so chunks read this way are the chunks the
/// fold would have read itself. The reading stops when the log ends, or
/// when the fold stops taking chunks (it failed, or the receiver is dropped).
fn read_ahead<S: Store>(store: &S, after: i64, chunk: usize) -> mpsc::Receiver<Result<Vec<EventEnvelope>, StoreError>> {
    let (chunks, receiver) = mpsc::channel(1);
    let mut events = store.read_all(after, chunk);
    tokio::spawn(async move {
        let mut next = Vec::with_capacity(chunk);
        loop {
            let full = match events.next().await {
                Some(Ok(event)) => {
                    next.push(event);
                    next.len() == chunk
                }
                Some(Err(error)) => {
                    let _ = chunks.send(Err(error)).await;
                    return;
                }
                None => {
                    // An empty last chunk tells the fold the log has ended.
                    let _ = chunks.send(Ok(next)).await;
                    return;
                }
            };
            if full {
                let ready = std::mem::replace(&mut next, Vec::with_capacity(chunk));
                if chunks.send(Ok(ready)).await.is_err() {
                    return;
                }
            }
        }
    });
    receiver
}

/// Folds every event after `position` (up to `until`, when given) into the
/// scratch copy, chunk by chunk. Returns the new position and the count.
async fn fold_into_scratch<T: ScratchTarget>(
    scratch: &mut T,
    rows: &mut WorkingSet,
    mut position: i64,
    until: Option<i64>,
    chunk: usize,
    commit_chunks: bool,
    mut source: EventSource,
) -> Result<(i64, u64), EngineError> {
    let mut folded = 0u64;
    loop {
        let read_started = Instant::now();
        let mut events = match &mut source {
            EventSource::Scratch => scratch.read_events(position, chunk).await?,
            EventSource::ReadAhead(chunks) => match chunks.recv().await {
                Some(chunk) => chunk?,
                None => {
                    return Err(EngineError::Store(StoreError::unavailable(
                        "the replay's log reader stopped before the end of the log",
                    )))
                }
            },
        };
        let read = read_started.elapsed();
        let complete = events.len() < chunk;
        if let Some(until) = until {
            events.retain(|event| event.seq <= until);
        }
        let Some(last) = events.last().map(|event| event.seq) else {
            scratch.flush().await?;
            return Ok((position, folded));
        };
        let fold_started = Instant::now();
        fold_events(scratch, rows, all_projectors(), &events).await?;
        let fold = fold_started.elapsed();
        folded += events.len() as u64;
        position = last;
        let commit_started = Instant::now();
        if commit_chunks {
            scratch.commit_chunk().await?;
        }
        tracing::debug!(
            events = events.len(),
            read_ms = read.as_millis() as u64,
            fold_ms = fold.as_millis() as u64,
            commit_ms = commit_started.elapsed().as_millis() as u64,
            cached_rows = rows.len(),
            "replay chunk"
        );
        // Ten thousand envelopes' strings: freed on another thread, not
        // the fold's (a tenth of its time when freed here).
        tokio::task::spawn_blocking(move || drop(events));
        if rows.len() > CACHE_ROWS {
            rows.clear();
        }
        if complete || until.is_some_and(|until| position >= until) {
            scratch.flush().await?;
            return Ok((position, folded));
        }
    }
}

impl<S: Store> Engine<S> {
    /// Rebuilds every projection from an empty state into a scratch copy.
    /// The caller compares or discards it.
    pub async fn replay_into_scratch(&self) -> Result<(S::Scratch, WorkingSet, ReplayStats), EngineError> {
        let started = Instant::now();
        let mut scratch = self.store.open_scratch().await?;
        // Scratch tables are written row by row whole (sqlx_handle.rs), so the
        // rows the store held before are not kept.
        let mut rows = WorkingSet::forgetting_stored_rows();
        let source = EventSource::ReadAhead(read_ahead(&self.store, 0, self.fold_chunk));
        let (position, events) =
            fold_into_scratch(&mut scratch, &mut rows, 0, None, self.fold_chunk, true, source).await?;
        Ok((
            scratch,
            rows,
            ReplayStats {
                events,
                position,
                elapsed: started.elapsed(),
            },
        ))
    }

    /// Replays the whole log and throws the result away: the replay benchmark.
    pub async fn replay(&self) -> Result<ReplayStats, EngineError> {
        let (scratch, _, stats) = self.replay_into_scratch().await?;
        scratch.discard().await?;
        Ok(stats)
    }

    /// Rebuilds every projection into scratch tables and compares them with
    /// the live ones, at one consistent position of the log.
    pub async fn verify(&self) -> Result<VerifyReport, EngineError> {
        let (mut scratch, mut rows, stats) = self.replay_into_scratch().await?;
        let result = async {
            let live_position = scratch.begin_snapshot().await?;
            if live_position < stats.position {
                return Err(EngineError::Store(StoreError::conflict(format!(
                    "the live projections are at seq {live_position} but the log reaches {}; \
                     restart opledger to catch them up",
                    stats.position
                ))));
            }
            // Writers may have appended since the replay read its last chunk;
            // fold up to the snapshot's position inside the snapshot.
            let (position, more) = fold_into_scratch(
                &mut scratch,
                &mut rows,
                stats.position,
                Some(live_position),
                self.fold_chunk,
                false,
                EventSource::Scratch,
            )
            .await?;
            let diffs = scratch.compare().await?;
            // The chain up to the compared position: a change to an event
            // and to the rows it folded into, made together, shows here.
            let chain = crate::integrity::check_chain(&self.store, position).await?;
            Ok(VerifyReport {
                position,
                events: stats.events + more,
                diffs,
                chain,
            })
        }
        .await;
        scratch.discard().await?;
        result
    }
}

impl<S: Store> Engine<S> {
    /// Records what a verification found (at the engine's clock's time), in
    /// place of the record before it.
    pub async fn record_verification(&self, report: &VerifyReport) -> Result<IntegrityCheck, EngineError> {
        let verification = Verification {
            verified_at: self.clock().now(),
            position: report.position,
            head_hash: report.chain.as_ref().ok().map(|point| point.hash),
            broken_at: report.chain.as_ref().err().map(|broken| broken.seq),
            differing_tables: i64::try_from(report.diffs.len()).unwrap_or(i64::MAX),
        };
        let recorded = verification.clone();
        self.store
            .write(move |tx: &mut S::Tx| {
                Box::pin(async move { tx.record_verification(&recorded).await.map_err(EngineError::from) })
            })
            .await?;
        Ok(verification.into())
    }
}
