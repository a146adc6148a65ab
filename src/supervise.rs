//! `opledger supervise`, `opledger export …` and the hidden
//! `opledger __run-supervised`: the binary's side of supervised execution
//! — flags, the artifact directory's default, signals, printing. The
//! supervisor and the export are `opledger_supervise`.

use crate::{Database, UsageError};
use anyhow::Context;
use clap::{Args, Subcommand};
use opledger_domain::BatchId;
use opledger_engine::{CommandContext, Engine};
use opledger_store::Store;
use opledger_supervise::export::child::{run_child, ChildArgs, ChildEnd};
use opledger_supervise::export::{ExportSpec, Format, What};
use opledger_supervise::{ArtifactDir, ExportRequest, Limits, SuperviseError, Supervisor, SupervisorOptions};
use std::path::PathBuf;
use std::time::Duration;

/// The principal and policy revision of the command line: a local user
/// reaches the ledger's files directly, so its tokens are bound to the
/// machine's one local principal.
const CLI_PRINCIPAL: &str = "cli";
const CLI_POLICY: &str = "local";

#[derive(Debug, Args)]
pub struct DirArgs {
    /// The artifact directory (default: `artifacts/` beside the SQLite file;
    /// required for PostgreSQL). Every supervisor of a ledger and every
    /// registration must use the same one.
    #[arg(long, env = "OPLEDGER_ARTIFACT_DIR", value_name = "DIR")]
    pub artifact_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SuperviseArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Children at once on this machine, shared by all its supervisors.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub slots: u64,
    /// This supervisor's name (default: host and process id).
    #[arg(long)]
    pub name: Option<String>,
    /// A job running longer fails with `timeout`.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub max_run_secs: u64,
    /// An artifact growing past this fails with `size_limit`.
    #[arg(long, value_name = "BYTES", default_value_t = 128 << 20)]
    pub max_artifact_bytes: u64,
    /// All artifacts and temporary files together; past it a job fails with `storage_full`.
    #[arg(long, value_name = "BYTES", default_value_t = 512 << 20)]
    pub max_storage_bytes: u64,
    /// How long a finished artifact is kept.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub expiry_secs: u64,
    /// A job queued longer fails with `queue_timeout`.
    #[arg(long, value_name = "SECONDS", default_value_t = 150)]
    pub max_queued_secs: u64,
    /// A running job whose supervisor's heartbeat is older fails with `supervisor_lost`.
    #[arg(long, value_name = "SECONDS", default_value_t = 15)]
    pub staleness_secs: u64,
    /// Between SIGTERM and SIGKILL of a child to stop.
    #[arg(long, value_name = "MILLISECONDS", default_value_t = 5_000)]
    pub grace_ms: u64,
    /// How often the sweeping patrol runs.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub patrol_secs: u64,
}

#[derive(Debug, Subcommand)]
pub enum ExportCommand {
    /// Register an export of the ledger as of now (its log head); prints its job token.
    Create(CreateArgs),
    /// Where an export stands: status, phase, counts, heartbeat, artifact.
    Status(TokenArgs),
    /// Stop an export: at once when queued; a running one ends `cancelled`
    /// once its child is gone and its files removed.
    Cancel(TokenArgs),
    /// Copy a finished export's file.
    Download(DownloadArgs),
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// `operations`, `capability_counts` or `batch_items`.
    #[arg(long)]
    pub what: What,
    /// `csv` or `json`.
    #[arg(long)]
    pub format: Format,
    /// The batch of a `batch_items` export.
    #[arg(long, value_name = "ID")]
    pub batch: Option<BatchId>,
    /// Export the ledger as of this earlier log position instead of the head.
    #[arg(long, value_name = "SEQ")]
    pub as_of_seq: Option<i64>,
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// The job token `export create` printed.
    pub token: String,
}

#[derive(Debug, Args)]
pub struct DownloadArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    pub token: String,
    /// Where to write the file (written whole, then renamed into place).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum RunSupervisedCommand {
    /// Run one export into a temporary file, reporting on standard output.
    Export {
        #[arg(long)]
        spec: String,
        #[arg(long)]
        out: PathBuf,
    },
}

