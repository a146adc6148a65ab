//! The transaction plumbing every command shares: who issues a command
//! ([`CommandContext`]) and the metadata its events carry ([`Stamp`]); the
//! write helper that runs a command's body in one write transaction with
//! its working set and appends what the body decided ([`Engine::command`]);
//! the append itself ([`commit_appends`]: append, fold inline, advance the
//! positions, then the in-transaction [`REACTIONS`]); and the boxing of
//! command futures ([`spawnable`]).
//!
//! This is the bottom of the engine's command layer: every command module
//! (commands, work, batches, review, ingestion, startup) imports it, and it
//! imports none of them, so a command commits through the same path as
//! every other without reaching into another command's module. What must
//! follow every command's events in the same transaction is listed here,
//! in [`REACTIONS`], and lives below, in `reactions`.

use crate::error::EngineError;
use crate::fold::fold_events;
use crate::idempotency::{Once, RequestId};
use crate::observe::{WorkClock, WriteKind};
use crate::reactions::Reaction;
use crate::Engine;
use opledger_domain::events::Event;
use opledger_domain::projections::{all_projectors, WorkingSet};
use opledger_domain::{EventEnvelope, NewEvent, Timestamp};
use opledger_store::{BoxFuture, Store, StoreError, StreamAppend, TimeSource, WriteTx};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

/// Who issues a command, and which flow it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandContext {
    /// Recorded as the events' actor: a worker id, a user, `system`.
    pub actor: String,
    /// Groups the events of one flow; a new id per command when absent.
    pub correlation_id: Option<String>,
    /// The caller's id for this one command, when it may retry it: a retry
    /// with the same id is answered from the first attempt's record
    /// instead of running again (see `idempotency`). Commands that take
    /// many items in one call refuse it.
    pub request_id: Option<RequestId>,
}

impl CommandContext {
    pub fn actor(actor: impl Into<String>) -> Self {
        CommandContext {
            actor: actor.into(),
            correlation_id: None,
            request_id: None,
        }
    }

    pub fn with_correlation(mut self, correlation_id: impl Into<String>) -> Self {
        self.correlation_id = Some(correlation_id.into());
        self
    }

    pub fn with_request_id(mut self, request_id: RequestId) -> Self {
        self.request_id = Some(request_id);
        self
    }

    /// The command `command` asking `asked`, when this context carries a
    /// request id: what [`Engine::command_once`] checks and records.
    pub(crate) fn once(&self, command: &'static str, asked: serde_json::Value) -> Option<Once> {
        let request_id = self.request_id.as_ref()?;
        Some(Once::new(request_id, &self.actor, command, asked))
    }

    /// Refuses a request id on a command that takes many items in one
    /// call: one id names one command, and such a call's answers mix
    /// refusals with results.
    pub(crate) fn refuse_request_id(&self, command: &str) -> Result<(), EngineError> {
        match &self.request_id {
            Some(request_id) => Err(EngineError::invalid(format!(
                "{command} takes many items and no request id (got {}): retry its items one by one \
                 with a request id each",
                opledger_domain::quote(request_id.as_str())
            ))),
            None => Ok(()),
        }
    }
}

/// The metadata a command stamps on each event it appends.
#[derive(Debug, Clone)]
pub(crate) struct Stamp {
    pub(crate) recorded_at: Timestamp,
    actor: String,
    correlation_id: String,
    causation_id: String,
}

impl Stamp {
    /// This stamp at the time its command's transaction gives it
    /// ([`command_time`]).
    pub(crate) async fn in_transaction<T: WriteTx>(
        mut self,
        tx: &mut T,
        source: TimeSource,
    ) -> Result<Self, EngineError> {
        self.recorded_at = command_time(tx, self.recorded_at, source).await?;
        Ok(self)
    }

    pub(crate) fn event(&self, event: Event) -> NewEvent {
        NewEvent {
            event,
            recorded_at: self.recorded_at,
            actor: self.actor.clone(),
            correlation_id: self.correlation_id.clone(),
            causation_id: Some(self.causation_id.clone()),
        }
    }
}

