//! The last step of a run: what needs a person among the folder's files.

use crate::{IngestError, ReviewEntry};
use opledger_domain::projections::ReviewRow;
use opledger_domain::MediaId;
use opledger_engine::Engine;
use opledger_store::Store;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The open review entries of files under `root`: entries that name a
/// path under it, or the media item at such a path.
pub(crate) async fn review_entries<S: Store>(engine: &Engine<S>, root: &Path) -> Result<Vec<ReviewEntry>, IngestError> {
    Ok(open_entries_under(engine, root)
        .await?
        .into_iter()
        .map(|(entry, path)| ReviewEntry {
            entry_id: entry.entry_id,
            path: Some(path),
            kind: entry.kind,
            reason_code: entry.reason_code,
            detail: entry.detail,
        })
        .collect())
}

/// The open review entries of files under `root`, each with its file's
/// path, oldest first.
pub(crate) async fn open_entries_under<S: Store>(
    engine: &Engine<S>,
    root: &Path,
) -> Result<Vec<(ReviewRow, String)>, IngestError> {
    let root_text = opledger_media::path_text(root);
    let under_root = |path: &str| Path::new(path).starts_with(&root_text);
    let entries = engine.review_entries().await?;
    // Entries that name no path name their media item: the item's path
    // is the entry's when the item is the one found at that path.
    let unnamed: BTreeSet<MediaId> = entries
        .iter()
        .filter(|entry| entry.path.is_none())
        .filter_map(|entry| entry.media_id)
        .collect();
    let unnamed: Vec<MediaId> = unnamed.into_iter().collect();
    let paths: BTreeSet<String> = engine
        .media_by_id(&unnamed)
        .await?
        .into_values()
        .map(|media| media.path)
        .filter(|path| under_root(path))
        .collect();
    let paths: Vec<String> = paths.into_iter().collect();
    let media_paths: BTreeMap<MediaId, String> = engine
        .media_by_path(&paths)
        .await?
        .into_iter()
        .map(|(path, media)| (media.media_id, path))
        .collect();
    let mut ours = Vec::new();
    for entry in entries {
        let path = entry
            .path
            .clone()
            .or_else(|| entry.media_id.and_then(|id| media_paths.get(&id).cloned()));
        if let Some(path) = path.filter(|path| under_root(path)) {
            ours.push((entry, path));
        }
    }
    Ok(ours)
}
