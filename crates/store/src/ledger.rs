//! Whether a database is an opledger ledger, decided the same way on every
//! backend from what the backend lists: the names of the tables in the
//! schema it would write into, and the migrations applied there.
//!
//! *Why:* opening a store creates its schema in an empty database; in a
//! database that already holds something else (another application's
//! tables) it must refuse instead of adding twenty tables beside them.

use crate::StoreError;
use opledger_domain::quote;

/// The table every ledger has: the event log.
pub const LOG_TABLE: &str = "media_operation_events";

/// The migrations table of the driver's migrator: present in a new
/// database whose first migration has not run yet, so it alone does not
/// make a database foreign.
pub const MIGRATIONS_TABLE: &str = "_sqlx_migrations";

/// What a database holds, as far as opening it is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contents {
    /// Nothing (or only an empty migrations table): a new ledger is made here.
    Empty,
    /// An opledger ledger.
    Ledger,
}

/// Decides from the table names of a database (`described` names it in
/// messages, never with a password): empty, a ledger, or refused as
/// another application's database (Unavailable: exit 5).
pub fn recognize(described: &str, tables: &[String]) -> Result<Contents, StoreError> {
    if tables.iter().any(|table| table == LOG_TABLE) {
        return Ok(Contents::Ledger);
    }
    let others: Vec<&String> = tables.iter().filter(|table| *table != MIGRATIONS_TABLE).collect();
    if others.is_empty() {
        return Ok(Contents::Empty);
    }
    const NAMED: usize = 5;
    let mut names: Vec<String> = others.iter().take(NAMED).map(|table| quote(table)).collect();
    if others.len() > NAMED {
        names.push(format!("… ({} tables in all)", others.len()));
    }
    Err(StoreError::unavailable(format!(
        "{described} holds tables {} but no {LOG_TABLE}: not an opledger ledger (opledger writes \
         only into a new, empty database or its own ledger)",
        names.join(", ")
    )))
}

/// Refuses to read a ledger whose schema is older than this build's
/// (`applied` of `needed` migrations): reading commands do not migrate,
/// and this build's queries expect the newer schema.
pub fn check_schema(described: &str, applied: i64, needed: i64) -> Result<(), StoreError> {
    if applied < needed {
        return Err(StoreError::unavailable(format!(
            "{described}: the ledger's schema is at migration {applied} and this build reads migration \
             {needed}; opened for reading only, it is not upgraded (a command that writes upgrades it)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn a_database_with_other_tables_and_no_log_is_refused_naming_them() {
        assert_eq!(recognize("db", &[]).unwrap(), Contents::Empty);
        assert_eq!(recognize("db", &names(&[MIGRATIONS_TABLE])).unwrap(), Contents::Empty);
        assert_eq!(
            recognize("db", &names(&["customers", LOG_TABLE])).unwrap(),
            Contents::Ledger
        );
        let refused = recognize("shop.db", &names(&["customers", "orders"])).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::Unavailable);
        assert!(
            refused.message.contains(
                "shop.db holds tables customers, orders but no media_operation_events: not an opledger ledger"
            ),
            "{}",
            refused.message
        );
        let many: Vec<String> = (0..40).map(|index| format!("t{index:02}")).collect();
        let message = recognize("db", &many).unwrap_err().message;
        assert!(message.contains("t04, … (40 tables in all)"), "{message}");
        assert!(!message.contains("t05"), "{message}");
    }

    #[test]
    fn an_older_schema_is_refused_for_reading() {
        assert!(check_schema("db", 5, 5).is_ok());
        assert!(check_schema("db", 6, 5).is_ok());
        let refused = check_schema("db", 3, 5).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::Unavailable);
        assert!(refused.message.contains("migration 3"), "{}", refused.message);
    }
}
