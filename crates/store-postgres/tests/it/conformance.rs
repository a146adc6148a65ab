//! The store conformance suite against PostgreSQL: each test gets a
//! database of its own (`opledger_test_<uuid>`) on the server named by
//! `OPLEDGER_TEST_POSTGRES_URL`, dropped afterwards, so the tests run in
//! parallel. No server there: each test says so loudly and passes, unless
//! `CI=true`, where it fails.

use opledger_store_conformance::conformance_tests;

conformance_tests!({
    match opledger_testkit::postgres::backend().await {
        Some(harness) => std::future::ready(harness),
        // No server (and not CI): the check is skipped, loudly.
        None => return,
    }
});
