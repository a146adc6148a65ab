//! Liveness in the artifact directory: a supervisor's heartbeat, and a
//! job's heartbeat and progress counters. Written by the supervisor only
//! (every second, and at each progress report of its child), read by
//! status and by other supervisors. Not the log: a heartbeat is no fact of
//! the job's history, and a second's counters would flood the timeline;
//! what the job's history needs (its phases, its final counts, how it
//! ended) is recorded on its operation.

use crate::dir::{write_atomically, ArtifactDir};
use crate::locks::is_held;
use crate::SuperviseError;
use opledger_domain::{OperationId, Timestamp};
use serde::{Deserialize, Serialize};
use std::fs;
use std::time::Duration;

/// A supervisor's heartbeat file (`supervisors/<name>.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SupervisorLive {
    pub name: String,
    pub pid: u32,
    pub heartbeat_at: Timestamp,
}

/// A job's liveness file (`jobs/<operation>.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobLive {
    /// The supervisor running it.
    pub supervisor: String,
    /// The supervisor's last heartbeat of the job.
    pub heartbeat_at: Timestamp,
    /// The last progress the child reported.
    pub updated_at: Timestamp,
    pub phase: String,
    pub processed: u64,
    /// None while aggregating: the size is not known yet.
    pub total: Option<u64>,
    /// `rows` or `pivot_cells`.
    pub logical_count_unit: Option<String>,
    /// Regular result rows, subtotal and total rows apart.
    pub regular_rows: Option<u64>,
    /// The child's process id (for tests and operators).
    pub child_pid: Option<u32>,
}

pub fn write_supervisor(dir: &ArtifactDir, live: &SupervisorLive) -> Result<(), SuperviseError> {
    let path = dir.supervisors().join(format!("{}.json", live.name));
    let bytes = serde_json::to_vec(live).expect("liveness serializes");
    write_atomically(&path, &bytes).map_err(SuperviseError::io(format!("writing {}", path.display())))
}

pub fn write_job(dir: &ArtifactDir, job: OperationId, live: &JobLive) -> Result<(), SuperviseError> {
    let path = dir.job_live(job);
    let bytes = serde_json::to_vec(live).expect("liveness serializes");
    write_atomically(&path, &bytes).map_err(SuperviseError::io(format!("writing {}", path.display())))
}

/// A job's liveness file, if there is a readable one.
pub fn read_job(dir: &ArtifactDir, job: OperationId) -> Option<JobLive> {
    let bytes = fs::read(dir.job_live(job)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The supervisors alive now: their lock is held and their heartbeat is
/// younger than `staleness`. A supervisor whose lock is free died; its
/// files are removed on the way.
pub fn live_supervisors(
    dir: &ArtifactDir,
    now: Timestamp,
    staleness: Duration,
) -> Result<Vec<SupervisorLive>, SuperviseError> {
    let mut alive = Vec::new();
    let entries = fs::read_dir(dir.supervisors())
        .map_err(SuperviseError::io(format!("listing {}", dir.supervisors().display())))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|extension| extension.to_str()) != Some("lock") {
            continue;
        }
        let heartbeat = path.with_extension("json");
        if !is_held(&path)? {
            let _ = fs::remove_file(&heartbeat);
            let _ = fs::remove_file(&path);
            continue;
        }
        let Some(live) = fs::read(&heartbeat)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<SupervisorLive>(&bytes).ok())
        else {
            continue;
        };
        if fresh(live.heartbeat_at, now, staleness) {
            alive.push(live);
        }
    }
    alive.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(alive)
}

/// Whether a heartbeat at `at` is younger than `staleness` at `now`.
pub fn fresh(at: Timestamp, now: Timestamp, staleness: Duration) -> bool {
    let age = now.as_micros().saturating_sub(at.as_micros());
    age < i64::try_from(staleness.as_micros()).unwrap_or(i64::MAX)
}
