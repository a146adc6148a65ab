//! Blocking file steps of an output commit, run off the async threads.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Runs blocking file work on tokio's blocking pool.
pub(crate) async fn blocking<T, F>(work: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> io::Result<T> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(error) => Err(io::Error::other(format!("file work did not finish: {error}"))),
    }
}

/// Flushes a written file's data to disk, so that a rename made after it
/// can never expose an empty or partial file after a crash.
pub(crate) fn sync_file(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// Renames `temp` over `final_path` (atomic on one filesystem: readers see
/// the old file or the new one, never a mix), then flushes the directory so
/// the rename itself survives a crash. A failed directory flush is only
/// logged: the rename has happened and cannot be taken back.
pub(crate) fn rename_into_place(temp: &Path, final_path: &Path) -> io::Result<()> {
    std::fs::rename(temp, final_path)?;
    #[cfg(unix)]
    {
        let directory = match final_path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if let Err(error) = File::open(&directory).and_then(|dir| dir.sync_all()) {
            tracing::warn!(directory = %directory.display(), %error, "renamed an output but could not flush its directory");
        }
    }
    Ok(())
}

/// Removes files that may or may not exist; returns how many were removed.
/// Errors other than "not there" are logged and leave the file behind.
pub(crate) fn remove_all(paths: &[PathBuf]) -> usize {
    let mut removed = 0;
    for path in paths {
        match std::fs::remove_file(path) {
            Ok(()) => removed += 1,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => tracing::warn!(path = %path.display(), %error, "could not remove a temporary output"),
        }
    }
    removed
}
