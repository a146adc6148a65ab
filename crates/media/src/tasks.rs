//! The worker tasks for the registry's image kinds: `metadata`,
//! `thumbnail` and `perceptual_hash` (inputs in
//! `crates/domain/src/tasks.rs`).
//!
//! Each run follows the same steps:
//!
//! 1. Count the execution (the optional [`ExecutionCounter`]), so a test or
//!    the ingest summary can tell how many tasks really ran.
//! 2. Find the file: the claim names a media item, and the caller's
//!    [`PathResolver`] says where its file is now. Paths are not part of a
//!    revision (moving a file does not change what a thumbnail of it is),
//!    so the claim cannot carry one.
//! 3. Read the file once and check its SHA-256 against the claim's
//!    `content_digest`. The revision was computed from that digest; bytes
//!    that no longer match it must not produce its output. A mismatch is a
//!    **retryable** failure: the file changed after it was registered, which
//!    is ordinary in a live library (an edit, a copy still running), not a
//!    defect of the item. The ingest's next scan registers the new digest and
//!    requests a new revision, which the retry-waiting task takes up at once;
//!    if nobody does, the kind's retry budget ends it `failed_terminal` with
//!    the mismatch as its last error. A digest that is not SHA-256 (or is
//!    missing) cannot be checked at all and is terminal.
//! 4. Decode those same bytes (never the file again: what was checked is
//!    what is decoded) into the working image, [`crate::decode_working`],
//!    under the task's [`DecodeLimits`] (`with_limits`; the defaults
//!    otherwise), and do the image work, abandoning it if the job is told
//!    to stop. With a [`DecodeCache`] (`with_cache`, shared by the three
//!    tasks as the ingest shares it), steps 3 and 4 run once per content
//!    digest: a task whose digest was decoded by another takes that working
//!    image without reading the file (see [`mod@crate::cache`] for why that
//!    is the same output).
//!
//! Steps 3 and 4 (and writing a thumbnail's temporary file) run as one
//! closure, on the [`ComputeThreads`] the task was given
//! (`on_compute_threads`, as the ingest does) or else on tokio's blocking
//! pool: one trip off the async runtime per task, not one per step. *Why:*
//! each trip wakes a thread and then the task; with three trips a task,
//! those wake-ups were about a fifth of the time an ingest's image work
//! held the CPU, and the bytes went cold between threads.
//!
//! Failures: an unreadable file is retryable (I/O); bytes that are not a
//! decodable image (corrupt, truncated, a text file named `.jpg`), an
//! image larger than the limits (a decompression bomb), and inputs this
//! code cannot honour are terminal, with the reason first (`not a
//! decodable image: ...`, `too large to decode: ...`) and the file's path
//! after it.
//!
//! The tasks report no progress phases: one image takes milliseconds, and
//! every phase change is an event on the timeline, which would cost the
//! ledger more than the work it describes.

use crate::cache::{DecodeCache, Decoded};
use crate::camera::camera_facts;
use crate::decode::DecodeLimits;
use crate::dhash::{dhash, DHASH_ALGORITHM};
use crate::error::MediaError;
use crate::hash::{sha256_hex, DIGEST_PREFIX};
use crate::image_ops::{encode_image, image_metadata, ThumbnailFormat};
use crate::working::{decode_working, WorkingImage, DEFAULT_WORKING_SIDE};
use futures::future::BoxFuture;
use opledger_domain::MediaId;
use opledger_worker::{ComputeThreads, Job, JobError, Outcome, Task, TaskError};
use serde_json::{json, Value};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counts task executions (every call of `run`, whatever its outcome).
pub type ExecutionCounter = Arc<AtomicU64>;

/// The largest `max_side` a thumbnail task accepts: beyond it a "thumbnail"
/// is a full-size copy, and a typo (25600) should fail loudly.
pub const MAX_THUMBNAIL_SIDE: u32 = 4096;

/// Where a media item's file is now. The caller knows (the ledger's media
/// registry, a library's own database); this crate does not.
///
/// Return [`TaskError::Retryable`] for trouble that may pass (the registry
/// is unavailable) and [`TaskError::Terminal`] when the item cannot have a
/// file (it is not known at all).
pub trait PathResolver: Send + Sync + 'static {
    fn resolve(&self, media: MediaId) -> BoxFuture<'static, Result<PathBuf, TaskError>>;
}

struct FnResolver<F>(F);

