//! The worker tasks for files that are not images: `video_metadata` and
//! `poster_frame` (through [`Ffmpeg`]), and `audio_metadata` (through
//! [`crate::audio`], pure Rust).
//!
//! They follow the image tasks' steps (see [`mod@crate::tasks`]): count the
//! run, find the file through the caller's [`PathResolver`], check its
//! bytes against the claim's `content_digest` (a mismatch is retryable: the
//! file changed after it was registered), then read it. A video is hashed
//! as a stream and handed to the tools by path; an audio file is read
//! once, and what was checked is what is parsed.
//!
//! Failures: an unreadable file is retryable; a file the tools refuse, or
//! that they do not finish within their time limit, is terminal with the
//! tool's reason and the file's path. Without the tools (`Ffmpeg` not
//! given) the video tasks end terminal with [`NO_FFMPEG`]; the ingest does
//! not let them get that far, and requests them `blocked` instead.

use crate::audio::audio_facts;
use crate::error::MediaError;
use crate::hash::{hash_reader, sha256_hex, DIGEST_PREFIX};
use crate::image_ops::{encode_image, thumbnail, ThumbnailFormat};
use crate::tasks::{expected_sha256, task_error, ExecutionCounter, PathResolver};
use crate::video::{Ffmpeg, NO_FFMPEG};
use opledger_worker::{Job, Outcome, Task, TaskError};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How a task finds and checks its file.
#[derive(Clone)]
struct FileSource {
    resolver: Arc<dyn PathResolver>,
    executions: Option<ExecutionCounter>,
}

/// What reading the file found, off the async threads.
enum Read<T> {
    Done(T),
    Mismatch(String),
}

impl FileSource {
    fn count(&self) {
        if let Some(executions) = &self.executions {
            executions.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn locate(&self, job: &Job) -> Result<PathBuf, TaskError> {
        let Some(media) = job.media_id() else {
            return Err(TaskError::terminal(format!(
                "{} runs on a media item, but this claim names none",
                job.kind()
            )));
        };
        self.resolver.resolve(media).await
    }

    /// The file, checked against the claim's digest: its path, and its
    /// bytes when `keep` (else it is hashed as a stream).
    async fn checked(&self, job: &Job, keep: bool) -> Result<(PathBuf, Option<Vec<u8>>), TaskError> {
        let expected = expected_sha256(job.inputs())?;
        let path = self.locate(job).await?;
        job.checkpoint()?;
        let reading = path.clone();
        let work = tokio::task::spawn_blocking(move || -> Result<Read<Option<Vec<u8>>>, std::io::Error> {
            let (actual, bytes) = if keep {
                let bytes = std::fs::read(&reading)?;
                (sha256_hex(&bytes), Some(bytes))
            } else {
                (hash_reader(std::fs::File::open(&reading)?)?.sha256, None)
            };
            Ok(if actual == expected {
                Read::Done(bytes)
            } else {
                Read::Mismatch(format!(
                    "content changed since this revision was requested: expected {DIGEST_PREFIX}{expected}, \
                     the file now has {DIGEST_PREFIX}{actual} (file {}); a new scan requests a revision for it",
                    reading.display()
                ))
            })
        });
        let stopped = job.cancelled();
        let read = tokio::select! {
            read = work => read.map_err(|error| TaskError::retryable(format!("reading did not finish: {error}")))?,
            reason = stopped => return Err(TaskError::Stopped(reason)),
        };
        match read.map_err(|error| TaskError::retryable(format!("reading {}: {error}", path.display())))? {
            Read::Done(bytes) => Ok((path, bytes)),
            Read::Mismatch(message) => Err(TaskError::retryable(message)),
        }
    }

    /// `work` unless the job is told to stop first (a child process it
    /// runs is then dropped, which kills it).
    async fn unless_stopped<T>(&self, job: &Job, work: impl std::future::Future<Output = T>) -> Result<T, TaskError> {
        let stopped = job.cancelled();
        tokio::select! {
            done = work => Ok(done),
            reason = stopped => Err(TaskError::Stopped(reason)),
        }
    }
}

/// The tools, or the terminal error that says they are missing.
fn tools(ffmpeg: &Option<Ffmpeg>) -> Result<&Ffmpeg, TaskError> {
    ffmpeg.as_ref().ok_or_else(|| TaskError::terminal(NO_FFMPEG))
}

/// The `video_metadata` kind: `{"container", "duration_seconds", "width",
/// "height", "codec", "frame_rate", "byte_size"}` (and `"audio_codec"` when
/// the video has sound), from `ffprobe`.
#[derive(Clone)]
pub struct VideoMetadataTask {
    source: FileSource,
    ffmpeg: Option<Ffmpeg>,
}

impl VideoMetadataTask {
    /// `ffmpeg`: the tools ([`Ffmpeg::find`]); `None` where they are not
    /// installed.
    pub fn new(resolver: Arc<dyn PathResolver>, ffmpeg: Option<Ffmpeg>) -> Self {
        VideoMetadataTask {
            source: FileSource {
                resolver,
                executions: None,
            },
            ffmpeg,
        }
    }

    pub fn with_counter(mut self, executions: ExecutionCounter) -> Self {
        self.source.executions = Some(executions);
        self
    }
}

impl Task for VideoMetadataTask {
    fn kind(&self) -> &'static str {
        "video_metadata"
    }

    fn versions(&self) -> Vec<String> {
        crate::implemented_version("video_metadata")
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        self.source.count();
        let ffmpeg = tools(&self.ffmpeg)?;
        let (path, _) = self.source.checked(job, false).await?;
        let facts = self
            .source
            .unless_stopped(job, ffmpeg.probe(&path))
            .await?
            .map_err(|error| task_error(&error, &path))?;
        let mut output = facts.to_json();
        if let Ok(meta) = std::fs::metadata(&path) {
            output["byte_size"] = json!(meta.len());
        }
        Ok(Outcome::output(output))
    }
}

/// The `poster_frame` kind: a frame a tenth into the video (at most 5 s
/// in), longest side `max_side`, encoded as `format` (`png` or `jpeg`),
/// written like a thumbnail to `<thumbnails_dir>/<revision>.<png|jpg>`
/// through the job's fenced output. Output: `{"path", "width", "height",
/// "at_seconds"}`.
#[derive(Clone)]
pub struct PosterFrameTask {
    source: FileSource,
    ffmpeg: Option<Ffmpeg>,
    thumbnails_dir: PathBuf,
}

impl PosterFrameTask {
    pub fn new(resolver: Arc<dyn PathResolver>, ffmpeg: Option<Ffmpeg>, thumbnails_dir: impl Into<PathBuf>) -> Self {
        PosterFrameTask {
            source: FileSource {
                resolver,
                executions: None,
            },
            ffmpeg,
            thumbnails_dir: thumbnails_dir.into(),
        }
    }

