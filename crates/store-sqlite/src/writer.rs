//! The single writer with group commit, on a thread of its own.
//!
//! One OS thread owns the writer connection (rusqlite) and takes work from a
//! channel. Work waiting in the queue when the writer becomes free is run in
//! one transaction, each piece inside its own savepoint; a failing or
//! panicking piece rolls back to its savepoint and leaves the others alone.
//! Pieces that arrive while a group runs join it before its COMMIT (see
//! [`LATE_JOIN_WINDOW`]).
//! Nobody is answered until the COMMIT (an fsync under `synchronous=FULL`)
//! has returned, so an acknowledgement always means durable. Under load many
//! commands share one fsync; alone, a command pays exactly one.
//!
//! *Why a thread:* every statement through an async driver is a handoff to
//! the driver's thread and back. Here a piece of work runs on the thread
//! that owns the connection, and the only handoffs left are the piece going
//! in and the answer coming out.

use crate::config::Synchronous;
use crate::tx::SqliteTx;
use futures::executor::block_on;
use opledger_store::group_commit::{Done, Piece};
use opledger_store::StoreError;
use std::panic::AssertUnwindSafe;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Most pieces of work grouped into one commit; bounds how long the first
/// piece of a group waits for the others.
const MAX_GROUP: usize = 256;

/// How long after a group started a piece that arrived meanwhile may still
/// join it. *Why:* callers that each wait for their answer before sending
/// again (workers alternating claim and report) fall into cohorts: while
/// one half's group runs, the other half's answers come back and their
/// next pieces queue for the group after. Groups then hold half the
/// callers and every piece pays twice the commits it needs. Letting the
/// late half join merges the cohorts without ever waiting idle for them;
/// the window bounds how much longer the first pieces wait for their answer.
/// Measured (`bench lifecycle --workers 4`, interleaved): groups of two
/// pieces became groups of four, +5–10% tasks/s; claim latency unchanged.
const LATE_JOIN_WINDOW: Duration = Duration::from_millis(20);

/// One caller's work as the writer thread queues it.
pub(crate) type QueuedPiece = Box<dyn Piece<SqliteTx>>;

/// Starts the writer thread: it opens the writer connection (`open`),
/// answers `ready` with the outcome, then takes work until every store
/// handle is dropped.
pub(crate) fn start(
    open: impl FnOnce() -> Result<rusqlite::Connection, StoreError> + Send + 'static,
    synchronous: Synchronous,
    pieces: mpsc::Receiver<QueuedPiece>,
) -> Result<oneshot::Receiver<Result<(), StoreError>>, StoreError> {
    let (ready, opened) = oneshot::channel();
    // Work ran on a Tokio task before it ran here; entering the opener's
    // runtime keeps Tokio's timers usable inside a piece of work. (Entering
    // is not running on it: `blocking_recv` below is allowed.)
    let runtime = tokio::runtime::Handle::try_current().ok();
    std::thread::Builder::new()
        .name("opledger-sqlite-writer".into())
        .spawn(move || {
            let _runtime = runtime.as_ref().map(tokio::runtime::Handle::enter);
            match open() {
                Ok(connection) => {
                    let _ = ready.send(Ok(()));
                    run(SqliteTx::new(connection), synchronous, pieces);
                }
                Err(error) => {
                    let _ = ready.send(Err(error));
                }
            }
        })
        .map_err(|error| StoreError::unavailable(format!("starting the SQLite writer thread: {error}")))?;
    Ok(opened)
}

/// The writer loop: waits for work, groups whatever else is queued, runs it.
fn run(mut tx: SqliteTx, synchronous: Synchronous, mut pieces: mpsc::Receiver<QueuedPiece>) {
    // `blocking_recv` parks this thread (it is not a runtime thread) until
    // a caller sends; callers keep queueing while a group runs and commits.
    while let Some(first) = pieces.blocking_recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match pieces.try_recv() {
                Ok(piece) => group.push(piece),
                Err(_) => break,
            }
        }
        // A group of liveness work only is committed without its own
        // fsync: its WAL frames reach the disk with the next durable
        // commit or checkpoint. (The setting cannot change inside a
        // transaction, so it is decided per group, before BEGIN.)
        let relaxed = synchronous == Synchronous::Full && group.iter().all(|piece| piece.is_liveness());
        if relaxed {
            relax(&tx, "NORMAL");
        }
        // Pieces that arrive while the group runs may join it, but not a
        // relaxed group: they would commit without their fsync.
        let late = if relaxed { None } else { Some(&mut pieces) };
        run_group(&mut tx, group, late);
        if relaxed {
            relax(&tx, synchronous.pragma_value());
        }
    }
    // Dropping the transaction closes the connection.
}

