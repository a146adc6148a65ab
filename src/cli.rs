//! The command line, as clap sees it.

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use opledger_domain::{BatchId, MediaId, OperationId, RegionId};
use opledger_engine::{CommandContext, RequestId, MAX_CLAIM_BATCH, MAX_LEASE_MS};
use std::path::PathBuf;

/// The default bound on a text flag, in bytes (`--max-text-bytes`; what
/// it bounds and why: `limits`).
pub const DEFAULT_MAX_TEXT_BYTES: usize = 64 * 1024;

/// An event-sourced operations ledger for media pipelines.
#[derive(Debug, Parser)]
#[command(name = "opledger", version, about, propagate_version = true)]
pub struct Cli {
    /// Database to use: a SQLite file (`sqlite:PATH`, `sqlite:PATH?synchronous=normal`, or a bare path),
    /// or `postgres://USER@HOST:PORT/DATABASE` (`?connect_timeout=SECONDS`, default 5).
    #[arg(long, global = true, env = "OPLEDGER_DATABASE_URL", default_value = "opledger.db")]
    pub database_url: String,

    /// The most bytes a text flag takes (`--error`, `--reason`, `--output`, `--no-result`);
    /// longer ones are refused and nothing is recorded. `serve` holds every
    /// text of a request body, and every output, to the same bound.
    #[arg(long, global = true, env = "OPLEDGER_MAX_TEXT_BYTES", default_value_t = DEFAULT_MAX_TEXT_BYTES, value_name = "BYTES")]
    pub max_text_bytes: usize,

