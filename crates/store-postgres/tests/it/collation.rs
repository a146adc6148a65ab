//! Paged walks compare text bytewise, as SQLite does, even in a database
//! whose default collation orders text as a language does (ICU `en-US`:
//! lower case before upper, punctuation ignored at first): the shared
//! checks of walks and prefix ranges, run in such a database.

use opledger_store::StoreError;
use opledger_store_conformance::Harness;
use opledger_store_postgres::{PostgresConfig, PostgresStore};
use sqlx::{Connection, Executor, PgConnection};

struct LanguageOrdered {
    config: PostgresConfig,
}

impl Harness for LanguageOrdered {
    type Store = PostgresStore;

    async fn open(&self) -> PostgresStore {
        PostgresStore::open(self.config.clone())
            .await
            .expect("opening the language-ordered database")
    }

    async fn execute_raw(&self, _sql: &str) -> Result<(), StoreError> {
        Err(StoreError::unavailable("these checks send no SQL of their own"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walks_and_prefix_ranges_are_bytewise_in_a_database_ordered_by_language() {
    let Some(backend) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let database = format!("{}_en", backend.database());
    let mut admin = backend.connect().await;
    admin
        .execute(
            format!("CREATE DATABASE {database} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'").as_str(),
        )
        .await
        .expect("creating a database ordered by ICU en-US");
    let config = backend.config().with_database(&database);
    let mut probe = PgConnection::connect_with(&config.options).await.unwrap();
    let language_order: bool = sqlx::query_scalar("SELECT '/a/b' < '/a/B' AND '/a/' > '/a-b'")
        .fetch_one(&mut probe)
        .await
        .unwrap();
    assert!(language_order, "the database's own order is not bytewise");
    let _ = probe.close().await;

    let harness = LanguageOrdered { config };
    opledger_store_conformance::pages_walk_every_row_once_in_bytewise_order_both_ways(&harness).await;
    opledger_store_conformance::a_prefix_range_holds_exactly_the_paths_with_that_prefix(&harness).await;
    opledger_store_conformance::equalities_select_and_filters_are_checked_on_a_bounded_walk(&harness).await;

    admin
        .execute(format!("DROP DATABASE {database} WITH (FORCE)").as_str())
        .await
        .expect("dropping the language-ordered database");
    let _ = admin.close().await;
}
