//! Startup: bring every projection to the head of the log before anything
//! else runs. A projection stored at another version is rebuilt through a
//! shadow copy (build from the log in chunks while the old copy keeps
//! serving, catch up, swap in one transaction); one that is merely behind
//! (new in this build) is caught up in place.

use crate::error::EngineError;
use crate::fold::fold_events;
use crate::tx::{CommandContext, Decided};
use crate::Engine;
use opledger_domain::projections::{all_projectors, family_of, ProjectionSpec, Projector};
use opledger_store::{Store, StoreError, TableSet, WriteTx};

/// What [`Engine::maintain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Task operations whose results were recorded stale.
    pub stale_marked: usize,
    /// Batch items whose settled outcome was recorded.
    pub batch_items_settled: usize,
}

/// One projection as stored, against what this build folds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionReadiness {
    pub name: &'static str,
    /// The version its stored tables were built by; `None` when the
    /// database has no tables of it yet.
    pub stored_version: Option<u32>,
    /// The version this build folds.
    pub version: u32,
    /// The last `seq` folded into it (0 when it has no tables yet).
    pub position: i64,
}

/// Whether this build can read the stored projections as they are: read
/// without writing anything (no catch-up, no rebuild), for commands that
/// only read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// The log's head when it was read.
    pub head: i64,
    pub projections: Vec<ProjectionReadiness>,
}

impl Readiness {
    /// Projections stored at another version than this build folds (or not
    /// stored at all): their tables are not what this build reads, and only
    /// a writing command's startup rebuilds them.
    pub fn outdated(&self) -> Vec<&ProjectionReadiness> {
        self.projections
            .iter()
            .filter(|projection| projection.stored_version != Some(projection.version))
            .collect()
    }

    /// How many events the furthest-behind projection has not folded yet.
    pub fn lag(&self) -> i64 {
        self.projections
            .iter()
            .map(|projection| (self.head - projection.position).max(0))
            .max()
            .unwrap_or(0)
    }
}

/// What startup did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartupReport {
    /// (projection, stored version, new version, events folded).
    pub rebuilt: Vec<(String, u32, u32, u64)>,
    /// (projection, events folded).
    pub caught_up: Vec<(String, u64)>,
    /// Former built-in task kinds declared for a ledger written before
    /// declarations existed (once; 0 afterwards).
    pub kinds_declared: usize,
}

impl<S: Store> Engine<S> {
    /// Brings every projection to the head of the log. Run it before
    /// commands: inline folding refuses to run on a projection that is not
    /// at the head.
    pub async fn startup(&self) -> Result<StartupReport, EngineError> {
        let mut report = StartupReport::default();
        // The head first: positions only grow, and a writer appending in
        // between moves every live projection past it, not behind it.
        let head = self.store.head().await?;
        let states = self.store.projection_states().await?;
        let stored = |spec: &ProjectionSpec| {
            states
                .iter()
                .find(|state| state.name == spec.name)
                .cloned()
                .ok_or_else(|| StoreError::corrupt(format!("projection {} has no stored position", spec.name)))
        };
        let mut done: Vec<&'static str> = Vec::new();
        for projector in all_projectors() {
            let spec = projector.spec();
            if done.contains(&spec.name) {
                continue;
            }
            let family = family_of(spec);
            done.extend(family.iter().map(|member| member.name));
            let mut stale = false;
            let mut behind = false;
            for member in &family {
                let state = stored(member)?;
                stale |= state.version != member.version;
                behind |= state.position < head;
            }
            // A family whose tables reference each other is rebuilt as a
            // whole when any member changed, and also when one is merely
            // behind: catching up one member alone could insert rows that
            // reference parents its family has already deleted.
            if stale || (behind && family.len() > 1) {
                let folded = self.rebuild_through_shadow(&family).await?;
                for member in &family {
                    report
                        .rebuilt
                        .push((member.name.to_string(), stored(member)?.version, member.version, folded));
                }
            } else {
                for member in &family {
                    let projector = all_projectors()
                        .iter()
                        .copied()
                        .find(|projector| projector.spec().name == member.name)
                        .expect("a family is made of known projections");
                    let folded = self.catch_up(projector).await?;
                    if folded > 0 {
                        report.caught_up.push((member.name.to_string(), folded));
                    }
                }
            }
        }
        // With every projection at the head, a ledger whose tasks name
        // kinds it never declared gets their declarations.
        report.kinds_declared = self.upgrade_kinds(&CommandContext::actor("system")).await?;
        Ok(report)
    }

    /// How the stored projections stand against this build, read without
    /// writing: the engine of a reading command asks this instead of
    /// running [`Engine::startup`].
    pub async fn readiness(&self) -> Result<Readiness, EngineError> {
        let head = self.store.head().await?;
        let states = self.store.projection_states().await?;
        let projections = all_projectors()
            .iter()
            .map(|projector| {
                let spec = projector.spec();
                let stored = states.iter().find(|state| state.name == spec.name);
                ProjectionReadiness {
                    name: spec.name,
                    stored_version: stored.map(|state| state.version),
                    version: spec.version,
                    position: stored.map_or(0, |state| state.position),
                }
            })
            .collect();
        Ok(Readiness { head, projections })
    }

