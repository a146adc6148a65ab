//! The single writer with group commit.
//!
//! Work waiting in the queue when the writer becomes free is run in one
//! transaction, each piece inside its own savepoint; a failing piece rolls
//! back to its savepoint and leaves the others alone. Nobody is answered
//! until the COMMIT (an fsync under `synchronous=FULL`) has returned, so an
//! acknowledgement always means durable. Under load many commands share one
//! fsync; alone, a command pays exactly one.

use crate::error::map;
use crate::tx::SqliteTx;
use futures::FutureExt;
use opledger_store::{BoxFuture, StoreError};
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use tokio::sync::{mpsc, oneshot};

/// Most pieces of work grouped into one commit; bounds how long the first
/// piece of a group waits for the others.
const MAX_GROUP: usize = 256;

/// What a piece of work left behind: whether it succeeded, and how to
/// answer its caller once the commit outcome is known.
pub(crate) struct Done {
    ok: bool,
    finish: Box<dyn FnOnce(Result<(), StoreError>) + Send>,
}

/// One caller's work, type-erased so pieces of different types can queue
/// together.
pub(crate) trait Job: Send {
    fn run<'t>(self: Box<Self>, tx: &'t mut SqliteTx) -> BoxFuture<'t, Done>;
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
    F: for<'t> FnOnce(&'t mut SqliteTx) -> BoxFuture<'t, Result<R, E>> + Send + 'static,
{
    fn run<'t>(self: Box<Self>, tx: &'t mut SqliteTx) -> BoxFuture<'t, Done> {
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

async fn execute(tx: &mut SqliteTx, sql: &str) -> Result<(), StoreError> {
    crate::rows::script(tx.connection(), sql)
        .await
        .map_err(|error| map(error, sql))
}

/// The writer task: runs until every store handle is dropped.
pub(crate) async fn run(mut tx: SqliteTx, mut jobs: mpsc::Receiver<Box<dyn Job>>) {
    while let Some(first) = jobs.recv().await {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        run_group(&mut tx, group).await;
    }
    crate::close_quietly(tx.into_connection()).await;
}

async fn run_group(tx: &mut SqliteTx, group: Vec<Box<dyn Job>>) {
    let started = std::time::Instant::now();
    let pieces = group.len();
    // A lone piece needs no savepoint: its failure rolls back the transaction.
    let use_savepoints = group.len() > 1;
    // Savepoint bookkeeping costs no round trips of its own: the first
    // savepoint opens with the transaction, and each piece's RELEASE (with
    // the next piece's SAVEPOINT) rides along with the piece's last flush.
    let begin = if use_savepoints {
        "BEGIN IMMEDIATE; SAVEPOINT work"
    } else {
        "BEGIN IMMEDIATE"
    };
    if let Err(error) = execute(tx, begin).await {
        let _ = execute(tx, "ROLLBACK").await;
        for job in group {
            job.abort(error.clone());
        }
        return;
    }
    tx.begin_transaction();
    let mut finishes = Vec::with_capacity(group.len());
    let mut broken: Option<StoreError> = None;
    let mut any_ok = false;
    for (index, job) in group.into_iter().enumerate() {
        if let Some(error) = &broken {
            job.abort(error.clone());
            continue;
        }
        let more = index + 1 < pieces;
        let before = tx.checkpoint();
        let mut outcome = AssertUnwindSafe(job.run(tx)).catch_unwind().await;
        // Writes the work gathered but did not need to read back are sent
        // now; if they fail, the work fails with their error.
        if let Ok(done) = &mut outcome {
            if done.ok {
                if use_savepoints {
                    tx.defer("RELEASE work");
                    if more {
                        tx.defer("SAVEPOINT work");
                    }
                }
                if let Err(error) = tx.flush().await {
                    done.ok = false;
                    let finish = std::mem::replace(&mut done.finish, Box::new(|_| {}));
                    done.finish = Box::new(move |_| finish(Err(error)));
                }
            }
        }
        let ok = matches!(&outcome, Ok(done) if done.ok);
        if ok {
            any_ok = true;
        } else {
            tx.restore(before);
            if use_savepoints {
                // The piece's savepoint is still open (a failed flush stops
                // before its RELEASE); undo the piece and open the next one's.
                let undo = if more {
                    "ROLLBACK TO work; RELEASE work; SAVEPOINT work"
                } else {
                    "ROLLBACK TO work; RELEASE work"
                };
                if let Err(error) = execute(tx, undo).await {
                    broken = Some(error);
                }
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
    let commit = match broken {
        Some(error) => Err(error),
        None if !any_ok => Err(StoreError::unavailable("nothing to commit")),
        None => execute(tx, "COMMIT").await,
    };
    tracing::trace!(
        pieces,
        work_us = worked.as_micros() as u64,
        commit_us = (started.elapsed() - worked).as_micros() as u64,
        "write group"
    );
    if commit.is_err() {
        // Nothing of this group is durable; make sure the transaction is gone.
        let _ = execute(tx, "ROLLBACK").await;
        tx.begin_transaction();
    }
    for finish in finishes {
        finish(commit.clone());
    }
}
