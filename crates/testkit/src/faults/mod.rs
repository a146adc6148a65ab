//! Storage fault injection for tests: [`FaultyStore`] wraps any backend's
//! store and makes chosen write transactions fail the way a real database
//! or connection can — refused before the work runs, failed at commit (the
//! work ran and is rolled back), or **applied but reported failed** (the
//! commit is durable and the caller hears an error: the connection dropped
//! after COMMIT, a timeout that fired just too early).
//!
//! Faults are per write transaction ([`Store::write`] and
//! [`Store::write_liveness`] calls), counted from 1 in the order the calls
//! reach the wrapper: one scheduled for the k-th write ([`FaultyStore::fail_write`],
//! single-fault mode) or for every write until cleared
//! ([`FaultyStore::fail_every_write`], persistent mode). An injected
//! failure is `Unavailable`, what the backends map a lost connection or a
//! failed commit to (exit 5, HTTP 503). Reads pass through untouched.
//!
//! Inside a write transaction, the work is handed the backend's own
//! transaction wrapped ([`FaultyTx`]), so that the k-th *statement* from
//! now fails ([`FaultyStore::fail_statement`]): the statement answers
//! Unavailable, the transaction is aborted from then on, and nothing of it
//! is committed. And a commit can be made *slow*
//! ([`FaultyStore::slow_commits`]): the work is done, and the transaction
//! is held open (with the backend's write lock) for a while before the
//! backend commits it, as a slow disk or a stalled WAL flush would.
//!
//! *Why a wrapper of the store contract, not of one backend:* the engine
//! reaches storage only through [`Store`], so a fault there is a fault of
//! every backend, and the same test runs on SQLite and PostgreSQL
//! (`backend_tests!`). It lives here, in the dev-only testkit, so nothing
//! of it is in a release build (`tests/it/architecture/dependencies.rs`
//! checks that no library depends on this crate).

use futures::stream::BoxStream;
use opledger_domain::chain::ChainEntry;
use opledger_domain::projections::{Cell, Row, TableSpec};
use opledger_domain::{EventEnvelope, OperationStatus, StreamId, Timestamp};
use opledger_store::{
    AheadQuery, BoxFuture, ClaimQueue, ClaimableAhead, ExpiredClaim, Lease, Page, PageQuery, ProjectionState, Store,
    StoreError, Verification,
};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod tx;

pub use tx::FaultyTx;

/// How one write transaction fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The transaction cannot begin: the work never runs.
    Begin,
    /// The work runs, then the commit fails: everything it did is rolled
    /// back, and the caller hears the failure.
    Commit,
    /// The work runs and commits durably, and the caller is told it
    /// failed: the ambiguous case a retry must not apply twice.
    AppliedButReported,
}

impl Fault {
    fn error(self) -> StoreError {
        StoreError::unavailable(match self {
            Fault::Begin => "injected fault: the write transaction could not begin",
            Fault::Commit => "injected fault: the commit failed and was rolled back",
            Fault::AppliedButReported => "injected fault: the connection was lost after the commit",
        })
    }
}

#[derive(Default)]
struct Plan {
    /// Write transactions that reached the wrapper so far.
    writes: AtomicU64,
    /// Faults injected so far.
    injected: AtomicU64,
    /// Single faults by the number of the write they hit.
    scheduled: Mutex<BTreeMap<u64, Fault>>,
    /// The fault every write gets until cleared.
    persistent: Mutex<Option<Fault>>,
    /// Statements the work of write transactions made so far.
    statements: AtomicU64,
    /// The numbers of the statements that fail.
    scheduled_statements: Mutex<BTreeSet<u64>>,
    /// How long each commit is held back, when commits are slow.
    commit_delay: Mutex<Option<Duration>>,
    /// Transactions whose work answered Ok after one of its statements failed.
    swallowed: AtomicU64,
}

impl Plan {
    /// The fault, if any, of the write that arrives now.
    fn next(&self) -> Option<Fault> {
        let number = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        let scheduled = self.scheduled.lock().expect("fault plan").remove(&number);
        let fault = scheduled.or(*self.persistent.lock().expect("fault plan"));
        if fault.is_some() {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        fault
    }

    fn commit_delay(&self) -> Option<Duration> {
        *self.commit_delay.lock().expect("fault plan")
    }
}

/// The work of one write transaction as the backend's store takes it.
type InnerWork<T, R, E> = Box<dyn for<'t> FnOnce(&'t mut T) -> BoxFuture<'t, Result<R, E>> + Send>;