    /// The most task kinds the catalogue may hold (`kinds apply` and the
    /// HTTP service refuse a declaration past it).
    #[arg(long, global = true, env = "OPLEDGER_MAX_KINDS", default_value_t = opledger_engine::DEFAULT_MAX_KINDS,
          value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_kinds: usize,

    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

impl Command {
    /// Whether the command only reads: it opens the store read-only, so it
    /// works on a read-only file or a role granted only SELECT, and never
    /// migrates, catches projections up, rebuilds or runs maintenance
    /// (see `main::dispatch`). One line per reading command.
    pub fn reads_only(&self) -> bool {
        match self {
            Command::Status(_) | Command::Timeline(_) | Command::Describe(_) | Command::Capabilities { .. } => true,
            Command::Kinds {
                command: KindsCommand::List | KindsCommand::Show { .. },
            } => true,
            Command::Review {
                command: ReviewCommand::List(_),
            } => true,
            Command::Media {
                command: MediaCommand::Show(_) | MediaCommand::List(_),
            } => true,
            Command::Ops {
                command: OpsCommand::List(_),
            } => true,
            Command::Batch {
                command: BatchCommand::Show { .. } | BatchCommand::List { .. },
            } => true,
            Command::Task {
                command: TaskCommand::Show(_),
            } => true,
            Command::Replay(args) => !args.rebuild,
            // The export child reads the log only; status and download read.
            Command::RunSupervised { .. } => true,
            Command::Export {
                command: crate::supervise::ExportCommand::Status(_) | crate::supervise::ExportCommand::Download(_),
            } => true,
            _ => false,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Ingest a folder of images: every file through its stages, its image
    /// tasks run by local workers; a second run does only what changed.
    Ingest(IngestArgs),
    /// Write a folder of generated sample images (and, optionally, corrupt files).
    SampleMedia(SampleMediaArgs),
    /// Operations by status, media counts, projection positions and lag.
    Status(StatusArgs),
    /// An operation's events in order, as a history: local time, the time
    /// since the step before, who, what.
    Timeline(TimelineArgs),
    /// One operation explained: where it stands, why (one sentence), and
    /// its history.
    Describe(DescribeArgs),
    /// Rebuild every projection from the log into scratch tables (`--verify`
    /// compares them with the live ones), or repair the live ones (`--rebuild`).
    Replay(ReplayArgs),
    /// The media registry: register, show and list media items.
    Media {
        #[command(subcommand)]
        command: MediaCommand,
    },
    /// Operations: list them newest first, filtered.
    Ops {
        #[command(subcommand)]
        command: OpsCommand,
    },
    /// The application's task kinds: declare them from a TOML file, list and show them.
    Kinds {
        #[command(subcommand)]
        command: KindsCommand,
    },
    /// The work protocol, for shell and foreign-language workers.
    Task {
        #[command(subcommand)]
        command: TaskCommand,
    },
    /// Batches: named runs over a fixed set of items, with exact progress.
    Batch {
        #[command(subcommand)]
        command: BatchCommand,
    },
    /// The review queue: work that needs a person.
    Review {
        #[command(subcommand)]
        command: ReviewCommand,
    },
    /// Request again, in one batch, every result a new version of its kind made stale.
    Reprocess(ReprocessArgs),
    /// A media item's capability states: what it can serve now, and if not, why.
    Capabilities {
        /// The media item.
        #[arg(long, value_name = "ID")]
        media: MediaId,
    },
    /// One recovery pass: claims whose lease expired are interrupted, then
    /// requeued, cancelled or failed per their task kind's policy.
    Recover,
    /// Serve the JSON API, the work protocol over HTTP, live updates and the
    /// dashboard, until SIGTERM or Ctrl-C.
    Serve(ServeArgs),
    /// Bearer tokens for `serve`: make one and add its hash to a tokens file.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Benchmarks: JSON figures with the raw floor measured in the same run.
    Bench(BenchArgs),
    /// Run supervised jobs (exports), each in a child process with limits
    /// enforced from outside, until SIGTERM or Ctrl-C.
    Supervise(crate::supervise::SuperviseArgs),
    /// Exports of the ledger as files: create, status, cancel, download.
    Export {
        #[command(subcommand)]
        command: crate::supervise::ExportCommand,
    },
    /// The child a supervisor starts (not for people).
    #[command(name = "__run-supervised", hide = true)]
    RunSupervised {
        #[command(subcommand)]
        command: crate::supervise::RunSupervisedCommand,
    },
    /// Generated documentation.
    #[command(hide = true)]
    Docs {
        #[command(subcommand)]
        command: DocsCommand,
    },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on. A non-loopback address needs `--tokens`.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub bind: std::net::SocketAddr,
    /// The tokens file (`opledger token new` writes it): SHA-256 hashes of
    /// bearer tokens with their roles.
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<std::path::PathBuf>,
    /// Reading routes answer without a token.
    #[arg(long)]
    pub allow_anonymous_read: bool,
    /// The largest request body accepted, in bytes (larger is 413).
    #[arg(long, value_name = "BYTES", default_value_t = opledger_http::DEFAULT_BODY_LIMIT as u64,
          value_parser = clap::value_parser!(u64).range(1024..=(64 << 20)))]
    pub body_limit: u64,
    /// Seconds between the recovery passes the service runs itself.
    #[arg(long, value_name = "SECONDS", value_parser = interval_seconds, default_value = "5")]
    pub recovery_interval: std::time::Duration,
    /// Request logs on standard error: `text`, or `json` (one object a line).
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Where the export routes find jobs' artifacts: the directory the
    /// supervisors of this ledger share.
    #[command(flatten)]
    pub artifacts: crate::supervise::DirArgs,
    /// A directory worker-reported output files (thumbnails) may be served
    /// from, besides `thumbnails/` beside the database, which the reference
    /// pipeline writes (repeatable). A recorded path that resolves, links
    /// followed, anywhere else is never served.
    #[arg(long = "outputs-dir", value_name = "DIR")]
    pub outputs_dirs: Vec<std::path::PathBuf>,
    /// The largest output file served, in bytes (a larger one is 404).
    #[arg(long, value_name = "BYTES", default_value_t = opledger_http::DEFAULT_MAX_FILE_BYTES)]
    pub max_file_bytes: u64,
    /// Seconds a client has to send a request's headers, from connecting or
    /// from the end of its previous response (so also how long an idle
    /// connection is kept); a slower one is disconnected.
    #[arg(long, value_name = "SECONDS", value_parser = interval_seconds, default_value = "10")]
    pub header_timeout: std::time::Duration,
    /// Seconds a client has to send a request's body once its headers came
    /// (a slower one is answered 408).
    #[arg(long, value_name = "SECONDS", value_parser = interval_seconds, default_value = "30")]
    pub body_timeout: std::time::Duration,
    /// Connections served at once; one more is answered 503 and closed.
    #[arg(long, value_name = "N", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// Seconds shutdown waits for requests in flight before dropping them.
    #[arg(long, value_name = "SECONDS", value_parser = interval_seconds, default_value = "10")]
    pub shutdown_grace: std::time::Duration,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token: prints it once on standard output and appends its
    /// hash, name and role to the tokens file (created 0600).
    New(TokenNewArgs),
}

#[derive(Debug, Args)]
pub struct TokenNewArgs {
    /// `reader` (reads), `worker` (the work protocol) or `admin` (everything).
    #[arg(long, value_parser = ["reader", "worker", "admin"])]
    pub role: String,
    /// A name for the token, recorded as the actor of what it does.
    #[arg(long)]
    pub name: String,
    /// Task kinds a worker token is limited to (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "KIND,...")]
    pub kinds: Vec<String>,
    /// The tokens file to append to.
    #[arg(long, value_name = "FILE")]
    pub tokens_file: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the summary again each time the ledger changes, until Ctrl-C
    /// (with `--json`, one compact object a line).
    #[arg(long)]
    pub watch: bool,
    /// How often `--watch` looks for a change, in seconds.
    #[arg(long, value_name = "SECONDS", value_parser = interval_seconds, default_value = "1", requires = "watch")]
    pub interval: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct TimelineArgs {
    /// The operation's id.
    pub operation_id: OperationId,
    /// Then print new events as they are appended, until Ctrl-C (with
    /// `--json`, one compact envelope a line).
    #[arg(long)]
    pub follow: bool,
    /// Every field of every event: seq, UTC time, actor, causation,
    /// correlation and the whole payload.
    #[arg(long)]
    pub verbose: bool,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// The operation's id.
    pub operation_id: OperationId,
    /// Show the timeline with every field of every event.
    #[arg(long)]
    pub verbose: bool,
}

/// A polling interval in seconds: more than 0, at most an hour.
fn interval_seconds(text: &str) -> Result<std::time::Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(seconds) if (0.05..=3_600.0).contains(&seconds) => Ok(std::time::Duration::from_secs_f64(seconds)),
        _ => Err(format!(
            "an interval is a number of seconds from 0.05 to 3600, not {:?}",
            text.chars().take(40).collect::<String>()
        )),
    }
}

