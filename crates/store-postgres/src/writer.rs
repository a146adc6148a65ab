//! Group commit: one writer task per store takes the pieces of work its
//! callers queue and runs whatever is waiting in one write transaction,
//! each piece inside its own savepoint, as SQLite's writer thread does.
//!
//! *Why:* write transactions take turns on the append lock, which each
//! holds through its COMMIT's WAL flush (the lock is released only after
//! the commit is durable and visible; that is what keeps `seq` in commit
//! order as readers see it). One transaction at a time therefore pays one
//! lock hand-off, one BEGIN and one flush; pieces grouped into it share
//! those, and pieces from the same process no longer queue for the lock
//! one by one. Across processes the advisory lock still serializes groups.
//!
//! A piece that fails, or panics, rolls back to its savepoint and leaves
//! the others alone (a failed statement aborts a PostgreSQL transaction;
//! the rollback to the savepoint clears that too). Nobody is answered
//! until the COMMIT has returned, so an answer means durable. A lone piece
//! runs without a savepoint: its failure rolls back the transaction. The
//! savepoints cost one round trip per piece: a kept piece's RELEASE and the
//! next piece's SAVEPOINT go together, a failed piece's savepoint is reused
//! by the next, and the last piece's is left to COMMIT.

use crate::tx::PostgresTx;
use futures::FutureExt;
use opledger_store::group_commit::Piece;
use opledger_store::StoreError;
use sqlx::PgPool;
use std::panic::AssertUnwindSafe;
use tokio::sync::mpsc;

/// Most pieces grouped into one commit; bounds how long the first piece of
/// a group waits for the others. Each piece that writes is a
/// subtransaction, and PostgreSQL caches at most 64 of them per backend in
/// shared memory: beyond that, every other session's visibility checks of
/// this transaction's rows go through pg_subtrans, which is slow. So a
/// group stays below 64 pieces.
const MAX_GROUP: usize = 48;

/// One caller's work as the writer task queues it.
pub(crate) type QueuedPiece = Box<dyn Piece<PostgresTx>>;

/// The writer loop: waits for work, groups whatever else is queued, runs
/// it; ends when every store handle (every sender) is gone. `committed` is
/// told the log head after each commit that appended.
pub(crate) async fn run(pool: PgPool, mut pieces: mpsc::Receiver<QueuedPiece>, committed: impl Fn(i64) + Send) {
    while let Some(first) = pieces.recv().await {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match pieces.try_recv() {
                Ok(piece) => group.push(piece),
                Err(_) => break,
            }
        }
        if let Some(head) = run_group(&pool, group).await {
            committed(head);
        }
    }
}

/// Runs one group in one transaction; returns the head after a commit.
async fn run_group(pool: &PgPool, group: Vec<QueuedPiece>) -> Option<i64> {
    let started = std::time::Instant::now();
    let pieces = group.len();
    let use_savepoints = pieces > 1;
    let mut tx = match PostgresTx::begin(pool).await {
        Ok(tx) => tx,
        Err(error) => {
            for piece in group {
                piece.abort(error.clone());
            }
            return None;
        }
    };
    let mut answers = Vec::with_capacity(pieces);
    let mut broken: Option<StoreError> = None;
    let mut any_ok = false;
    if use_savepoints {
        if let Err(error) = tx.open_savepoint().await {
            broken = Some(error);
        }
    }
    for (index, piece) in group.into_iter().enumerate() {
        if let Some(error) = &broken {
            piece.abort(error.clone());
            continue;
        }
        let checkpoint = tx.checkpoint();
        let mut outcome = AssertUnwindSafe(piece.run(&mut tx)).catch_unwind().await;
        // A piece that succeeded keeps its writes only if they all went
        // through (work that ignored a failed statement finds out here).
        if let Ok(done) = &mut outcome {
            if done.ok() && use_savepoints {
                if let Err(error) = tx.keep_piece(index + 1 < pieces).await {
                    done.fail(error);
                }
            }
        }
        let ok = matches!(&outcome, Ok(done) if done.ok());
        if ok {
            any_ok = true;
        } else if use_savepoints {
            // Undo the piece; the next one runs in the same savepoint.
            if let Err(error) = tx.undo_piece(checkpoint).await {
                broken = Some(error);
            }
        }
        match outcome {
            // A failed piece's answer is its own error; the commit cannot change it.
            Ok(done) if !done.ok() => done.answer(Ok(())),
            Ok(done) => answers.push(done),
            // A panicking piece dropped its answer channel; its caller hears so.
            Err(_) => {}
        }
    }
    let worked = started.elapsed();
    let head = tx.known_head();
    let commit = match broken {
        Some(error) => {
            tx.rollback().await;
            Err(error)
        }
        None if !any_ok => {
            tx.rollback().await;
            Err(StoreError::unavailable("nothing to commit"))
        }
        None => tx.commit().await,
    };
    tracing::trace!(
        pieces,
        work_us = worked.as_micros() as u64,
        commit_us = (started.elapsed() - worked).as_micros() as u64,
        "write group"
    );
    let committed = commit.is_ok();
    // Answered only now, after COMMIT returned: an answer means durable.
    for done in answers {
        done.answer(commit.clone());
    }
    head.filter(|_| committed)
}
