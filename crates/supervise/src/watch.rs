//! One job's supervision: the child started, its reports read, a look
//! every second (heartbeats, a cancel request, the limits), the child
//! stopped (SIGTERM, the grace, SIGKILL) and reaped, its files removed or
//! its artifact renamed into place — and only then the outcome recorded,
//! under the supervisor's command context (`context`; `fail` is how the
//! patrol, too, records a job that failed for good).

use crate::dir::ArtifactDir;
use crate::export::{ChildReport, ExportSpec};
use crate::jobs::{output_value, Artifact, ExportOutput};
use crate::live::{write_job, JobLive};
use crate::{FailReason, SuperviseError, SupervisorOptions};
use opledger_domain::decide::OperationCommand;
use opledger_domain::projections::OperationRow;
use opledger_domain::{Cause, OperationId, Timestamp};
use opledger_engine::{CommandContext, Engine};
use opledger_store::Store;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

/// Why a child is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Cancelled,
    Failed(FailReason),
}

/// One claimed job and everything its supervision needs.
pub(crate) struct Job<S: Store> {
    pub(crate) engine: Engine<S>,
    pub(crate) dir: ArtifactDir,
    pub(crate) options: SupervisorOptions,
    pub(crate) row: OperationRow,
    pub(crate) spec: ExportSpec,
    pub(crate) claim_token: String,
}

impl<S: Store> Job<S> {
    fn id(&self) -> OperationId {
        self.row.operation_id
    }

    async fn command(&self, command: OperationCommand) -> Result<(), SuperviseError> {
        self.engine
            .operation_command(&context(&self.options.name), self.id(), command)
            .await?;
        Ok(())
    }

    async fn progress(&self, phase: &str, processed: u64, total: Option<u64>) -> Result<(), SuperviseError> {
        self.command(OperationCommand::Progress {
            claim_token: self.claim_token.clone(),
            phase: phase.to_string(),
            processed: i64::try_from(processed).unwrap_or(i64::MAX),
            total: total.map(|total| i64::try_from(total).unwrap_or(i64::MAX)),
        })
        .await
    }

    fn write_live(&self, live: &JobLive) {
        if let Err(error) = write_job(&self.dir, self.id(), live) {
            tracing::warn!(%error, "job heartbeat not written");
        }
    }

