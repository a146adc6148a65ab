//! Which server and database, and how many connections to it.

use sqlx::postgres::PgConnectOptions;
use std::str::FromStr;

#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// Server, database, user and any libpq-style options from the URL.
    pub options: PgConnectOptions,
    /// Connections for write transactions. Writes take turns on the append
    /// lock, so more than a few only wait; a few let the next transaction
    /// be queued at the server while the current one commits.
    pub write_connections: u32,
    /// Size of the read pool.
    pub read_connections: u32,
}

impl PostgresConfig {
    /// Parses `postgres://…` or `postgresql://…` (libpq URL syntax).
    pub fn from_url(url: &str) -> Result<Self, String> {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(format!("{url:?} is not a postgres:// URL"));
        }
        let options = PgConnectOptions::from_str(url).map_err(|error| format!("invalid PostgreSQL URL: {error}"))?;
        Ok(PostgresConfig {
            options,
            write_connections: 4,
            read_connections: 8,
        })
    }

    /// The same server and user, another database.
    pub fn with_database(mut self, database: &str) -> Self {
        self.options = self.options.database(database);
        self
    }

    /// The database name, for messages (never the password).
    pub fn describe(&self) -> String {
        format!(
            "{}:{}/{}",
            self.options.get_host(),
            self.options.get_port(),
            self.options.get_database().unwrap_or("(default)")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_others_are_refused() {
        let config = PostgresConfig::from_url("postgres://root@127.0.0.1:5432/test").unwrap();
        assert_eq!(config.describe(), "127.0.0.1:5432/test");
        assert_eq!(config.with_database("other").describe(), "127.0.0.1:5432/other");
        assert!(PostgresConfig::from_url("sqlite://x.db").is_err());
    }
}
