//! The `opledger` command: thin glue over the library crates. Parsing is
//! clap's, work is the engine's, and exit codes are decided once, here:
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | ok |
//! | 1 | a check found differences (`replay --verify`) |
//! | 2 | bad usage or invalid input |
//! | 3 | conflict: stale claim, illegal transition, version conflict |
//! | 4 | not found |
//! | 5 | storage unavailable or corrupt, or not an opledger ledger |
//! | 130 | `ingest` stopped by SIGINT (Ctrl-C): what it held is released, the next run resumes |
//! | 141 | standard output was closed before the answer was written (a reader such as `head` stopped reading); nothing is printed, and a claim whose answer was not written is given back |
//! | 143 | `ingest` stopped by SIGTERM, likewise; an export child (`__run-supervised`) that stopped after SIGTERM |

/// Every command prints through these, which shadow the standard macros in
/// this crate: a write to a closed standard output (`| head -1`) must end
/// the command quietly with exit 141 instead of panicking, and a claim
/// whose answer could not be written must be given back. The write goes
/// to `output::write_stdout`, which records a failure instead of
/// panicking; `main` turns it into the exit code.
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!($($arg)*))
    };
}

/// See [`print!`].
macro_rules! println {
    () => {
        $crate::output::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod batch;
mod cli;
mod docs;
mod explain;
mod ingest;
mod kinds;
mod limits;
mod media_file;
mod output;
mod query;
mod review_bulk;
mod serve;
mod supervise;
mod task;

use anyhow::Context;
use clap::Parser;
use cli::{Cli, Command, DocsCommand, MediaCommand, OpsCommand, TokenCommand, Workload};
use opledger_domain::{quoted, DomainError};
use opledger_engine::{CommandContext, Engine, EngineError};
use opledger_store::{ErrorKind, Store};
use opledger_store_postgres::{PostgresConfig, PostgresStore};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use std::io::IsTerminal;
use std::io::Write;
use std::process::ExitCode;

/// Projection folds and the driver allocate many small strings and rows;
/// mimalloc serves them markedly faster than the system allocator here
/// (replay spent a quarter of its time in glibc malloc and free).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// An error that already knows its exit code (bad usage found after parsing).
#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Standard output was closed before the command's answer was written.
#[derive(Debug)]
pub(crate) struct OutputClosed;

impl std::fmt::Display for OutputClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed before the answer was written")
    }
}

impl std::error::Error for OutputClosed {}

/// The exit code of a command whose standard output was closed under it,
/// as a shell reports a process ended by SIGPIPE (128 + 13).
const OUTPUT_CLOSED: u8 = 141;

/// What a successful run wants the process to exit with.
enum Outcome {
    Ok,
    /// A check ran and found differences.
    Differences,
    /// Stopped early by a signal: 128 + its number, as a shell reports it.
    Interrupted {
        by: String,
    },
}

/// The exit code of a run stopped by `by` (`SIGINT`, `SIGTERM`).
fn interrupted_code(by: &str) -> u8 {
    match by {
        "SIGTERM" => 143,
        _ => 130,
    }
}

/// Colour (ANSI escapes) only on a terminal, and never when `NO_COLOR` is
/// set to anything (no-color.org).
fn colour(stream: &impl IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
}

