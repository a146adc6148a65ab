//! Test backends for opledger: a fresh, empty database of each backend per
//! test, and [`backend_tests!`], which runs one generic test body on every
//! backend. Behaviour tests are written once, as `async fn name<B:
//! Backend>(backend: &B)`, and listed in the macro; it expands to a module
//! per test with one `#[tokio::test]` per backend (`name::sqlite`,
//! `name::postgres`), so a failure names the test and the backend.
//!
//! SQLite gets a file in a temporary folder. PostgreSQL gets a database of
//! its own (`opledger_test_<uuid>`) on the server `OPLEDGER_TEST_POSTGRES_URL`
//! names (default `postgres://root@127.0.0.1:5432/test`), dropped when the
//! backend value is dropped, so tests run in parallel. Without a server a
//! PostgreSQL test prints a loud SKIPPED and passes, except under `CI=true`,
//! where it fails.
//!
//! [`faults::FaultyStore`] wraps any backend's store and fails chosen
//! write transactions (before, at, or after their commit) or a chosen
//! statement inside one (the transaction aborted), or holds commits back
//! (slow commits): the storage fault injection of the retry, fault-loop
//! and slow-commit tests.
//!
//! [`powerloss`] is a SQLite VFS whose writes are lost unless synced when
//! its process is killed: the power loss of the power-loss tests.
//!
//! This crate must not know the engine, the worker runtime or any business
//! rule: it only opens stores and hands out URLs. (It is built from the store
//! crates, and the engine's tests depend on it; a dependency on the engine
//! here would build a second, incompatible copy of the engine into them.)
//! It is a dev-dependency only: no crate's library may depend on it
//! (`tests/it/architecture/dependencies.rs`).

pub mod faults;
pub mod postgres;
pub mod powerloss;
#[cfg(test)]
mod powerloss_vfs_tests;
pub mod sqlite;

pub use opledger_store_conformance::Harness;
pub use postgres::PostgresBackend;
pub use sqlite::SqliteBackend;

/// One fresh database of one backend. [`Harness::open`] opens a new store on
/// it each time it is called (its own connections, as a second process
/// would); [`Backend::url`] is what a CLI process is given as
/// `--database-url` to reach the same database.
pub trait Backend: Harness {
    /// `"sqlite"` or `"postgres"`, for messages.
    fn name(&self) -> &'static str;

    /// The `--database-url` of this database.
    fn url(&self) -> String;
}

/// The size of a load a test puts on the ledger: `regular` in every run,
/// `soak` when `OPLEDGER_SOAK=1` (a long run by hand, for rare races).
pub fn load_size(regular: usize, soak: usize) -> usize {
    if std::env::var("OPLEDGER_SOAK").as_deref() == Ok("1") {
        soak
    } else {
        regular
    }
}

/// Expands each listed test body into one test per backend.
///
/// ```text
/// async fn requests_are_idempotent<B: Backend>(backend: &B) {
///     let store = backend.open().await;
///     // …
/// }
///
/// opledger_testkit::backend_tests!(requests_are_idempotent, another_body);
/// // or, for bodies that want more runtime threads:
/// opledger_testkit::backend_tests!(worker_threads = 4; many_workers_drain_the_queue);
/// ```
///
/// The test crate needs `tokio` (with `macros` and `rt-multi-thread`) among
/// its dev-dependencies, since `#[tokio::test]` is resolved there.
#[macro_export]
macro_rules! backend_tests {
    (worker_threads = $threads:literal; $($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
                async fn sqlite() {
                    let backend = $crate::sqlite::backend().await;
                    super::$name(&backend).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = $threads)]
                async fn postgres() {
                    // None: no server and not CI; the skip was announced.
                    let Some(backend) = $crate::postgres::backend().await else { return };
                    super::$name(&backend).await;
                }
            }
        )+
    };
    ($($name:ident),+ $(,)?) => {
        $crate::backend_tests!(worker_threads = 2; $($name),+);
    };
}
