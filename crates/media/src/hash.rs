//! The content hash: SHA-256 of a file's bytes, read in fixed-size chunks
//! so a large video costs a buffer, not its size in memory.

use crate::error::MediaError;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// How a digest is written in the ledger (`content_digest` of a media item
/// and of every task's inputs): the algorithm, a colon, lowercase hex.
pub const DIGEST_PREFIX: &str = "sha256:";

/// Bytes read per step. 256 KiB keeps the syscall count low on large files
/// while staying far below any file worth hashing in memory.
const CHUNK: usize = 256 * 1024;

/// A file's SHA-256 and how many bytes it had.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContentHash {
    /// Lowercase hex, 64 digits.
    pub sha256: String,
    pub byte_size: u64,
}

impl ContentHash {
    /// The digest as the ledger records it: `sha256:<hex>`.
    pub fn digest(&self) -> String {
        format!("{DIGEST_PREFIX}{}", self.sha256)
    }

    /// Whether `digest` names these bytes. Accepts the ledger's
    /// `sha256:<hex>` and bare hex, in either case.
    pub fn matches(&self, digest: &str) -> bool {
        let hex = digest.strip_prefix(DIGEST_PREFIX).unwrap_or(digest);
        hex.eq_ignore_ascii_case(&self.sha256)
    }
}

/// Streams `path` through SHA-256.
pub fn hash_file(path: &Path) -> Result<ContentHash, MediaError> {
    let file = File::open(path).map_err(|source| MediaError::io("opening", path, source))?;
    hash_reader(file).map_err(|source| MediaError::io("reading", path, source))
}

/// Streams any reader through SHA-256 until its end.
pub fn hash_reader(mut reader: impl Read) -> io::Result<ContentHash> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0_u8; CHUNK];
    let mut byte_size = 0_u64;
    loop {
        let read = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        hasher.update(&buffer[..read]);
        byte_size += read as u64;
    }
    Ok(ContentHash {
        sha256: to_hex(&hasher.finalize()),
        byte_size,
    })
}

/// SHA-256 of bytes already in memory, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    to_hex(&Sha256::digest(bytes))
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn known_vectors() {
        assert_eq!(sha256_hex(b""), EMPTY);
        assert_eq!(sha256_hex(b"abc"), ABC);
        let hashed = hash_reader(&b"abc"[..]).unwrap();
        assert_eq!(hashed.sha256, ABC);
        assert_eq!(hashed.byte_size, 3);
        assert_eq!(hashed.digest(), format!("sha256:{ABC}"));
        assert!(hashed.matches(&format!("sha256:{ABC}")));
        assert!(hashed.matches(&ABC.to_uppercase()));
        assert!(!hashed.matches(&format!("sha256:{EMPTY}")));
    }

    #[test]
    fn a_file_spanning_many_chunks_hashes_like_its_bytes_in_memory() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("big.bin");
        // Not a multiple of the chunk size, so the last read is partial.
        let bytes: Vec<u8> = (0..(3 * CHUNK + 12_345))
            .map(|index| (index * 31 % 251) as u8)
            .collect();
        std::fs::write(&path, &bytes).unwrap();
        let hashed = hash_file(&path).unwrap();
        assert_eq!(hashed.sha256, sha256_hex(&bytes));
        assert_eq!(hashed.byte_size, bytes.len() as u64);
    }

    #[test]
    fn a_missing_file_is_retryable_io_trouble() {
        let folder = tempfile::tempdir().unwrap();
        let error = hash_file(&folder.path().join("gone.png")).unwrap_err();
        assert!(error.is_retryable(), "{error}");
        assert!(error.to_string().contains("gone.png"), "{error}");
    }
}