/// The time a command decides and records at, read inside its write
/// transaction ([`WriteTx::command_time`]): the engine clock's `proposed`
/// time, or the store's shared clock when the engine's clock defers to it
/// (the system clock on PostgreSQL), and never before the last event's.
/// *Why in the transaction:* decisions that compare times (a lease
/// expired, a task is due) are made under the write lock against the
/// log's present, whatever the clock of the host that sent the command;
/// the time goes into the events, so replay never asks a clock.
pub(crate) async fn command_time<T: WriteTx>(
    tx: &mut T,
    proposed: Timestamp,
    source: TimeSource,
) -> Result<Timestamp, EngineError> {
    Ok(tx.command_time(proposed, source).await?)
}

/// Boxes a command's future where the command makes it.
///
/// The commands a worker runtime or a pipeline spawns (requests, claims,
/// reports, progress, cancels) return a [`BoxFuture`], boxed inside the
/// method, where the future's lifetimes are the caller's. An `async fn`
/// whose future holds a store write (a closure over a higher-ranked
/// transaction lifetime) and borrowed arguments cannot be proven `Send` for
/// every lifetime at the caller's `tokio::spawn`, and so could not be
/// spawned onto a runtime; boxed here, `Send` is proven once, for the
/// method's own lifetimes. Each such method's body is one `spawnable(…)`
/// of its work (an `async move` block, or a private `async fn` shared by
/// several of them).
pub(crate) fn spawnable<'a, T>(future: impl Future<Output = T> + Send + 'a) -> BoxFuture<'a, T> {
    Box::pin(future)
}

/// The reactions every command's events get inside its transaction, in
/// this order: each reads the envelopes the command appended and the rows
/// they left, and returns appends of its own, which are appended and folded
/// in the same transaction. A reaction's own events get no reactions (none
/// of them settles or reopens an operation: batch settlements, and the
/// unblocking, enqueueing and blocking of waiting tasks), so this never
/// recurses.
pub(crate) const REACTIONS: &[Reaction] = &[
    // Applicability: a task requeued for content its kind does not apply
    // to is recorded not_applicable (first: that settles it, which the
    // reactions after it must see).
    Reaction::Applicability,
    // Needs: tasks blocked by a capability these events settled or
    // reopened are queued when their needs are met, or blocked again
    // (before the settlement: a block on a need that ended without a
    // result settles the task's batch items).
    Reaction::Needs,
    // Completion reconciliation: batches holding an operation these events
    // settled record its outcome in the same transaction.
    Reaction::BatchSettlement,
    // Versions: waiting tasks behind their kind's declared version (a new
    // version just declared, or a task just put back to waiting, by the
    // command or the reactions before) are requested again at it (last:
    // it sees every task the others queued).
    Reaction::Versions,
];

/// Appends, folds every projection inline, and moves their positions, then
/// runs the [`REACTIONS`], all inside the caller's transaction. `rows` may
/// hold rows the command already loaded; they are reused rather than read
/// again.
pub(crate) async fn commit_appends<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    appends: Vec<StreamAppend>,
) -> Result<Vec<EventEnvelope>, EngineError> {
    let mut envelopes = append_and_fold(tx, rows, appends).await?;
    // Each reaction sees the command's events and those of the reactions
    // before it (a task one records not_applicable is settled for the
    // batches that hold it).
    for reaction in REACTIONS {
        let reacted = reaction.appends(tx, rows, &envelopes).await?;
        if !reacted.is_empty() {
            envelopes.extend(append_and_fold(tx, rows, reacted).await?);
        }
    }
    Ok(envelopes)
}

/// Appends, folds inline and advances positions; nothing else. The trusted
/// low-level path ([`Engine::append`]) uses it as is: it records exactly the
/// events it is given.
pub(crate) async fn append_and_fold<T: WriteTx>(
    tx: &mut T,
    rows: &mut WorkingSet,
    appends: Vec<StreamAppend>,
) -> Result<Vec<EventEnvelope>, EngineError> {
    let envelopes = tx.append(appends).await?;
    let (Some(first), Some(last)) = (envelopes.first(), envelopes.last()) else {
        return Ok(envelopes);
    };
    let (from, to) = (first.seq - 1, last.seq);
    fold_events(tx, rows, all_projectors(), &envelopes).await?;
    tx.advance_positions(from, to).await?;
    Ok(envelopes)
}

