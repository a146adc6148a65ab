//! Many writes in one statement: the writes a piece of work gathered (its
//! events, its projection rows, its leases and the projections' new
//! position) go to the server as the parts of one statement, each part a
//! data-modifying `WITH` query, so they cost one round trip instead of one
//! each.
//!
//! *Why:* the writer holds the append lock across every round trip of its
//! transaction, so a round trip (the server's wake-up, the client's) is
//! paid by every writer of the database, not only by this one. A claim of
//! 32 tasks sent up to eight write statements (leases, events, three
//! projection tables, two counts, positions); the server work is the same
//! in one statement, the waiting is not.
//!
//! *Why it is safe:* every part writes other rows (a table's changes are
//! coalesced by key first, and a key is either written or deleted), the
//! parts of a `WITH` all run to completion whether read or not, and foreign
//! keys and the log's gap-free trigger are checked after the whole
//! statement, when every part's rows are in place. A part the database
//! refuses fails the statement, and nothing of it stays.

use crate::error::map;
use crate::values::Values;
use opledger_store::StoreError;
use sqlx::PgConnection;

/// One parameter of the statement.
pub(crate) enum Bind {
    Array(Values),
    Integer(i64),
}

/// The statement being gathered: its parts (each one SQL statement whose
/// parameters are numbered for their place in the whole) and the
/// parameters in order.
#[derive(Default)]
pub(crate) struct Statement {
    parts: Vec<String>,
    binds: Vec<Bind>,
}

impl Statement {
    /// Takes a parameter and returns its placeholder with `cast` (e.g.
    /// `$3::text[]`).
    pub(crate) fn param(&mut self, bind: Bind, cast: &str) -> String {
        self.binds.push(bind);
        format!("${}::{cast}", self.binds.len())
    }

    /// Adds a part built with placeholders from [`Statement::param`].
    pub(crate) fn push(&mut self, part: String) {
        self.parts.push(part);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The whole statement's text: the last part is the main statement, the
    /// others its `WITH` queries.
    pub(crate) fn sql(&self) -> String {
        match self.parts.split_last() {
            None => String::new(),
            Some((main, [])) => main.clone(),
            Some((main, others)) => {
                let queries: Vec<String> = others
                    .iter()
                    .enumerate()
                    .map(|(index, part)| format!("part_{index} AS ({part})"))
                    .collect();
                format!("WITH {} {main}", queries.join(", "))
            }
        }
    }

    /// Sends the statement (nothing when it has no part).
    pub(crate) async fn execute(self, conn: &mut PgConnection, context: &str) -> Result<(), StoreError> {
        if self.parts.is_empty() {
            return Ok(());
        }
        let sql = self.sql();
        let mut query = sqlx::query(&sql);
        for bind in self.binds {
            query = match bind {
                Bind::Array(values) => values.bind_array(query),
                Bind::Integer(value) => query.bind(value),
            };
        }
        query.execute(&mut *conn).await.map_err(|error| map(error, context))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_domain::projections::ColumnType;

    #[test]
    fn parts_after_the_first_make_the_first_ones_with_queries() {
        let mut statement = Statement::default();
        let keys = statement.param(Bind::Array(Values::new(ColumnType::Text, 0)), "text[]");
        statement.push(format!("DELETE FROM a WHERE k = ANY({keys})"));
        let position = statement.param(Bind::Integer(7), "bigint");
        statement.push(format!("UPDATE b SET p = {position}"));
        assert_eq!(
            statement.sql(),
            "WITH part_0 AS (DELETE FROM a WHERE k = ANY($1::text[])) UPDATE b SET p = $2::bigint"
        );
    }

    #[test]
    fn a_single_part_is_the_statement_itself() {
        let mut statement = Statement::default();
        let position = statement.param(Bind::Integer(7), "bigint");
        statement.push(format!("UPDATE b SET p = {position}"));
        assert_eq!(statement.sql(), "UPDATE b SET p = $1::bigint");
        assert!(Statement::default().sql().is_empty());
    }
}
