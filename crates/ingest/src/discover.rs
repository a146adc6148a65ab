//! The first step of a run: walk the folder, and classify each file against
//! what the ledger knows of its path (new, changed, unchanged, an
//! ingestion an earlier run left unfinished, or one that failed because
//! the file could not be read and can be now), find the folders that
//! cannot be read, and the files the ledger ingested under the folder that
//! are gone from disk.
//!
//! Paths are the ledger's text of them ([`opledger_media::path_text`]): a
//! name that is not UTF-8 is recorded reversibly and read by its real bytes.

use crate::summary::SkippedFile;
use crate::IngestError;
use opledger_domain::events::BatchItemSpec;
use opledger_domain::projections::OperationRow;
use opledger_domain::{OperationId, OperationStatus};
use opledger_engine::{Engine, FileObservation};
use opledger_media::{path_text, text_path};
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

/// A folder under the root that could not be listed.
pub(crate) struct UnreadableFolder {
    pub path: PathBuf,
    /// Why, without the path (the ingestion names it).
    pub reason: String,
}

/// What the walk found.
pub(crate) struct Walked {
    pub files: Vec<FoundFile>,
    /// Entries that are not regular files or folders: never opened.
    pub skipped: Vec<SkippedFile>,
    pub unreadable: Vec<UnreadableFolder>,
    /// Folders listed, the root's own included (their texts).
    pub folders: Vec<String>,
}

/// How the folder's files compare with the ledger.
pub(crate) struct Classified {
    /// Files that get a new ingestion.
    pub fresh: Vec<FileObservation>,
    /// Ingestions taken over: left unfinished by an earlier run (resumed),
    /// or failed on a file that can be read now (retried).
    pub resume: Vec<OperationId>,
    /// Worker names of the earlier runs holding the unfinished ingestions:
    /// dead, since this run holds the lock.
    pub dead_workers: BTreeSet<String>,
    /// The last ingestions of unchanged files, for the batch.
    pub unchanged: Vec<BatchItemSpec>,
    /// Files the ledger ingested under the folder that are gone from disk.
    pub gone: Vec<FileObservation>,
    /// Folders that cannot be read and are not yet recorded so: each gets
    /// an ingestion that fails with the reason.
    pub unreadable: Vec<(FileObservation, String)>,
    /// Failed ingestions of folders that can be read again: closed.
    pub readable_again: Vec<OperationId>,
    /// Files the ledger has no media item for.
    pub new: usize,
    /// Files with a media item whose last ingestion no longer matches them.
    pub changed: usize,
    /// Files whose ingestion an earlier run left unfinished.
    pub resumed: usize,
}

/// Compares the walked files with the ledger: the latest ingestion and the
/// media item of each file's path, looked up by path.
pub(crate) async fn classify<S: Store>(
    engine: &Engine<S>,
    root: &Path,
    walked: &Walked,
) -> Result<Classified, IngestError> {
    let files = &walked.files;
    let paths: Vec<String> = files.iter().map(|file| file.observation.path.clone()).collect();
    let known = engine.ingestions_by_path(&paths).await?;
    let media = engine.media_by_path(&paths).await?;
    let mut classified = Classified {
        fresh: Vec::new(),
        resume: Vec::new(),
        dead_workers: BTreeSet::new(),
        unchanged: Vec::new(),
        gone: Vec::new(),
        unreadable: Vec::new(),
        readable_again: Vec::new(),
        new: 0,
        changed: 0,
        resumed: 0,
    };
    for file in files {
        let observation = &file.observation;
        let has_media = media.contains_key(&observation.path);
        let count_fresh = |classified: &mut Classified| {
            if has_media {
                classified.changed += 1;
            } else {
                classified.new += 1;
            }
        };
        match known.get(&observation.path) {
            Some(operation) if !operation.status.is_terminal() => {
                classified.resume.push(operation.operation_id);
                classified.dead_workers.extend(operation.worker.clone());
                classified.resumed += 1;
            }
            // The file could not be read (or did not settle): tried again
            // once it can be opened; until then its failure stands.
            Some(operation) if operation.status.is_failed_for_good() => {
                if std::fs::File::open(&file.path).is_ok() {
                    classified.resume.push(operation.operation_id);
                    count_fresh(&mut classified);
                } else {
                    classified.unchanged.push(unchanged_item(operation, observation));
                }
            }
            Some(operation)
                if operation.status != OperationStatus::MissingConfirmed && same_file(operation, observation) =>
            {
                classified.unchanged.push(unchanged_item(operation, observation));
            }
            _ => {
                count_fresh(&mut classified);
                classified.fresh.push(observation.clone());
            }
        }
    }
    folders(engine, walked, &mut classified).await?;
    classified.gone = gone_files(engine, root, walked).await?;
    Ok(classified)
}

fn unchanged_item(operation: &OperationRow, observation: &FileObservation) -> BatchItemSpec {
    BatchItemSpec {
        operation_id: operation.operation_id,
        label: observation.path.clone(),
    }
}

