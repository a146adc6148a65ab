//! One error type for the media work, split by whether another attempt
//! could succeed.

use std::io;
use std::path::PathBuf;
use thiserror::Error;

/// What media work can fail with.
#[derive(Debug, Error)]
pub enum MediaError {
    /// The file could not be read or written (missing, permissions, a full
    /// disk, a flaky mount). Another attempt may succeed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The bytes are not an image this build decodes: corrupt, truncated,
    /// another kind of file, or a format without a codec here. The same
    /// bytes fail the same way every time.
    #[error("not a decodable image: {0}")]
    NotAnImage(String),
    /// The image is larger than this worker decodes: its header declares
    /// more pixels than the [`crate::DecodeLimits`] allow, or a decode that
    /// would hold more memory than they allow. Refused before any pixel is
    /// decoded; the same bytes are refused the same way under the same
    /// limits, so it is final (another worker with higher limits may take
    /// it up when the work is retried).
    #[error("too large to decode: {0}")]
    TooLarge(String),
    /// The caller asked for something that cannot be done (an unknown
    /// output format, a zero size). Final.
    #[error("{0}")]
    Invalid(String),
    /// A file that is not an image could not be read for what it is: a
    /// video `ffprobe`/`ffmpeg` refused or did not finish within its time
    /// limit, audio whose container does not parse. The same bytes fail
    /// the same way, so it is final.
    #[error("{0}")]
    Unreadable(String),
}

impl MediaError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        MediaError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// Whether another attempt on the same bytes could succeed: only I/O
    /// trouble can clear up by itself.
    pub fn is_retryable(&self) -> bool {
        matches!(self, MediaError::Io { .. })
    }
}
