//! The supervisor: takes a free slot, claims a queued export, runs it in a
//! child process (a re-exec of the binary that opens its own database
//! connection), and watches it every second from outside — heartbeats,
//! cancel requests, run time, artifact size, storage. A child to stop gets
//! SIGTERM, then SIGKILL after the grace; it is reaped and its files are
//! removed before `cancelled` or `failed_terminal` is recorded.
//!
//! **At most once.** Before claiming a job the supervisor takes its
//! execution lock (`jobs/<operation>.lock`) and holds it as long as the
//! child lives; the claim itself is an event at the operation's version,
//! so two supervisors cannot both claim it. A claimed job whose lock can be
//! taken lost its supervisor (the OS released the lock when it died): the
//! patrol fails it (`supervisor_lost`) and removes its files — it is never
//! queued again, so it never runs twice. The engine's recovery does not
//! touch export operations (it recovers task claims only).

use crate::dir::ArtifactDir;
use crate::export::ExportSpec;
use crate::jobs::{spec_of, sweep_files};
use crate::live::{fresh, read_job, write_supervisor, SupervisorLive};
use crate::locks::FileLock;
use crate::watch::{context, fail, Job};
use crate::{FailReason, SuperviseError, SupervisorOptions, EXPORT_KIND};
use opledger_domain::projections::OperationRow;
use opledger_domain::{DomainError, OperationStatus, Timestamp};
use opledger_engine::{Engine, EngineError, OperationItem, OpsFilter, PageRequest};
use opledger_store::{ErrorKind, Store};
use std::future::Future;
use std::time::Duration;
use tokio::task::JoinSet;

/// The most exports of one status a supervisor looks at in one pass.
const LISTED: usize = 1_000;

/// A running supervisor.
pub struct Supervisor<S: Store> {
    engine: Engine<S>,
    dir: ArtifactDir,
    options: SupervisorOptions,
    _alive: FileLock,
}

impl<S: Store> Supervisor<S> {
    /// Starts a supervisor: takes its liveness lock and writes its first
    /// heartbeat.
    pub fn start(engine: Engine<S>, dir: ArtifactDir, options: SupervisorOptions) -> Result<Self, SuperviseError> {
        let well_named = !options.name.is_empty()
            && options.name.len() <= 64
            && options
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !well_named {
            return Err(EngineError::invalid(format!(
                "supervisor name {} must be 1 to 64 letters, digits, `_`, `-` or `.`",
                opledger_domain::quoted(&options.name)
            ))
            .into());
        }
        if options.slots == 0 {
            return Err(EngineError::invalid("a supervisor needs at least one slot").into());
        }
        let lock_path = dir.supervisors().join(format!("{}.lock", options.name));
        let alive = FileLock::try_take(&lock_path)?.ok_or_else(|| {
            SuperviseError::Engine(EngineError::Domain(DomainError::Conflict(format!(
                "a supervisor named {} is already running",
                options.name
            ))))
        })?;
        let supervisor = Supervisor {
            engine,
            dir,
            options,
            _alive: alive,
        };
        supervisor.heartbeat()?;
        Ok(supervisor)
    }

    fn heartbeat(&self) -> Result<(), SuperviseError> {
        write_supervisor(
            &self.dir,
            &SupervisorLive {
                name: self.options.name.clone(),
                pid: std::process::id(),
                heartbeat_at: self.engine.now(),
            },
        )
    }