/// Logs on standard error, filtered by `OPLEDGER_LOG` (default: warnings;
/// `serve` also logs each request and its lifecycle at info), as text or,
/// for `serve --log-format json`, one JSON object a line.
fn init_logs(cli: &Cli) {
    let (default, json) = match &cli.command {
        Command::Serve(args) => ("info", args.log_format == "json"),
        _ => ("warn", false),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("OPLEDGER_LOG").unwrap_or_else(|_| default.into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        logs.with_ansi(colour(&std::io::stderr())).init();
    }
}

fn main() -> ExitCode {
    let mut cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return parse_error(error),
    };
    init_logs(&cli);
    // One thread is enough for a command line run, and measurably faster on
    // a small machine: the store's driver threads do the blocking work, and
    // fewer threads hand work back and forth. A replay is the exception: it
    // reads the log ahead on a task of its own while it folds, which pays
    // only on a second thread (measured: 144-161k → 175-183k events/s).
    // A supervisor's jobs, and an export child's SIGTERM listener while it
    // computes, need threads of their own too.
    let threaded = matches!(
        cli.command,
        Command::Serve(_) | Command::Supervise(_) | Command::RunSupervised { .. }
    );
    let builder = if replays(&cli) || threaded {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match { builder }.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            report(&format!("opledger: cannot start the async runtime: {error}"));
            return ExitCode::from(5);
        }
    };
    let result = match limits::check(&mut cli).and_then(|()| media_file::take(&mut cli)) {
        Ok(()) => runtime.block_on(run(cli)),
        Err(error) => Err(error.into()),
    };
    // Whatever was left in the buffer must reach the reader too.
    let written = output::flush();
    match result {
        Ok(_) if !written => ExitCode::from(OUTPUT_CLOSED),
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Differences) => ExitCode::from(1),
        Ok(Outcome::Interrupted { by }) => ExitCode::from(interrupted_code(&by)),
        Err(error) if error.downcast_ref::<OutputClosed>().is_some() => ExitCode::from(OUTPUT_CLOSED),
        Err(error) => {
            report(&format!("opledger: {error:#}"));
            ExitCode::from(exit_code(&error))
        }
    }
}

/// Writes a message to standard error; a closed standard error loses it
/// instead of panicking.
fn report(message: &str) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

/// A command line clap refused: its message, with any long argument quoted
/// short (clap repeats a refused value whole, and a value may be megabytes),
/// and its exit code (2; help and version are 0).
fn parse_error(error: clap::Error) -> ExitCode {
    let code = error.exit_code();
    let mut message = error.render().to_string();
    for argument in std::env::args_os().skip(1) {
        let argument = argument.to_string_lossy();
        let value = argument.split_once('=').map_or(&*argument, |(_, value)| value);
        for long in [&*argument, value] {
            if long.len() > opledger_domain::quote::QUOTE_BYTES && message.contains(long) {
                message = message.replace(long, &opledger_domain::quote(long));
            }
        }
    }
    let shown = if code == 0 {
        write!(std::io::stdout(), "{message}")
    } else {
        write!(std::io::stderr(), "{message}")
    };
    match shown {
        Err(_) if code == 0 => ExitCode::from(OUTPUT_CLOSED),
        _ => ExitCode::from(u8::try_from(code).unwrap_or(2)),
    }
}

/// Whether the command rebuilds projections from the whole log.
fn replays(cli: &Cli) -> bool {
    match &cli.command {
        Command::Replay(_) => true,
        Command::Bench(args) => matches!(args.workload, Workload::Replay),
        _ => false,
    }
}

/// The one place errors become exit codes.
fn exit_code(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<UsageError>().is_some() {
        return 2;
    }
    if let Some(opledger_supervise::SuperviseError::Gone(_)) = error.downcast_ref() {
        return 4;
    }
    let engine_error = error
        .chain()
        .find_map(|cause| {
            cause.downcast_ref::<EngineError>().cloned().or_else(|| {
                cause
                    .downcast_ref::<opledger_ingest::IngestError>()
                    .and_then(opledger_ingest::IngestError::engine_error)
                    .cloned()
            })
        })
        .or_else(|| {
            error
                .chain()
                .find_map(|cause| cause.downcast_ref::<opledger_store::StoreError>().cloned())
                .map(EngineError::Store)
        });
    match engine_error {
        Some(EngineError::Domain(DomainError::InvalidInput(_))) => 2,
        Some(EngineError::Domain(DomainError::IllegalTransition(_) | DomainError::Conflict(_))) => 3,
        Some(EngineError::Domain(DomainError::NotFound { .. })) => 4,
        Some(EngineError::Store(store)) => match store.kind {
            ErrorKind::Conflict => 3,
            ErrorKind::NotFound => 4,
            ErrorKind::Constraint => 2,
            ErrorKind::Unavailable | ErrorKind::Corrupt => 5,
        },
        None => 5,
    }
}

