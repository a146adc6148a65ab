//! Which server and database, and how many connections to it.

use opledger_domain::quote;
use sqlx::postgres::PgConnectOptions;
use std::str::FromStr;
use std::time::Duration;

/// How long opening a store waits for the server when the URL does not say
/// (`connect_timeout`, in seconds, as libpq spells it).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the server lets a session sit inside a transaction waiting for
/// its client before ending it (`idle_in_transaction_session_timeout`).
/// Far above a healthy transaction's pauses between statements.
pub const STALLED_TRANSACTION_TIMEOUT: &str = "10s";

/// What a PostgreSQL URL must look like, for messages.
pub const URL_FORM: &str = "postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?connect_timeout=SECONDS]";

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
    /// How long a new connection may take before the server is reported
    /// unreachable (Unavailable, naming host and port).
    pub connect_timeout: Duration,
}

impl PostgresConfig {
    /// Parses `postgres://…` or `postgresql://…` (libpq URL syntax). The URL
    /// must name a database (its path, or a `dbname` parameter): without
    /// one the driver would pick the user's default database, which is
    /// never the ledger someone meant. `connect_timeout=SECONDS` bounds how
    /// long a connection may take (default 5 s). Refusals quote the URL
    /// short and without its password.
    pub fn from_url(url: &str) -> Result<Self, String> {
        Self::parse(url, true)
    }

    /// Parses the URL of a server rather than of a ledger (the benchmarks
    /// and tests make databases of their own there): a URL without a
    /// database connects to `postgres`, the server's maintenance database.
    pub fn server_from_url(url: &str) -> Result<Self, String> {
        let mut config = Self::parse(url, false)?;
        if config.options.get_database().is_none() {
            config.options = config.options.database("postgres");
        }
        Ok(config)
    }