/// Task kinds are declared by the application, in a TOML file of
/// `[[kind]]` tables (see `examples/pipeline.toml`), and recorded in the log.
#[derive(Debug, Subcommand)]
pub enum KindsCommand {
    /// Declare the kinds of a file: new ones are declared, unchanged ones
    /// append nothing, a new version makes older results stale; any refusal
    /// records nothing.
    Apply {
        /// The declaration file (`-` reads standard input).
        file: PathBuf,
        /// Decide and report, record nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Every task kind with its version, capability and policy.
    List,
    /// One task kind: inputs with their constraints and defaults, needs, policy.
    Show {
        /// The kind's name.
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct ReprocessArgs {
    /// Every stale result (the only selection there is, and so required).
    #[arg(long, required = true)]
    pub stale: bool,
    /// Only this kind's.
    #[arg(long)]
    pub kind: Option<String>,
    /// The batch's name (default `reprocess stale KINDS`).
    #[arg(long)]
    pub batch_name: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Compare the rebuilt projections with the live ones; exit 1 on any difference.
    #[arg(long, conflicts_with = "rebuild")]
    pub verify: bool,
    /// Rebuild every live projection from the log (through shadow tables
    /// swapped in), repairing rows that drifted from it.
    #[arg(long)]
    pub rebuild: bool,
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
        /// The content digest when known: `sha256:` and 64 lowercase hex digits.
        #[arg(long, value_parser = content_digest)]
        digest: Option<String>,
        /// The size in bytes, when known.
        #[arg(long)]
        size: Option<i64>,
        /// Register the path even when a media item already has it.
        #[arg(long)]
        allow_duplicate_path: bool,
    },
    /// A media item with its capabilities, operations, batches, open review
    /// entries and thumbnail, by id or by path.
    Show(MediaShowArgs),
    /// Media items by path (bytewise), a page at a time.
    List(MediaListArgs),
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("item").required(true).args(["media_id", "path"])))]
pub struct MediaShowArgs {
    /// The media item's id.
    pub media_id: Option<String>,
    /// The item at this path (the latest registered, when several are).
    #[arg(long)]
    pub path: Option<String>,
}