/// The artifact directory: the flag, else `artifacts/` beside a SQLite file.
fn artifact_dir(args: &DirArgs, database_url: &str) -> anyhow::Result<ArtifactDir> {
    let root = match (&args.artifact_dir, crate::database(database_url)?) {
        (Some(dir), _) => dir.clone(),
        (None, Database::Sqlite(config)) => ArtifactDir::beside(&config.path),
        (None, Database::Postgres(_)) => return Err(UsageError(
            "a PostgreSQL ledger has no file to put artifacts beside: give --artifact-dir (or OPLEDGER_ARTIFACT_DIR)"
                .to_string(),
        )
        .into()),
    };
    ArtifactDir::open(root).map_err(into_anyhow)
}

/// The artifact directory of `opledger serve`'s export routes: the flag's
/// (a directory that cannot be opened stops the service), else `artifacts/`
/// beside a SQLite file when it can be opened. Without one (a PostgreSQL
/// ledger without the flag) the service runs and its export routes answer
/// 503.
pub fn serve_artifact_dir(args: &DirArgs, database_url: &str) -> anyhow::Result<Option<ArtifactDir>> {
    let root = match (&args.artifact_dir, crate::database(database_url)?) {
        (Some(dir), _) => return ArtifactDir::open(dir).map(Some).map_err(into_anyhow),
        (None, Database::Sqlite(config)) => ArtifactDir::beside(&config.path),
        (None, Database::Postgres(_)) => {
            tracing::warn!("no --artifact-dir (or OPLEDGER_ARTIFACT_DIR): the export routes will answer 503");
            return Ok(None);
        }
    };
    match ArtifactDir::open(&root) {
        Ok(dir) => Ok(Some(dir)),
        Err(error) => {
            tracing::warn!(%error, "the default artifact directory cannot be used: the export routes will answer 503");
            Ok(None)
        }
    }
}

/// Keeps each error's exit code: the engine's as they are, a refused token
/// as bad input (2), a gone artifact as not found (4).
fn into_anyhow(error: SuperviseError) -> anyhow::Error {
    match error {
        SuperviseError::Engine(error) => anyhow::Error::new(error),
        SuperviseError::Token(message) => UsageError(message).into(),
        // Said as it is ("the artifact of export … expired"); `exit_code`
        // reads it as not found.
        other => anyhow::Error::new(other),
    }
}

/// Runs a supervisor until SIGTERM or Ctrl-C, then lets running jobs end.
pub async fn supervise<S: Store>(engine: Engine<S>, args: &SuperviseArgs, database_url: &str) -> anyhow::Result<()> {
    let dir = artifact_dir(&args.dir, database_url)?;
    let options = SupervisorOptions {
        slots: usize::try_from(args.slots).unwrap_or(1),
        limits: Limits {
            run_time: Duration::from_secs(args.max_run_secs),
            artifact_bytes: args.max_artifact_bytes,
            storage_bytes: args.max_storage_bytes,
            expiry: Duration::from_secs(args.expiry_secs),
            queued_wait: Duration::from_secs(args.max_queued_secs),
            staleness: Duration::from_secs(args.staleness_secs),
            grace: Duration::from_millis(args.grace_ms),
        },
        name: args
            .name
            .clone()
            .unwrap_or_else(|| format!("{}-{}", opledger_supervise::dir::host_name(), std::process::id())),
        exe: std::env::current_exe().context("finding this binary to run children")?,
        database_url: database_url.to_string(),
        poll: Duration::from_millis(250),
        patrol: Duration::from_secs(args.patrol_secs.max(1)),
    };
    let supervisor = Supervisor::start(engine, dir, options).map_err(into_anyhow)?;
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("listening for SIGTERM")?;
    let stop = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    supervisor.run(stop).await.map_err(into_anyhow)
}