async fn run(cli: Cli) -> anyhow::Result<Outcome> {
    match &cli.command {
        Command::Docs { command } => {
            match command {
                DocsCommand::StateMachines => print!("{}", docs::state_machines()),
                DocsCommand::Cli => print!("{}", docs::cli_reference()),
                DocsCommand::Http => print!("{}", docs::http_reference()),
            }
            return Ok(Outcome::Ok);
        }
        Command::Bench(args) => {
            // The engine's and the store's errors keep their exit codes.
            let report =
                opledger_bench::run(&cli.database_url, &args.options())
                    .await
                    .map_err(|error| match error {
                        opledger_bench::BenchError::Engine(error) => anyhow::Error::new(error),
                        opledger_bench::BenchError::Store(error) => anyhow::Error::new(error),
                        other => anyhow::Error::new(other),
                    })?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            return Ok(Outcome::Ok);
        }
        Command::SampleMedia(args) => {
            ingest::sample_media(args, cli.json)?;
            return Ok(Outcome::Ok);
        }
        Command::Token {
            command: TokenCommand::New(args),
        } => {
            serve::token_new(args)?;
            return Ok(Outcome::Ok);
        }
        Command::Serve(args) => {
            // The service starts the engine itself: it answers health while
            // startup runs and reports ready only after it.
            let tokens = serve::check(args)?;
            let artifacts = supervise::serve_artifact_dir(&args.artifacts, &cli.database_url)?;
            match database(&cli.database_url)? {
                Database::Postgres(config) => {
                    let described = config_description(&cli.database_url);
                    let store = PostgresStore::open(*config)
                        .await
                        .with_context(|| format!("opening {described}"))?;
                    serve::serve(store, args, tokens, artifacts, &cli).await?;
                }
                Database::Sqlite(config) => {
                    let store = SqliteStore::open(config)
                        .await
                        .with_context(|| format!("opening {}", quoted(&cli.database_url)))?;
                    serve::serve(store, args, tokens, artifacts, &cli).await?;
                }
            }
            return Ok(Outcome::Ok);
        }
        _ => {}
    }
    // Checked before a store is opened, which would create the file.
    if let Command::Ingest(args) = &cli.command {
        ingest::check_folder(args)?;
    }
    let read_only = cli.command.reads_only();
    match database(&cli.database_url)? {
        Database::Postgres(config) => {
            let described = config_description(&cli.database_url);
            let store = if read_only {
                PostgresStore::open_read_only(*config).await
            } else {
                PostgresStore::open(*config).await
            };
            dispatch(store.with_context(|| format!("opening {described}"))?, &cli).await
        }
        Database::Sqlite(config) => {
            let store = if read_only {
                SqliteStore::open_read_only(config).await
            } else {
                SqliteStore::open(config).await
            };
            dispatch(
                store.with_context(|| format!("opening {}", quoted(&cli.database_url)))?,
                &cli,
            )
            .await
        }
    }
}

/// Records what `replay --verify` found, for `status`. The check itself
/// reads through a read-only store (it must work where nothing may be
/// written); the record is a write, so it opens the ledger for writing
/// beside it, and where that is refused (a read-only file, a SELECT-only
/// role) the check stands unrecorded, said on stderr by the caller.
async fn record_verification(url: &str, report: &opledger_engine::VerifyReport) -> anyhow::Result<()> {
    match database(url)? {
        Database::Postgres(config) => {
            let store = PostgresStore::open(*config).await?;
            Engine::new(store).record_verification(report).await?;
        }
        Database::Sqlite(config) => {
            let store = SqliteStore::open(config).await?;
            Engine::new(store).record_verification(report).await?;
        }
    }
    Ok(())
}

/// A database URL for messages, without its password, quoted short.
fn config_description(url: &str) -> String {
    opledger_domain::quote(&opledger_store_postgres::without_password(url))
}

/// Which backend a `--database-url` names.
enum Database {
    Sqlite(SqliteConfig),
    Postgres(Box<PostgresConfig>),
}

/// The database URLs opledger accepts, for messages.
const ACCEPTED_URLS: &str = "accepted: a SQLite file (`PATH`, `sqlite:PATH`, `sqlite:PATH?synchronous=normal`) \
     or `postgres://USER@HOST:PORT/DATABASE`";