/// Sets `PRAGMA synchronous` between groups. A failure leaves the
/// setting as it was, which is only ever the more durable one.
fn relax(tx: &SqliteTx, level: &str) {
    if let Err(error) = tx.execute(&format!("PRAGMA synchronous = {level}")) {
        tracing::warn!(%error, level, "could not set the writer's synchronous level");
    }
}

/// Runs one piece of work to completion on this thread. Its future only
/// awaits `SqliteTx` methods, which never wait, so `block_on` polls it
/// through without parking; a piece that awaited anything else (a lock, a
/// channel, a timer) would still complete, only holding up the writer
/// meanwhile, as it did when the writer was a task.
fn run_piece(piece: QueuedPiece, tx: &mut SqliteTx) -> std::thread::Result<Done> {
    std::panic::catch_unwind(AssertUnwindSafe(|| block_on(piece.run(tx))))
}

/// Runs `group` in one transaction, then, while the transaction is still
/// open, whatever arrived on `late` meanwhile (see [`LATE_JOIN_WINDOW`]),
/// and commits.
fn run_group(tx: &mut SqliteTx, group: Vec<QueuedPiece>, mut late: Option<&mut mpsc::Receiver<QueuedPiece>>) {
    let started = std::time::Instant::now();
    let mut pieces = group.len();
    // A lone piece needs no savepoint: its failure rolls back the transaction.
    let mut use_savepoints = group.len() > 1;
    if let Err(error) = tx.execute("BEGIN IMMEDIATE") {
        tx.rollback_quietly();
        for piece in group {
            piece.abort(error.clone());
        }
        return;
    }
    tx.begin_transaction();
    let mut answers = Vec::with_capacity(group.len());
    let mut broken: Option<StoreError> = None;
    let mut any_ok = false;
    let mut queue: std::collections::VecDeque<QueuedPiece> = group.into();
    loop {
        let piece = match queue.pop_front() {
            Some(piece) => piece,
            None => {
                // The group's own pieces are done. A piece that arrived
                // meanwhile joins while the group is young, none failed the
                // transaction, and the group is not full; it runs in a
                // savepoint of its own, like every piece after the first.
                // A lone first piece that failed ran without one, so its
                // writes may still be in the transaction: nothing joins it.
                let open = broken.is_none() && (use_savepoints || any_ok);
                let young = started.elapsed() < LATE_JOIN_WINDOW && pieces < MAX_GROUP;
                match late
                    .as_deref_mut()
                    .filter(|_| open && young)
                    .map(mpsc::Receiver::try_recv)
                {
                    Some(Ok(piece)) => {
                        pieces += 1;
                        use_savepoints = true;
                        piece
                    }
                    _ => break,
                }
            }
        };
        if let Some(error) = &broken {
            piece.abort(error.clone());
            continue;
        }
        if use_savepoints {
            if let Err(error) = tx.execute("SAVEPOINT work") {
                piece.abort(error.clone());
                broken = Some(error);
                continue;
            }
        }
        let before = tx.checkpoint();
        let mut outcome = run_piece(piece, tx);
        // A write that failed fails the piece, even if the work carried on;
        // a piece that succeeded releases its savepoint into the transaction.
        if let Ok(done) = &mut outcome {
            if done.ok() {
                let mut end = tx.take_failure();
                if end.is_ok() && use_savepoints {
                    end = tx.execute("RELEASE work");
                }
                if let Err(error) = end {
                    done.fail(error);
                }
            }
        }
        let ok = matches!(&outcome, Ok(done) if done.ok());
        if ok {
            any_ok = true;
        } else {
            tx.restore(before);
            if use_savepoints {
                // Undo the piece; the next one opens its own savepoint.
                if let Err(error) = tx.execute("ROLLBACK TO work").and_then(|()| tx.execute("RELEASE work")) {
                    broken = Some(error);
                }
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
    let commit = match broken {
        Some(error) => Err(error),
        None if !any_ok => Err(StoreError::unavailable("nothing to commit")),
        None => tx.execute("COMMIT"),
    };
    tracing::trace!(
        pieces,
        work_us = worked.as_micros() as u64,
        commit_us = (started.elapsed() - worked).as_micros() as u64,
        "write group"
    );
    if commit.is_err() {
        // Nothing of this group is durable; make sure the transaction is gone.
        tx.rollback_quietly();
        tx.begin_transaction();
    }
    // Answered only now, after COMMIT returned: an answer means durable.
    for done in answers {
        done.answer(commit.clone());
    }
}
