//! The write transaction a [`super::FaultyStore`] hands its work: the
//! backend's own, wrapped so that a planned statement fails. Every call the
//! work makes on it that reaches the database (each `RowTarget` and
//! `WriteTx` call but `use_tables`) is one statement, counted across
//! transactions in the order they arrive; the planned one answers
//! Unavailable without reaching the database, and the transaction is
//! aborted from then on, as a failed statement leaves a PostgreSQL
//! transaction: every later statement fails too, and work that answers Ok
//! all the same is rolled back and reported failed (and counted, see
//! [`super::FaultyStore::swallowed`]).

use super::Plan;
use opledger_domain::envelope::EventEnvelope;
use opledger_domain::projections::{Cell, ProjectionSpec, Row, RowChange, TableSpec};
use opledger_domain::Timestamp;
use opledger_store::{
    ClaimQuery, CommandRecord, Lease, RowTarget, StoreError, StreamAppend, TableSet, TimeSource, Verification, WriteTx,
};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A backend's write transaction with planned statement faults.
pub struct FaultyTx<T> {
    /// The backend's transaction, borrowed mutably for as long as this
    /// value lives (see [`FaultyTx::borrowing`]).
    inner: NonNull<T>,
    plan: Arc<Plan>,
    /// Set once a statement failed: the transaction is aborted.
    aborted: Option<StoreError>,
}

// SAFETY: a `FaultyTx<T>` stands for the `&mut T` it was made from (it is
// made and dropped inside the closure that holds that borrow, and no other
// path reaches the `T` meanwhile), and `&mut T` is `Send` when `T` is.
unsafe impl<T: Send> Send for FaultyTx<T> {}

impl<T: WriteTx> FaultyTx<T> {
    /// Wraps the backend's transaction. The caller keeps the borrow alive
    /// and unused for as long as the wrapper lives: it makes the wrapper,
    /// lends it to the work, and drops it before the borrow ends.
    pub(super) fn borrowing(inner: &mut T, plan: Arc<Plan>) -> Self {
        FaultyTx {
            inner: NonNull::from(inner),
            plan,
            aborted: None,
        }
    }

    /// The failure that aborted the transaction, if a statement failed.
    pub(super) fn aborted(&self) -> Option<StoreError> {
        self.aborted.clone()
    }

    /// Counts one statement; answers its planned failure, or the failure
    /// that aborted the transaction before it.
    fn statement(&mut self) -> Result<&mut T, StoreError> {
        if let Some(error) = &self.aborted {
            return Err(StoreError::unavailable(format!(
                "the transaction is aborted by an earlier failure ({error}); commands are ignored until its end"
            )));
        }
        let number = self.plan.statements.fetch_add(1, Ordering::SeqCst) + 1;
        if self
            .plan
            .scheduled_statements
            .lock()
            .expect("fault plan")
            .remove(&number)
        {
            self.plan.injected.fetch_add(1, Ordering::SeqCst);
            let error = StoreError::unavailable(format!("injected fault: statement {number} failed"));
            self.aborted = Some(error.clone());
            return Err(error);
        }
        // SAFETY: `inner` came from a `&mut T` that outlives this value and
        // that nothing else uses while it lives (`borrowing`); `&mut self`
        // makes this the only reference made from it now.
        Ok(unsafe { self.inner.as_mut() })
    }
}

impl<T: WriteTx> RowTarget for FaultyTx<T> {
    async fn load_rows(&mut self, table: &'static TableSpec, keys: &[String]) -> Result<Vec<Row>, StoreError> {
        self.statement()?.load_rows(table, keys).await
    }

