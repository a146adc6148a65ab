//! The durable schema's migrations as a backend embeds them: each file of
//! `migrations/<backend>/` is compiled into the backend (`include_str!`),
//! so a build needs no database and a binary no files beside it. A file is
//! named as sqlx names a migration, `NNNN_description.sql`: its version is
//! NNNN and its description the rest with spaces for underscores, and its
//! checksum is taken over its text as it is, so a ledger migrated by any
//! build of this project sees the same versions and checksums.

/// One migration file's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Embedded {
    pub version: i64,
    pub description: String,
    pub sql: &'static str,
    /// The file opts out of running in a transaction
    /// (`-- no-transaction` on its first line).
    pub no_tx: bool,
}

/// The parts of the migration file `name` holding `sql`. A name that is not
/// `NNNN_description.sql` is a build mistake, named in the panic (the
/// backends' schema tests read every embedded file).
pub fn embedded(name: &str, sql: &'static str) -> Embedded {
    let parsed = name
        .strip_suffix(".sql")
        .and_then(|stem| stem.split_once('_'))
        .and_then(|(version, description)| Some((version.parse::<i64>().ok()?, description)));
    let Some((version, description)) = parsed else {
        panic!("migration file {name:?} is not named NNNN_description.sql");
    };
    Embedded {
        version,
        description: description.replace('_', " "),
        sql,
        no_tx: sql.starts_with("-- no-transaction"),
    }
}

/// The last version of `files` (0 for none).
pub fn last_version(files: &[(&str, &'static str)]) -> i64 {
    files
        .iter()
        .map(|(name, sql)| embedded(name, sql).version)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_name_gives_the_version_and_description_sqlx_gives_it() {
        let parsed = embedded("0005_command_requests.sql", "-- the file's text");
        assert_eq!(parsed.version, 5);
        assert_eq!(parsed.description, "command requests");
        assert!(!parsed.no_tx);
        assert!(embedded("0007_x.sql", "-- no-transaction\n-- the rest").no_tx);
        assert_eq!(
            last_version(&[("0002_b.sql", ""), ("0010_c.sql", ""), ("0001_a.sql", "")]),
            10
        );
    }
}
