//! The store conformance suite against SQLite: each test gets its own
//! database file in its own temporary folder (`opledger_testkit::sqlite`).

use opledger_store_conformance::conformance_tests;

conformance_tests!(opledger_testkit::sqlite::backend());
