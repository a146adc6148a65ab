//! Projection DDL, rendered for the live tables, a shadow copy in the same
//! schema, or a scratch copy in a schema of its own. The copies and their
//! names are the store's (`opledger_store::tables`); the DDL text and
//! PostgreSQL's rules for naming tables inside a schema are this backend's.

use opledger_domain::projections::ProjectionSpec;
pub use opledger_store::tables::{table_name, Copy, SHADOW_SUFFIX};

/// The PostgreSQL DDL of a projection, from `projections/<name>/postgres.sql`.
pub fn template(spec: &ProjectionSpec) -> &'static str {
    match spec.name {
        "media_registry" => include_str!("../../../projections/media_registry/postgres.sql"),
        "media_operations" => include_str!("../../../projections/media_operations/postgres.sql"),
        "processing_states" => include_str!("../../../projections/processing_states/postgres.sql"),
        "entity_capability_states" => include_str!("../../../projections/entity_capability_states/postgres.sql"),
        "batches" => include_str!("../../../projections/batches/postgres.sql"),
        "review_queue" => include_str!("../../../projections/review_queue/postgres.sql"),
        "task_kinds" => include_str!("../../../projections/task_kinds/postgres.sql"),
        other => panic!("projection {other} has no PostgreSQL DDL; add projections/{other}/postgres.sql"),
    }
}

/// Renders the DDL for the live tables or a shadow copy (indexes included).
/// On PostgreSQL a reference is resolved by the schema search path, so a
/// scratch copy qualifies both the definition and every reference;
/// references to another projection's tables (foreign keys into the
/// family's parents) point at the same copy, since a family is always
/// built, swapped and replayed together.
pub fn render(spec: &ProjectionSpec, copy: Copy<'_>) -> String {
    let name = |table: &str| table_name(table, copy);
    opledger_store::tables::render(template(spec), spec, name, name)
}

/// The tables of a scratch copy in `schema`: unlogged (it is thrown away
/// after use, so its writes need no WAL) and without secondary indexes (it
/// is read by primary key and compared whole; the indexes would only slow
/// replay). Keys, uniques, CHECKs and cascading foreign keys stay: the
/// scratch copy must refuse and cascade exactly as the live tables do.
pub fn render_scratch(spec: &ProjectionSpec, schema: &str) -> String {
    without_indexes(&render(spec, Copy::Scratch(schema))).replace("CREATE TABLE ", "CREATE UNLOGGED TABLE ")
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
    use opledger_domain::projections::{all_specs, PROCESSING_STATES};

    #[test]
    fn scratch_copies_keep_every_table_unlogged_and_drop_every_index() {
        for spec in all_specs() {
            let sql = render_scratch(spec, "scratch");
            assert!(!sql.to_ascii_uppercase().contains("CREATE INDEX"), "{sql}");
            assert_eq!(
                sql.matches("CREATE UNLOGGED TABLE scratch.").count(),
                spec.tables.len(),
                "{sql}"
            );
            assert!(
                !sql.contains("REFERENCES media ") && !sql.contains("REFERENCES media_regions "),
                "{sql}"
            );
        }
    }

    #[test]
    fn every_projection_renders_for_every_copy() {
        for spec in all_specs() {
            for copy in [Copy::Live, Copy::Shadow] {
                let sql = render(spec, copy);
                for table in spec.tables {
                    assert!(sql.contains(&table_name(table.name, copy)), "{sql}");
                }
            }
        }
        let shadow = render(&PROCESSING_STATES, Copy::Shadow);
        assert!(shadow.contains("REFERENCES media__shadow (id)"), "{shadow}");
    }

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
