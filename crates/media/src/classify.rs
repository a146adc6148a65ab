//! What a file is, by its content: the media kind it is registered with
//! (`image`, `video`, `audio`, `other`) and the format its first bytes
//! declare, read from the magic bytes (the `infer` crate's table), never
//! from the name, so a PNG named `.jpg` is a PNG and a video named `.jpg`
//! is a video.
//!
//! One exception keeps damage visible: bytes no format claims (a
//! truncated or zeroed file, text) under a name that says *image* are an
//! `image`, a damaged one, whose image tasks then fail with the decoder's
//! reason and bring it to a person. Classified `other`, a damaged photo
//! would end `not_applicable`, as if it had never been a photo.

use crate::error::MediaError;
use std::io::Read;
use std::path::Path;

/// How many leading bytes classification reads: enough for every format's
/// signature in the table (some sit a few kilobytes in).
pub const SNIFF_BYTES: usize = 8192;

/// What kind of media a file holds, as the ledger registers it; declared
/// kinds name these in `applies_to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MediaKind {
    Image,
    Video,
    Audio,
    Other,
}

impl MediaKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MediaKind::Image => "image",
            MediaKind::Video => "video",
            MediaKind::Audio => "audio",
            MediaKind::Other => "other",
        }
    }
}

impl std::fmt::Display for MediaKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A file's kind and the format its content declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classified {
    pub kind: MediaKind,
    /// The format's usual extension (`jpg`, `png`, `heif`, `avif`, `mp4`,
    /// `wav`, ...), when the content names one.
    pub format: Option<&'static str>,
    /// The format's MIME type, when the content names one.
    pub mime: Option<&'static str>,
}

impl Classified {
    /// Whether it may be a camera RAW: a RAW's header names it, or it is a
    /// TIFF (whose IFDs tell a RAW from an ordinary picture).
    pub fn may_be_raw(&self) -> bool {
        self.kind == MediaKind::Image && matches!(self.format, Some("tif" | "cr2" | "orf" | "rw2" | "raf"))
    }

    /// Whether decoding it needs libheif (HEIF/HEIC and AVIF photos).
    pub fn needs_heif(&self) -> bool {
        self.kind == MediaKind::Image && matches!(self.format, Some("heif" | "avif"))
    }
}

/// Names that say *image*: the fallback for bytes no format claims.
const IMAGE_EXTENSIONS: &[&str] = &[
    "jpg", "jpeg", "jpe", "png", "gif", "webp", "tif", "tiff", "heic", "heif", "avif", "bmp", "cr2", "cr3", "nef",
    "nrw", "arw", "dng", "orf", "rw2", "raf", "pef", "srw",
];

/// Classifies `head`, the first bytes of the file called `name` (at least
/// [`SNIFF_BYTES`] of them when the file has that many).
pub fn classify_bytes(head: &[u8], name: &Path) -> Classified {
    // Camera RAWs whose headers are their own (not every one is known to
    // the sniffer).
    if let Some(format) = crate::raw::raw_magic(head) {
        return Classified {
            kind: MediaKind::Image,
            format: Some(format),
            mime: Some("image/x-raw"),
        };
    }
    if let Some(found) = infer::get(head) {
        let kind = match found.matcher_type() {
            infer::MatcherType::Image => MediaKind::Image,
            infer::MatcherType::Video => MediaKind::Video,
            infer::MatcherType::Audio => MediaKind::Audio,
            _ => MediaKind::Other,
        };
        return Classified {
            kind,
            format: Some(found.extension()),
            mime: Some(found.mime_type()),
        };
    }
    let named_image = name
        .extension()
        .and_then(|extension| extension.to_str())
        .is_some_and(|extension| IMAGE_EXTENSIONS.contains(&extension.to_ascii_lowercase().as_str()));
    Classified {
        kind: if named_image {
            MediaKind::Image
        } else {
            MediaKind::Other
        },
        format: None,
        mime: None,
    }
}

/// Classifies the file at `path` by its first [`SNIFF_BYTES`] bytes.
pub fn classify_file(path: &Path) -> Result<Classified, MediaError> {
    let file = std::fs::File::open(path).map_err(|error| MediaError::io("opening", path, error))?;
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    file.take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(|error| MediaError::io("reading", path, error))?;
    Ok(classify_bytes(&head, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_decides_the_kind_whatever_the_name() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        let classified = classify_bytes(png, Path::new("holiday.jpg"));
        assert_eq!(classified.kind, MediaKind::Image);
        assert_eq!(classified.format, Some("png"));
        let wav = b"RIFF\x24\0\0\0WAVEfmt ";
        assert_eq!(classify_bytes(wav, Path::new("x.jpg")).kind, MediaKind::Audio);
        let mp4 = b"\0\0\0\x20ftypisom\0\0\x02\0isomiso2avc1mp41";
        assert_eq!(classify_bytes(mp4, Path::new("clip.png")).kind, MediaKind::Video);
        let heic = b"\0\0\0\x18ftypheic\0\0\0\0mif1heic";
        let classified = classify_bytes(heic, Path::new("IMG_0001.HEIC"));
        assert_eq!((classified.kind, classified.format), (MediaKind::Image, Some("heif")));
        assert!(classified.needs_heif());
    }

    #[test]
    fn bytes_no_format_claims_are_an_image_only_under_an_image_name() {
        let text = b"This is a text file with an image's name, not an image.\n";
        assert_eq!(classify_bytes(text, Path::new("notes.JPG")).kind, MediaKind::Image);
        assert_eq!(classify_bytes(b"", Path::new("empty.png")).kind, MediaKind::Image);
        assert_eq!(classify_bytes(text, Path::new("notes.txt")).kind, MediaKind::Other);
        assert_eq!(classify_bytes(text, Path::new("README")).kind, MediaKind::Other);
    }
}
