//! The copies of the projection tables a backend keeps (live, a shadow
//! being rebuilt, a scratch copy for replay), their physical names, and
//! the rendering of a backend's projection DDL template for one copy.
//!
//! The templates (`projections/<name>/<backend>.sql`) are each backend's
//! own text; what is shared is only how their `{{t:table}}` (where a table
//! is defined) and `{{r:table}}` (where it is referred to) placeholders
//! become names, so every backend builds, swaps and replays the same copies.

use crate::TableSet;
use opledger_domain::projections::{all_specs, ProjectionSpec};

/// Which copy of the tables a rendering or a statement addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copy<'a> {
    /// The tables readers use.
    Live,
    /// Suffixed tables beside the live ones, swapped in by renaming.
    Shadow,
    /// Same names in a schema of their own.
    Scratch(&'a str),
}

impl From<TableSet> for Copy<'static> {
    fn from(set: TableSet) -> Self {
        match set {
            TableSet::Live => Copy::Live,
            TableSet::Shadow => Copy::Shadow,
        }
    }
}

/// What a shadow table's (and a shadow position's) name ends with.
pub const SHADOW_SUFFIX: &str = "__shadow";

/// The physical name of a table in a copy: the live name, the name with
/// [`SHADOW_SUFFIX`], or the name qualified by the scratch schema.
pub fn table_name(table: &str, copy: Copy<'_>) -> String {
    match copy {
        Copy::Live => table.to_string(),
        Copy::Shadow => format!("{table}{SHADOW_SUFFIX}"),
        Copy::Scratch(schema) => format!("{schema}.{table}"),
    }
}

/// Renders `template`, the DDL of `spec`: each `{{t:table}}` of the spec's
/// own tables becomes `defined(table)`, each `{{r:table}}` of any
/// projection's table (foreign keys into the family's parents)
/// `referenced(table)`. A backend decides the names, since backends
/// resolve a reference inside a schema differently.
///
/// Panics when a placeholder is left: the template names a table no spec
/// (or, where it defines one, not its own spec) has, a bug of the build.
pub fn render(
    template: &str,
    spec: &ProjectionSpec,
    defined: impl Fn(&str) -> String,
    referenced: impl Fn(&str) -> String,
) -> String {
    let mut text = template.to_string();
    for table in spec.tables {
        text = text.replace(&format!("{{{{t:{}}}}}", table.name), &defined(table.name));
    }
    for table in all_specs().iter().flat_map(|spec| spec.tables.iter()) {
        text = text.replace(&format!("{{{{r:{}}}}}", table.name), &referenced(table.name));
    }
    assert!(
        !text.contains("{{"),
        "projection {} DDL names a table outside its spec: {text}",
        spec.name
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_domain::projections::PROCESSING_STATES;

    #[test]
    fn copies_name_their_tables_apart() {
        assert_eq!(table_name("media", Copy::Live), "media");
        assert_eq!(table_name("media", Copy::Shadow), "media__shadow");
        assert_eq!(table_name("media", Copy::Scratch("s")), "s.media");
        assert_eq!(Copy::from(TableSet::Shadow), Copy::Shadow);
    }

    #[test]
    fn definitions_and_references_are_named_by_the_backends_rules() {
        let template = "T {{t:media_processing_states}} R {{r:media}} R {{r:media_processing_states}}";
        let rendered = render(
            template,
            &PROCESSING_STATES,
            |table| format!("d:{table}"),
            |table| format!("r:{table}"),
        );
        assert_eq!(
            rendered,
            "T d:media_processing_states R r:media R r:media_processing_states"
        );
    }

    #[test]
    #[should_panic(expected = "outside its spec")]
    fn a_definition_of_another_projections_table_is_refused() {
        render("{{t:media}}", &PROCESSING_STATES, str::to_string, str::to_string);
    }
}