impl<F, Fut> PathResolver for FnResolver<F>
where
    F: Fn(MediaId) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<PathBuf, TaskError>> + Send + 'static,
{
    fn resolve(&self, media: MediaId) -> BoxFuture<'static, Result<PathBuf, TaskError>> {
        Box::pin((self.0)(media))
    }
}

/// A resolver from an async function or closure:
/// `resolver_fn(move |media| { let map = map.clone(); async move { ... } })`.
pub fn resolver_fn<F, Fut>(resolve: F) -> Arc<dyn PathResolver>
where
    F: Fn(MediaId) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<PathBuf, TaskError>> + Send + 'static,
{
    Arc::new(FnResolver(resolve))
}

/// What every image task shares: how to find the file, the counter, where
/// its CPU work runs, and the limits its decodes run under.
#[derive(Clone)]
struct Source {
    resolver: Arc<dyn PathResolver>,
    executions: Option<ExecutionCounter>,
    /// The threads the work runs on; without them, tokio's blocking pool.
    compute: Option<ComputeThreads>,
    limits: DecodeLimits,
    /// Shared with the other image tasks of the same worker, if given.
    cache: Option<Arc<DecodeCache>>,
    /// The side the metadata and the perceptual hash decode at, and the
    /// least a thumbnail does.
    working_side: u32,
}

impl Source {
    fn new(resolver: Arc<dyn PathResolver>) -> Self {
        Source {
            resolver,
            executions: None,
            compute: None,
            limits: DecodeLimits::default(),
            cache: None,
            working_side: DEFAULT_WORKING_SIDE,
        }
    }

    /// Where the claim's media item's file is now.
    async fn locate(&self, job: &Job) -> Result<PathBuf, TaskError> {
        let Some(media) = job.media_id() else {
            return Err(TaskError::terminal(format!(
                "{} runs on a media item, but this claim names none",
                job.kind()
            )));
        };
        self.resolver.resolve(media).await
    }

    /// The working image of the claim's file at `side`, then `after` on
    /// it, on a compute thread: from the cache when a task of the same
    /// digest has decoded it (no read at all), else read, checked and
    /// decoded (steps 2 to 4) in the same trip as `after`. Returns the
    /// file's path and what `after` made, or why the bytes were refused.
    async fn with_working<T, F>(
        &self,
        job: &Job,
        side: u32,
        after: F,
    ) -> Result<(PathBuf, Result<T, Arc<MediaError>>), TaskError>
    where
        T: Send + 'static,
        F: FnOnce(&WorkingImage) -> T + Send + 'static,
    {
        let limits = self.limits;
        let Some(cache) = self.cache.clone() else {
            let (path, made) = self
                .run_checked(job, move |bytes| {
                    decode_working(bytes, &limits, side).map(|working| after(&working))
                })
                .await?;
            return Ok((path, made.map_err(Arc::new)));
        };
        let expected = expected_sha256(job.inputs())?;
        let slot = cache.slot(&expected, side);
        if let Some(decoded) = slot.get() {
            let path = self.locate(job).await?;
            job.checkpoint()?;
            let decoded = decoded.clone();
            let made = self
                .off_thread(job, move || decoded.map(|working| after(&working)))
                .await?;
            return Ok((path, made));
        }
        // The first task of this digest decodes and runs `after` in the
        // same trip; a task that finds that decode under way waits for it.
        let mut after = Some(after);
        let mut first: Option<(PathBuf, Option<T>)> = None;
        let decoded: Decoded = {
            let init = async {
                let work = after.take();
                let (path, (decoded, made)) = self
                    .run_checked(job, move |bytes| {
                        cache.count_decode();
                        let decoded: Decoded = decode_working(bytes, &limits, side).map(Arc::new).map_err(Arc::new);
                        let made = match (&decoded, work) {
                            (Ok(working), Some(work)) => Some(work(working)),
                            _ => None,
                        };
                        (decoded, made)
                    })
                    .await?;
                first = Some((path, made));
                Ok::<_, TaskError>(decoded)
            };
            let stopped = job.cancelled();
            tokio::select! {
                decoded = slot.get_or_try_init(|| init) => decoded?.clone(),
                reason = stopped => return Err(TaskError::Stopped(reason)),
            }
        };
        match (first, after) {
            (Some((path, Some(made))), _) => Ok((path, Ok(made))),
            // This task decoded, and the bytes were refused.
            (Some((path, None)), _) => match decoded {
                Err(refused) => Ok((path, Err(refused))),
                Ok(_) => Err(TaskError::retryable("the shared decode ran without its task's work")),
            },
            (None, Some(after)) => {
                let path = self.locate(job).await?;
                let made = self
                    .off_thread(job, move || decoded.map(|working| after(&working)))
                    .await?;
                Ok((path, made))
            }
            (None, None) => Err(TaskError::retryable("the shared decode ended without its task's work")),
        }
    }

