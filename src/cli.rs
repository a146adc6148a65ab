//! The command line, as clap sees it.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// An event-sourced operations ledger for media pipelines.
#[derive(Debug, Parser)]
#[command(name = "opledger", version, about, propagate_version = true)]
pub struct Cli {
    /// Database to use: a SQLite file (`sqlite:PATH`, `sqlite:PATH?synchronous=normal`, or a bare path).
    #[arg(long, global = true, env = "OPLEDGER_DATABASE_URL", default_value = "opledger.db")]
    pub database_url: String,

    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Operations by status, media counts, projection positions and lag.
    Status,
    /// An operation's events in order, with actor, time and cause.
    Timeline {
        /// The operation's id.
        operation_id: String,
    },
    /// Rebuild every projection from the log into scratch tables.
    Replay(ReplayArgs),
    /// The media registry.
    Media {
        #[command(subcommand)]
        command: MediaCommand,
    },
    /// Benchmarks: JSON figures with the raw floor measured in the same run.
    Bench(BenchArgs),
    /// Generated documentation.
    #[command(hide = true)]
    Docs {
        #[command(subcommand)]
        command: DocsCommand,
    },
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Compare the rebuilt projections with the live ones; exit 1 on any difference.
    #[arg(long)]
    pub verify: bool,
}

#[derive(Debug, Subcommand)]
pub enum MediaCommand {
    /// Register a media item; prints its new id.
    Add {
        /// Where the file is.
        #[arg(long)]
        path: String,
        /// What kind of media it is.
        #[arg(long, default_value = "image")]
        kind: String,
        /// The content digest, e.g. `sha256:...`, when known.
        #[arg(long)]
        digest: Option<String>,
        /// The size in bytes, when known.
        #[arg(long)]
        size: Option<i64>,
    },
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which workload to run.
    pub workload: Workload,
    /// Events in the log the workload builds and measures.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
    /// Events per transaction for the batched append figure.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Events appended one per transaction for the unbatched figure.
    #[arg(long, default_value_t = 2_000)]
    pub unbatched_events: u64,
    /// Rounds of each measurement; figures are medians (ours and the floor alternate).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Folder for the benchmark databases (a temporary folder when absent).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Durable appends with inline projections, batched and unbatched.
    Append,
    /// Rebuilding every projection from the log.
    Replay,
}

#[derive(Debug, Subcommand)]
pub enum DocsCommand {
    /// Print docs/state-machines.md as generated from the transition table.
    StateMachines,
}