    pub fn with_counter(mut self, executions: ExecutionCounter) -> Self {
        self.source.executions = Some(executions);
        self
    }
}

impl Task for PosterFrameTask {
    fn kind(&self) -> &'static str {
        "poster_frame"
    }

    fn versions(&self) -> Vec<String> {
        crate::implemented_version("poster_frame")
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        self.source.count();
        let ffmpeg = tools(&self.ffmpeg)?;
        let (max_side, format) = poster_inputs(job.inputs())?;
        let (path, _) = self.source.checked(job, false).await?;
        let made = self
            .source
            .unless_stopped(job, async {
                let facts = ffmpeg.probe(&path).await?;
                let at = facts.poster_time();
                let frame = ffmpeg.poster_frame(&path, at, max_side).await?;
                let small = thumbnail(&frame, max_side)?;
                let encoded = encode_image(&small, format)?;
                Ok::<_, MediaError>((encoded, small.width(), small.height(), at))
            })
            .await?;
        let (encoded, width, height, at) = made.map_err(|error| task_error(&error, &path))?;
        let final_path = self
            .thumbnails_dir
            .join(format!("{}.{}", job.revision(), format.extension()));
        let temporary = job.output_path_for(&final_path)?;
        std::fs::create_dir_all(&self.thumbnails_dir)
            .and_then(|()| std::fs::write(&temporary, &encoded))
            .map_err(|error| TaskError::retryable(format!("writing poster frame {}: {error}", temporary.display())))?;
        job.commit_output(&temporary, &final_path).await?;
        Ok(Outcome::output(json!({
            "path": final_path.to_string_lossy(),
            "width": width,
            "height": height,
            "at_seconds": at,
        })))
    }
}

/// `max_side` (1 to [`crate::MAX_THUMBNAIL_SIDE`]) and `format` of a
/// poster frame claim.
fn poster_inputs(inputs: &Value) -> Result<(u32, ThumbnailFormat), TaskError> {
    let max_side = inputs
        .get("max_side")
        .and_then(Value::as_u64)
        .filter(|side| (1..=u64::from(crate::MAX_THUMBNAIL_SIDE)).contains(side))
        .ok_or_else(|| {
            TaskError::terminal(format!(
                "poster_frame max_side must be a whole number from 1 to {}, not {}",
                crate::MAX_THUMBNAIL_SIDE,
                inputs.get("max_side").unwrap_or(&Value::Null)
            ))
        })?;
    let format = inputs.get("format").and_then(Value::as_str).unwrap_or("");
    let format = ThumbnailFormat::parse(format).map_err(|error| TaskError::terminal(error.to_string()))?;
    Ok((max_side as u32, format))
}

/// The `audio_metadata` kind: `{"format", "codec", "duration_seconds",
/// "sample_rate", "channels", "bit_depth", "bitrate_kbps", "byte_size",
/// "tags"}` ([`crate::AudioFacts`]), read in pure Rust.
#[derive(Clone)]
pub struct AudioMetadataTask {
    source: FileSource,
}

impl AudioMetadataTask {
    pub fn new(resolver: Arc<dyn PathResolver>) -> Self {
        AudioMetadataTask {
            source: FileSource {
                resolver,
                executions: None,
            },
        }
    }

    pub fn with_counter(mut self, executions: ExecutionCounter) -> Self {
        self.source.executions = Some(executions);
        self
    }
}

impl Task for AudioMetadataTask {
    fn kind(&self) -> &'static str {
        "audio_metadata"
    }

    fn versions(&self) -> Vec<String> {
        crate::implemented_version("audio_metadata")
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        self.source.count();
        let (path, bytes) = self.source.checked(job, true).await?;
        let bytes = bytes.unwrap_or_default();
        let byte_size = bytes.len();
        let facts = tokio::task::spawn_blocking(move || audio_facts(&bytes))
            .await
            .map_err(|error| TaskError::retryable(format!("audio work did not finish: {error}")))?
            .map_err(|error| task_error(&error, &path))?;
        let mut output = facts.to_json();
        output["byte_size"] = json!(byte_size);
        Ok(Outcome::output(output))
    }
}