    /// Step 1: every run counts, including those that refuse their inputs.
    fn count(&self) {
        if let Some(executions) = &self.executions {
            executions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Steps 2 to 4 of the module documentation: finds the file, then in
    /// one closure on a compute thread reads it, checks its digest and
    /// runs `work` on the checked bytes. Returns the file's path and what
    /// `work` returned.
    async fn run_checked<T, F>(&self, job: &Job, work: F) -> Result<(PathBuf, T), TaskError>
    where
        T: Send + 'static,
        F: FnOnce(&[u8]) -> T + Send + 'static,
    {
        let Some(media) = job.media_id() else {
            return Err(TaskError::terminal(format!(
                "{} runs on a media item, but this claim names none",
                job.kind()
            )));
        };
        let expected = expected_sha256(job.inputs())?;
        let path = self.resolver.resolve(media).await?;
        job.checkpoint()?;
        let reading = path.clone();
        let stop = job.stop_signal();
        let checked = self
            .off_thread(job, move || {
                // Work queued behind others may start after its job was
                // told to stop: nobody waits for it any more.
                if let Err(stopped) = stop.checkpoint() {
                    return Ok(Checked::Stopped(stopped));
                }
                let bytes = std::fs::read(&reading)?;
                let actual = sha256_hex(&bytes);
                if !actual.eq_ignore_ascii_case(&expected) {
                    return Ok::<_, std::io::Error>(Checked::Mismatch { expected, actual });
                }
                Ok(Checked::Done(work(&bytes)))
            })
            .await?
            .map_err(|error| TaskError::retryable(format!("reading {}: {error}", path.display())))?;
        match checked {
            Checked::Done(output) => Ok((path, output)),
            Checked::Stopped(stopped) => Err(stopped.into()),
            Checked::Mismatch { expected, actual } => Err(TaskError::retryable(format!(
                "content changed since this revision was requested: expected {DIGEST_PREFIX}{expected}, \
                 the file now has {DIGEST_PREFIX}{actual} (file {}); a new scan requests a revision for it",
                path.display()
            ))),
        }
    }

    /// Runs blocking work on the compute threads (or tokio's blocking
    /// pool); returns early with [`TaskError::Stopped`] if the job is told
    /// to stop meanwhile (the work finishes in the background and its
    /// result is dropped).
    async fn off_thread<T, F>(&self, job: &Job, work: F) -> Result<T, TaskError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let stopped = job.cancelled();
        let done = async {
            match &self.compute {
                Some(threads) => threads.run(work).await.map_err(|error| error.to_string()),
                None => tokio::task::spawn_blocking(work)
                    .await
                    .map_err(|error| error.to_string()),
            }
        };
        tokio::select! {
            done = done => done.map_err(|error| TaskError::retryable(format!("image work did not finish: {error}"))),
            reason = stopped => Err(TaskError::Stopped(reason)),
        }
    }
}

/// What the closure of [`Source::run_checked`] found.
enum Checked<T> {
    Done(T),
    /// The digest the claim expected and the one its file has now.
    Mismatch {
        expected: String,
        actual: String,
    },
    /// The job was told to stop before the work began.
    Stopped(JobError),
}

/// The hex SHA-256 the claim's `content_digest` names (`sha256:<hex>`, or
/// bare hex).
pub(crate) fn expected_sha256(inputs: &Value) -> Result<String, TaskError> {
    let Some(digest) = inputs.get("content_digest").and_then(Value::as_str) else {
        return Err(TaskError::terminal(
            "the claim has no content_digest input to check the file against",
        ));
    };
    let hex = digest.strip_prefix(DIGEST_PREFIX).unwrap_or(digest);
    if hex.len() != 64 || !hex.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Err(TaskError::terminal(format!(
            "content_digest {digest:?} is not a SHA-256 digest ({DIGEST_PREFIX}<64 hex digits>), \
             so the file cannot be checked against it"
        )));
    }
    Ok(hex.to_ascii_lowercase())
}

