//! The durable schema, embedded at build time (no database needed to
//! build, no files needed beside the binary): every file of
//! `migrations/postgres`, in order, handed to sqlx's migrator. A new migration is
//! a new file there and a new line here; the schema test fails when a file
//! is missing from the list.

use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use std::borrow::Cow;

/// Every migration file: its name and its text.
pub const MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_event_log.sql",
        include_str!("../../../migrations/postgres/0001_event_log.sql"),
    ),
    (
        "0002_task_leases.sql",
        include_str!("../../../migrations/postgres/0002_task_leases.sql"),
    ),
    (
        "0003_gap_free_per_statement.sql",
        include_str!("../../../migrations/postgres/0003_gap_free_per_statement.sql"),
    ),
    (
        "0004_chain_hash.sql",
        include_str!("../../../migrations/postgres/0004_chain_hash.sql"),
    ),
    (
        "0005_command_requests.sql",
        include_str!("../../../migrations/postgres/0005_command_requests.sql"),
    ),
    (
        "0006_lease_principal.sql",
        include_str!("../../../migrations/postgres/0006_lease_principal.sql"),
    ),
];

/// [`MIGRATIONS`] as a source of sqlx migrations.
#[derive(Debug)]
struct Embedded;

impl MigrationSource<'static> for Embedded {
    fn resolve(self) -> futures::future::BoxFuture<'static, Result<Vec<Migration>, BoxDynError>> {
        let migrations = MIGRATIONS
            .iter()
            .map(|(name, sql)| {
                let file = opledger_store::migrations::embedded(name, sql);
                Migration::new(
                    file.version,
                    Cow::Owned(file.description),
                    MigrationType::Simple,
                    Cow::Borrowed(file.sql),
                    file.no_tx,
                )
            })
            .collect();
        Box::pin(async move { Ok(migrations) })
    }
}

/// The migrator of [`MIGRATIONS`].
pub async fn migrator() -> Migrator {
    Migrator::new(Embedded)
        .await
        .expect("embedded migrations resolve without reading anything")
}

/// The last migration this build has.
pub fn last_version() -> i64 {
    opledger_store::migrations::last_version(MIGRATIONS)
}
