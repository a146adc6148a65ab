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
//! | 5 | storage unavailable or corrupt |

mod batch;
mod cli;
mod ingest;
mod kinds;
mod output;
mod query;
mod task;

use anyhow::Context;
use clap::Parser;
use cli::{Cli, Command, DocsCommand, MediaCommand, OpsCommand, Workload};
use opledger_domain::{DomainError, OperationId};
use opledger_engine::{CommandContext, Engine, EngineError};
use opledger_store::{ErrorKind, Store};
use opledger_store_postgres::{PostgresConfig, PostgresStore};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
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

/// What a successful run wants the process to exit with.
enum Outcome {
    Ok,
    /// A check ran and found differences.
    Differences,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("OPLEDGER_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // One thread is enough for a command line run, and measurably faster on
    // a small machine: the store's driver threads do the blocking work, and
    // fewer threads hand work back and forth. A replay is the exception: it
    // reads the log ahead on a task of its own while it folds, which pays
    // only on a second thread (measured: 144-161k → 175-183k events/s).
    let builder = if replays(&cli) {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match { builder }.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("opledger: cannot start the async runtime: {error}");
            return ExitCode::from(5);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Differences) => ExitCode::from(1),
        Err(error) => {
            eprintln!("opledger: {error:#}");
            ExitCode::from(exit_code(&error))
        }
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
    let engine_error = error
        .chain()
        .find_map(|cause| cause.downcast_ref::<EngineError>().cloned())
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
        Command::Docs {
            command: DocsCommand::StateMachines,
        } => {
            print!("{}", opledger_domain::state_machine_doc::render());
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
        _ => {}
    }
    if cli.database_url.starts_with("postgres://") || cli.database_url.starts_with("postgresql://") {
        let config = PostgresConfig::from_url(&cli.database_url).map_err(UsageError)?;
        let store = PostgresStore::open(config)
            .await
            .with_context(|| format!("opening {}", config_description(&cli.database_url)))?;
        return dispatch(store, &cli).await;
    }
    let config = SqliteConfig::from_url(&cli.database_url).map_err(UsageError)?;
    let store = SqliteStore::open(config)
        .await
        .with_context(|| format!("opening {}", cli.database_url))?;
    dispatch(store, &cli).await
}

/// A database URL for messages, without its password.
fn config_description(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            let user = credentials.split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..scheme_end + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

/// Runs a command on any backend.
async fn dispatch<S: Store>(store: S, cli: &Cli) -> anyhow::Result<Outcome> {
    let (engine, startup) = Engine::open(store).await.context("starting up")?;
    for (name, from, to, events) in &startup.rebuilt {
        tracing::info!(projection = name, from, to, events, "projection rebuilt");
    }
    let context = CommandContext::actor("cli");
    // Reading the log back must not change it; every other command first
    // records stale results and settles batches whose items settled.
    if !matches!(cli.command, Command::Replay(_)) {
        engine
            .maintain(&CommandContext::actor("system"))
            .await
            .context("maintenance")?;
    }
    match &cli.command {
        Command::Status => {
            let report = engine.status().await?;
            output::status(&report, cli.json);
        }
        Command::Timeline { operation_id } => {
            let operation_id: OperationId = operation_id.parse().map_err(UsageError)?;
            let events = engine.timeline(operation_id).await?;
            output::timeline(&events, cli.json);
        }
        Command::Replay(args) => {
            if !args.verify {
                let stats = engine.replay().await?;
                output::replay(&stats, cli.json);
                return Ok(Outcome::Ok);
            }
            let report = engine.verify().await?;
            output::verify(&report, cli.json);
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
                },
        } => {
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
        Command::Ingest(args) => {
            ingest::run(&engine, args, &cli.database_url, cli.json).await?;
        }
        Command::Bench(_) | Command::Docs { .. } | Command::SampleMedia(_) => {
            unreachable!("handled before opening a database")
        }
    }
    Ok(Outcome::Ok)
}