/// A media error as a task error, naming the file: I/O is retryable,
/// everything else terminal.
pub(crate) fn task_error(error: &MediaError, path: &Path) -> TaskError {
    let message = format!("{error} (file {})", path.display());
    if error.is_retryable() {
        TaskError::Retryable(message)
    } else {
        TaskError::Terminal(message)
    }
}

/// The `metadata` kind: `{"format", "width", "height", "byte_size"}`, and
/// `"exif"` when the file has an EXIF block ([`crate::CameraFacts`]: date
/// taken, make, model, lens, exposure, orientation, `gps_present`; the
/// coordinates only with the input `gps_coordinates: true`).
///
/// By default it checks that the whole image decodes, under the same
/// limits as the other image tasks, so a file truncated after its header,
/// and a bomb that they refuse, fail here too (terminal) instead of
/// reporting dimensions for pixels that are not there or will never be
/// decoded. Given a [`DecodeCache`] (as the ingest gives it), that check is
/// the decode the thumbnail and the perceptual hash share: the metadata
/// adds no decode of its own. [`MetadataTask::header_only`] reads the
/// header alone, which allocates nothing for pixels, so it applies no
/// limit and reports what any header declares.
#[derive(Clone)]
pub struct MetadataTask {
    source: Source,
    full_decode: bool,
}

impl MetadataTask {
    /// The `extractor` input this implementation answers to (absent means
    /// this one too).
    pub const EXTRACTOR: &'static str = "image";

    pub fn new(resolver: Arc<dyn PathResolver>) -> Self {
        MetadataTask {
            source: Source::new(resolver),
            full_decode: true,
        }
    }

    pub fn with_counter(mut self, executions: ExecutionCounter) -> Self {
        self.source.executions = Some(executions);
        self
    }

    /// Runs the image work on `threads` instead of tokio's blocking pool,
    /// so no more images are decoded at once than it has threads.
    pub fn on_compute_threads(mut self, threads: ComputeThreads) -> Self {
        self.source.compute = Some(threads);
        self
    }

    /// Decodes under `limits` instead of [`DecodeLimits::default`].
    pub fn with_limits(mut self, limits: DecodeLimits) -> Self {
        self.source.limits = limits;
        self
    }

    /// Shares decodes with the other image tasks given the same `cache`:
    /// a file's bytes are decoded once for all of them (per digest).
    pub fn with_cache(mut self, cache: Arc<DecodeCache>) -> Self {
        self.source.cache = Some(cache);
        self
    }

    /// Reads only the header: faster, but a truncated file and a bomb
    /// pass (with the dimensions their headers declare).
    pub fn header_only(mut self) -> Self {
        self.full_decode = false;
        self
    }
}

impl Task for MetadataTask {
    fn kind(&self) -> &'static str {
        "metadata"
    }

    fn versions(&self) -> Vec<String> {
        crate::implemented_version("metadata")
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        self.source.count();
        let extractor = job.inputs().get("extractor").and_then(Value::as_str);
        if let Some(extractor) = extractor.filter(|name| *name != Self::EXTRACTOR) {
            return Err(TaskError::terminal(format!(
                "this worker's metadata extractor is {:?}, the claim asks for {extractor:?}",
                Self::EXTRACTOR
            )));
        }
        let coordinates = match job.inputs().get("gps_coordinates") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(wanted)) => *wanted,
            Some(other) => {
                return Err(TaskError::terminal(format!(
                    "metadata input gps_coordinates must be true or false, not {other}"
                )))
            }
        };
        let (metadata, camera) = if self.full_decode {
            let (path, found) = self
                .source
                .with_working(job, self.source.working_side, |working| {
                    (working.metadata(), working.camera.clone())
                })
                .await?;
            found.map_err(|error| task_error(&error, &path))?
        } else {
            let (path, found) = self
                .source
                .run_checked(job, |bytes| {
                    image_metadata(bytes).map(|metadata| (metadata, camera_facts(bytes)))
                })
                .await?;
            found.map_err(|error| task_error(&error, &path))?
        };
        let mut output = json!({
            "format": metadata.format,
            "width": metadata.width,
            "height": metadata.height,
            "byte_size": metadata.byte_size,
        });
        if let Some(camera) = camera {
            output["exif"] = camera.to_json(coordinates);
        }
        Ok(Outcome::output(output))
    }
}

