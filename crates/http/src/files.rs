//! Files the service reads from disk because a worker named them: an
//! image output (a thumbnail) is served only from the ledger's output
//! directories, as a regular file of a bounded size, as a raster image
//! type decided from its bytes, and streamed in chunks.
//!
//! A worker-reported path is untrusted data: the ledger records it as
//! given, and this module decides, each time it is asked, whether the file
//! it names may be handed out. It must not know who recorded the path nor
//! which route serves it.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderName, HeaderValue};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use tokio::io::AsyncReadExt;

/// 32 MiB: the largest file served unless configured otherwise.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 32 << 20;

/// The size of each read and of each chunk handed to the connection.
const CHUNK_BYTES: usize = 64 * 1024;

/// What an image's type is decided from.
const SNIFF_BYTES: usize = 64;

/// The headers every file response carries: the type is ours, not the
/// browser's guess; nothing in it runs or loads anything; other origins
/// cannot embed it.
pub fn file_headers() -> [(HeaderName, HeaderValue); 3] {
    [
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'none'; sandbox"),
        ),
        (
            HeaderName::from_static("cross-origin-resource-policy"),
            HeaderValue::from_static("same-origin"),
        ),
    ]
}

/// The directories files are served from (canonical: links resolved) and
/// the size bound.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    roots: Vec<PathBuf>,
    max_bytes: u64,
}

impl Outputs {
    /// Output roots as given; each is resolved now (a root that does not
    /// exist yet is kept as given, made absolute, and serves nothing until
    /// it exists with that very path).
    pub fn new(roots: impl IntoIterator<Item = PathBuf>, max_bytes: u64) -> Self {
        let roots = roots
            .into_iter()
            .map(|root| {
                std::fs::canonicalize(&root)
                    .or_else(|_| std::path::absolute(&root))
                    .unwrap_or(root)
            })
            .collect();
        Outputs { roots, max_bytes }
    }

    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Opens `recorded` as a servable image, or says why not. Blocking
    /// (path resolution and `open`); never blocks on a FIFO or device,
    /// which are opened non-blocking and refused by their descriptor.
    pub fn open_image(&self, recorded: &str) -> Result<ServedImage, Refusal> {
        let path = Path::new(recorded);
        if !path.is_absolute() {
            return Err(Refusal::Outside);
        }
        let resolved = std::fs::canonicalize(path).map_err(|error| Refusal::Unreadable(error.kind()))?;
        if !self.contains(&resolved) {
            return Err(Refusal::Outside);
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(open_flags())
            .open(&resolved)
            .map_err(|error| Refusal::Unreadable(error.kind()))?;
        // What the descriptor really is, whatever changed on the path since
        // it was resolved.
        if let Some(opened) = descriptor_path(&file) {
            if !self.contains(&opened) {
                return Err(Refusal::Outside);
            }
        }
        let metadata = file.metadata().map_err(|error| Refusal::Unreadable(error.kind()))?;
        if !metadata.file_type().is_file() {
            return Err(Refusal::NotRegular);
        }
        if metadata.len() > self.max_bytes {
            return Err(Refusal::TooLarge {
                size: metadata.len(),
                limit: self.max_bytes,
            });
        }
        let mut head = vec![0u8; SNIFF_BYTES.min(usize::try_from(metadata.len()).unwrap_or(SNIFF_BYTES))];
        file.read_exact(&mut head)
            .map_err(|error| Refusal::Unreadable(error.kind()))?;
        let content_type = raster_type(&head).ok_or(Refusal::NotRaster)?;
        Ok(ServedImage {
            file,
            head,
            len: metadata.len(),
            content_type,
        })
    }

    fn contains(&self, resolved: &Path) -> bool {
        self.roots
            .iter()
            .any(|root| resolved.starts_with(root) && resolved != root.as_path())
    }
}

/// `O_NONBLOCK` so that opening a FIFO never waits for a writer;
/// `O_NOFOLLOW` so that a link put in the resolved path's place is refused;
/// `O_NOCTTY` so that a terminal never becomes ours.
fn open_flags() -> i32 {
    libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW
}

/// The path an open descriptor names, where the system tells it.
fn descriptor_path(file: &File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// Why a file is not served. Every refusal answers as if there were no
/// file (404), but a file that is there and is no raster image (415).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It resolves outside every output directory (or is relative).
    Outside,
    /// Not a regular file: a FIFO, a device, a directory, a socket.
    NotRegular,
    TooLarge {
        size: u64,
        limit: u64,
    },
    /// It cannot be resolved, opened or read.
    Unreadable(std::io::ErrorKind),
    /// Its bytes are no PNG, JPEG, WebP, GIF or AVIF image.
    NotRaster,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Outside => write!(f, "it is outside the ledger's output directories"),
            Refusal::NotRegular => write!(f, "it is not a regular file"),
            Refusal::TooLarge { size, limit } => write!(f, "it is {size} bytes, more than the {limit} served"),
            Refusal::Unreadable(kind) => write!(f, "it cannot be read ({kind})"),
            Refusal::NotRaster => write!(f, "it is not a PNG, JPEG, WebP, GIF or AVIF image"),
        }
    }
}