    pub(crate) async fn supervise(self) -> Result<(), SuperviseError> {
        self.command(OperationCommand::Start {
            claim_token: self.claim_token.clone(),
        })
        .await?;
        // Recorded before the child's first query; the size is not known.
        self.progress("aggregating", 0, None).await?;
        let now = self.engine.now();
        let mut live = JobLive {
            supervisor: self.options.name.clone(),
            heartbeat_at: now,
            updated_at: now,
            phase: "aggregating".to_string(),
            processed: 0,
            total: None,
            logical_count_unit: Some(self.spec.count_unit().to_string()),
            regular_rows: None,
            child_pid: None,
        };
        self.write_live(&live);
        let temporary = self.dir.temporary(self.id());
        let mut command = tokio::process::Command::new(&self.options.exe);
        // The URL goes in the environment, not on a command line every
        // user of the machine can read.
        command
            .env("OPLEDGER_DATABASE_URL", &self.options.database_url)
            .arg("__run-supervised")
            .arg("export")
            .arg("--spec")
            .arg(serde_json::to_string(&self.spec).expect("a spec serializes"))
            .arg("--out")
            .arg(&temporary)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe and touches no memory of the
        // parent; it runs in the forked child before exec.
        unsafe {
            command.pre_exec(|| {
                // The child dies with its supervisor (SIGKILL included), so
                // a job failed for a lost supervisor is not still running.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .map_err(SuperviseError::io(format!("starting {}", self.options.exe.display())))?;
        let pid = child.id();
        live.child_pid = pid;
        self.write_live(&live);
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let stderr_text = tokio::spawn(async move {
            let mut text = String::new();
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
            text
        });
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut stopping: Option<Stop> = None;
        let mut kill_at: Option<tokio::time::Instant> = None;
        let mut done: Option<ChildReport> = None;
        let mut recorded_phase = "aggregating".to_string();
        let mut stdout_open = true;
        let exit = loop {
            tokio::select! {
                exit = child.wait() => break exit.map_err(SuperviseError::io("waiting for the export child"))?,
                line = lines.next_line(), if stdout_open => match line {
                    Ok(Some(line)) => self.take_report(&line, &mut live, &mut recorded_phase, &mut done).await?,
                    _ => stdout_open = false,
                },
                _ = tick.tick() => {
                    live.heartbeat_at = self.engine.now();
                    self.write_live(&live);
                    if stopping.is_none() {
                        stopping = self.check_limits(started).await;
                        if stopping.is_some() {
                            signal(pid, libc::SIGTERM);
                            kill_at = Some(tokio::time::Instant::now() + self.options.limits.grace);
                        }
                    }
                }
                () = sleep_until(kill_at) => {
                    signal(pid, libc::SIGKILL);
                    kill_at = None;
                }
            }
        };
        // What the child wrote before it exited is still to be read.
        while stdout_open {
            match lines.next_line().await {
                Ok(Some(line)) => {
                    self.take_report(&line, &mut live, &mut recorded_phase, &mut done)
                        .await?
                }
                _ => stdout_open = false,
            }
        }
        // The child is reaped (`wait` returned): only now is anything
        // recorded about how it ended.
        let context_text = stderr_text.await.unwrap_or_default();
        let _ = std::fs::remove_file(self.dir.job_live(self.id()));
        if stopping.is_none() && exit.success() {
            if let Some(ChildReport::Done {
                size,
                sha256,
                processed,
                total,
                regular_rows,
            }) = done
            {
                stopping = self.check_done(size).await;
                if stopping.is_none() {
                    return self.succeed(size, sha256, processed, total, regular_rows).await;
                }
            }
        }
        self.dir.remove_job_files(self.id());
        match stopping {
            Some(Stop::Cancelled) => {
                self.command(OperationCommand::Transition {
                    cause: Cause::Cancel,
                    reason: "cancelled".to_string(),
                })
                .await
            }
            Some(Stop::Failed(reason)) => {
                fail(
                    &self.engine,
                    &context(&self.options.name),
                    self.id(),
                    &self.claim_token,
                    reason,
                )
                .await
            }
            None => {
                let said = context_text.lines().last().unwrap_or("").trim();
                self.command(OperationCommand::Fail {
                    claim_token: self.claim_token.clone(),
                    error: format!(
                        "{}: the export child ended with {exit}{}",
                        FailReason::ChildFailed.as_str(),
                        if said.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", opledger_domain::quote(said))
                        }
                    ),
                    retryable: false,
                })
                .await
            }
        }
    }

    /// Takes one line of the child's: progress is written to the job's
    /// liveness file, and a new phase recorded on its timeline.
    async fn take_report(
        &self,
        line: &str,
        live: &mut JobLive,
        recorded_phase: &mut String,
        done: &mut Option<ChildReport>,
    ) -> Result<(), SuperviseError> {
        match serde_json::from_str::<ChildReport>(line) {
            Ok(ChildReport::Progress {
                phase,
                processed,
                total,
                regular_rows,
            }) => {
                live.updated_at = self.engine.now();
                live.processed = processed;
                live.total = total;
                live.regular_rows = regular_rows;
                live.phase = phase.clone();
                self.write_live(live);
                if phase != *recorded_phase {
                    self.progress(&phase, processed, total).await?;
                    *recorded_phase = phase;
                }
            }
            Ok(report @ ChildReport::Done { .. }) => *done = Some(report),
            Err(_) => tracing::warn!(
                line = %opledger_domain::quote(line),
                "the export child wrote a line that is no report"
            ),
        }
        Ok(())
    }

    /// What the once-a-second look finds: a cancel request, or a limit
    /// passed.
    async fn check_limits(&self, started: Instant) -> Option<Stop> {
        match self.engine.operation(self.id()).await {
            Ok(row) if row.cancel_requested => return Some(Stop::Cancelled),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "reading the export's row failed"),
        }
        let limits = &self.options.limits;
        if started.elapsed() > limits.run_time {
            return Some(Stop::Failed(FailReason::Timeout));
        }
        let size = std::fs::metadata(self.dir.temporary(self.id()))
            .map(|metadata| metadata.len())
            .unwrap_or(0);
        if size > limits.artifact_bytes {
            return Some(Stop::Failed(FailReason::SizeLimit));
        }
        if self.dir.storage_used() > limits.storage_bytes {
            return Some(Stop::Failed(FailReason::StorageFull));
        }
        None
    }

    /// The same checks on a finished file, before it becomes the artifact.
    async fn check_done(&self, size: u64) -> Option<Stop> {
        match self.engine.operation(self.id()).await {
            Ok(row) if row.cancel_requested => return Some(Stop::Cancelled),
            _ => {}
        }
        let limits = &self.options.limits;
        if size > limits.artifact_bytes {
            return Some(Stop::Failed(FailReason::SizeLimit));
        }
        if self.dir.storage_used() > limits.storage_bytes {
            return Some(Stop::Failed(FailReason::StorageFull));
        }
        None
    }

    async fn succeed(
        &self,
        size: u64,
        sha256: String,
        processed: u64,
        total: u64,
        regular_rows: u64,
    ) -> Result<(), SuperviseError> {
        let extension = self.spec.format.extension();
        let target = self.dir.artifact(self.id(), extension);
        std::fs::rename(self.dir.temporary(self.id()), &target).map_err(SuperviseError::io(format!(
            "renaming the export into {}",
            target.display()
        )))?;
        if let Ok(files) = std::fs::File::open(self.dir.files_dir()) {
            let _ = files.sync_all();
        }
        self.progress("writing", processed, Some(total)).await?;
        let expires_at = Timestamp::from_micros(
            self.engine
                .now()
                .as_micros()
                .saturating_add(i64::try_from(self.options.limits.expiry.as_micros()).unwrap_or(i64::MAX)),
        );
        let output = ExportOutput {
            artifact: Artifact {
                size,
                sha256,
                expires_at,
                file: format!("{}.{extension}", self.id()),
            },
            processed,
            total,
            regular_rows,
            logical_count_unit: self.spec.count_unit().to_string(),
        };
        self.command(OperationCommand::Succeed {
            claim_token: self.claim_token.clone(),
            output: output_value(&output),
        })
        .await
    }
}

fn signal(pid: Option<u32>, signal: libc::c_int) {
    if let Some(pid) = pid.and_then(|pid| libc::pid_t::try_from(pid).ok()) {
        // SAFETY: kill takes plain integers; the pid is our unreaped child
        // (reaping happens only in `wait`, after which nothing is sent).
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The command context a supervisor records under (actor
/// `supervisor:NAME`).
pub(crate) fn context(name: &str) -> CommandContext {
    CommandContext::actor(format!("supervisor:{name}"))
}

/// Fails a claimed job for good, with `reason` as its error.
pub(crate) async fn fail<S: Store>(
    engine: &Engine<S>,
    context: &CommandContext,
    job: OperationId,
    claim_token: &str,
    reason: FailReason,
) -> Result<(), SuperviseError> {
    engine
        .operation_command(
            context,
            job,
            OperationCommand::Fail {
                claim_token: claim_token.to_string(),
                error: reason.as_str().to_string(),
                retryable: false,
            },
        )
        .await?;
    Ok(())
}
