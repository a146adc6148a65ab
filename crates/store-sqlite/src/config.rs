//! Where the database is and how durable its commits are.

use std::path::PathBuf;

/// SQLite's `synchronous` setting, as far as opledger offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// Every commit is fsynced before it is acknowledged (the default): an
    /// acknowledged event survives power loss.
    Full,
    /// WAL commits are fsynced only at checkpoints: much faster, and the
    /// database stays consistent, but the last commits before a power loss
    /// (not a process crash) may be lost. Opt in with `?synchronous=normal`.
    Normal,
}

impl Synchronous {
    /// The value of `PRAGMA synchronous`, as sqlx sends it for the same setting.
    pub(crate) fn pragma_value(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

impl From<Synchronous> for sqlx::sqlite::SqliteSynchronous {
    fn from(value: Synchronous) -> Self {
        match value {
            Synchronous::Full => sqlx::sqlite::SqliteSynchronous::Full,
            Synchronous::Normal => sqlx::sqlite::SqliteSynchronous::Normal,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    pub path: PathBuf,
    pub synchronous: Synchronous,
    /// Size of the read pool.
    pub read_connections: u32,
}

impl SqliteConfig {
    pub fn at(path: impl Into<PathBuf>) -> Self {
        SqliteConfig {
            path: path.into(),
            synchronous: Synchronous::Full,
            read_connections: 4,
        }
    }

    /// Parses `sqlite:PATH`, `sqlite://PATH` or a bare path, with an optional
    /// `?synchronous=full|normal`.
    pub fn from_url(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        if path.is_empty() {
            return Err(format!("database URL {url:?} names no file"));
        }
        let mut config = SqliteConfig::at(path);
        for pair in query
            .into_iter()
            .flat_map(|query| query.split('&'))
            .filter(|pair| !pair.is_empty())
        {
            match pair.split_once('=') {
                Some(("synchronous", "full")) => config.synchronous = Synchronous::Full,
                Some(("synchronous", "normal")) => config.synchronous = Synchronous::Normal,
                _ => {
                    return Err(format!(
                        "database URL {url:?}: unknown option {pair:?} (known: synchronous=full|normal)"
                    ))
                }
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_forms() {
        assert_eq!(
            SqliteConfig::from_url("opledger.db").unwrap().path,
            PathBuf::from("opledger.db")
        );
        assert_eq!(
            SqliteConfig::from_url("sqlite:x/y.db").unwrap().path,
            PathBuf::from("x/y.db")
        );
        assert_eq!(
            SqliteConfig::from_url("sqlite:///tmp/a.db").unwrap().path,
            PathBuf::from("/tmp/a.db")
        );
        let normal = SqliteConfig::from_url("sqlite:a.db?synchronous=normal").unwrap();
        assert_eq!(normal.synchronous, Synchronous::Normal);
        assert!(SqliteConfig::from_url("sqlite:a.db?journal=off").is_err());
        assert!(SqliteConfig::from_url("sqlite:").is_err());
    }
}
