//! The media work of opledger's ingest pipeline: what happens to a file
//! once the ledger has decided it should happen. A streaming SHA-256 content
//! hash; *settling* (waiting until a file that is still being written stops
//! changing); image metadata (format, dimensions, byte size); thumbnails;
//! a 64-bit perceptual hash (dHash); the [`opledger_worker::Task`]
//! implementations that run the `metadata`, `thumbnail` and
//! `perceptual_hash` kinds on claimed work, with their declarations
//! ([`KINDS_TOML`]); and a generator of deterministic
//! sample images (with optional corrupt files) for trying the pipeline out.
//!
//! Files are classified by content ([`classify_file`]: `image`, `video`,
//! `audio`, `other`), and the image kinds apply to images only. Video gets
//! `video_metadata` and `poster_frame` through `ffprobe`/`ffmpeg` as child
//! processes with a time limit, when they are installed ([`Ffmpeg`]);
//! audio gets `audio_metadata` in pure Rust ([`audio_facts`]). HEIF/HEIC
//! and AVIF photos are images of their own formats, decoded only in a
//! build with the `heif` feature ([`HEIF_SUPPORT`]). Camera RAW photos
//! (CR2, NEF, ARW, DNG, ORF, RW2, PEF, RAF) are read through the largest
//! JPEG preview they embed (`raw.rs`).
//!
//! It knows image formats and files, and must not know SQL, a store backend
//! or the engine's commands: the worker tasks see only a
//! [`opledger_worker::Job`] (the claim, its inputs, fenced file outputs),
//! and a task learns where a media item's file is through a
//! [`PathResolver`] the caller supplies, because paths are not part of a
//! revision. Everything else here is plain functions on files and bytes,
//! usable without a ledger at all.
//!
//! Every pixel is decoded under [`DecodeLimits`], through one of two
//! checked entry points: [`decode_image_with`] (every pixel, full size) and
//! [`decode_working`] (the working image the tasks share: a JPEG decoded at
//! reduced size by DCT scaling, upright, at most twice a thumbnail's side).
//! A header that declares more than the limits allow is refused before
//! decoding, and a decode is strict, so a truncated or damaged file is an
//! error rather than a grey picture. The image tasks of one worker decode a
//! file once between them ([`DecodeCache`], by content digest).
//!
//! Errors say whether trying again could help ([`MediaError::is_retryable`]):
//! a file that cannot be read is I/O trouble (retryable); bytes that do not
//! decode as an image, or an image larger than the limits, are final
//! (terminal), whatever the reader guesses.

// Public so their documentation (the settling rule, the dHash algorithm,
// the tasks' steps and failure decisions) is part of the API docs; the
// items are re-exported below for short paths.
/// The declarations of the kinds this crate's tasks run (`kinds.toml`):
/// the ingest applies them before it requests any (`opledger kinds apply`
/// format).
pub const KINDS_TOML: &str = include_str!("../kinds.toml");

/// The version [`KINDS_TOML`] declares for `kind`: the version this
/// crate's task of that kind implements, which its workers state when they
/// claim (so they are never offered work requested at another version).
/// Empty for a kind the file does not declare.
pub fn implemented_version(kind: &str) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct File {
        kind: Vec<Declared>,
    }
    #[derive(serde::Deserialize)]
    struct Declared {
        name: String,
        version: String,
    }
    static VERSIONS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    VERSIONS
        .get_or_init(|| {
            let file: File = toml::from_str(KINDS_TOML).expect("kinds.toml is a valid declaration file");
            file.kind
                .into_iter()
                .map(|declared| (declared.name, declared.version))
                .collect()
        })
        .iter()
        .filter(|(name, _)| name == kind)
        .map(|(_, version)| version.clone())
        .collect()
}

pub mod audio;
pub mod av_tasks;
pub mod cache;
pub mod camera;
pub mod classify;
pub mod decode;
pub mod dhash;
pub mod error;
pub mod hash;
#[cfg(feature = "heif")]
mod heif;
pub mod image_ops;
mod jpeg;
mod jpeg_scaled;
mod jpeg_scan;
#[cfg(test)]
mod jpeg_scan_tests;
mod limits;
pub mod paths;
mod raw;
pub mod samples;
pub mod settle;
pub mod tasks;
pub mod video;
pub mod working;

/// Whether this build decodes HEIF/HEIC and AVIF photos (the `heif`
/// feature, which links the system's libheif). Without it their image
/// kinds are requested `blocked` with [`NO_HEIF_SUPPORT`].
pub const HEIF_SUPPORT: bool = cfg!(feature = "heif");

/// The reason HEIF/AVIF photos' image kinds are blocked in a build without
/// the `heif` feature.
pub const NO_HEIF_SUPPORT: &str = "built without HEIF support";

/// The kinds the image tasks run ([`KINDS_TOML`]): what a HEIF photo's
/// block names in a build without HEIF support.
pub const IMAGE_KINDS: &[&str] = &["metadata", "thumbnail", "perceptual_hash"];

/// The kinds of video files, run through `ffprobe`/`ffmpeg`.
pub const VIDEO_KINDS: &[&str] = &["video_metadata", "poster_frame"];

/// The kinds of sound files.
pub const AUDIO_KINDS: &[&str] = &["audio_metadata"];

/// The `image` crate this one is built on (its types appear in the API).
pub use image;

pub use audio::{audio_facts, AudioFacts};
pub use av_tasks::{AudioMetadataTask, PosterFrameTask, VideoMetadataTask};
pub use cache::DecodeCache;
pub use camera::{camera_facts, CameraFacts};
pub use classify::{classify_bytes, classify_file, Classified, MediaKind};
pub use decode::{decode_image, decode_image_with, DecodeLimits, DecodedImage};
pub use dhash::{dhash, hamming_distance, DHash, DHASH_ALGORITHM};
pub use error::MediaError;
pub use hash::{hash_file, hash_reader, sha256_hex, ContentHash, DIGEST_PREFIX};
pub use image_ops::{
    encode_image, format_name, image_metadata, read_classified_metadata, read_metadata, shrink, thumbnail,
    thumbnail_size, ImageMetadata, ThumbnailFormat, DEFAULT_THUMBNAIL_SIDE,
};
pub use paths::{path_text, text_path};
/// Synthetic camera RAWs for tests.
#[doc(hidden)]
pub use raw::synthetic as raw_samples;
pub use samples::{generate_samples, generate_samples_with, SampleOptions, SampleSet};
pub use settle::{file_state, is_settled, FileState, SettleClock, SettleError, Settled, Settler, SystemSettleClock};
pub use tasks::{
    resolver_fn, ExecutionCounter, MetadataTask, PathResolver, PerceptualHashTask, ThumbnailTask, MAX_THUMBNAIL_SIDE,
};
pub use video::{Ffmpeg, VideoFacts, NO_FFMPEG};
pub use working::{decode_working, WorkingImage, DEFAULT_WORKING_SIDE};