/// Which page of a listing: `--limit` rows from where `--after` says.
#[derive(Debug, Args)]
pub struct PageArgs {
    /// Rows on the page, 1 to 1000.
    #[arg(long, default_value_t = opledger_engine::DEFAULT_PAGE_LIMIT, value_parser = page_limit, allow_negative_numbers = true)]
    pub limit: usize,
    /// Start after this cursor: the `next` of the page before.
    #[arg(long, value_name = "CURSOR")]
    pub after: Option<String>,
}

#[derive(Debug, Args)]
pub struct MediaListArgs {
    /// Only items of this media kind (e.g. `image`).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only items whose capability of this name ...
    #[arg(long)]
    pub capability: Option<String>,
    /// ... is in this status (repeat for several; any status when absent).
    #[arg(long = "capability-status", value_name = "STATUS", requires = "capability")]
    pub capability_statuses: Vec<String>,
    /// Only items whose path starts with this text (exact case).
    #[arg(long)]
    pub path_prefix: Option<String>,
    #[command(flatten)]
    pub page: PageArgs,
}

#[derive(Debug, Subcommand)]
pub enum OpsCommand {
    /// Operations newest first (with --batch: last item first), a page at a time.
    List(OpsListArgs),
}

#[derive(Debug, Args)]
pub struct OpsListArgs {
    /// Only operations in this status (repeat for several).
    #[arg(long = "status", value_name = "STATUS")]
    pub statuses: Vec<String>,
    /// Only operations of this kind (repeat for several).
    #[arg(long = "kind", value_name = "KIND")]
    pub kinds: Vec<String>,
    /// Only the items of this batch.
    #[arg(long, value_name = "ID")]
    pub batch: Option<String>,
    /// Only operations on this media item.
    #[arg(long, value_name = "ID")]
    pub media: Option<String>,
    /// Only operations created at or after this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only operations created before this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Only operations this worker holds now.
    #[arg(long)]
    pub worker: Option<String>,
    #[command(flatten)]
    pub page: PageArgs,
}

fn page_limit(text: &str) -> Result<usize, String> {
    let max = opledger_engine::MAX_PAGE_LIMIT;
    match text.trim().parse::<i64>() {
        Ok(limit) if (1..=max as i64).contains(&limit) => Ok(limit as usize),
        _ => Err(format!("a page holds 1 to {max} rows")),
    }
}

/// The work protocol. A worker claims tasks, heartbeats within its lease,
/// reports progress, and completes or fails each task with the claim token it
/// was given; a report whose token no longer holds the task exits 3.
#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Request a task kind on a media item or region at the revision its inputs determine.
    Request(RequestArgs),
    /// Claim available tasks (after one recovery pass); prints the claim(s), or a null token.
    #[command(disable_version_flag = true)]
    Claim(ClaimArgs),
    /// Extend a claim's lease; tells whether cancellation was requested.
    Heartbeat(HeartbeatArgs),
    /// Report progress of a claimed task.
    Progress(ProgressArgs),
    /// Record a claimed task's result.
    Complete(CompleteArgs),
    /// Record a claimed task's failure (retried with backoff unless `--terminal`).
    Fail(FailArgs),
    /// Cancel a task: at once when unclaimed, else at its worker's next heartbeat.
    Cancel(CancelArgs),
    /// The worker stopped and cleaned up after a cancel request: the task is cancelled.
    AckCancel(TokenArgs),
    /// Give a claim back unused: the task is queued again at once, counted
    /// neither as an attempt nor as a failure.
    Release(ReleaseArgs),
    /// A task's processing state.
    Show(ShowArgs),
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["media", "region"])))]
pub struct RequestArgs {
    /// The media item to run a media task kind on.
    #[arg(long, value_name = "ID")]
    pub media: Option<MediaId>,
    /// The region to run a region task kind on (e.g. crop_embedding).
    #[arg(long, value_name = "ID")]
    pub region: Option<RegionId>,
    /// The task kind, one of the declared ones (`opledger kinds list`).
    #[arg(long)]
    pub kind: String,
    /// The inputs as a JSON object (`-` reads them from stdin); what the target provides is filled in.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    pub inputs: String,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i32,
    #[command(flatten)]
    pub retry: RetryArgs,
}