/// What a command's body decided: the appends that carry it out, and its
/// answer (ready, or read once the appends are folded).
pub(crate) struct Decided<R> {
    appends: Vec<StreamAppend>,
    answer: Answer<R>,
}

/// Reads a command's answer from the rows its appends left and the
/// envelopes they got.
type ReadAnswer<R> = Box<dyn FnOnce(&WorkingSet, Vec<EventEnvelope>) -> Result<R, EngineError> + Send>;

enum Answer<R> {
    Ready(R),
    Folded(ReadAnswer<R>),
}

impl<R: Send + 'static> Decided<R> {
    /// The same appends, answering what `f` makes of this answer (a batch
    /// command's one answer, as a single command's). An error from `f`
    /// fails the whole command.
    pub(crate) fn map<T: Send + 'static>(
        self,
        f: impl FnOnce(R) -> Result<T, EngineError> + Send + 'static,
    ) -> Decided<T> {
        let Decided { appends, answer } = self;
        Decided {
            appends,
            answer: Answer::Folded(Box::new(move |rows, envelopes| match answer {
                Answer::Ready(answer) => f(answer),
                Answer::Folded(read) => f(read(rows, envelopes)?),
            })),
        }
    }

    /// Commits the appends (possibly none) and reads the answer: what the
    /// write helper does after the body.
    async fn settle<T: WriteTx>(self, tx: &mut T, rows: &mut WorkingSet) -> Result<R, EngineError> {
        let Decided { appends, answer } = self;
        let envelopes = if appends.is_empty() {
            Vec::new()
        } else {
            commit_appends(tx, rows, appends).await?
        };
        match answer {
            Answer::Ready(answer) => Ok(answer),
            Answer::Folded(read) => read(rows, envelopes),
        }
    }
}

impl<R> Decided<R> {
    /// Answers `answer` once `appends` (possibly none) are committed.
    pub(crate) fn answer(answer: R, appends: Vec<StreamAppend>) -> Self {
        Decided {
            appends,
            answer: Answer::Ready(answer),
        }
    }

    /// Answers what `read` finds once `appends` are folded: the rows as
    /// they left the working set, and the envelopes appended (the
    /// command's, then its reactions').
    pub(crate) fn then(
        appends: Vec<StreamAppend>,
        read: impl FnOnce(&WorkingSet, Vec<EventEnvelope>) -> Result<R, EngineError> + Send + 'static,
    ) -> Self {
        Decided {
            appends,
            answer: Answer::Folded(Box::new(read)),
        }
    }
}

/// The work [`Store::write`] runs for a command: a fresh working set, the
/// body, then the body's appends committed and its answer read. A
/// `liveness` body appends nothing.
fn in_transaction<T, R, F>(
    liveness: bool,
    clock: Option<Arc<WorkClock>>,
    body: F,
) -> impl for<'t> FnOnce(&'t mut T) -> BoxFuture<'t, Result<R, EngineError>> + Send
where
    T: WriteTx,
    R: Send + 'static,
    F: for<'t> FnOnce(&'t mut T, &'t mut WorkingSet) -> BoxFuture<'t, Result<Decided<R>, EngineError>> + Send + 'static,
{
    move |tx: &mut T| {
        Box::pin(async move {
            if let Some(clock) = &clock {
                clock.begin();
            }
            let mut rows = WorkingSet::default();
            let decided = body(tx, &mut rows).await?;
            debug_assert!(
                !liveness || decided.appends.is_empty(),
                "a liveness command appends nothing"
            );
            let answer = decided.settle(tx, &mut rows).await;
            if let Some(clock) = &clock {
                clock.end();
            }
            answer
        })
    }
}