    /// Rebuilds every projection from the log, family by family, each
    /// through shadow tables swapped in when they reach the head (as
    /// startup rebuilds a projection whose version changed): the repair
    /// for live rows that drifted from the log. Writers keep going between
    /// chunks. Answers (projection, version, events folded) per projection.
    pub async fn rebuild_projections(&self) -> Result<Vec<(String, u32, u64)>, EngineError> {
        let mut rebuilt = Vec::new();
        let mut done: Vec<&'static str> = Vec::new();
        for projector in all_projectors() {
            let spec = projector.spec();
            if done.contains(&spec.name) {
                continue;
            }
            let family = family_of(spec);
            done.extend(family.iter().map(|member| member.name));
            let folded = self.rebuild_through_shadow(&family).await?;
            rebuilt.extend(
                family
                    .iter()
                    .map(|member| (member.name.to_string(), member.version, folded)),
            );
        }
        Ok(rebuilt)
    }

    /// The maintenance that follows startup and precedes work: results
    /// produced by task versions no longer current are recorded stale, and
    /// batches whose items settled without their batch noticing record
    /// those outcomes (completion reconciliation). Idempotent; the CLI and
    /// the worker runtime run it after [`Engine::startup`].
    pub async fn maintain(&self, context: &CommandContext) -> Result<MaintenanceReport, EngineError> {
        Ok(MaintenanceReport {
            stale_marked: self.sweep_task_versions(context).await?,
            batch_items_settled: self.reconcile_batches(context).await?,
        })
    }

    /// Folds the events a live projection has not seen, a chunk per
    /// transaction, until it is at the head.
    async fn catch_up(&self, projector: &'static dyn Projector) -> Result<u64, EngineError> {
        let chunk = self.fold_chunk;
        let mut folded = 0u64;
        loop {
            // Folded into one projection alone, never appended to: a
            // command with nothing to append.
            let (count, at_head) = self
                .command(move |tx, rows| {
                    Box::pin(async move {
                        let spec = projector.spec();
                        let position = tx.projection_position(spec).await?.ok_or_else(|| {
                            StoreError::conflict(format!("projection {} changed version during startup", spec.name))
                        })?;
                        let events = tx.read_events(position, chunk).await?;
                        let Some(last) = events.last().map(|event| event.seq) else {
                            return Ok(Decided::answer((0u64, true), Vec::new()));
                        };
                        fold_events(tx, rows, &[projector], &events).await?;
                        tx.advance_position(spec, position, last).await?;
                        Ok(Decided::answer((events.len() as u64, events.len() < chunk), Vec::new()))
                    })
                })
                .await?;
            folded += count;
            if at_head {
                return Ok(folded);
            }
        }
    }

    /// Rebuilds a family of projections from the log into shadow copies and
    /// swaps them in together. Each chunk is its own transaction, so writers
    /// keep going between chunks; the last chunk reads to the head and swaps
    /// inside the same transaction, so no event appended meanwhile can be
    /// missed.
    async fn rebuild_through_shadow(&self, family: &[&'static ProjectionSpec]) -> Result<u64, EngineError> {
        let family: Vec<&'static ProjectionSpec> = family.to_vec();
        let projectors: Vec<&'static dyn Projector> = all_projectors()
            .iter()
            .copied()
            .filter(|projector| family.iter().any(|spec| spec.name == projector.spec().name))
            .collect();
        for spec in &family {
            tracing::info!(
                projection = spec.name,
                version = spec.version,
                "rebuilding projection through a shadow"
            );
        }
        let specs = family.clone();
        self.command(move |tx, _| {
            Box::pin(async move {
                for spec in specs {
                    tx.create_shadow(spec).await?;
                }
                Ok(Decided::answer((), Vec::new()))
            })
        })
        .await?;
        let chunk = self.fold_chunk;
        let mut folded = 0u64;
        loop {
            let (family, projectors) = (family.clone(), projectors.clone());
            let (count, swapped) = self
                .command(move |tx, rows| {
                    Box::pin(async move {
                        // The members' shadows move together, so any one's
                        // position is the family's.
                        let position = tx.shadow_position(family[0]).await?.ok_or_else(|| {
                            StoreError::conflict(format!("the shadow of {} disappeared", family[0].name))
                        })?;
                        let events = tx.read_events(position, chunk).await?;
                        tx.use_tables(TableSet::Shadow);
                        fold_events(tx, rows, &projectors, &events).await?;
                        tx.use_tables(TableSet::Live);
                        if let Some(last) = events.last() {
                            for spec in &family {
                                tx.set_shadow_position(spec, last.seq).await?;
                            }
                        }
                        let at_head = events.len() < chunk;
                        if at_head {
                            tx.swap_shadows(&family).await?;
                        }
                        Ok(Decided::answer((events.len() as u64, at_head), Vec::new()))
                    })
                })
                .await?;
            folded += count;
            if swapped {
                return Ok(folded);
            }
        }
    }
}