/// Waits `delay` on any executor (the SQLite writer thread polls its work
/// without a tokio timer): a thread of its own sleeps it.
async fn pause(delay: Duration) {
    let (done, waited) = futures::channel::oneshot::channel::<()>();
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        let _ = done.send(());
    });
    let _ = waited.await;
}

/// A store whose write transactions fail as planned; see the module docs.
/// Cheap to clone; clones share the plan.
#[derive(Clone)]
pub struct FaultyStore<S> {
    inner: S,
    plan: Arc<Plan>,
}

impl<S: Store> FaultyStore<S> {
    /// Wraps `inner` with no fault planned.
    pub fn new(inner: S) -> Self {
        FaultyStore {
            inner,
            plan: Arc::new(Plan::default()),
        }
    }

    /// The store underneath, which no fault reaches.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Makes the `k`-th write transaction from now (1: the next one) fail
    /// with `fault`.
    pub fn fail_write(&self, k: u64, fault: Fault) {
        assert!(k >= 1, "writes are counted from 1");
        let number = self.writes() + k;
        self.plan.scheduled.lock().expect("fault plan").insert(number, fault);
    }

    /// Makes every write transaction fail with `fault` until called with
    /// `None`.
    pub fn fail_every_write(&self, fault: Option<Fault>) {
        *self.plan.persistent.lock().expect("fault plan") = fault;
    }

    /// Makes the `k`-th statement from now (1: the next one) that the work
    /// of a write transaction makes fail, aborting its transaction.
    pub fn fail_statement(&self, k: u64) {
        assert!(k >= 1, "statements are counted from 1");
        let number = self.statements() + k;
        self.plan
            .scheduled_statements
            .lock()
            .expect("fault plan")
            .insert(number);
    }

    /// Holds every write transaction open for `delay` after its work is
    /// done and before the backend commits it, until called with `None`.
    pub fn slow_commits(&self, delay: Option<Duration>) {
        *self.plan.commit_delay.lock().expect("fault plan") = delay;
    }

    /// Forgets every planned fault (slow commits included).
    pub fn clear(&self) {
        self.plan.scheduled.lock().expect("fault plan").clear();
        self.plan.scheduled_statements.lock().expect("fault plan").clear();
        self.fail_every_write(None);
        self.slow_commits(None);
    }

    /// Statements the work of write transactions made so far.
    pub fn statements(&self) -> u64 {
        self.plan.statements.load(Ordering::SeqCst)
    }

    /// Write transactions whose work answered Ok although one of its
    /// statements had failed (reported failed and rolled back, as
    /// PostgreSQL rolls back an aborted transaction): work that swallows a
    /// storage error.
    pub fn swallowed(&self) -> u64 {
        self.plan.swallowed.load(Ordering::SeqCst)
    }

    /// Write transactions that reached this store so far.
    pub fn writes(&self) -> u64 {
        self.plan.writes.load(Ordering::SeqCst)
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.plan.injected.load(Ordering::SeqCst)
    }

    /// Runs `work` through `write` (the inner store's durable or liveness
    /// write) with the fault the plan gives this write, on the backend's
    /// transaction wrapped for statement faults.
    async fn faulty<R, E, F, W, Fut>(&self, work: F, write: W) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: for<'t> FnOnce(&'t mut FaultyTx<S::Tx>) -> BoxFuture<'t, Result<R, E>> + Send + 'static,
        W: FnOnce(InnerWork<S::Tx, R, E>) -> Fut,
        Fut: Future<Output = Result<R, E>>,
    {
        let fault = self.plan.next();
        if let Some(fault @ Fault::Begin) = fault {
            return Err(E::from(fault.error()));
        }
        let plan = self.plan.clone();
        let inner: InnerWork<S::Tx, R, E> = Box::new(move |tx: &mut S::Tx| {
            Box::pin(async move {
                let mut wrapped = FaultyTx::borrowing(tx, plan.clone());
                let result = work(&mut wrapped).await;
                let aborted = wrapped.aborted();
                drop(wrapped);
                let answer = match (result, aborted) {
                    (Ok(_), Some(error)) => {
                        plan.swallowed.fetch_add(1, Ordering::SeqCst);
                        return Err(E::from(error));
                    }
                    (result, _) => result?,
                };
                if let Some(fault @ Fault::Commit) = fault {
                    // The work's own writes are rolled back with it.
                    return Err(E::from(fault.error()));
                }
                if let Some(delay) = plan.commit_delay() {
                    pause(delay).await;
                }
                Ok(answer)
            })
        });
        let answer = write(inner).await?;
        match fault {
            Some(fault @ Fault::AppliedButReported) => Err(E::from(fault.error())),
            _ => Ok(answer),
        }
    }
}

