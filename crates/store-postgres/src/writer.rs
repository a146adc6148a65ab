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
use opledger_store::{BoxFuture, StoreError};
use sqlx::PgPool;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use tokio::sync::{mpsc, oneshot};

/// Most pieces grouped into one commit; bounds how long the first piece of
/// a group waits for the others. Each piece that writes is a
/// subtransaction, and PostgreSQL caches at most 64 of them per backend in
/// shared memory: beyond that, every other session's visibility checks of
/// this transaction's rows go through pg_subtrans, which is slow. So a
/// group stays below 64 pieces.
const MAX_GROUP: usize = 48;

/// What a piece of work left behind: whether it succeeded, and how to
/// answer its caller once the commit outcome is known.
pub(crate) struct Done {
    ok: bool,
    finish: Box<dyn FnOnce(Result<(), StoreError>) + Send>,
}

/// One caller's work, type-erased so pieces of different types can queue
/// together.
pub(crate) trait Job: Send {
    fn run<'t>(self: Box<Self>, tx: &'t mut PostgresTx) -> BoxFuture<'t, Done>;
    /// Answers the caller without running (the transaction could not start).
    fn abort(self: Box<Self>, error: StoreError);
}

pub(crate) struct WorkJob<F, R, E> {
    work: F,
    sender: oneshot::Sender<Result<R, E>>,
    _result: PhantomData<fn() -> (R, E)>,
}

impl<F, R, E> WorkJob<F, R, E> {
    pub(crate) fn new(work: F, sender: oneshot::Sender<Result<R, E>>) -> Self {
        WorkJob {
            work,
            sender,
            _result: PhantomData,
        }
    }
}

impl<F, R, E> Job for WorkJob<F, R, E>
where
    R: Send + 'static,
    E: From<StoreError> + Send + 'static,
    F: for<'t> FnOnce(&'t mut PostgresTx) -> BoxFuture<'t, Result<R, E>> + Send + 'static,
{
    fn run<'t>(self: Box<Self>, tx: &'t mut PostgresTx) -> BoxFuture<'t, Done> {
        let WorkJob { work, sender, .. } = *self;
        Box::pin(async move {
            let result = work(tx).await;
            let ok = result.is_ok();
            Done {
                ok,
                finish: Box::new(move |commit: Result<(), StoreError>| {
                    let answer = match (result, commit) {
                        (Ok(value), Ok(())) => Ok(value),
                        (Ok(_), Err(error)) => Err(E::from(error)),
                        (Err(error), _) => Err(error),
                    };
                    // The caller may have given up waiting; nothing to do then.
                    let _ = sender.send(answer);
                }),
            }
        })
    }

    fn abort(self: Box<Self>, error: StoreError) {
        let _ = self.sender.send(Err(E::from(error)));
    }
}

/// The writer loop: waits for work, groups whatever else is queued, runs
/// it; ends when every store handle (every sender) is gone. `committed` is
/// told the log head after each commit that appended.
pub(crate) async fn run(pool: PgPool, mut jobs: mpsc::Receiver<Box<dyn Job>>, committed: impl Fn(i64) + Send) {
    while let Some(first) = jobs.recv().await {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        if let Some(head) = run_group(&pool, group).await {
            committed(head);
        }
    }
}

/// Runs one group in one transaction; returns the head after a commit.
async fn run_group(pool: &PgPool, group: Vec<Box<dyn Job>>) -> Option<i64> {
    let started = std::time::Instant::now();
    let pieces = group.len();
    let use_savepoints = pieces > 1;
    let mut tx = match PostgresTx::begin(pool).await {
        Ok(tx) => tx,
        Err(error) => {
            for job in group {
                job.abort(error.clone());
            }
            return None;
        }
    };
    let mut finishes = Vec::with_capacity(pieces);
    let mut broken: Option<StoreError> = None;
    let mut any_ok = false;
    if use_savepoints {
        if let Err(error) = tx.open_savepoint().await {
            broken = Some(error);
        }
    }
    for (index, job) in group.into_iter().enumerate() {
        if let Some(error) = &broken {
            job.abort(error.clone());
            continue;
        }
        let checkpoint = tx.checkpoint();
        let mut outcome = AssertUnwindSafe(job.run(&mut tx)).catch_unwind().await;
        // A piece that succeeded keeps its writes only if they all went
        // through (work that ignored a failed statement finds out here).
        if let Ok(done) = &mut outcome {
            if done.ok && use_savepoints {
                if let Err(error) = tx.keep_piece(index + 1 < pieces).await {
                    done.ok = false;
                    let finish = std::mem::replace(&mut done.finish, Box::new(|_| {}));
                    done.finish = Box::new(move |_| finish(Err(error)));
                }
            }
        }
        let ok = matches!(&outcome, Ok(done) if done.ok);
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
            Ok(done) if !done.ok => (done.finish)(Ok(())),
            Ok(done) => finishes.push(done.finish),
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
    for finish in finishes {
        finish(commit.clone());
    }
    head.filter(|_| committed)
}
