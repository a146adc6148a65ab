//! The image tasks run by a real `opledger_worker::WorkerPool` on a real
//! SQLite ledger, over generated files: outputs recorded per revision,
//! thumbnails committed under the revision's name, corrupt files ending
//! `failed_terminal` with a clear reason, a file changed after registration
//! failing retryably until its new digest is requested, hostile files
//! (cut short, lying, damaged, decompression bombs) ending `failed_terminal`
//! with their reason in the review queue, and replay agreeing with the live
//! projections afterwards.

use crate::support;

use opledger_domain::{MediaId, OperationStatus};
use opledger_engine::{CommandContext, Engine, TaskRequest, TaskTarget};
use opledger_media::{
    decode_image, decode_working, dhash, generate_samples_with, hash_file, read_metadata, resolver_fn, DecodeLimits,
    MetadataTask, PathResolver, PerceptualHashTask, SampleOptions, ThumbnailTask, DEFAULT_WORKING_SIDE,
};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use opledger_worker::{ComputeThreads, TaskError, WorkerPool};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KINDS: [&str; 3] = ["metadata", "thumbnail", "perceptual_hash"];

async fn engine_at(folder: &Path) -> Engine<SqliteStore> {
    let store = SqliteStore::open(SqliteConfig::at(folder.join("ledger.db")))
        .await
        .unwrap();
    let engine = Engine::new(store);
    engine.startup().await.unwrap();
    // The kinds these tasks implement, at the versions their workers state.
    let kinds = opledger_engine::parse_kinds(opledger_media::KINDS_TOML).unwrap();
    engine
        .declare(
            &CommandContext::actor("test"),
            kinds.kinds.into_iter().map(|kind| kind.declaration).collect(),
        )
        .await
        .unwrap();
    engine
}

fn context() -> CommandContext {
    CommandContext::actor("media-test")
}

/// Where each registered media item's file is, as the ingest would know it.
type Paths = Arc<Mutex<BTreeMap<MediaId, PathBuf>>>;

fn resolver(paths: &Paths) -> Arc<dyn PathResolver> {
    let paths = paths.clone();
    resolver_fn(move |media: MediaId| {
        let path = paths.lock().unwrap().get(&media).cloned();
        async move { path.ok_or_else(|| TaskError::terminal(format!("media {media} has no known file"))) }
    })
}

async fn register(engine: &Engine<SqliteStore>, paths: &Paths, path: &Path) -> MediaId {
    let hashed = hash_file(path).unwrap();
    let media = engine
        .register_media(
            &context(),
            &path.to_string_lossy(),
            "image",
            Some(hashed.digest()),
            Some(hashed.byte_size as i64),
        )
        .await
        .unwrap();
    paths.lock().unwrap().insert(media, path.to_path_buf());
    media
}

fn inputs_for(kind: &str, thumbnail_format: &str) -> Value {
    match kind {
        "thumbnail" => json!({"max_side": 256, "format": thumbnail_format}),
        "perceptual_hash" => json!({"algorithm": "dhash"}),
        _ => json!({}),
    }
}

async fn request(engine: &Engine<SqliteStore>, media: MediaId, kind: &str, thumbnail_format: &str) {
    engine
        .request_task(
            &context(),
            TaskRequest {
                target: TaskTarget::Media(media),
                kind: kind.into(),
                inputs: inputs_for(kind, thumbnail_format),
                priority: 0,
            },
        )
        .await
        .unwrap();
}

struct Counters {
    metadata: Arc<AtomicU64>,
    thumbnail: Arc<AtomicU64>,
    perceptual_hash: Arc<AtomicU64>,
}

impl Counters {
    fn new() -> Self {
        Counters {
            metadata: Arc::new(AtomicU64::new(0)),
            thumbnail: Arc::new(AtomicU64::new(0)),
            perceptual_hash: Arc::new(AtomicU64::new(0)),
        }
    }

    fn get(&self) -> (u64, u64, u64) {
        (
            self.metadata.load(Ordering::SeqCst),
            self.thumbnail.load(Ordering::SeqCst),
            self.perceptual_hash.load(Ordering::SeqCst),
        )
    }
}