    /// Runs until `stop` resolves, then lets the running jobs finish (a
    /// service manager's stop timeout must exceed the run-time limit and
    /// the grace).
    pub async fn run(self, stop: impl Future<Output = ()>) -> Result<(), SuperviseError> {
        let mut running: JoinSet<()> = JoinSet::new();
        let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
        let mut poll = tokio::time::interval(self.options.poll);
        let mut patrol = tokio::time::interval(self.options.patrol);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                _ = heartbeat.tick() => {
                    if let Err(error) = self.heartbeat() {
                        tracing::warn!(%error, "supervisor heartbeat not written");
                    }
                }
                _ = patrol.tick() => {
                    if let Err(error) = self.patrol().await {
                        tracing::warn!(%error, "patrol failed");
                    }
                }
                _ = poll.tick() => {
                    if let Err(error) = self.start_jobs(&mut running).await {
                        tracing::warn!(%error, "claiming exports failed");
                    }
                }
                Some(ended) = running.join_next(), if !running.is_empty() => {
                    if let Err(error) = ended {
                        tracing::error!(%error, "a job's supervision panicked");
                    }
                }
            }
        }
        while let Some(ended) = running.join_next().await {
            if let Err(error) = ended {
                tracing::error!(%error, "a job's supervision panicked");
            }
        }
        Ok(())
    }

    /// Claims queued exports while a slot is free, each into a task that
    /// supervises its child.
    async fn start_jobs(&self, running: &mut JoinSet<()>) -> Result<(), SuperviseError> {
        loop {
            let Some(slot) = self.free_slot()? else {
                return Ok(());
            };
            let Some((row, spec, lock, token)) = self.claim_next().await? else {
                return Ok(());
            };
            let job = Job {
                engine: self.engine.clone(),
                dir: self.dir.clone(),
                options: self.options.clone(),
                row,
                spec,
                claim_token: token,
            };
            running.spawn(async move {
                let operation = job.row.operation_id;
                if let Err(error) = job.supervise().await {
                    tracing::error!(%error, %operation, "supervising an export failed");
                }
                drop(lock);
                drop(slot);
            });
        }
    }

    fn free_slot(&self) -> Result<Option<FileLock>, SuperviseError> {
        for slot in 0..self.options.slots {
            if let Some(lock) = FileLock::try_take(&self.dir.slot_lock(slot))? {
                return Ok(Some(lock));
            }
        }
        Ok(None)
    }

    /// Exports in `statuses`, oldest first (at most [`LISTED`]); rows are
    /// read only for those acted on.
    async fn listed(&self, statuses: Vec<OperationStatus>) -> Result<Vec<OperationItem>, SuperviseError> {
        let filter = OpsFilter {
            statuses,
            kinds: vec![EXPORT_KIND.to_string()],
            ..OpsFilter::default()
        };
        let mut items = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .engine
                .list_operations(&filter, &PageRequest { limit: 200, after })
                .await?;
            items.extend(page.items);
            match page.next {
                Some(next) if items.len() < LISTED => after = Some(next),
                _ => break,
            }
        }
        // Newest first in the listing; the oldest is served first.
        items.reverse();
        Ok(items)
    }

    /// The oldest queued export this supervisor could claim, with its
    /// execution lock (taken before the claim, so no patrol ever sees it
    /// claimed and unlocked while its supervisor lives).
    async fn claim_next(&self) -> Result<Option<(OperationRow, ExportSpec, FileLock, String)>, SuperviseError> {
        for item in self.listed(vec![OperationStatus::Queued]).await? {
            if self.overdue(item.created_at) {
                continue;
            }
            let Some(lock) = FileLock::try_take(&self.dir.job_lock(item.operation_id))? else {
                continue;
            };
            let row = self.engine.operation(item.operation_id).await?;
            if row.status != OperationStatus::Queued {
                continue;
            }
            let spec = match spec_of(&row) {
                Ok(spec) => spec,
                Err(error) => {
                    tracing::warn!(%error, operation = %row.operation_id, "an export that cannot run");
                    continue;
                }
            };
            let lease_ms =
                (self.options.limits.run_time + self.options.limits.grace + Duration::from_secs(60)).as_millis();
            let claimed = self
                .engine
                .claim_operation(
                    &context(&self.options.name),
                    row.operation_id,
                    &self.options.name,
                    i64::try_from(lease_ms).unwrap_or(i64::MAX),
                )
                .await;
            match claimed {
                Ok(token) => return Ok(Some((row, spec, lock, token))),
                Err(error) if lost_race(&error) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Ok(None)
    }

    fn overdue(&self, created_at: Timestamp) -> bool {
        !fresh(created_at, self.engine.now(), self.options.limits.queued_wait)
    }

    /// The sweep every supervisor runs at start and every patrol interval:
    /// expired artifacts and leftover temporary files removed, jobs that
    /// waited too long or lost their supervisor failed.
    pub async fn patrol(&self) -> Result<(), SuperviseError> {
        sweep_files(&self.engine, &self.dir, &self.options.limits).await;
        let context = context(&self.options.name);
        for row in self.listed(vec![OperationStatus::Queued]).await? {
            if !self.overdue(row.created_at) {
                continue;
            }
            let Some(_lock) = FileLock::try_take(&self.dir.job_lock(row.operation_id))? else {
                continue;
            };
            // Claimed to be failed: a queued operation cannot fail unclaimed.
            match self
                .engine
                .claim_operation(&context, row.operation_id, &self.options.name, 60_000)
                .await
            {
                Ok(token) => {
                    fail(
                        &self.engine,
                        &context,
                        row.operation_id,
                        &token,
                        FailReason::QueueTimeout,
                    )
                    .await?
                }
                Err(error) if lost_race(&error) => {}
                Err(error) => return Err(error.into()),
            }
        }
        let now = self.engine.now();
        for item in self
            .listed(vec![OperationStatus::Leased, OperationStatus::Running])
            .await?
        {
            let lock = FileLock::try_take(&self.dir.job_lock(item.operation_id))?;
            // Read with the lock taken: a job that ended just before (its
            // supervisor releases the lock only after recording how) is
            // seen ended, and its artifact is left alone.
            let row = self.engine.operation(item.operation_id).await?;
            if !row.status.is_claimed() {
                continue;
            }
            let stale = match read_job(&self.dir, row.operation_id) {
                Some(live) => !fresh(live.heartbeat_at, now, self.options.limits.staleness),
                None => !fresh(row.updated_at, now, self.options.limits.staleness),
            };
            if lock.is_none() && !stale {
                continue;
            }
            if lock.is_none() {
                tracing::warn!(operation = %row.operation_id, "the supervisor holding this export stopped heartbeating");
            }
            self.dir.remove_job_files(row.operation_id);
            if let Some(token) = &row.claim_token {
                match fail(
                    &self.engine,
                    &context,
                    row.operation_id,
                    token,
                    FailReason::SupervisorLost,
                )
                .await
                {
                    Ok(()) => {}
                    Err(SuperviseError::Engine(error)) if lost_race(&error) => {}
                    Err(error) => return Err(error),
                }
            }
            let _ = std::fs::remove_file(self.dir.job_live(row.operation_id));
        }
        Ok(())
    }
}

/// A claim or report refused because another supervisor got there first.
fn lost_race(error: &EngineError) -> bool {
    match error {
        EngineError::Domain(DomainError::Conflict(_) | DomainError::IllegalTransition(_)) => true,
        EngineError::Store(store) => store.kind == ErrorKind::Conflict,
        _ => false,
    }
}
