//! Projection DDL, rendered for the live tables, a shadow copy, or a
//! scratch copy in an attached schema. The copies and their names are the
//! store's (`opledger_store::tables`); the DDL text and SQLite's rules for
//! naming tables inside a schema are this backend's.

use opledger_domain::projections::ProjectionSpec;
pub use opledger_store::tables::{table_name, Copy, SHADOW_SUFFIX};

/// The SQLite DDL of a projection, from `projections/<name>/sqlite.sql`.
pub fn template(spec: &ProjectionSpec) -> &'static str {
    match spec.name {
        "media_registry" => include_str!("../../../projections/media_registry/sqlite.sql"),
        "media_operations" => include_str!("../../../projections/media_operations/sqlite.sql"),
        "processing_states" => include_str!("../../../projections/processing_states/sqlite.sql"),
        "entity_capability_states" => include_str!("../../../projections/entity_capability_states/sqlite.sql"),
        "batches" => include_str!("../../../projections/batches/sqlite.sql"),
        "review_queue" => include_str!("../../../projections/review_queue/sqlite.sql"),
        "task_kinds" => include_str!("../../../projections/task_kinds/sqlite.sql"),
        other => panic!("projection {other} has no SQLite DDL; add projections/{other}/sqlite.sql"),
    }
}

/// Renders the DDL for one copy. SQLite creates a table or index in a
/// schema by qualifying its name, but references inside it are to the same
/// schema and must stay unqualified; references to another projection's
/// tables (foreign keys into the family's parents) point at the same copy,
/// since a family is always built, swapped and replayed together.
pub fn render(spec: &ProjectionSpec, copy: Copy<'_>) -> String {
    let sql = opledger_store::tables::render(
        template(spec),
        spec,
        |table| table_name(table, copy),
        |table| match copy {
            Copy::Scratch(_) => table.to_string(),
            Copy::Live | Copy::Shadow => table_name(table, copy),
        },
    );
    expand_in_lists(&sql)
}

/// Rewrites `column IN ('a', 'b', 'c', ...)` (more than two literals) as
/// `(column = 'a' OR column = 'b' OR ...)`. *Why:* for a list of more than
/// two values SQLite builds an ephemeral index of the list each time a
/// statement that evaluates the expression runs, and every insert and
/// every update of a status evaluates the vocabulary CHECKs: 3.5 µs per
/// row measured, a quarter of the writer's statements in the lifecycle.
/// A chain of comparisons is a few instructions. The DDL files keep the
/// readable `IN` form; two-value lists (the partial indexes' `WHERE`,
/// which the claim queries must match word for word) are left alone, as
/// is `NOT IN`.
pub fn expand_in_lists(sql: &str) -> String {
    const IN: &str = " IN (";
    let literal = |item: &str| {
        item.len() >= 2 && item.starts_with('\'') && item.ends_with('\'') && !item[1..item.len() - 1].contains('\'')
    };
    let mut out = String::with_capacity(sql.len() * 2);
    let mut rest = sql;
    while let Some(at) = rest.find(IN) {
        let (before, after) = rest.split_at(at);
        let Some(close) = after[IN.len()..].find(')') else {
            break;
        };
        let items: Vec<&str> = after[IN.len()..IN.len() + close].split(',').map(str::trim).collect();
        let column_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |index| index + 1);
        let column = &before[column_start..];
        if column.is_empty()
            || column.eq_ignore_ascii_case("NOT")
            || items.len() <= 2
            || !items.iter().all(|item| literal(item))
        {
            out.push_str(&rest[..at + IN.len()]);
            rest = &rest[at + IN.len()..];
            continue;
        }
        out.push_str(before);
        out.truncate(out.len() - column.len());
        out.push('(');
        let comparisons: Vec<String> = items.iter().map(|item| format!("{column} = {item}")).collect();
        out.push_str(&comparisons.join(" OR "));
        out.push(')');
        rest = &after[IN.len() + close + 1..];
    }
    out.push_str(rest);
    out
}