/// The `thumbnail` kind: longest side `max_side`, aspect kept, never
/// upscaled, encoded as `format` (`png` or `jpeg`), written to
/// `<thumbnails_dir>/<revision>.<png|jpg>` through the job's fenced output
/// (a temporary file renamed into place only while the claim still holds,
/// so an old claim never overwrites a newer thumbnail). Output:
/// `{"path", "width", "height"}`.
#[derive(Clone)]
pub struct ThumbnailTask {
    source: Source,
    thumbnails_dir: PathBuf,
}

impl ThumbnailTask {
    /// `thumbnails_dir` is created when the first thumbnail is written.
    pub fn new(resolver: Arc<dyn PathResolver>, thumbnails_dir: impl Into<PathBuf>) -> Self {
        ThumbnailTask {
            source: Source::new(resolver),
            thumbnails_dir: thumbnails_dir.into(),
        }
    }

    pub fn with_counter(mut self, executions: ExecutionCounter) -> Self {
        self.source.executions = Some(executions);
        self
    }

    /// Runs the image work on `threads` instead of tokio's blocking pool,
    /// so no more images are decoded at once than it has threads.
    pub fn on_compute_threads(mut self, threads: ComputeThreads) -> Self {
        self.source.compute = Some(threads);
        self
    }

    /// Decodes under `limits` instead of [`DecodeLimits::default`].
    pub fn with_limits(mut self, limits: DecodeLimits) -> Self {
        self.source.limits = limits;
        self
    }

    /// Shares decodes with the other image tasks given the same `cache`:
    /// a file's bytes are decoded once for all of them (per digest).
    pub fn with_cache(mut self, cache: Arc<DecodeCache>) -> Self {
        self.source.cache = Some(cache);
        self
    }

    /// Where the thumbnail of `revision` goes.
    pub fn path_for(&self, revision: &str, format: ThumbnailFormat) -> PathBuf {
        self.thumbnails_dir.join(format!("{revision}.{}", format.extension()))
    }
}

/// `max_side` and `format` from a thumbnail claim's inputs.
fn thumbnail_inputs(inputs: &Value) -> Result<(u32, ThumbnailFormat), TaskError> {
    let max_side = inputs.get("max_side").and_then(|value| {
        value.as_u64().or_else(|| {
            value
                .as_f64()
                .filter(|side| side.fract() == 0.0 && *side >= 0.0)
                .map(|side| side as u64)
        })
    });
    let max_side = match max_side {
        Some(side) if (1..=u64::from(MAX_THUMBNAIL_SIDE)).contains(&side) => side as u32,
        _ => {
            return Err(TaskError::terminal(format!(
                "thumbnail max_side must be a whole number from 1 to {MAX_THUMBNAIL_SIDE}, not {}",
                inputs.get("max_side").unwrap_or(&Value::Null)
            )))
        }
    };
    let format = inputs.get("format").and_then(Value::as_str).unwrap_or("");
    let format = ThumbnailFormat::parse(format).map_err(|error| TaskError::terminal(error.to_string()))?;
    Ok((max_side, format))
}

impl Task for ThumbnailTask {
    fn kind(&self) -> &'static str {
        "thumbnail"
    }

    fn versions(&self) -> Vec<String> {
        crate::implemented_version("thumbnail")
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        self.source.count();
        let (max_side, format) = thumbnail_inputs(job.inputs())?;
        let final_path = self.path_for(job.revision(), format);
        let temporary = job.output_path_for(&final_path)?;
        let (directory, writing) = (self.thumbnails_dir.clone(), temporary.clone());
        let stop = job.stop_signal();
        let side = self.source.working_side.max(max_side.saturating_mul(2));
        let (path, made) = self
            .source
            .with_working(job, side, move |working| {
                let small = working.thumbnail(max_side)?;
                let encoded = encode_image(&small, format)?;
                // A job told to stop meanwhile has stopped waiting for this
                // closure and may have cleaned up its temporaries already:
                // writing now would leave a file nobody removes.
                let written = match stop.checkpoint() {
                    Err(stopped) => Written::Stopped(stopped),
                    Ok(()) => Written::Io(
                        std::fs::create_dir_all(&directory).and_then(|()| std::fs::write(&writing, &encoded)),
                    ),
                };
                Ok::<_, MediaError>((written, small.width(), small.height()))
            })
            .await?;
        let made = made.map_err(|error| task_error(&error, &path))?;
        let (written, width, height) = made.map_err(|error| task_error(&error, &path))?;
        match written {
            Written::Stopped(stopped) => return Err(stopped.into()),
            Written::Io(result) => result
                .map_err(|error| TaskError::retryable(format!("writing thumbnail {}: {error}", temporary.display())))?,
        }
        job.commit_output(&temporary, &final_path).await?;
        Ok(Outcome::output(json!({
            "path": final_path.to_string_lossy(),
            "width": width,
            "height": height,
        })))
    }
}