/// Wraps a command's body in the check and the record of its request id
/// (see [`Engine::command_once`]): the wrapped body settles the inner
/// body's appends itself, so it can record what they appended, and
/// answers with nothing more to append. `always`: record even when
/// nothing was appended (liveness).
fn remembered<T, R, F>(
    once: Once,
    now: Timestamp,
    always: bool,
    body: F,
) -> impl for<'t> FnOnce(&'t mut T, &'t mut WorkingSet) -> BoxFuture<'t, Result<Decided<R>, EngineError>> + Send
where
    T: WriteTx,
    R: Serialize + DeserializeOwned + Send + 'static,
    F: for<'t> FnOnce(&'t mut T, &'t mut WorkingSet) -> BoxFuture<'t, Result<Decided<R>, EngineError>> + Send + 'static,
{
    move |tx: &mut T, rows: &mut WorkingSet| {
        Box::pin(async move {
            if let Some(record) = tx.command_record(once.request_id()).await? {
                let answer = once.recorded_answer(&record)?;
                let answer = serde_json::from_str(&answer).map_err(|error| {
                    StoreError::corrupt(format!(
                        "the answer recorded under request id {} does not read back: {error}",
                        opledger_domain::quote(once.request_id())
                    ))
                })?;
                return Ok(Decided::answer(answer, Vec::new()));
            }
            let before = tx.head().await?;
            let answer = body(tx, rows).await?.settle(tx, rows).await?;
            let after = tx.head().await?;
            let seqs = (after > before).then_some((before + 1, after));
            if seqs.is_some() || always {
                let text = serde_json::to_string(&answer)
                    .map_err(|error| StoreError::corrupt(format!("a command's answer does not serialize: {error}")))?;
                tx.record_command(&once.record(text, seqs, now)).await?;
            }
            Ok(Decided::answer(answer, Vec::new()))
        })
    }
}

impl<S: Store> Engine<S> {
    pub(crate) fn stamp(&self, context: &CommandContext) -> Stamp {
        let command_id = self.ids.next().to_string();
        Stamp {
            recorded_at: self.clock.now(),
            actor: context.actor.clone(),
            correlation_id: context.correlation_id.clone().unwrap_or_else(|| command_id.clone()),
            causation_id: command_id,
        }
    }

    /// Runs a command's body in one write transaction: the body loads the
    /// rows it decides on into the working set it is given and asks the
    /// domain; the appends it returns are then committed with
    /// [`commit_appends`] (appended, folded, reacted to) before the
    /// transaction commits, and its answer is read. A body that refuses
    /// returns its error: nothing of it is written. A body whose later step
    /// must read what an earlier append folded commits that one itself
    /// (with [`commit_appends`], on the same working set) and returns the
    /// rest.
    pub(crate) async fn command<R, F>(&self, body: F) -> Result<R, EngineError>
    where
        R: Send + 'static,
        F: for<'t> FnOnce(&'t mut S::Tx, &'t mut WorkingSet) -> BoxFuture<'t, Result<Decided<R>, EngineError>>
            + Send
            + 'static,
    {
        let clock = self.observer.as_ref().map(|_| Arc::new(WorkClock::default()));
        let called = Instant::now();
        let result = self.store.write(in_transaction(false, clock.clone(), body)).await;
        self.observe(clock, WriteKind::Log, result.is_ok(), called);
        result
    }

    /// [`Engine::command`] for a body that records: `stamp` is given the
    /// command's time inside the transaction ([`command_time`]) before the
    /// body gets it, so everything the body decides by time and every
    /// event it stamps use that time.
    pub(crate) async fn stamped<R, F>(&self, stamp: Stamp, body: F) -> Result<R, EngineError>
    where
        R: Send + 'static,
        F: for<'t> FnOnce(&'t mut S::Tx, &'t mut WorkingSet, Stamp) -> BoxFuture<'t, Result<Decided<R>, EngineError>>
            + Send
            + 'static,
    {
        let source = self.clock.source();
        self.command(move |tx, rows| {
            Box::pin(async move {
                let stamp = stamp.in_transaction(tx, source).await?;
                body(tx, rows, stamp).await
            })
        })
        .await
    }

    /// Where this engine's write commands take their time from.
    pub(crate) fn time_source(&self) -> TimeSource {
        self.clock.source()
    }

    /// The time by the clock write commands decide by, read outside a
    /// transaction: the store's shared clock when the engine's clock defers
    /// to it and the store has one (PostgreSQL's server), otherwise the
    /// engine's clock. For a read that picks what a write then checks
    /// again (recovery's expired claims), and for comparing with a lease's
    /// end (a worker deciding whether to heartbeat).
    pub async fn read_time(&self) -> Result<Timestamp, EngineError> {
        if self.clock.source() == TimeSource::Shared {
            if let Some(now) = self.store.shared_time().await? {
                return Ok(now);
            }
        }
        Ok(self.clock.now())
    }