/// The request id of a writing command a caller may retry.
#[derive(Debug, Clone, Default, Args)]
pub struct RetryArgs {
    /// Names this command for its retries (1-200 visible ASCII characters,
    /// e.g. a UUID): run again with the same id, after a timeout or a lost
    /// answer, it prints the first run's result and records nothing more;
    /// the same id for another command exits 3. Kept 7 days.
    #[arg(long, value_name = "ID", value_parser = request_id)]
    pub request_id: Option<RequestId>,
}

impl RetryArgs {
    /// `actor`'s command context, carrying the request id when given.
    pub fn context(&self, actor: impl Into<String>) -> CommandContext {
        let context = CommandContext::actor(actor);
        match &self.request_id {
            Some(request_id) => context.with_request_id(request_id.clone()),
            None => context,
        }
    }
}

fn request_id(text: &str) -> Result<RequestId, String> {
    RequestId::new(text).map_err(|error| error.to_string())
}

#[derive(Debug, Args)]
pub struct ClaimArgs {
    /// Task kinds to take (repeat, or separate with commas); any kind when absent.
    #[arg(long = "kind", value_name = "KIND", value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// A version of the kind this worker's code implements (repeat): only
    /// tasks requested at a stated version are offered. `KIND=VERSION`
    /// names the kind; a bare `VERSION` is of the one `--kind`. Without
    /// it, any version is offered (unsafe: old code may run work requested
    /// for a newer version).
    #[arg(long = "version", value_name = "[KIND=]VERSION")]
    pub versions: Vec<String>,
    /// Who claims: recorded on the claim and shown on the timeline.
    #[arg(long)]
    pub worker: String,
    /// How long the claim holds without a heartbeat, in whole seconds.
    #[arg(long, value_name = "SECONDS", value_parser = lease_seconds, allow_negative_numbers = true)]
    pub lease: i64,
    /// How many tasks to take at most; above 1 the answer is `{"claims": [...]}`.
    #[arg(long, default_value_t = 1, value_parser = claim_limit, allow_negative_numbers = true)]
    pub limit: usize,
    #[command(flatten)]
    pub retry: RetryArgs,
}

/// The claim a worker reports on.
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The claim token `task claim` printed.
    #[arg(value_parser = claim_token)]
    pub token: String,
    /// The revision the claim runs; when given it must match too.
    #[arg(long)]
    pub revision: Option<String>,
    /// Recorded as the actor of any event this report appends (default `cli`).
    #[arg(long)]
    pub worker: Option<String>,
    #[command(flatten)]
    pub retry: RetryArgs,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub claim: TokenArgs,
    /// Why, recorded on the timeline.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
}

#[derive(Debug, Args)]
pub struct HeartbeatArgs {
    #[command(flatten)]
    pub claim: TokenArgs,
    /// Extend the lease to this many seconds from now (default: the length the claim took).
    #[arg(long, value_name = "SECONDS", value_parser = lease_seconds, allow_negative_numbers = true)]
    pub lease: Option<i64>,
}

#[derive(Debug, Args)]
pub struct ProgressArgs {
    #[command(flatten)]
    pub claim: TokenArgs,
    /// What the task is doing, e.g. `aggregating`; a new phase is an event on the timeline.
    #[arg(long)]
    pub phase: String,
    /// Units really done so far.
    #[arg(long, allow_negative_numbers = true)]
    pub processed: i64,
    /// Units in all, when known.
    #[arg(long, allow_negative_numbers = true)]
    pub total: Option<i64>,
}

