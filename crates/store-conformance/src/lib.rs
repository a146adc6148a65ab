//! The backend conformance suite: the store contracts of `opledger-store`
//! as behavioural tests, written once and run against every backend. A
//! backend's test file invokes [`conformance_tests!`] with a [`Harness`]
//! for a fresh database, which expands to one `#[tokio::test]` per check.
//!
//! The checks go through the `Store` traits, except where a contract is the
//! database's own (the log refuses UPDATE, DELETE and out-of-order inserts;
//! the tables refuse what their constraints refuse): those probes send
//! plain SQL through [`Harness::execute_raw`], the one hook a backend
//! provides, written in the SQL both backends accept.
//!
//! This crate is for tests only (`publish = false`, a dev-dependency of the
//! backends; `tests/it/architecture/dependencies.rs` checks that no library
//! depends on it) and must not know a driver: it reaches a database only
//! through the harness, so the same checks hold every backend to the same
//! contract.
//! The suite is split by topic: the log (`log.rs`), group commit
//! (`group_commit.rs`), the ledger's locks (`lock.rs`), the work protocol's queries (`work.rs`), projection
//! rows (`rows.rs`), paged walks (`pages.rs`), scratch copies
//! (`scratch.rs`) and time in the log (`time.rs`).

mod chain;
mod fixtures;
mod group_commit;
mod lock;
mod log;
mod pages;
mod rows;
mod scratch;
mod time;
mod work;

pub use chain::*;
pub use fixtures::registered;
pub use group_commit::*;
pub use lock::*;
pub use log::*;
pub use pages::*;
pub use rows::*;
pub use scratch::*;
pub use time::*;
pub use work::*;

use opledger_store::{Store, StoreError};
use std::future::Future;

/// How the suite reaches one fresh database of a backend.
pub trait Harness: Send + Sync + 'static {
    type Store: Store;

    /// Opens a store on this harness's database. Each call opens new
    /// connections (its own writer), as a second process would.
    fn open(&self) -> impl Future<Output = Self::Store> + Send;

    /// Runs one SQL statement directly on the database, bypassing the
    /// store: the suite's probes of what the database itself refuses. Any
    /// refusal is an error (its kind is not checked).
    fn execute_raw(&self, sql: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Expands to one test per conformance check for a harness constructor.
/// `$make` is an async expression producing a fresh harness.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            append_and_read_round_trip,
            appends_are_atomic_across_streams,
            concurrent_appends_at_the_same_expected_version_exactly_one_conflicts,
            seq_is_gap_free_and_ordered_after_eight_concurrent_appenders,
            update_and_delete_on_the_log_are_refused_by_the_database,
            inserts_that_skip_a_seq_or_a_stream_version_are_refused_by_the_database,
            corrupt_row_is_a_corrupt_error_naming_its_seq,
            read_all_pages_through_the_whole_log,
            a_stream_read_after_a_version_returns_only_what_follows_it_in_order,
            expected_version_is_checked_per_stream,
            concurrent_writes_on_one_store_succeed_or_fail_on_their_own,
            claimable_rows_come_by_priority_then_waiting_time_within_kinds_and_time,
            a_claim_that_states_versions_is_offered_only_tasks_requested_at_them,
            claimable_tasks_ahead_are_those_a_claim_of_the_kind_takes_first,
            claim_queues_count_each_kinds_claimable_tasks_and_their_oldest_time,
            leases_round_trip_and_expired_claims_honour_extended_leases,
            rows_are_found_by_non_key_columns,
            processing_state_constraints_are_enforced_by_the_database,
            rows_written_from_a_known_stored_row_land_whole_even_when_the_store_lacks_it,
            concurrent_pieces_whose_rows_the_database_refuses_fail_alone_with_their_events,
            rows_loaded_from_several_tables_at_once_equal_rows_loaded_table_by_table,
            scratch_loads_see_every_row_written_before_them,
            a_scratch_write_the_database_refuses_is_reported_by_a_later_call_at_the_latest,
            pages_walk_every_row_once_in_bytewise_order_both_ways,
            a_prefix_range_holds_exactly_the_paths_with_that_prefix,
            equalities_select_and_filters_are_checked_on_a_bounded_walk,
            a_walk_query_the_table_cannot_answer_is_refused,
            concurrent_appends_in_one_store_and_across_stores_chain_in_seq_order,
            an_event_without_a_chain_hash_is_refused_by_the_database,
            the_last_integrity_check_is_recorded_and_replaced_by_the_next,
            a_ledger_lock_has_one_holder_across_stores_until_it_is_dropped,
            a_ledger_lock_name_that_is_not_a_short_word_is_refused,
            recorded_at_never_goes_backwards_along_seq,
            a_command_takes_the_shared_clock_where_the_backend_has_one
        );
    };
    (@each $make:expr; $($name:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $make.await;
                $crate::$name(&harness).await;
            }
        )+
    };
}