/// An image file opened for serving.
#[derive(Debug)]
pub struct ServedImage {
    file: File,
    /// The bytes already read from the start (the type was decided on them).
    head: Vec<u8>,
    len: u64,
    content_type: &'static str,
}

impl ServedImage {
    pub fn content_type(&self) -> &'static str {
        self.content_type
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file as a body of 64 KiB chunks: the bytes it had when it was
    /// opened, never more (a file that grows is cut at its opened size; one
    /// that shrinks ends the body early, as an error).
    pub fn into_body(self) -> Body {
        let ServedImage { file, head, len, .. } = self;
        let left = len - head.len() as u64;
        let state = (Some(Bytes::from(head)), tokio::fs::File::from_std(file), left);
        let stream = futures::stream::unfold(state, |(head, mut file, left)| async move {
            if let Some(head) = head.filter(|head| !head.is_empty()) {
                return Some((Ok(head), (None, file, left)));
            }
            if left == 0 {
                return None;
            }
            let want = usize::try_from(left).unwrap_or(CHUNK_BYTES).min(CHUNK_BYTES);
            let mut chunk = vec![0u8; want];
            match file.read(&mut chunk).await {
                Ok(0) => Some((
                    Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the file shrank while it was served",
                    )),
                    (None, file, 0),
                )),
                Ok(read) => {
                    chunk.truncate(read);
                    Some((Ok(Bytes::from(chunk)), (None, file, left - read as u64)))
                }
                Err(error) => Some((Err(error), (None, file, 0))),
            }
        });
        Body::from_stream(stream)
    }
}

/// The raster image type `head` (a file's first bytes) begins, if any:
/// never SVG, HTML or anything a browser would run.
pub fn raster_type(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Some("image/png");
    }
    if head.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return Some("image/jpeg");
    }
    if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        return Some("image/gif");
    }
    if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        return Some("image/webp");
    }
    if is_avif(head) {
        return Some("image/avif");
    }
    None
}

/// An ISO-BMFF `ftyp` box whose major or a compatible brand is AVIF.
fn is_avif(head: &[u8]) -> bool {
    if head.len() < 16 || &head[4..8] != b"ftyp" {
        return false;
    }
    let size = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let end = size.min(head.len());
    let brand = |at: usize| {
        head.get(at..at + 4)
            .is_some_and(|brand| brand == b"avif" || brand == b"avis")
    };
    // Major brand at 8, minor version at 12, compatible brands from 16.
    brand(8) || (16..end).step_by(4).any(brand)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raster_types_are_decided_from_the_bytes_and_nothing_else_passes() {
        assert_eq!(raster_type(b"\x89PNG\r\n\x1a\n...."), Some("image/png"));
        assert_eq!(raster_type(&[0xFF, 0xD8, 0xFF, 0xE0]), Some("image/jpeg"));
        assert_eq!(raster_type(b"GIF89a...."), Some("image/gif"));
        assert_eq!(raster_type(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        let mut avif = b"\0\0\0\x1cftypmif1\0\0\0\0mif1avifmiaf".to_vec();
        avif.resize(40, 0);
        assert_eq!(raster_type(&avif), Some("image/avif"));
        assert_eq!(raster_type(b"<svg xmlns=\"http://www.w3.org/2000/svg\">"), None);
        assert_eq!(raster_type(b"<!DOCTYPE html><script>"), None);
        assert_eq!(raster_type(b"\0\0\0\x18ftypisom\0\0\0\0isommp42"), None);
        assert_eq!(raster_type(b""), None);
    }
}