    /// [`Engine::command`] for a command that may carry a request id
    /// (`once`, see `idempotency`). Inside the write transaction, before
    /// the body: a command recorded under the id answers its recorded
    /// answer and nothing runs or is appended (the same id for another
    /// command is a Conflict). Otherwise the body runs, its appends are
    /// committed and its answer read as [`Engine::command`] does, and the
    /// command is recorded under the id with its answer and the seqs it
    /// appended, in the same transaction: the record exists exactly when
    /// the command's events do. A refused command records nothing, and
    /// neither does one that appended nothing (a claim that found no task,
    /// a request of the revision already requested, progress within a
    /// phase): it changed nothing a retry could repeat, and its retry
    /// decides afresh (a claim retried after an empty answer may take a
    /// task that arrived since, as a long-polling claim does).
    pub(crate) async fn command_once<R, F>(&self, once: Option<Once>, body: F) -> Result<R, EngineError>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
        F: for<'t> FnOnce(&'t mut S::Tx, &'t mut WorkingSet) -> BoxFuture<'t, Result<Decided<R>, EngineError>>
            + Send
            + 'static,
    {
        match once {
            None => self.command(body).await,
            Some(once) => self.command(remembered(once, self.clock.now(), false, body)).await,
        }
    }

    /// [`Engine::command_once`] for a liveness body (a heartbeat), which
    /// never appends: it is recorded whenever it succeeds, in its liveness
    /// commit, so its retry answers the first answer and extends nothing
    /// again.
    pub(crate) async fn liveness_command_once<R, F>(&self, once: Option<Once>, body: F) -> Result<R, EngineError>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
        F: for<'t> FnOnce(&'t mut S::Tx, &'t mut WorkingSet) -> BoxFuture<'t, Result<Decided<R>, EngineError>>
            + Send
            + 'static,
    {
        match once {
            None => self.liveness_command(body).await,
            Some(once) => {
                self.liveness_command(remembered(once, self.clock.now(), true, body))
                    .await
            }
        }
    }

    /// [`Engine::stamped`] under a request id ([`Engine::command_once`]):
    /// the recorded answer of an earlier attempt, or the body at the
    /// command's time inside the transaction, recorded under the id.
    pub(crate) async fn stamped_once<R, F>(&self, once: Option<Once>, stamp: Stamp, body: F) -> Result<R, EngineError>
    where
        R: Serialize + DeserializeOwned + Send + 'static,
        F: for<'t> FnOnce(&'t mut S::Tx, &'t mut WorkingSet, Stamp) -> BoxFuture<'t, Result<Decided<R>, EngineError>>
            + Send
            + 'static,
    {
        let source = self.clock.source();
        self.command_once(once, move |tx, rows| {
            Box::pin(async move {
                let stamp = stamp.in_transaction(tx, source).await?;
                body(tx, rows, stamp).await
            })
        })
        .await
    }

    /// [`Engine::command`] for a body that changes liveness only (lease
    /// rows, never the log or a projection), through
    /// [`Store::write_liveness`]: it must return no appends.
    pub(crate) async fn liveness_command<R, F>(&self, body: F) -> Result<R, EngineError>
    where
        R: Send + 'static,
        F: for<'t> FnOnce(&'t mut S::Tx, &'t mut WorkingSet) -> BoxFuture<'t, Result<Decided<R>, EngineError>>
            + Send
            + 'static,
    {
        let clock = self.observer.as_ref().map(|_| Arc::new(WorkClock::default()));
        let called = Instant::now();
        let result = self
            .store
            .write_liveness(in_transaction(true, clock.clone(), body))
            .await;
        self.observe(clock, WriteKind::Liveness, result.is_ok(), called);
        result
    }

    /// Hands a command's timings to the observer, when there is one.
    fn observe(&self, clock: Option<Arc<WorkClock>>, kind: WriteKind, committed: bool, called: Instant) {
        if let (Some(observer), Some(clock)) = (&self.observer, clock) {
            observer.written(clock.timings(kind, committed, called));
        }
    }
}