/// `opledger export …`.
pub async fn export<S: Store>(
    engine: &Engine<S>,
    command: &ExportCommand,
    database_url: &str,
    json: bool,
) -> anyhow::Result<()> {
    let context = CommandContext::actor(CLI_PRINCIPAL);
    match command {
        ExportCommand::Create(args) => {
            let dir = artifact_dir(&args.dir, database_url)?;
            let request = ExportRequest {
                what: args.what,
                format: args.format,
                batch: args.batch,
                as_of_seq: args.as_of_seq,
                principal: CLI_PRINCIPAL.to_string(),
                policy: CLI_POLICY.to_string(),
            };
            let registered = opledger_supervise::create_export(engine, &dir, &Limits::default(), &context, request)
                .await
                .map_err(into_anyhow)?;
            if json {
                println!("{}", serde_json::to_string(&registered)?);
            } else {
                println!(
                    "export {} registered at seq {}\njob token: {}",
                    registered.operation_id, registered.as_of_seq, registered.job_token
                );
            }
        }
        ExportCommand::Status(args) => {
            let dir = artifact_dir(&args.dir, database_url)?;
            let status = opledger_supervise::export_status(engine, &dir, &args.token, CLI_PRINCIPAL, CLI_POLICY)
                .await
                .map_err(into_anyhow)?;
            if json {
                println!("{}", serde_json::to_string(&status)?);
            } else {
                let counts = match (status.processed, status.total) {
                    (Some(processed), Some(total)) => format!(" {processed}/{total} {}", status.logical_count_unit),
                    (Some(processed), None) => format!(" {processed} {}", status.logical_count_unit),
                    _ => String::new(),
                };
                println!(
                    "export {}: {}{}{} (as of seq {})",
                    status.operation_id,
                    status.status,
                    status
                        .phase
                        .as_deref()
                        .map(|phase| format!(", {phase}"))
                        .unwrap_or_default(),
                    counts,
                    status.as_of_seq
                );
                if let Some(reason) = &status.reason {
                    println!("reason: {reason}");
                }
                if let Some(artifact) = &status.artifact {
                    println!(
                        "artifact: {} bytes, sha256 {}, expires {}",
                        artifact.size, artifact.sha256, artifact.expires_at
                    );
                } else if status.expired {
                    println!("artifact: expired");
                }
            }
        }
        ExportCommand::Cancel(args) => {
            let dir = artifact_dir(&args.dir, database_url)?;
            let status =
                opledger_supervise::cancel_export(engine, &dir, &context, &args.token, CLI_PRINCIPAL, CLI_POLICY)
                    .await
                    .map_err(into_anyhow)?;
            if json {
                println!("{}", serde_json::json!({"status": status}));
            } else {
                println!("export {status}");
            }
        }
        ExportCommand::Download(args) => {
            let dir = artifact_dir(&args.dir, database_url)?;
            let (path, artifact) =
                opledger_supervise::jobs::artifact_path(engine, &dir, &args.token, CLI_PRINCIPAL, CLI_POLICY)
                    .await
                    .map_err(into_anyhow)?;
            let mut partial = args.out.as_os_str().to_owned();
            partial.push(".part");
            let partial = PathBuf::from(partial);
            std::fs::copy(&path, &partial).with_context(|| format!("writing {}", partial.display()))?;
            std::fs::rename(&partial, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
            if json {
                println!("{}", serde_json::to_string(&artifact)?);
            } else {
                println!("{} bytes written to {}", artifact.size, args.out.display());
            }
        }
    }
    Ok(())
}

/// `opledger __run-supervised export`: the child a supervisor starts.
/// True when it stopped after SIGTERM.
pub async fn run_supervised<S: Store>(engine: &Engine<S>, command: &RunSupervisedCommand) -> anyhow::Result<bool> {
    let RunSupervisedCommand::Export { spec, out } = command;
    let spec: ExportSpec =
        serde_json::from_str(spec).map_err(|error| UsageError(format!("--spec is not an export spec: {error}")))?;
    let args = ChildArgs { spec, out: out.clone() };
    let mut reports = std::io::stdout();
    let ended = run_child(engine.store(), &args, &mut reports)
        .await
        .map_err(into_anyhow)?;
    Ok(ended == ChildEnd::Stopped)
}