/// Parses `--database-url`: a PostgreSQL URL, or a SQLite file. Anything
/// else (another scheme, an in-memory database, which would vanish when
/// the command ends) is bad usage, said with the forms accepted.
fn database(url: &str) -> Result<Database, UsageError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        // Its refusals say the form a PostgreSQL URL takes.
        return PostgresConfig::from_url(url)
            .map(|config| Database::Postgres(Box::new(config)))
            .map_err(UsageError);
    }
    let lowered = url.to_ascii_lowercase();
    let scheme = lowered.split_once(':').map(|(scheme, _)| scheme).unwrap_or("");
    let foreign_scheme = lowered.contains("://") && !lowered.starts_with("sqlite://");
    let known_other = [
        "mysql",
        "mariadb",
        "postgres",
        "postgresql",
        "http",
        "https",
        "file",
        "redis",
        "mongodb",
    ]
    .contains(&scheme);
    if foreign_scheme || known_other {
        return Err(UsageError(format!(
            "database URL {} is not one opledger can use; {ACCEPTED_URLS}",
            quoted(&config_description(url))
        )));
    }
    let config = SqliteConfig::from_url(url).map_err(|refused| UsageError(format!("{refused}; {ACCEPTED_URLS}")))?;
    let path = config.path.to_string_lossy();
    if path == ":memory:" || path.is_empty() || lowered.contains("mode=memory") {
        return Err(UsageError(format!(
            "database URL {} names an in-memory database, which would vanish when the command ends; {ACCEPTED_URLS}",
            quoted(url)
        )));
    }
    Ok(Database::Sqlite(config))
}

/// Runs a command on any backend. A reading command (`Command::reads_only`)
/// got a read-only store: it runs no startup and no maintenance, and
/// refuses projections stored at another version than this build reads
/// (only a writing command's startup rebuilds them); projections merely
/// behind the log are read as they are, with a note on stderr (`status`
/// shows each one's lag). Every other command first brings the
/// projections to the head (startup) and runs maintenance.
async fn dispatch<S: Store>(store: S, cli: &Cli) -> anyhow::Result<Outcome> {
    let engine = if cli.command.reads_only() {
        let engine = Engine::new(store);
        check_readable(&engine).await?;
        engine
    } else {
        let engine = Engine::new(store).with_max_kinds(cli.max_kinds);
        let startup = engine.startup().await.context("starting up")?;
        for (name, from, to, events) in &startup.rebuilt {
            tracing::info!(projection = name, from, to, events, "projection rebuilt");
        }
        // Stale results are recorded and batches whose items settled are
        // settled before the command acts.
        engine
            .maintain(&CommandContext::actor("system"))
            .await
            .context("maintenance")?;
        engine
    };
    let context = CommandContext::actor("cli");
    match &cli.command {
        Command::Status(args) => explain::status(&engine, args, cli.json).await?,
        Command::Timeline(args) => explain::timeline(&engine, args, cli.json).await?,
        Command::Describe(args) => explain::describe(&engine, args, cli.json).await?,
        Command::Replay(args) => {
            if args.rebuild {
                let rebuilt = engine.rebuild_projections().await?;
                output::rebuilt(&rebuilt, cli.json);
                return Ok(Outcome::Ok);
            }
            if !args.verify {
                let stats = engine.replay().await?;
                output::replay(&stats, cli.json);
                return Ok(Outcome::Ok);
            }
            let report = engine.verify().await?;
            output::verify(&report, cli.json);
            if let Err(error) = record_verification(&cli.database_url, &report).await {
                eprintln!("note: this check was not recorded for `opledger status`: {error:#}");
            }
            if !report.is_identical() {
                return Ok(Outcome::Differences);
            }
        }
        Command::Media {
            command:
                MediaCommand::Add {
                    path,
                    kind,
                    digest,
                    size,
                    allow_duplicate_path,
                },
        } => {
            if !allow_duplicate_path {
                if let Some(existing) = engine.media_by_path(std::slice::from_ref(path)).await?.get(path) {
                    return Err(EngineError::Domain(DomainError::Conflict(format!(
                        "{} is already registered as media {} (pass --allow-duplicate-path to register it again)",
                        quoted(path),
                        existing.media_id
                    )))
                    .into());
                }
            }
            let media_id = engine
                .register_media(&context, path, kind, digest.clone(), *size)
                .await?;
            output::media_added(media_id, cli.json);
        }
        Command::Media {
            command: MediaCommand::Show(args),
        } => query::media_show(&engine, args, cli.json).await?,
        Command::Media {
            command: MediaCommand::List(args),
        } => query::media_list(&engine, args, cli.json).await?,
        Command::Ops {
            command: OpsCommand::List(args),
        } => query::ops_list(&engine, args, cli.json).await?,
        Command::Task { command } => task::run(&engine, command, cli.json).await?,
        Command::Kinds { command } => kinds::run(&engine, command, cli.json).await?,
        Command::Reprocess(args) => kinds::reprocess(&engine, args, cli.json).await?,
        Command::Recover => task::recover(&engine, cli.json).await?,
        Command::Batch { command } => batch::batch(&engine, command, cli.json).await?,
        Command::Review { command } => batch::review(&engine, command, cli.json).await?,
        Command::Capabilities { media } => batch::capabilities(&engine, *media, cli.json).await?,
        Command::Supervise(args) => supervise::supervise(engine, args, &cli.database_url).await?,
        Command::Export { command } => supervise::export(&engine, command, &cli.database_url, cli.json).await?,
        Command::RunSupervised { command } => {
            if supervise::run_supervised(&engine, command).await? {
                return Ok(Outcome::Interrupted {
                    by: "SIGTERM".to_string(),
                });
            }
        }
        Command::Ingest(args) => {
            let summary = ingest::run(&engine, args, &cli.database_url, cli.json).await?;
            if let Some(interrupted) = summary.interrupted {
                return Ok(Outcome::Interrupted { by: interrupted.by });
            }
        }
        Command::Bench(_)
        | Command::Docs { .. }
        | Command::SampleMedia(_)
        | Command::Serve(_)
        | Command::Token { .. } => {
            unreachable!("handled before opening a database")
        }
    }
    Ok(Outcome::Ok)
}