/// Unreadable folders not yet recorded as such (a folder whose last
/// ingestion failed keeps that failure while it stays unreadable), and
/// recorded ones that can be read again.
async fn folders<S: Store>(
    engine: &Engine<S>,
    walked: &Walked,
    classified: &mut Classified,
) -> Result<(), IngestError> {
    let unreadable: Vec<String> = walked.unreadable.iter().map(|folder| path_text(&folder.path)).collect();
    let known = engine.ingestions_by_path(&unreadable).await?;
    for (folder, text) in walked.unreadable.iter().zip(unreadable) {
        if known
            .get(&text)
            .is_some_and(|operation| operation.status.is_failed_for_good())
        {
            continue;
        }
        classified.unreadable.push((
            FileObservation {
                path: text,
                byte_size: 0,
                modified_ns: 0,
            },
            folder.reason.clone(),
        ));
    }
    classified.readable_again = engine
        .ingestions_by_path(&walked.folders)
        .await?
        .into_values()
        .filter(|operation| operation.status.is_failed_for_good())
        .map(|operation| operation.operation_id)
        .collect();
    Ok(())
}

/// Files the ledger ingested under `root` that are not among the walked
/// files and not yet recorded as gone, in path order. The ledger's paths
/// are listed once (one short column per operation); only those under
/// `root` and not on disk are looked up. A path under a folder that cannot
/// be read, or that cannot be looked at, is not known to be gone.
async fn gone_files<S: Store>(
    engine: &Engine<S>,
    root: &Path,
    walked: &Walked,
) -> Result<Vec<FileObservation>, IngestError> {
    let on_disk: BTreeSet<&str> = walked
        .files
        .iter()
        .map(|file| file.observation.path.as_str())
        .chain(walked.folders.iter().map(String::as_str))
        .collect();
    let root_text = path_text(root);
    let hidden: Vec<String> = walked.unreadable.iter().map(|folder| path_text(&folder.path)).collect();
    let candidates: Vec<String> = engine
        .operation_paths()
        .await?
        .into_iter()
        .filter(|path| Path::new(path).starts_with(&root_text) && !on_disk.contains(path.as_str()))
        .filter(|path| !hidden.iter().any(|folder| Path::new(path).starts_with(folder)))
        .filter(|path| matches!(std::fs::exists(text_path(path)), Ok(false)))
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

/// The size and modification time of a file, as an observation of `path`.
pub(crate) fn observe(path: &Path, metadata: &std::fs::Metadata) -> FileObservation {
    let modified_ns = metadata
        .modified()
        .ok()
        .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |since| i64::try_from(since.as_nanos()).unwrap_or(i64::MAX));
    FileObservation {
        path: path_text(path),
        byte_size: i64::try_from(metadata.len()).unwrap_or(i64::MAX),
        modified_ns,
    }
}

/// Every regular file under `root`, sorted by path, except the excluded;
/// and the folders under it that cannot be listed (the walk goes on
/// without them). Only the root itself failing to list is an error.
pub(crate) fn walk(root: &Path, exclude: &[PathBuf]) -> Result<Walked, IngestError> {
    let mut walked = Walked {
        files: Vec::new(),
        skipped: Vec::new(),
        unreadable: Vec::new(),
        folders: Vec::new(),
    };
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = match std::fs::read_dir(&folder) {
            Ok(entries) => entries,
            Err(error) if folder == root => {
                return Err(IngestError::Io(format!(
                    "cannot read folder {}: {error}",
                    folder.display()
                )))
            }
            Err(error) => {
                walked.unreadable.push(UnreadableFolder {
                    path: folder,
                    reason: format!("cannot read folder: {error}"),
                });
                continue;
            }
        };
        let mut listed = true;
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(error) => {
                    walked.unreadable.push(UnreadableFolder {
                        path: folder.clone(),
                        reason: format!("cannot list the whole folder: {error}"),
                    });
                    listed = false;
                    break;
                }
            };
            let path = entry.path();
            if exclude.iter().any(|excluded| path.starts_with(excluded)) || is_companion(&path, exclude) {
                continue;
            }
            // An entry whose type cannot be read is left alone, like one
            // that vanished between listing and stat.
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                folders.push(path);
            } else if kind.is_file() {
                let Ok(metadata) = entry.metadata() else { continue };
                let observation = observe(&path, &metadata);
                walked.files.push(FoundFile { path, observation });
            } else {
                walked.skipped.push(SkippedFile {
                    path: path_text(&path),
                    reason: not_a_file(kind).to_string(),
                });
            }
        }
        if listed {
            walked.folders.push(path_text(&folder));
        }
    }
    // By path, component by component (not by the path's text).
    walked.files.sort_by(|a, b| a.path.cmp(&b.path));
    walked.unreadable.sort_by(|a, b| a.path.cmp(&b.path));
    walked.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    walked.folders.sort();
    Ok(walked)
}

/// Why an entry that is neither a regular file nor a folder is skipped. It
/// is never opened: opening a FIFO blocks until a writer comes, a device
/// may never end, and a link may lead out of the folder (a link to a file
/// inside it names a file the walk finds anyway).
fn not_a_file(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_symlink() {
        "a symbolic link (links are not followed: one may lead outside the folder)"
    } else if kind.is_fifo() {
        "a FIFO (named pipe), not a file"
    } else if kind.is_socket() {
        "a socket, not a file"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device, not a file"
    } else {
        "not a regular file"
    }
}

/// The database's own companions (`ledger.db-wal`, `-shm`, `-journal`).
fn is_companion(path: &Path, exclude: &[PathBuf]) -> bool {
    let text = path.as_os_str().as_encoded_bytes();
    exclude.iter().any(|excluded| {
        let excluded = excluded.as_os_str().as_encoded_bytes();
        text.starts_with(excluded) && text[excluded.len()..].starts_with(b"-")
    })
}