    async fn load_rows_of_tables(
        &mut self,
        requests: &[(&'static TableSpec, Vec<String>)],
    ) -> Result<Vec<Row>, StoreError> {
        self.statement()?.load_rows_of_tables(requests).await
    }

    async fn load_rows_where(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        value: &Cell,
    ) -> Result<Vec<Row>, StoreError> {
        self.statement()?.load_rows_where(table, column, value).await
    }

    async fn write_rows(&mut self, changes: &[RowChange]) -> Result<(), StoreError> {
        self.statement()?.write_rows(changes).await
    }
}

impl<T: WriteTx> WriteTx for FaultyTx<T> {
    async fn append(&mut self, appends: Vec<StreamAppend>) -> Result<Vec<EventEnvelope>, StoreError> {
        self.statement()?.append(appends).await
    }

    async fn advance_positions(&mut self, from: i64, to: i64) -> Result<(), StoreError> {
        self.statement()?.advance_positions(from, to).await
    }

    async fn advance_position(&mut self, spec: &'static ProjectionSpec, from: i64, to: i64) -> Result<(), StoreError> {
        self.statement()?.advance_position(spec, from, to).await
    }

    async fn projection_position(&mut self, spec: &'static ProjectionSpec) -> Result<Option<i64>, StoreError> {
        self.statement()?.projection_position(spec).await
    }

    fn use_tables(&mut self, set: TableSet) {
        // SAFETY: as in `statement`: the only reference made from `inner`
        // now, and it outlives this value.
        unsafe { self.inner.as_mut() }.use_tables(set)
    }

    async fn read_events(&mut self, after: i64, limit: usize) -> Result<Vec<EventEnvelope>, StoreError> {
        self.statement()?.read_events(after, limit).await
    }

    async fn head(&mut self) -> Result<i64, StoreError> {
        self.statement()?.head().await
    }

    async fn command_time(&mut self, caller: Timestamp, source: TimeSource) -> Result<Timestamp, StoreError> {
        self.statement()?.command_time(caller, source).await
    }

    async fn create_shadow(&mut self, spec: &'static ProjectionSpec) -> Result<(), StoreError> {
        self.statement()?.create_shadow(spec).await
    }

    async fn shadow_position(&mut self, spec: &'static ProjectionSpec) -> Result<Option<i64>, StoreError> {
        self.statement()?.shadow_position(spec).await
    }

    async fn set_shadow_position(&mut self, spec: &'static ProjectionSpec, position: i64) -> Result<(), StoreError> {
        self.statement()?.set_shadow_position(spec, position).await
    }

    async fn swap_shadows(&mut self, specs: &[&'static ProjectionSpec]) -> Result<(), StoreError> {
        self.statement()?.swap_shadows(specs).await
    }

    async fn find_rows(
        &mut self,
        table: &'static TableSpec,
        filters: &[(&'static str, Cell)],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        self.statement()?.find_rows(table, filters, limit).await
    }

    async fn claimable(&mut self, query: &ClaimQuery) -> Result<Vec<Row>, StoreError> {
        self.statement()?.claimable(query).await
    }

    async fn lease(&mut self, claim_token: &str) -> Result<Option<Lease>, StoreError> {
        self.statement()?.lease(claim_token).await
    }

    async fn leases(&mut self, claim_tokens: &[String]) -> Result<Vec<Lease>, StoreError> {
        self.statement()?.leases(claim_tokens).await
    }

    async fn find_rows_in(
        &mut self,
        table: &'static TableSpec,
        column: &'static str,
        values: &[Cell],
    ) -> Result<Vec<Row>, StoreError> {
        self.statement()?.find_rows_in(table, column, values).await
    }

    async fn put_lease(&mut self, lease: &Lease) -> Result<(), StoreError> {
        self.statement()?.put_lease(lease).await
    }

    async fn delete_lease(&mut self, claim_token: &str) -> Result<(), StoreError> {
        self.statement()?.delete_lease(claim_token).await
    }

    async fn record_verification(&mut self, verification: &Verification) -> Result<(), StoreError> {
        self.statement()?.record_verification(verification).await
    }

    async fn command_record(&mut self, request_id: &str) -> Result<Option<CommandRecord>, StoreError> {
        self.statement()?.command_record(request_id).await
    }

    async fn record_command(&mut self, record: &CommandRecord) -> Result<(), StoreError> {
        self.statement()?.record_command(record).await
    }

    async fn forget_commands(&mut self, recorded_before: Timestamp, limit: usize) -> Result<u64, StoreError> {
        self.statement()?.forget_commands(recorded_before, limit).await
    }
}
