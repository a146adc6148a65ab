//! The first step of a run: walk the folder, and classify each file against
//! what the ledger knows of its path (new, changed, unchanged, or an
//! ingestion a dead run left unfinished), and find the files the ledger
//! ingested under the folder that are gone from disk.

use crate::IngestError;
use opledger_domain::events::BatchItemSpec;
use opledger_domain::projections::OperationRow;
use opledger_domain::{OperationId, OperationStatus};
use opledger_engine::{Engine, FileObservation};
use opledger_store::Store;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// A regular file of the folder, as the walk found it.
pub(crate) struct FoundFile {
    pub path: PathBuf,
    pub observation: FileObservation,
}

/// How the folder's files compare with the ledger.
pub(crate) struct Classified {
    /// Files that get a new ingestion.
    pub fresh: Vec<FileObservation>,
    /// Ingestions a run that died left unfinished: taken over.
    pub resume: Vec<OperationId>,
    /// The last ingestions of unchanged files, for the batch.
    pub unchanged: Vec<BatchItemSpec>,
    /// Files the ledger ingested under the folder that are gone from disk.
    pub gone: Vec<FileObservation>,
    /// Files the ledger has no media item for.
    pub new: usize,
    /// Files with a media item whose last ingestion no longer matches them.
    pub changed: usize,
}

/// Compares the walked files with the ledger: the latest ingestion and the
/// media item of each file's path, looked up by path.
pub(crate) async fn classify<S: Store>(
    engine: &Engine<S>,
    root: &Path,
    files: &[FoundFile],
) -> Result<Classified, IngestError> {
    let paths: Vec<String> = files.iter().map(|file| file.observation.path.clone()).collect();
    let known = engine.ingestions_by_path(&paths).await?;
    let media = engine.media_by_path(&paths).await?;
    let mut classified = Classified {
        fresh: Vec::new(),
        resume: Vec::new(),
        unchanged: Vec::new(),
        gone: Vec::new(),
        new: 0,
        changed: 0,
    };
    for file in files {
        let observation = &file.observation;
        let has_media = media.contains_key(&observation.path);
        match known.get(&observation.path) {
            Some(operation) if !operation.status.is_terminal() => {
                classified.resume.push(operation.operation_id);
                if has_media {
                    classified.changed += 1;
                } else {
                    classified.new += 1;
                }
            }
            Some(operation)
                if operation.status != OperationStatus::MissingConfirmed && same_file(operation, observation) =>
            {
                classified.unchanged.push(BatchItemSpec {
                    operation_id: operation.operation_id,
                    label: file.path.display().to_string(),
                });
            }
            _ => {
                if has_media {
                    classified.changed += 1;
                } else {
                    classified.new += 1;
                }
                classified.fresh.push(observation.clone());
            }
        }
    }
    classified.gone = gone_files(engine, root, files).await?;
    Ok(classified)
}

/// Files the ledger ingested under `root` that are not among `files` and
/// not yet recorded as gone, in path order. The ledger's paths are listed
/// once (one short column per operation); only those under `root` and not
/// on disk are looked up.
async fn gone_files<S: Store>(
    engine: &Engine<S>,
    root: &Path,
    files: &[FoundFile],
) -> Result<Vec<FileObservation>, IngestError> {
    let on_disk: BTreeSet<&str> = files.iter().map(|file| file.observation.path.as_str()).collect();
    let root_text = root.display().to_string();
    let candidates: Vec<String> = engine
        .operation_paths()
        .await?
        .into_iter()
        .filter(|path| Path::new(path).starts_with(&root_text) && !on_disk.contains(path.as_str()))
        .collect();
    Ok(engine
        .ingestions_by_path(&candidates)
        .await?
        .into_values()
        .filter(|operation| operation.status != OperationStatus::MissingConfirmed)
        .filter_map(|operation| operation.path)
        .map(|path| FileObservation {
            path,
            byte_size: 0,
            modified_ns: 0,
        })
        .collect())
}

/// Whether an ingestion's recorded observation is this file as it is now.
fn same_file(operation: &OperationRow, observation: &FileObservation) -> bool {
    serde_json::from_str::<Value>(&operation.inputs)
        .ok()
        .is_some_and(|inputs| {
            inputs["byte_size"] == json!(observation.byte_size)
                && inputs["modified_ns"] == json!(observation.modified_ns)
        })
}

/// Every regular file under `root`, sorted by path, except the excluded.
pub(crate) fn walk(root: &Path, exclude: &[PathBuf]) -> Result<Vec<FoundFile>, IngestError> {
    let mut found = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder)
            .map_err(|error| IngestError::Io(format!("cannot read folder {}: {error}", folder.display())))?;
        for entry in entries {
            let entry = entry.map_err(|error| IngestError::Io(format!("reading {}: {error}", folder.display())))?;
            let path = entry.path();
            if exclude.iter().any(|excluded| path.starts_with(excluded)) || is_companion(&path, exclude) {
                continue;
            }
            let kind = entry
                .file_type()
                .map_err(|error| IngestError::Io(format!("reading {}: {error}", path.display())))?;
            if kind.is_dir() {
                folders.push(path);
            } else if kind.is_file() {
                // A file that vanished between listing and stat is not there.
                let Ok(metadata) = entry.metadata() else { continue };
                let modified_ns = metadata
                    .modified()
                    .ok()
                    .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |since| i64::try_from(since.as_nanos()).unwrap_or(i64::MAX));
                let observation = FileObservation {
                    path: path.display().to_string(),
                    byte_size: i64::try_from(metadata.len()).unwrap_or(i64::MAX),
                    modified_ns,
                };
                found.push(FoundFile { path, observation });
            }
        }
    }
    // By path, component by component (not by the path's text).
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// The database's own companions (`ledger.db-wal`, `-shm`, `-journal`).
fn is_companion(path: &Path, exclude: &[PathBuf]) -> bool {
    let text = path.display().to_string();
    exclude.iter().any(|excluded| {
        let excluded = excluded.display().to_string();
        text.starts_with(&excluded) && text[excluded.len()..].starts_with('-')
    })
}