#[derive(Debug, Args)]
pub struct CompleteArgs {
    #[command(flatten)]
    pub claim: TokenArgs,
    /// The task's output as JSON (`-` reads it from stdin); null when absent.
    #[arg(long, value_name = "JSON", conflicts_with = "no_result")]
    pub output: Option<String>,
    /// The task ran and found nothing to produce, for this reason.
    #[arg(long, value_name = "REASON")]
    pub no_result: Option<String>,
}

#[derive(Debug, Args)]
pub struct FailArgs {
    #[command(flatten)]
    pub claim: TokenArgs,
    /// What went wrong.
    #[arg(long, value_name = "TEXT")]
    pub error: String,
    /// Do not retry: the failure is final.
    #[arg(long)]
    pub terminal: bool,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The task's operation id.
    pub operation_id: OperationId,
    /// Why, recorded on the timeline.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    #[command(flatten)]
    pub retry: RetryArgs,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("task").required(true).args(["media", "region", "operation"])))]
pub struct ShowArgs {
    /// The media item the task runs on (with `--kind`).
    #[arg(long, value_name = "ID")]
    pub media: Option<MediaId>,
    /// The region the task runs on (with `--kind`).
    #[arg(long, value_name = "ID")]
    pub region: Option<RegionId>,
    /// The task's operation id.
    #[arg(long, value_name = "ID")]
    pub operation: Option<OperationId>,
    /// The task kind, with `--media` or `--region`.
    #[arg(long, required_unless_present = "operation", conflicts_with = "operation")]
    pub kind: Option<String>,
}

/// A lease in whole seconds, 1 up to the engine's longest lease.
fn lease_seconds(text: &str) -> Result<i64, String> {
    let max = MAX_LEASE_MS / 1_000;
    let seconds: i64 = text.trim().parse().map_err(|_| {
        format!(
            "a lease is a whole number of seconds (1 to {max}), not {}",
            opledger_domain::quoted(text)
        )
    })?;
    if !(1..=max).contains(&seconds) {
        return Err(format!(
            "a lease must be between 1 and {max} seconds ({} days), not {seconds}",
            max / 86_400
        ));
    }
    Ok(seconds)
}

/// A claim token as `task claim` prints it (a UUID); anything else is bad
/// input (exit 2), not a claim that lost its task (exit 3).
fn claim_token(text: &str) -> Result<String, String> {
    match uuid::Uuid::try_parse(text.trim()) {
        Ok(_) => Ok(text.trim().to_string()),
        Err(_) => Err(format!(
            "a claim token is the UUID `task claim` printed, not {}",
            opledger_domain::quoted(text)
        )),
    }
}

/// A content digest: `sha256:` and 64 lowercase hex digits.
fn content_digest(text: &str) -> Result<String, String> {
    opledger_domain::digest::check(text).map(|()| text.to_string())
}

fn claim_limit(text: &str) -> Result<usize, String> {
    match text.trim().parse::<i64>() {
        Ok(limit) if (1..=MAX_CLAIM_BATCH as i64).contains(&limit) => Ok(limit as usize),
        _ => Err(format!(
            "a claim takes 1 to {MAX_CLAIM_BATCH} tasks, not {}",
            opledger_domain::quoted(text)
        )),
    }
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
    /// Tasks the lifecycle workload runs (half metadata, half thumbnail).
    #[arg(long, default_value_t = 10_000)]
    pub tasks: u64,
    /// Worker counts the lifecycle workload measures, one run each (e.g. `1,4`).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub workers: Vec<usize>,
    /// Tasks each lifecycle worker claims per call.
    #[arg(long, default_value_t = 32)]
    pub claim_batch: usize,
    /// Folder for the benchmark databases (a temporary folder when absent).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Images the ingest workload generates and ingests.
    #[arg(long, default_value_t = 1_000)]
    pub files: usize,
    /// `ingest` only: generate this many camera-sized JPEGs instead and
    /// measure them against the floor (read, SHA-256, one reduced-size decode).
    #[arg(long, value_name = "N")]
    pub photos: Option<usize>,
    /// The size of the generated photos (`--photos`), in megapixels.
    #[arg(long, default_value_t = 12.0)]
    pub megapixels: f64,
    /// Queries the status and timeline workloads time.
    #[arg(long, default_value_t = 1_000)]
    pub samples: usize,
    /// Append the figures to `<DIR>/<workload>.jsonl` (one JSON object a
    /// line, with the time, commit and cores); DIR defaults to `benches/results`.
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true, default_missing_value = "benches/results")]
    pub record: Option<PathBuf>,
}

