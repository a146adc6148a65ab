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
    use opledger_domain::tasks::{kinds_for, TargetType};

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

    /// The kinds a processing-state table's CHECK allows, as listed in the DDL.
    fn checked_kinds(sql: &str, table: &str) -> Vec<String> {
        let start = sql
            .find(&format!("CREATE TABLE {table}"))
            .unwrap_or_else(|| panic!("{table} not in the DDL"));
        let rest = &sql[start..];
        let list_start = rest.find("task_kind IN (").expect("a task_kind CHECK") + "task_kind IN (".len();
        let list_end = list_start + rest[list_start..].find(')').expect("the CHECK list ends");
        rest[list_start..list_end]
            .split(',')
            .map(|kind| kind.trim().trim_matches('\'').to_string())
            .collect()
    }

    #[test]
    fn processing_state_checks_list_exactly_the_registrys_kinds_per_target_type() {
        let sql = render(&PROCESSING_STATES, Copy::Live);
        assert_eq!(
            checked_kinds(&sql, "media_processing_states"),
            kinds_for(TargetType::Media),
            "update projections/processing_states/postgres.sql (and bump the projection version) with the registry"
        );
        assert_eq!(
            checked_kinds(&sql, "region_processing_states"),
            kinds_for(TargetType::Region)
        );
    }
}