/// The writing command that brings projections to this build's version.
const UPGRADING_COMMAND: &str = "opledger recover";

/// Whether a reading command can read the stored projections as they are:
/// refused when any is stored at another version than this build reads
/// (its tables are not what this build's queries expect), naming the
/// writing command that rebuilds them; a note on stderr when they are
/// merely behind the log.
async fn check_readable<S: Store>(engine: &Engine<S>) -> anyhow::Result<()> {
    let readiness = engine.readiness().await.context("reading the projections' versions")?;
    let outdated = readiness.outdated();
    if !outdated.is_empty() {
        let named: Vec<String> = outdated
            .iter()
            .map(|projection| match projection.stored_version {
                Some(stored) => format!(
                    "{} (stored v{stored}, this build reads v{})",
                    projection.name, projection.version
                ),
                None => format!(
                    "{} (not built yet, this build reads v{})",
                    projection.name, projection.version
                ),
            })
            .collect();
        return Err(EngineError::Store(opledger_store::StoreError::unavailable(format!(
            "the ledger's projections are not at this build's versions: {}. A reading command does not \
             rebuild them; run `{UPGRADING_COMMAND}` (or any command that writes) once to rebuild them",
            named.join(", ")
        )))
        .into());
    }
    let lag = readiness.lag();
    if lag > 0 {
        report(&format!(
            "opledger: note: the projections are up to {lag} events behind the log (head at seq {}); \
             this reads them as they are (`{UPGRADING_COMMAND}` or any command that writes catches them up)",
            readiness.head
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_ingest::IngestError;

    #[test]
    fn an_ingest_stopped_by_a_conflict_exits_3_not_5() {
        let conflict = EngineError::Domain(DomainError::Conflict("claim token does not hold the operation".into()));
        let error = anyhow::Error::from(IngestError::Engine(conflict)).context("ingesting photos");
        assert_eq!(exit_code(&error), 3);
        let unavailable = EngineError::Store(opledger_store::StoreError::unavailable("the disk is full"));
        assert_eq!(exit_code(&anyhow::Error::from(IngestError::Engine(unavailable))), 5);
        assert_eq!(exit_code(&anyhow::Error::from(IngestError::Io("a folder".into()))), 5);
    }
}