    fn parse(url: &str, require_database: bool) -> Result<Self, String> {
        let shown = || quote(&without_password(url));
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(format!("{} is not a postgres:// URL ({URL_FORM})", shown()));
        }
        let mut parsed = url::Url::parse(url)
            .map_err(|error| format!("invalid PostgreSQL URL {} ({error}): {URL_FORM}", shown()))?;
        if parsed.host_str().is_none_or(str::is_empty) && !parsed.query_pairs().any(|(key, _)| key == "host") {
            return Err(format!("PostgreSQL URL {} names no server: {URL_FORM}", shown()));
        }
        let named_in_path = !parsed.path().trim_start_matches('/').is_empty();
        let named_in_query = parsed
            .query_pairs()
            .any(|(key, value)| key == "dbname" && !value.is_empty());
        if require_database && !named_in_path && !named_in_query {
            return Err(format!(
                "PostgreSQL URL {} names no database: give one after the server ({URL_FORM})",
                shown()
            ));
        }
        let mut connect_timeout = DEFAULT_CONNECT_TIMEOUT;
        let mut kept: Vec<(String, String)> = Vec::new();
        for (key, value) in parsed.query_pairs() {
            if key == "connect_timeout" {
                connect_timeout = match value.trim().parse::<f64>() {
                    Ok(seconds) if seconds > 0.0 && seconds <= 86_400.0 => Duration::from_secs_f64(seconds),
                    _ => {
                        return Err(format!(
                            "PostgreSQL URL {}: connect_timeout is a number of seconds above 0, not {}",
                            shown(),
                            quote(&value)
                        ))
                    }
                };
            } else {
                kept.push((key.into_owned(), value.into_owned()));
            }
        }
        if kept.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(kept);
        }
        let mut options = PgConnectOptions::from_str(parsed.as_str())
            .map_err(|error| format!("invalid PostgreSQL URL {} ({error}): {URL_FORM}", shown()))?;
        // A client that stops inside a write transaction (a frozen VM, a
        // SIGSTOPped process) holds the append lock, and with it every
        // writer of every host, until the server ends its session. Unless
        // the URL sets its own (`options=-c idle_in_transaction_session_timeout=…`),
        // the server ends such a session after STALLED_TRANSACTION_TIMEOUT;
        // its transaction rolls back, so nothing of it is half there.
        if !url.contains("idle_in_transaction_session_timeout") {
            options = options.options([("idle_in_transaction_session_timeout", STALLED_TRANSACTION_TIMEOUT)]);
        }
        Ok(PostgresConfig {
            options,
            write_connections: 4,
            read_connections: 8,
            connect_timeout,
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

    /// The server, for messages: host and port.
    pub fn server(&self) -> String {
        format!("{}:{}", self.options.get_host(), self.options.get_port())
    }
}

/// A URL for messages, without the password of its credentials.
pub fn without_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            let user = credentials.split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..scheme_end + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_ends_when_its_client_stalls_inside_a_transaction_unless_the_url_says_otherwise() {
        let default = PostgresConfig::from_url("postgres://root@127.0.0.1:5432/test").unwrap();
        let options = default.options.get_options().unwrap_or_default();
        assert!(
            options.contains(&format!(
                "idle_in_transaction_session_timeout={STALLED_TRANSACTION_TIMEOUT}"
            )),
            "{options}"
        );
        let own = PostgresConfig::from_url(
            "postgres://root@127.0.0.1:5432/test?options=-c%20idle_in_transaction_session_timeout%3D1000",
        )
        .unwrap();
        let options = own.options.get_options().unwrap_or_default();
        assert_eq!(
            options.matches("idle_in_transaction_session_timeout").count(),
            1,
            "{options}"
        );
        assert!(
            options.contains("idle_in_transaction_session_timeout=1000"),
            "{options}"
        );
    }

    #[test]
    fn urls_parse_and_others_are_refused() {
        let config = PostgresConfig::from_url("postgres://root@127.0.0.1:5432/test").unwrap();
        assert_eq!(config.describe(), "127.0.0.1:5432/test");
        assert_eq!(config.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(config.with_database("other").describe(), "127.0.0.1:5432/other");
        assert!(PostgresConfig::from_url("sqlite://x.db").is_err());
    }

    #[test]
    fn a_url_without_a_database_or_server_is_refused_with_the_accepted_form() {
        for url in [
            "postgres://",
            "postgres://root@127.0.0.1:5432/",
            "postgres://root@127.0.0.1:5432",
            "postgresql://root:secret@127.0.0.1/?sslmode=disable",
        ] {
            let refused = PostgresConfig::from_url(url).unwrap_err();
            assert!(refused.contains(URL_FORM), "{url}: {refused}");
            assert!(!refused.contains("secret"), "{url}: {refused}");
        }
        let by_parameter = PostgresConfig::from_url("postgres://root@127.0.0.1:5432/?dbname=ledger").unwrap();
        assert_eq!(by_parameter.describe(), "127.0.0.1:5432/ledger");
        let server = PostgresConfig::server_from_url("postgres://root@127.0.0.1:5432").unwrap();
        assert_eq!(server.describe(), "127.0.0.1:5432/postgres");
    }

    #[test]
    fn connect_timeout_is_taken_from_the_url_and_not_passed_on() {
        let config =
            PostgresConfig::from_url("postgres://root@127.0.0.1:5432/test?connect_timeout=2&sslmode=disable").unwrap();
        assert_eq!(config.connect_timeout, Duration::from_secs(2));
        assert!(PostgresConfig::from_url("postgres://root@127.0.0.1/test?connect_timeout=0").is_err());
        assert!(PostgresConfig::from_url("postgres://root@127.0.0.1/test?connect_timeout=soon").is_err());
    }

    #[test]
    fn a_long_url_is_quoted_short() {
        let url = format!("postgres://root@127.0.0.1:5432/?x={}", "y".repeat(100_000));
        let refused = PostgresConfig::from_url(&url).unwrap_err();
        assert!(refused.len() < 600, "{} bytes", refused.len());
    }
}