impl BenchArgs {
    /// The options of the benchmark crate's run.
    pub fn options(&self) -> opledger_bench::Options {
        opledger_bench::Options {
            workload: match self.workload {
                Workload::Append => opledger_bench::Workload::Append,
                Workload::Replay => opledger_bench::Workload::Replay,
                Workload::Lifecycle => opledger_bench::Workload::Lifecycle,
                Workload::Ingest => opledger_bench::Workload::Ingest,
                Workload::Status => opledger_bench::Workload::Status,
                Workload::Timeline => opledger_bench::Workload::Timeline,
                Workload::Export => opledger_bench::Workload::Export,
                Workload::Http => opledger_bench::Workload::Http,
            },
            events: self.events,
            batch: self.batch,
            unbatched_events: self.unbatched_events,
            rounds: self.rounds,
            tasks: self.tasks,
            workers: self.workers.clone(),
            claim_batch: self.claim_batch,
            dir: self.dir.clone(),
            files: self.files,
            photos: self.photos,
            megapixels: self.megapixels,
            samples: self.samples,
            record: self.record.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Durable appends with inline projections, batched and unbatched.
    Append,
    /// Rebuilding every projection from the log.
    Replay,
    /// Tasks through request, claim and complete with every projection updated, N workers.
    Lifecycle,
    /// `opledger ingest` of generated images with N workers; the ledger's share of the wall time.
    Ingest,
    /// Latency of the dashboard summary in a log of `--events` events.
    Status,
    /// Latency of one operation's timeline in a log of `--events` events.
    Timeline,
    /// The lifecycle over HTTP: an in-process `opledger serve` and N worker clients, against the in-process figure.
    Http,
    /// Seconds and peak RSS of exporting `operations` as CSV from a log of `--events` events, beside a plain scan.
    Export,
}

#[derive(Debug, Subcommand)]
pub enum DocsCommand {
    /// Print docs/state-machines.md as generated from the transition table.
    StateMachines,
    /// Print docs/cli.md: every command with its help, arguments and options.
    Cli,
    /// Print docs/http.md: every route of the OpenAPI document, and its schemas.
    Http,
}

#[derive(Debug, Subcommand)]
pub enum BatchCommand {
    /// Request task kinds on media items as one batch; prints the batch.
    Create(BatchCreateArgs),
    /// A batch's exact progress and a page of its items.
    Show {
        /// The batch id.
        batch_id: BatchId,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Batches, newest first (active ones only with --active), a page at a time.
    List {
        #[arg(long)]
        active: bool,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Cancel a batch: waiting and blocked items now, running ones at their
    /// next heartbeat. Prints the batch's progress and how many items were
    /// cancelled, asked to stop or already settled; the items with --verbose.
    Cancel {
        batch_id: BatchId,
        #[arg(long, default_value = "")]
        reason: String,
        /// Print every item of the batch too (in --json, an `items` array).
        #[arg(long)]
        verbose: bool,
        #[command(flatten)]
        retry: RetryArgs,
    },
    /// Run a batch's failed and cancelled items again, in the same batch.
    Resume {
        batch_id: BatchId,
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        retry: RetryArgs,
    },
}

#[derive(Debug, Args)]
pub struct BatchCreateArgs {
    /// The batch's name.
    #[arg(long)]
    pub name: String,
    /// Media items (repeat the flag or give several ids).
    #[arg(long, value_name = "ID", num_args = 1.., required_unless_present = "media_file")]
    pub media: Vec<MediaId>,
    /// A file of media ids, one a line (`-`: standard input), beside or
    /// instead of --media: for more items than a command line holds. Blank
    /// lines are skipped; a line that is not an id refuses the batch,
    /// naming its line, and nothing is recorded.
    #[arg(long, value_name = "FILE")]
    pub media_file: Option<std::path::PathBuf>,
    /// Task kinds to run on every item (repeat or give several).
    #[arg(long, value_name = "KIND", num_args = 1.., required = true)]
    pub kind: Vec<String>,
    /// Inputs of one kind as KIND=JSON, over the kind's defaults (repeatable).
    #[arg(long, value_name = "KIND=JSON")]
    pub inputs: Vec<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0)]
    pub priority: i32,
    #[command(flatten)]
    pub retry: RetryArgs,
}

#[derive(Debug, Subcommand)]
pub enum ReviewCommand {
    /// Open entries, oldest first, a page at a time.
    List(PageArgs),
    /// Resolve an entry by a recorded action.
    Resolve(ResolveArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ReviewActionArg {
    Retry,
    Dismiss,
    Acknowledge,
}

/// One entry by its id, or with `--all` every open entry the filters
/// match, each resolved as its own recorded action.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("entries").required(true).args(["entry_id", "all"])))]
pub struct ResolveArgs {
    /// The entry id (from `review list`).
    pub entry_id: Option<i64>,
    /// Every open entry the filters match, oldest first.
    #[arg(long)]
    pub all: bool,
    #[arg(long, value_enum)]
    pub action: ReviewActionArg,
    /// Retry at this revision (the requested one, or one requested before).
    #[arg(long, conflicts_with = "all")]
    pub revision: Option<String>,
    /// Why: recorded with the action.
    #[arg(long, default_value = "")]
    pub reason: String,
    /// With --all: only entries of this operation kind.
    #[arg(long, conflicts_with = "entry_id")]
    pub kind: Option<String>,
    /// With --all: only entries with this reason code (failed_terminal,
    /// dead_lettered, blocked, missing_required, source_missing).
    #[arg(long, conflicts_with = "entry_id", value_parser = reason_code)]
    pub reason_code: Option<opledger_domain::review::ReasonCode>,
    /// With --all: only entries of operations in this batch.
    #[arg(long, value_name = "ID", conflicts_with = "entry_id")]
    pub batch: Option<BatchId>,
    /// With --all: print what would be resolved, and append nothing.
    #[arg(long, conflicts_with = "entry_id")]
    pub dry_run: bool,
    /// With --all: resolve at most this many entries.
    #[arg(long, conflicts_with = "entry_id", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// With --all, each entry's resolution is recorded under `ID/ENTRY`.
    #[command(flatten)]
    pub retry: RetryArgs,
}

fn reason_code(text: &str) -> Result<opledger_domain::review::ReasonCode, String> {
    text.parse()
}

#[derive(Debug, Args)]
pub struct IngestArgs {
    /// The folder to ingest (walked recursively).
    pub dir: PathBuf,
    /// The batch's name (default: `ingest <folder>`).
    #[arg(long)]
    pub batch_name: Option<String>,
    /// Local workers running the image tasks (default: the number of cores).
    #[arg(long)]
    pub workers: Option<usize>,
    /// How long a file must stay unchanged before it is read, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub settle_ms: u64,
    /// How long, in seconds, the image workers keep trying while the
    /// database cannot take their writes (a full disk, an unreachable
    /// server) before the ingest stops with exit 5; the next run resumes.
    #[arg(long, default_value_t = 60)]
    pub give_up_after: u64,
}

#[derive(Debug, Args)]
pub struct SampleMediaArgs {
    /// The folder to write into (created if missing).
    pub dir: PathBuf,
    /// How many images.
    #[arg(long, default_value_t = 24)]
    pub count: usize,
    /// How many corrupt files besides (a truncated PNG, a text file named .jpg, an empty .png).
    #[arg(long, default_value_t = 0)]
    pub corrupt: usize,
    /// The same seed writes the same images.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}