/// The statements of rendered DDL minus its `CREATE INDEX` statements.
/// Comments go first (they may hold semicolons); the DDL files hold no
/// string literal with `--` or `;`, so a plain split is exact for them.
pub fn without_indexes(sql: &str) -> String {
    let code: String = sql
        .lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    code.split(';')
        .map(str::trim)
        .filter(|statement| {
            let upper = statement.to_ascii_uppercase();
            !statement.is_empty() && !upper.starts_with("CREATE INDEX") && !upper.starts_with("CREATE UNIQUE INDEX")
        })
        .map(|statement| format!("{statement};"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_domain::projections::all_specs;

    #[test]
    fn without_indexes_keeps_every_table_and_drops_every_index() {
        for spec in all_specs() {
            let sql = without_indexes(&render(spec, Copy::Scratch("scratch")));
            assert!(!sql.to_ascii_uppercase().contains("CREATE INDEX"), "{sql}");
            assert_eq!(sql.matches("CREATE TABLE").count(), spec.tables.len(), "{sql}");
        }
    }

    #[test]
    fn every_projection_renders_for_every_copy() {
        for spec in all_specs() {
            for copy in [Copy::Live, Copy::Shadow, Copy::Scratch("scratch")] {
                let sql = render(spec, copy);
                for table in spec.tables {
                    assert!(sql.contains(&table_name(table.name, copy)), "{sql}");
                }
            }
        }
    }
}

#[cfg(test)]
mod task_kind_references {
    use super::*;
    use opledger_domain::projections::PROCESSING_STATES;

    #[test]
    fn processing_states_reference_the_declared_task_kinds_by_target_type() {
        let sql = render(&PROCESSING_STATES, Copy::Shadow);
        assert_eq!(
            sql.matches("FOREIGN KEY (task_kind, task_target) REFERENCES task_kinds__shadow (name, target)")
                .count(),
            2,
            "{sql}"
        );
        assert!(sql.contains("DEFAULT 'media' CHECK (task_target = 'media')"), "{sql}");
        assert!(sql.contains("DEFAULT 'region' CHECK (task_target = 'region')"), "{sql}");
    }
}

#[cfg(test)]
mod in_list_expansion {
    use super::*;
    use opledger_domain::projections::all_specs;

    #[test]
    fn lists_of_more_than_two_literals_become_comparisons_and_the_rest_stay() {
        let sql = "CHECK (status IN ('a', 'b', 'c')), CHECK (x IN (0, 1)), CHECK (k IN ('p', 'q')),\n\
                   CHECK (state NOT IN ('r', 's', 't')), CHECK (stage IS NULL OR stage IN (\n    'u',\n    'v', 'w'))";
        assert_eq!(
            expand_in_lists(sql),
            "CHECK ((status = 'a' OR status = 'b' OR status = 'c')), CHECK (x IN (0, 1)), CHECK (k IN ('p', 'q')),\n\
             CHECK (state NOT IN ('r', 's', 't')), CHECK (stage IS NULL OR (stage = 'u' OR stage = 'v' OR stage = 'w'))"
        );
    }

    /// What the rendered DDL creates refuses exactly what the `IN` form
    /// refused, and no rendered table keeps a long `IN` list.
    #[test]
    fn expanded_checks_accept_and_refuse_what_the_lists_did() {
        for spec in all_specs() {
            let rendered = render(spec, Copy::Live);
            let template_lists = template(spec).matches(" IN (").count();
            assert!(
                rendered.matches(" IN (").count() <= template_lists,
                "{}: {rendered}",
                spec.name
            );
            for list_start in rendered.match_indices(" IN (").map(|(at, _)| at + " IN (".len()) {
                let list = &rendered[list_start..list_start + rendered[list_start..].find(')').unwrap()];
                let before = &rendered[..list_start];
                assert!(
                    list.split(',').count() <= 2 || before.ends_with("NOT IN ("),
                    "{}: a long IN list is left: {list}",
                    spec.name
                );
            }
        }
        let connection = rusqlite::Connection::open_in_memory().unwrap();
        connection
            .execute_batch(&expand_in_lists(
                "CREATE TABLE t (status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done')), \
                 stage TEXT CHECK (stage IS NULL OR stage IN ('a', 'b', 'c')))",
            ))
            .unwrap();
        for (status, stage) in [("queued", None), ("running", Some("a")), ("done", Some("c"))] {
            connection
                .execute("INSERT INTO t VALUES (?1, ?2)", rusqlite::params![status, stage])
                .unwrap_or_else(|error| panic!("{status} {stage:?} refused: {error}"));
        }
        for (status, stage) in [
            ("bogus", None),
            ("queued", Some("d")),
            ("QUEUED", None),
            ("queued ", None),
        ] {
            assert!(
                connection
                    .execute("INSERT INTO t VALUES (?1, ?2)", rusqlite::params![status, stage])
                    .is_err(),
                "{status:?} {stage:?} accepted"
            );
        }
    }
}
