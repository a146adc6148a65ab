//! The artifact directory: where supervisors meet. Every supervisor and
//! every registration of one ledger uses the same directory (on several
//! hosts, a shared filesystem with `flock`, atomic rename and fsync), laid
//! out as:
//!
//! | path | what |
//! | --- | --- |
//! | `slots/<host>-<i>.lock` | one lock per slot of a machine: a child runs only while its supervisor holds one |
//! | `supervisors/<name>.lock`, `.json` | held by a running supervisor; its heartbeat |
//! | `jobs/<operation>.lock` | the execution lock, held while the job's child lives |
//! | `jobs/<operation>.json` | the job's heartbeat and progress (liveness, not the log) |
//! | `tmp/<operation>.part` | the artifact being written |
//! | `files/<operation>.<ext>` | finished artifacts, until they expire |
//! | `secret` | the key job tokens are signed with (0600) |
//!
//! Created `0700`: artifacts are the ledger's contents and are never
//! served statically.

use crate::SuperviseError;
use opledger_domain::OperationId;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// One ledger's artifact directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactDir {
    root: PathBuf,
}

const SUBDIRS: [&str; 5] = ["slots", "supervisors", "jobs", "tmp", "files"];

impl ArtifactDir {
    /// The directory at `root`, created `0700` when missing, with its
    /// subdirectories (`0700`).
    pub fn open(root: impl Into<PathBuf>) -> Result<ArtifactDir, SuperviseError> {
        let root = root.into();
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true).mode(0o700);
        // A directory made here is 0700 whatever the umask; one that exists
        // keeps the mode its owner gave it (a shared directory's, say).
        if !root.exists() {
            builder.create(&root).map_err(SuperviseError::io(format!(
                "creating the artifact directory {}",
                root.display()
            )))?;
            fs::set_permissions(&root, fs::Permissions::from_mode(0o700))
                .map_err(SuperviseError::io(format!("restricting {}", root.display())))?;
        }
        for sub in SUBDIRS {
            let path = root.join(sub);
            builder
                .create(&path)
                .map_err(SuperviseError::io(format!("creating {}", path.display())))?;
        }
        Ok(ArtifactDir { root })
    }

    /// The default for a SQLite ledger: `artifacts/` beside its file.
    pub fn beside(database_file: &Path) -> PathBuf {
        database_file
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .join("artifacts")
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A slot of this machine: slots are per host, so supervisors of
    /// several hosts sharing the directory each have their own.
    pub fn slot_lock(&self, slot: usize) -> PathBuf {
        self.root.join("slots").join(format!("{}-{slot}.lock", host_name()))
    }

    pub fn supervisors(&self) -> PathBuf {
        self.root.join("supervisors")
    }

    pub fn job_lock(&self, job: OperationId) -> PathBuf {
        self.root.join("jobs").join(format!("{job}.lock"))
    }

    pub fn job_live(&self, job: OperationId) -> PathBuf {
        self.root.join("jobs").join(format!("{job}.json"))
    }

    pub fn temporary(&self, job: OperationId) -> PathBuf {
        self.root.join("tmp").join(format!("{job}.part"))
    }

    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub fn files_dir(&self) -> PathBuf {
        self.root.join("files")
    }

    pub fn artifact(&self, job: OperationId, extension: &str) -> PathBuf {
        self.files_dir().join(format!("{job}.{extension}"))
    }

    pub fn secret(&self) -> PathBuf {
        self.root.join("secret")
    }

    /// Bytes held by finished artifacts and temporary files together.
    pub fn storage_used(&self) -> u64 {
        [self.files_dir(), self.tmp_dir()]
            .iter()
            .filter_map(|dir| fs::read_dir(dir).ok())
            .flatten()
            .filter_map(|entry| entry.ok()?.metadata().ok())
            .map(|metadata| metadata.len())
            .sum()
    }

    /// Removes every file a job left: its temporary file, its artifact, its
    /// liveness file. Missing files are fine.
    pub fn remove_job_files(&self, job: OperationId) {
        let _ = fs::remove_file(self.temporary(job));
        for extension in ["csv", "json"] {
            let _ = fs::remove_file(self.artifact(job, extension));
        }
    }
}

/// This machine's name (`slots/` is keyed by it).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().replace(['/', '.'], "_"))
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "host".to_string())
}

/// Writes `bytes` to `path` through a temporary sibling and a rename, so a
/// reader sees the old content or the new, never half of it.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let write = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}-{write}.new", std::process::id()));
    let temporary = PathBuf::from(temporary);
    fs::write(&temporary, bytes)?;
    fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_artifact_directory_is_0700_and_an_existing_one_keeps_its_mode() {
        let parent = std::env::temp_dir().join(format!("opledger-dir-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&parent);
        let made = ArtifactDir::open(parent.join("new")).unwrap();
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(made.root()), 0o700);
        assert_eq!(mode(&made.files_dir()), 0o700);
        let existing = parent.join("existing");
        fs::create_dir_all(&existing).unwrap();
        fs::set_permissions(&existing, fs::Permissions::from_mode(0o750)).unwrap();
        ArtifactDir::open(&existing).unwrap();
        assert_eq!(mode(&existing), 0o750);
        fs::remove_dir_all(&parent).unwrap();
    }
}
