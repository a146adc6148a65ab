//! The pieces of work a group-committing writer queues: each caller's
//! work for [`Store::write`](crate::Store::write), type-erased so pieces of
//! different result types can wait in one queue, run one after another in
//! one transaction, and be answered once the transaction's commit is known.
//!
//! Shared by the backends' writers, which differ in how they run a group
//! (a thread of its own on SQLite, a task on PostgreSQL) but not in what a
//! piece is. `Tx` is the backend's write transaction.

use crate::{BoxFuture, StoreError};
use std::marker::PhantomData;
use tokio::sync::oneshot;

/// What a piece of work left behind: whether it succeeded, and how to
/// answer its caller once the commit outcome is known.
pub struct Done {
    ok: bool,
    answer: Box<dyn FnOnce(Result<(), StoreError>) + Send>,
}

impl Done {
    /// Whether the work succeeded (and its writes may stay).
    pub fn ok(&self) -> bool {
        self.ok
    }

    /// Fails a piece whose work succeeded but whose writes did not all go
    /// through: `error` becomes its answer, whatever the commit does.
    pub fn fail(&mut self, error: StoreError) {
        self.ok = false;
        let answer = std::mem::replace(&mut self.answer, Box::new(|_| {}));
        self.answer = Box::new(move |_| answer(Err(error)));
    }

    /// Answers the caller with the outcome of the commit its piece was part
    /// of. A failed piece's answer is its own error, whatever `commit` is.
    pub fn answer(self, commit: Result<(), StoreError>) {
        (self.answer)(commit)
    }
}

/// One caller's work, ready to run in a backend's write transaction `Tx`.
pub trait Piece<Tx>: Send {
    fn run<'t>(self: Box<Self>, tx: &'t mut Tx) -> BoxFuture<'t, Done>;
    /// Answers the caller without running (the transaction could not start).
    fn abort(self: Box<Self>, error: StoreError);
    /// Whether the work changes only liveness (see `Store::write_liveness`).
    fn is_liveness(&self) -> bool;
}

/// The piece of a [`Store::write`](crate::Store::write) call: its work and
/// the channel its caller waits on.
pub struct WorkPiece<F, R, E> {
    work: F,
    sender: oneshot::Sender<Result<R, E>>,
    liveness: bool,
    _result: PhantomData<fn() -> (R, E)>,
}

impl<F, R, E> WorkPiece<F, R, E> {
    pub fn new(work: F, sender: oneshot::Sender<Result<R, E>>) -> Self {
        WorkPiece {
            work,
            sender,
            liveness: false,
            _result: PhantomData,
        }
    }

    /// Marks the work as liveness only.
    pub fn liveness(mut self) -> Self {
        self.liveness = true;
        self
    }
}

impl<Tx, F, R, E> Piece<Tx> for WorkPiece<F, R, E>
where
    Tx: Send,
    R: Send + 'static,
    E: From<StoreError> + Send + 'static,
    F: for<'t> FnOnce(&'t mut Tx) -> BoxFuture<'t, Result<R, E>> + Send + 'static,
{
    fn run<'t>(self: Box<Self>, tx: &'t mut Tx) -> BoxFuture<'t, Done> {
        let WorkPiece { work, sender, .. } = *self;
        Box::pin(async move {
            let result = work(tx).await;
            let ok = result.is_ok();
            Done {
                ok,
                answer: Box::new(move |commit: Result<(), StoreError>| {
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

    fn is_liveness(&self) -> bool {
        self.liveness
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;

    /// A transaction that is only a counter.
    type Counter = u32;

    fn queued<R: Send + 'static>(
        work: impl for<'t> FnOnce(&'t mut Counter) -> BoxFuture<'t, Result<R, StoreError>> + Send + 'static,
    ) -> (Box<dyn Piece<Counter>>, oneshot::Receiver<Result<R, StoreError>>) {
        let (sender, receiver) = oneshot::channel();
        (Box::new(WorkPiece::new(work, sender)), receiver)
    }

    #[test]
    fn a_piece_that_succeeded_is_answered_with_the_commits_outcome() {
        for (commit, expected) in [
            (Ok(()), Ok(2)),
            (
                Err(StoreError::unavailable("lost")),
                Err(StoreError::unavailable("lost")),
            ),
        ] {
            let mut tx: Counter = 1;
            let (piece, mut answer) = queued(|tx: &mut Counter| {
                Box::pin(async move {
                    *tx += 1;
                    Ok(*tx)
                })
            });
            let done = block_on(piece.run(&mut tx));
            assert!(done.ok());
            assert!(answer.try_recv().is_err(), "answered before the commit");
            done.answer(commit);
            assert_eq!(answer.try_recv().unwrap(), expected);
        }
    }

    #[test]
    fn a_failed_piece_keeps_its_own_error_whatever_the_commit_does() {
        let mut tx: Counter = 0;
        let (piece, mut answer) =
            queued(|_: &mut Counter| Box::pin(async { Err::<(), _>(StoreError::conflict("no")) }));
        let done = block_on(piece.run(&mut tx));
        assert!(!done.ok());
        done.answer(Ok(()));
        assert_eq!(answer.try_recv().unwrap(), Err(StoreError::conflict("no")));

        // A piece whose work succeeded but whose writes did not.
        let (piece, mut answer) = queued(|_: &mut Counter| Box::pin(async { Ok(()) }));
        let mut done = block_on(piece.run(&mut tx));
        done.fail(StoreError::constraint("refused"));
        assert!(!done.ok());
        done.answer(Ok(()));
        assert_eq!(answer.try_recv().unwrap(), Err(StoreError::constraint("refused")));
    }

    fn never_runs(_: &mut Counter) -> BoxFuture<'_, Result<(), StoreError>> {
        panic!("an aborted piece ran")
    }

    #[test]
    fn an_aborted_piece_is_answered_without_running() {
        let (sender, mut answer) = oneshot::channel();
        let piece = WorkPiece::new(never_runs, sender).liveness();
        assert!(Piece::<Counter>::is_liveness(&piece));
        Piece::<Counter>::abort(Box::new(piece), StoreError::unavailable("no transaction"));
        assert_eq!(
            answer.try_recv().unwrap(),
            Err(StoreError::unavailable("no transaction"))
        );
    }
}