impl<S: Store> Store for FaultyStore<S> {
    type Tx = FaultyTx<S::Tx>;
    type Scratch = S::Scratch;
    type Lock = S::Lock;

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn write<R, E, F>(&self, work: F) -> impl Future<Output = Result<R, E>> + Send
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<R, E>> + Send + 'static,
    {
        let store = self.clone();
        async move { store.faulty(work, |work| store.inner.write(work)).await }
    }

    fn write_liveness<R, E, F>(&self, work: F) -> impl Future<Output = Result<R, E>> + Send
    where
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx) -> BoxFuture<'t, Result<R, E>> + Send + 'static,
    {
        let store = self.clone();
        async move { store.faulty(work, |work| store.inner.write_liveness(work)).await }
    }

    async fn read_stream(&self, stream_id: &StreamId) -> Result<Vec<EventEnvelope>, StoreError> {
        self.inner.read_stream(stream_id).await
    }

    async fn shared_time(&self) -> Result<Option<Timestamp>, StoreError> {
        self.inner.shared_time().await
    }

    async fn read_stream_after(
        &self,
        stream_id: &StreamId,
        after: i64,
        limit: usize,
    ) -> Result<Vec<EventEnvelope>, StoreError> {
        self.inner.read_stream_after(stream_id, after, limit).await
    }

    fn read_all(&self, after: i64, page_size: usize) -> BoxStream<'static, Result<EventEnvelope, StoreError>> {
        self.inner.read_all(after, page_size)
    }

    async fn head(&self) -> Result<i64, StoreError> {
        self.inner.head().await
    }

    async fn read_chain(&self, after: i64, limit: usize) -> Result<Vec<ChainEntry>, StoreError> {
        self.inner.read_chain(after, limit).await
    }

    async fn last_verification(&self) -> Result<Option<Verification>, StoreError> {
        self.inner.last_verification().await
    }

    async fn load_rows(&self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        self.inner.load_rows(table, keys).await
    }

    async fn scan_table(&self, table: &'static TableSpec) -> Result<Vec<Row>, StoreError> {
        self.inner.scan_table(table).await
    }

    async fn projection_states(&self) -> Result<Vec<ProjectionState>, StoreError> {
        self.inner.projection_states().await
    }

    async fn count_by(
        &self,
        table: &'static TableSpec,
        column: &'static str,
    ) -> Result<Vec<(Option<String>, i64)>, StoreError> {
        self.inner.count_by(table, column).await
    }

    async fn count_rows(&self, table: &'static TableSpec) -> Result<i64, StoreError> {
        self.inner.count_rows(table).await
    }

    async fn find_rows(
        &self,
        table: &'static TableSpec,
        filters: &[(&'static str, Cell)],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        self.inner.find_rows(table, filters, limit).await
    }

    async fn find_rows_in(
        &self,
        table: &'static TableSpec,
        column: &'static str,
        values: &[Cell],
    ) -> Result<Vec<Row>, StoreError> {
        self.inner.find_rows_in(table, column, values).await
    }

    async fn page_rows(&self, query: &PageQuery) -> Result<Page, StoreError> {
        self.inner.page_rows(query).await
    }

    async fn lease(&self, claim_token: &str) -> Result<Option<Lease>, StoreError> {
        self.inner.lease(claim_token).await
    }

    async fn expired_claims(&self, now: Timestamp, limit: usize) -> Result<Vec<ExpiredClaim>, StoreError> {
        self.inner.expired_claims(now, limit).await
    }

    async fn claimable_ahead(&self, query: &AheadQuery) -> Result<ClaimableAhead, StoreError> {
        self.inner.claimable_ahead(query).await
    }

    async fn claim_queues(
        &self,
        statuses: &'static [OperationStatus],
        now: Timestamp,
    ) -> Result<Vec<ClaimQueue>, StoreError> {
        self.inner.claim_queues(statuses, now).await
    }

    async fn open_scratch(&self) -> Result<Self::Scratch, StoreError> {
        self.inner.open_scratch().await
    }

    async fn try_lock_ledger(&self, name: &str) -> Result<Option<Self::Lock>, StoreError> {
        self.inner.try_lock_ledger(name).await
    }

    async fn lock_ledger(&self, name: &str) -> Result<Self::Lock, StoreError> {
        self.inner.lock_ledger(name).await
    }
}
