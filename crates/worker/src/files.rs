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

/// Removes the temporary outputs a dead process left in `dir`: files named
/// as [`crate::Job::output_path_for`] names them (`.{file}.{revision}.{claim_token}.tmp`)
/// whose claim token `is_held` does not vouch for. A process killed between
/// writing an output and renaming it leaves one behind; nothing else would
/// ever remove it. Returns how many were removed; other files are left alone.
pub fn remove_abandoned_outputs(dir: &Path, is_held: impl Fn(&str) -> bool) -> io::Result<usize> {
    let mut abandoned = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(claim_token) = temporary_output_token(name) else {
            continue;
        };
        if !is_held(claim_token) && entry.file_type()?.is_file() {
            abandoned.push(entry.path());
        }
    }
    Ok(remove_all(&abandoned))
}

/// The claim token of a temporary output's file name, or None when the name
/// is not one.
fn temporary_output_token(name: &str) -> Option<&str> {
    let stem = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (rest, claim_token) = stem.rsplit_once('.')?;
    let (_, revision) = rest.rsplit_once('.')?;
    let is_token = uuid::Uuid::parse_str(claim_token).is_ok();
    let is_revision =
        !revision.is_empty() && revision.len() <= 16 && revision.chars().all(|c| c.is_ascii_alphanumeric());
    (is_token && is_revision).then_some(claim_token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abandoned_outputs_are_removed_and_everything_else_stays() {
        let dir = tempfile::tempdir().unwrap();
        let held = "01a23182-e42f-73da-a0a0-5e609a0b7fb6";
        let dead = "01a23182-e42f-73da-a0a0-5e609a0b7fb7";
        let names = [
            format!(".abc.png.c7c86cc43affb918.{dead}.tmp"),
            format!(".abc.png.c7c86cc43affb918.{held}.tmp"),
            "abc.png".to_string(),
            ".hidden".to_string(),
            format!("notes.{dead}.tmp"),
            ".x.png.not-a-revision!.nope.tmp".to_string(),
        ];
        for name in &names {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let removed = remove_abandoned_outputs(dir.path(), |token| token == held).unwrap();
        assert_eq!(removed, 1);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        left.sort();
        let mut expected: Vec<String> = names[1..].to_vec();
        expected.sort();
        assert_eq!(left, expected);
    }
}