fn pool(
    engine: &Engine<SqliteStore>,
    paths: &Paths,
    thumbnails: &Path,
    counters: &Counters,
) -> WorkerPool<SqliteStore> {
    let resolver = resolver(paths);
    WorkerPool::builder(engine.clone(), "media-pool")
        .task(MetadataTask::new(resolver.clone()).with_counter(counters.metadata.clone()))
        .task(ThumbnailTask::new(resolver.clone(), thumbnails).with_counter(counters.thumbnail.clone()))
        .task(PerceptualHashTask::new(resolver).with_counter(counters.perceptual_hash.clone()))
        .workers(2)
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap()
}

fn output_of(view: &opledger_engine::TaskView) -> Value {
    serde_json::from_str(view.state.output.as_deref().expect("an output")).unwrap()
}

fn files_in(folder: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(folder) {
        Ok(entries) => entries.map(|entry| entry.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_runs_the_image_tasks_and_corrupt_files_end_failed_terminal() {
    let folder = tempfile::tempdir().unwrap();
    let photos = folder.path().join("photos");
    let thumbnails = folder.path().join("thumbnails");
    let samples = generate_samples_with(&photos, &SampleOptions::new(10, 42).with_corrupt(3)).unwrap();
    let engine = engine_at(folder.path()).await;
    let paths: Paths = Arc::default();

    let mut images = Vec::new();
    for (index, path) in samples.images.iter().enumerate() {
        let media = register(&engine, &paths, path).await;
        let format = if index % 2 == 0 { "png" } else { "jpeg" };
        for kind in KINDS {
            request(&engine, media, kind, format).await;
        }
        images.push((media, path.clone(), format));
    }
    let mut corrupt = Vec::new();
    for path in &samples.corrupt {
        let media = register(&engine, &paths, path).await;
        for kind in KINDS {
            request(&engine, media, kind, "png").await;
        }
        corrupt.push((media, path.clone()));
    }

    let counters = Counters::new();
    let report = pool(&engine, &paths, &thumbnails, &counters)
        .run_until_idle()
        .await
        .unwrap();

    let tasks = (3 * (images.len() + corrupt.len())) as u64;
    assert_eq!(report.executed, tasks);
    assert_eq!(report.completed, 3 * images.len() as u64);
    assert_eq!(report.failed_terminal, 3 * corrupt.len() as u64);
    assert_eq!(
        report.failed, report.failed_terminal,
        "no retryable failure: {report:?}"
    );
    let each = (images.len() + corrupt.len()) as u64;
    assert_eq!(counters.get(), (each, each, each), "every task ran once");

    for (media, path, format) in &images {
        let bytes = std::fs::read(path).unwrap();
        let original = decode_image(&bytes).unwrap();
        let header = read_metadata(path).unwrap();
        let view = |kind: &'static str| {
            let engine = engine.clone();
            let media = *media;
            async move {
                engine
                    .task_state(TaskTarget::Media(media), kind)
                    .await
                    .unwrap()
                    .unwrap()
            }
        };

        let metadata = view("metadata").await;
        assert_eq!(metadata.state.status, OperationStatus::Succeeded);
        assert_eq!(
            output_of(&metadata),
            json!({"format": header.format, "width": header.width, "height": header.height,
                   "byte_size": bytes.len()})
        );

        let thumbnail = view("thumbnail").await;
        assert_eq!(thumbnail.state.status, OperationStatus::Succeeded, "{}", path.display());
        let output = output_of(&thumbnail);
        let extension = if *format == "png" { "png" } else { "jpg" };
        let expected_path = thumbnails.join(format!("{}.{extension}", thumbnail.state.requested_revision));
        assert_eq!(output["path"], json!(expected_path.to_string_lossy()));
        let written = decode_image(&std::fs::read(&expected_path).unwrap()).unwrap();
        assert_eq!(opledger_media::format_name(written.format), *format);
        let (width, height) = (written.image.width(), written.image.height());
        assert_eq!(output["width"], json!(width));
        assert_eq!(output["height"], json!(height));
        let longest = header.width.max(header.height);
        assert_eq!(width.max(height), longest.min(256), "{}", path.display());

        // The hash of the working image every image task reads, and the
        // same picture as the full decode to within a few bits.
        let hash = view("perceptual_hash").await;
        assert_eq!(hash.state.status, OperationStatus::Succeeded);
        let working = decode_working(&bytes, &DecodeLimits::default(), DEFAULT_WORKING_SIDE).unwrap();
        assert_eq!(
            output_of(&hash),
            json!({"algorithm": "dhash64", "hash": dhash(&working.image).to_string()})
        );
        assert!(
            dhash(&original.image).distance(dhash(&working.image)) <= 4,
            "{}",
            path.display()
        );
    }
    assert_eq!(
        files_in(&thumbnails).len(),
        images.len(),
        "one thumbnail per image, no temporary file left: {:?}",
        files_in(&thumbnails)
    );

    for (media, path) in &corrupt {
        for kind in KINDS {
            let view = engine
                .task_state(TaskTarget::Media(*media), kind)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                view.state.status,
                OperationStatus::FailedTerminal,
                "{kind} on {}",
                path.display()
            );
            assert_eq!(view.state.attempt_count, 1, "a terminal failure is not retried");
            let error = view.state.last_error.clone().unwrap_or_default();
            assert!(
                error.starts_with("not a decodable image: "),
                "{kind} on {}: {error}",
                path.display()
            );
            assert!(
                error.contains(&*path.to_string_lossy()),
                "the reason names the file: {error}"
            );
        }
    }

    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_after_registration_fails_retryably_until_its_new_digest_is_requested() {
    let folder = tempfile::tempdir().unwrap();
    let photos = folder.path().join("photos");
    let thumbnails = folder.path().join("thumbnails");
    let samples = generate_samples_with(&photos, &SampleOptions::new(2, 9)).unwrap();
    let engine = engine_at(folder.path()).await;
    let paths: Paths = Arc::default();
    let path = &samples.images[0];
    let media = register(&engine, &paths, path).await;
    for kind in KINDS {
        request(&engine, media, kind, "png").await;
    }
    // Someone replaces the picture after it was registered.
    std::fs::copy(&samples.images[1], path).unwrap();

    let counters = Counters::new();
    let report = pool(&engine, &paths, &thumbnails, &counters)
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((report.executed, report.failed, report.failed_terminal), (3, 3, 0));
    for kind in KINDS {
        let view = engine
            .task_state(TaskTarget::Media(media), kind)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.state.status, OperationStatus::RetryWaiting, "{kind}");
        let error = view.state.last_error.unwrap_or_default();
        assert!(
            error.starts_with("content changed since this revision was requested"),
            "{error}"
        );
    }
    assert!(files_in(&thumbnails).is_empty(), "nothing written for the old revision");

    // The next scan records the new digest and asks again: a new revision,
    // queued at once, which the same pool now completes.
    let hashed = hash_file(path).unwrap();
    engine
        .update_media(
            &context(),
            media,
            &path.to_string_lossy(),
            Some(hashed.digest()),
            Some(hashed.byte_size as i64),
        )
        .await
        .unwrap();
    for kind in KINDS {
        request(&engine, media, kind, "png").await;
    }
    let report = pool(&engine, &paths, &thumbnails, &counters)
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!((report.executed, report.completed), (3, 3));
    assert_eq!(counters.get(), (2, 2, 2));
    for kind in KINDS {
        let view = engine
            .task_state(TaskTarget::Media(media), kind)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.state.status, OperationStatus::Succeeded, "{kind}");
        assert!(
            view.state.inputs.contains(&hashed.digest()),
            "the completed revision is the new content's"
        );
    }
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_the_tasks_cannot_honour_are_terminal_and_still_counted() {
    let folder = tempfile::tempdir().unwrap();
    let photos = folder.path().join("photos");
    let samples = generate_samples_with(&photos, &SampleOptions::new(1, 3)).unwrap();
    let engine = engine_at(folder.path()).await;
    let paths: Paths = Arc::default();
    let media = register(&engine, &paths, &samples.images[0]).await;
    for (kind, inputs) in [
        ("metadata", json!({"extractor": "exiftool"})),
        ("thumbnail", json!({"max_side": 256, "format": "tiff"})),
        ("perceptual_hash", json!({"algorithm": "phash"})),
    ] {
        engine
            .request_task(
                &context(),
                TaskRequest {
                    target: TaskTarget::Media(media),
                    kind: kind.into(),
                    inputs,
                    priority: 0,
                },
            )
            .await
            .unwrap();
    }
    let counters = Counters::new();
    let report = pool(&engine, &paths, &folder.path().join("thumbnails"), &counters)
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(report.failed_terminal, 3);
    assert_eq!(counters.get(), (1, 1, 1));
    for (kind, expected) in [
        ("metadata", "\"exiftool\""),
        ("thumbnail", "not \"tiff\""),
        ("perceptual_hash", "not \"phash\""),
    ] {
        let view = engine
            .task_state(TaskTarget::Media(media), kind)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.state.status, OperationStatus::FailedTerminal);
        let error = view.state.last_error.unwrap_or_default();
        assert!(error.contains(expected), "{kind}: {error}");
    }
}

