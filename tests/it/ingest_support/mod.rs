//! What the ingest's command-line tests share: running `opledger ingest`
//! on a folder, `replay --verify`, the ledger read back on a connection of
//! its own, and running a child without root's permission overrides (so a
//! file or folder without permissions cannot be read, as for any user).

use crate::common::{describe, opledger};
use futures::TryStreamExt;
use opledger_domain::projections::{Row, MEDIA_STATES_TABLE};
use opledger_domain::EventEnvelope;
use opledger_engine::Engine;
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// `opledger --json ingest photos --workers 2 EXTRA` in `dir`, expecting
/// exit 0; the parsed summary.
pub fn ingest(dir: &Path, extra: &[&str]) -> Value {
    let output = run_ingest(opledger(dir), extra);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", describe(&output)))
}

/// The same, whatever its exit.
pub fn run_ingest(mut command: Command, extra: &[&str]) -> Output {
    command
        .args(["--json", "ingest", "photos", "--workers", "2"])
        .args(extra)
        .output()
        .unwrap()
}

pub fn verify(dir: &Path) {
    let output = opledger(dir).args(["replay", "--verify"]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

pub fn count(summary: &Value, key: &str) -> u64 {
    summary[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing from {summary}"))
}

pub async fn engine(dir: &Path) -> Engine<SqliteStore> {
    let store = SqliteStore::open(SqliteConfig::at(dir.join("opledger.db")))
        .await
        .unwrap();
    Engine::open(store).await.unwrap().0
}

pub async fn events(engine: &Engine<SqliteStore>) -> Vec<EventEnvelope> {
    log(engine.store()).await
}

pub async fn log(store: &SqliteStore) -> Vec<EventEnvelope> {
    store.read_all(0, 1_000).try_collect().await.unwrap()
}

/// Task claims held in the ledger (processing states with a claim token).
pub async fn held_claims(store: &SqliteStore) -> usize {
    store
        .scan_table(&MEDIA_STATES_TABLE)
        .await
        .unwrap()
        .into_iter()
        .filter(|row| matches!(row, Row::ProcessingState(state) if state.claim_token.is_some()))
        .count()
}

/// Whether this process runs as root, whose permission overrides read a
/// file or folder whatever its mode.
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|meta| std::os::unix::fs::MetadataExt::uid(&meta) == 0)
        .unwrap_or(false)
}

/// The binary in `dir`, run without the capabilities that let root read
/// what its mode forbids (`setpriv`, from util-linux), so a mode of 000
/// denies it as it denies any user.
pub fn without_overrides(dir: &Path) -> Command {
    if !is_root() {
        return opledger(dir);
    }
    let mut command = Command::new("setpriv");
    command
        .args(["--bounding-set", "-dac_override,-dac_read_search", crate::common::BIN])
        .env_remove("OPLEDGER_DATABASE_URL")
        .env_remove("OPLEDGER_LOG")
        .current_dir(dir);
    command
}