/// Whether a thumbnail's temporary file was written.
enum Written {
    Io(std::io::Result<()>),
    Stopped(JobError),
}

/// The `perceptual_hash` kind: a 64-bit dHash (the algorithm is in
/// [`mod@crate::dhash`]). `algorithm` must be `dhash` or `dhash64`. Output:
/// `{"algorithm": "dhash64", "hash": "<16 hex digits>"}`.
#[derive(Clone)]
pub struct PerceptualHashTask {
    source: Source,
}

impl PerceptualHashTask {
    pub fn new(resolver: Arc<dyn PathResolver>) -> Self {
        PerceptualHashTask {
            source: Source::new(resolver),
        }
    }

    pub fn with_counter(mut self, executions: ExecutionCounter) -> Self {
        self.source.executions = Some(executions);
        self
    }

    /// Runs the image work on `threads` instead of tokio's blocking pool,
    /// so no more images are decoded at once than it has threads.
    pub fn on_compute_threads(mut self, threads: ComputeThreads) -> Self {
        self.source.compute = Some(threads);
        self
    }

    /// Decodes under `limits` instead of [`DecodeLimits::default`].
    pub fn with_limits(mut self, limits: DecodeLimits) -> Self {
        self.source.limits = limits;
        self
    }

    /// Shares decodes with the other image tasks given the same `cache`:
    /// a file's bytes are decoded once for all of them (per digest).
    pub fn with_cache(mut self, cache: Arc<DecodeCache>) -> Self {
        self.source.cache = Some(cache);
        self
    }
}

impl Task for PerceptualHashTask {
    fn kind(&self) -> &'static str {
        "perceptual_hash"
    }

    fn versions(&self) -> Vec<String> {
        crate::implemented_version("perceptual_hash")
    }

    async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
        self.source.count();
        let algorithm = job.inputs().get("algorithm").and_then(Value::as_str).unwrap_or("");
        if !matches!(algorithm.to_ascii_lowercase().as_str(), "dhash" | "dhash64") {
            return Err(TaskError::terminal(format!(
                "perceptual_hash computes {DHASH_ALGORITHM:?} (algorithm \"dhash\" or \"dhash64\"), not {algorithm:?}"
            )));
        }
        let (path, hash) = self
            .source
            .with_working(job, self.source.working_side, |working| dhash(&working.image))
            .await?;
        let hash = hash.map_err(|error| task_error(&error, &path))?;
        Ok(Outcome::output(json!({
            "algorithm": DHASH_ALGORITHM,
            "hash": hash.to_string(),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_read_with_or_without_their_prefix() {
        let hex = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
        let lower = hex.to_ascii_lowercase();
        assert_eq!(expected_sha256(&json!({"content_digest": hex})).unwrap(), lower);
        assert_eq!(
            expected_sha256(&json!({"content_digest": format!("sha256:{lower}")})).unwrap(),
            lower
        );
        for refused in [
            json!({}),
            json!({"content_digest": "md5:abc"}),
            json!({"content_digest": 7}),
        ] {
            assert!(
                matches!(expected_sha256(&refused), Err(TaskError::Terminal(_))),
                "{refused}"
            );
        }
    }

    #[test]
    fn thumbnail_inputs_are_checked() {
        assert_eq!(
            thumbnail_inputs(&json!({"max_side": 256, "format": "png"})).unwrap(),
            (256, ThumbnailFormat::Png)
        );
        assert_eq!(
            thumbnail_inputs(&json!({"max_side": 128.0, "format": "JPG"})).unwrap(),
            (128, ThumbnailFormat::Jpeg)
        );
        for refused in [
            json!({"max_side": 0, "format": "png"}),
            json!({"max_side": 25600, "format": "png"}),
            json!({"max_side": 12.5, "format": "png"}),
            json!({"max_side": 256, "format": "tiff"}),
            json!({"max_side": 256}),
        ] {
            assert!(
                matches!(thumbnail_inputs(&refused), Err(TaskError::Terminal(_))),
                "{refused}"
            );
        }
    }
}