/// A thumbnail task whose closure waits in the compute threads' queue when
/// its job is cancelled: the job stops without it, and when the closure's
/// turn comes it must leave nothing behind (no temporary file the runtime
/// already cleaned up for, no thumbnail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_task_whose_work_was_still_queued_leaves_no_file_behind() {
    let folder = tempfile::tempdir().unwrap();
    let photos = folder.path().join("photos");
    let thumbnails = folder.path().join("thumbnails");
    let samples = generate_samples_with(&photos, &SampleOptions::new(1, 7)).unwrap();
    let engine = engine_at(folder.path()).await;
    let paths: Paths = Arc::default();
    let media = register(&engine, &paths, &samples.images[0]).await;
    let operation = engine
        .request_task(
            &context(),
            TaskRequest {
                target: TaskTarget::Media(media),
                kind: "thumbnail".into(),
                inputs: inputs_for("thumbnail", "png"),
                priority: 0,
            },
        )
        .await
        .unwrap()
        .operation_id;

    // The one compute thread is busy until the test lets it go.
    let threads = ComputeThreads::new(1, "test-image").unwrap();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let blocker = {
        let threads = threads.clone();
        tokio::spawn(async move { threads.run(move || released.recv().ok()).await })
    };
    let pool = WorkerPool::builder(engine.clone(), "queued")
        .task(ThumbnailTask::new(resolver(&paths), &thumbnails).on_compute_threads(threads.clone()))
        .workers(1)
        .lease(Duration::from_secs(5))
        .heartbeat_interval(Duration::from_millis(30))
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap();
    let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        pool.run_until(async {
            let _ = shutdown_rx.await;
        })
        .await
    });

    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while engine
        .task_by_operation(operation)
        .await
        .unwrap()
        .unwrap()
        .lease
        .is_none()
    {
        assert!(tokio::time::Instant::now() < deadline, "the task was never claimed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    engine
        .cancel_task(&context(), operation, "the user removed the photo")
        .await
        .unwrap();
    while engine.task_by_operation(operation).await.unwrap().unwrap().state.status != OperationStatus::Cancelled {
        assert!(tokio::time::Instant::now() < deadline, "the task was never cancelled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Now the queued closure gets its turn; one queued after it tells when
    // it is done.
    release.send(()).unwrap();
    blocker.await.unwrap().unwrap();
    threads.run(|| ()).await.unwrap();
    assert_eq!(files_in(&thumbnails), Vec::<PathBuf>::new());

    shutdown.send(()).unwrap();
    let report = running.await.unwrap().unwrap();
    assert_eq!((report.executed, report.cancelled, report.completed), (1, 1, 0));
}

/// Hostile files registered beside a good photo, as an ingest registers
/// them (their headers read): every image task on each ends
/// `failed_terminal` at its first attempt with the reason and the file in
/// its error and a `failed_terminal` review entry, no thumbnail is written
/// for any of them, and the photo beside them succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_images_end_failed_terminal_with_their_reason_and_the_good_photo_beside_them_succeeds() {
    use support::*;
    let folder = tempfile::tempdir().unwrap();
    let photos = folder.path().join("photos");
    let thumbnails = folder.path().join("thumbnails");
    std::fs::create_dir_all(&photos).unwrap();
    let photo = photo_jpeg(1200, 800);
    let small = photo_jpeg(160, 120);
    let hostile: Vec<(&str, Vec<u8>, &str)> = vec![
        ("first-third.jpg", first_third(&photo), "not a decodable image: "),
        (
            "declares-10000.jpg",
            declaring(&small, 10_000, 10_000),
            "not a decodable image: ",
        ),
        (
            "random-bytes.jpg",
            with_random_bytes(&photo, 200, 7),
            "not a decodable image: ",
        ),
        ("only-header.jpg", only_its_header(&photo), "not a decodable image: "),
        (
            "bomb-65000.jpg",
            declaring(&small, 65_000, 65_000),
            "too large to decode: ",
        ),
        (
            "bomb-20000.png",
            png_bomb(20_000, png::ColorType::Rgb, png::BitDepth::Eight),
            "too large to decode: ",
        ),
        (
            "bomb-16383-grey16.png",
            png_bomb(16_383, png::ColorType::Grayscale, png::BitDepth::Sixteen),
            "too large to decode: ",
        ),
        ("bomb-65535.gif", gif_screen(65_535, 65_535), "too large to decode: "),
    ];
    let engine = engine_at(folder.path()).await;
    let paths: Paths = Arc::default();
    let good_path = photos.join("good.jpg");
    std::fs::write(&good_path, &photo).unwrap();
    let good = register(&engine, &paths, &good_path).await;
    for kind in KINDS {
        request(&engine, good, kind, "jpeg").await;
    }
    let mut registered = Vec::new();
    for (name, bytes, reason) in &hostile {
        let path = photos.join(name);
        std::fs::write(&path, bytes).unwrap();
        // The ingest registers a file from its header; a bomb's reads.
        if reason.starts_with("too large") {
            read_metadata(&path).unwrap();
        }
        let media = register(&engine, &paths, &path).await;
        for kind in KINDS {
            request(&engine, media, kind, "png").await;
        }
        registered.push((media, path, *reason));
    }

    let counters = Counters::new();
    let report = pool(&engine, &paths, &thumbnails, &counters)
        .run_until_idle()
        .await
        .unwrap();
    assert_eq!(report.completed, 3, "the good photo's tasks: {report:?}");
    assert_eq!(report.failed_terminal, 3 * hostile.len() as u64, "{report:?}");
    assert_eq!(
        report.failed, report.failed_terminal,
        "no retryable failure: {report:?}"
    );

    let entries = engine.review_entries().await.unwrap();
    for (media, path, reason) in &registered {
        for kind in KINDS {
            let view = engine
                .task_state(TaskTarget::Media(*media), kind)
                .await
                .unwrap()
                .unwrap();
            let file = path.display();
            assert_eq!(view.state.status, OperationStatus::FailedTerminal, "{kind} on {file}");
            assert_eq!(view.state.attempt_count, 1, "{kind} on {file}: not retried");
            let error = view.state.last_error.clone().unwrap_or_default();
            assert!(error.starts_with(reason), "{kind} on {file}: {error}");
            assert!(error.contains(&*path.to_string_lossy()), "{kind}: {error}");
            let entry = entries
                .iter()
                .find(|entry| entry.media_id == Some(*media) && entry.kind == kind)
                .unwrap_or_else(|| panic!("a review entry for {kind} on {file}"));
            assert_eq!(entry.reason_code, "failed_terminal");
            assert_eq!(entry.detail.as_deref(), Some(error.as_str()));
        }
    }
    assert_eq!(
        files_in(&thumbnails).len(),
        1,
        "the good photo's thumbnail only: {:?}",
        files_in(&thumbnails)
    );
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}
