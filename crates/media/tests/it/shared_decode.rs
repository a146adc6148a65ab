//! The image tasks of one file share one reduced-size decode: a real
//! `WorkerPool` on a real SQLite ledger with the ingest's declarations
//! (`KINDS_TOML`), the three tasks of every file given one `DecodeCache`
//! and its decode counter read; a photo turned by its EXIF orientation
//! comes out upright (pixels checked) with the hash of the upright
//! original; a large JPEG is decoded by DCT scaling at the smallest scale
//! still twice the thumbnail; the metadata reports the EXIF facts, with
//! coordinates only when asked. Replay agrees with the live projections
//! afterwards.

use image::codecs::jpeg::JpegEncoder;
use image::{DynamicImage, ImageEncoder, Rgb, RgbImage};
use opledger_domain::{MediaId, OperationStatus};
use opledger_engine::{CommandContext, Engine, TaskRequest, TaskTarget};
use opledger_media::{
    decode_image, decode_working, dhash, generate_samples_with, hash_file, resolver_fn, CameraFacts, DecodeCache,
    DecodeLimits, MetadataTask, PathResolver, PerceptualHashTask, SampleOptions, ThumbnailTask, DEFAULT_WORKING_SIDE,
    KINDS_TOML,
};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use opledger_worker::{TaskError, WorkerPool};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KINDS: [&str; 3] = ["metadata", "thumbnail", "perceptual_hash"];

type Paths = Arc<Mutex<BTreeMap<MediaId, PathBuf>>>;

fn context() -> CommandContext {
    CommandContext::actor("shared-decode-test")
}

async fn engine_at(folder: &Path) -> Engine<SqliteStore> {
    let store = SqliteStore::open(SqliteConfig::at(folder.join("ledger.db")))
        .await
        .unwrap();
    let engine = Engine::new(store);
    engine.startup().await.unwrap();
    let document = opledger_engine::parse_kinds(KINDS_TOML).unwrap();
    let report = engine.apply_kinds(&context(), &document, false).await.unwrap();
    assert!(report.refused().next().is_none(), "the ingest's kinds are declared");
    engine
}

fn resolver(paths: &Paths) -> Arc<dyn PathResolver> {
    let paths = paths.clone();
    resolver_fn(move |media: MediaId| {
        let path = paths.lock().unwrap().get(&media).cloned();
        async move { path.ok_or_else(|| TaskError::terminal(format!("media {media} has no known file"))) }
    })
}

/// Registers `path` and requests the three image tasks on it (defaults,
/// besides `metadata`'s own inputs).
async fn register(engine: &Engine<SqliteStore>, paths: &Paths, path: &Path, metadata: Value) -> MediaId {
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
    for kind in KINDS {
        let inputs = if kind == "metadata" {
            metadata.clone()
        } else {
            json!({})
        };
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
    media
}

/// Runs every requested task with one pool whose three tasks share `cache`.
async fn run(engine: &Engine<SqliteStore>, paths: &Paths, thumbnails: &Path, cache: &Arc<DecodeCache>) {
    let resolver = resolver(paths);
    WorkerPool::builder(engine.clone(), "shared-decode-pool")
        .task(MetadataTask::new(resolver.clone()).with_cache(cache.clone()))
        .task(ThumbnailTask::new(resolver.clone(), thumbnails).with_cache(cache.clone()))
        .task(PerceptualHashTask::new(resolver).with_cache(cache.clone()))
        .workers(4)
        .idle_poll(Duration::from_millis(20))
        .build()
        .unwrap()
        .run_until_idle()
        .await
        .unwrap();
}

async fn outcome(engine: &Engine<SqliteStore>, media: MediaId, kind: &str) -> (OperationStatus, Value) {
    let view = engine
        .task_state(TaskTarget::Media(media), kind)
        .await
        .unwrap()
        .unwrap();
    let output = view
        .state
        .output
        .as_deref()
        .map(|text| serde_json::from_str(text).unwrap())
        .unwrap_or(Value::Null);
    (view.state.status, output)
}

fn jpeg_with_exif(picture: &RgbImage, exif: Option<&CameraFacts>) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut encoder = JpegEncoder::new_with_quality(&mut bytes, 90);
    if let Some(facts) = exif {
        encoder.set_exif_metadata(facts.exif_block()).unwrap();
    }
    encoder
        .write_image(
            picture.as_raw(),
            picture.width(),
            picture.height(),
            image::ExtendedColorType::Rgb8,
        )
        .unwrap();
    bytes
}

/// An asymmetric picture: brightness rising left to right (so every dHash
/// bit is decided by a wide margin), and a red block in the top-left
/// corner.
fn asymmetric(width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        if x < width / 4 && y < height / 4 {
            Rgb([230, 20, 20])
        } else {
            let level = (20 + x * 215 / width) as u8;
            Rgb([level, level, level])
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_three_image_tasks_of_a_file_decode_it_once_between_them() {
    let folder = tempfile::tempdir().unwrap();
    let photos = folder.path().join("photos");
    let thumbnails = folder.path().join("thumbnails");
    let samples = generate_samples_with(&photos, &SampleOptions::new(8, 5).with_corrupt(2)).unwrap();
    let engine = engine_at(folder.path()).await;
    let paths: Paths = Arc::default();
    let mut images = Vec::new();
    for path in &samples.images {
        images.push((register(&engine, &paths, path, json!({})).await, path.clone()));
    }
    let mut corrupt = Vec::new();
    for path in &samples.corrupt {
        corrupt.push(register(&engine, &paths, path, json!({})).await);
    }

    let cache = Arc::new(DecodeCache::default());
    run(&engine, &paths, &thumbnails, &cache).await;

    assert_eq!(
        cache.decodes(),
        (images.len() + corrupt.len()) as u64,
        "one decode per file for its three tasks, a refused one included"
    );
    for (media, path) in &images {
        let working = decode_working(
            &std::fs::read(path).unwrap(),
            &DecodeLimits::default(),
            DEFAULT_WORKING_SIDE,
        )
        .unwrap();
        let (status, metadata) = outcome(&engine, *media, "metadata").await;
        assert_eq!(status, OperationStatus::Succeeded, "{}", path.display());
        assert_eq!(metadata["width"], json!(working.width));
        let (status, thumbnail) = outcome(&engine, *media, "thumbnail").await;
        assert_eq!(status, OperationStatus::Succeeded);
        let written = decode_image(&std::fs::read(thumbnail["path"].as_str().unwrap()).unwrap()).unwrap();
        assert_eq!(
            written.image.width().max(written.image.height()),
            working.width.max(working.height).min(256)
        );
        let (status, hash) = outcome(&engine, *media, "perceptual_hash").await;
        assert_eq!(status, OperationStatus::Succeeded);
        assert_eq!(hash["hash"], json!(dhash(&working.image).to_string()));
    }
    for media in &corrupt {
        for kind in KINDS {
            assert_eq!(
                outcome(&engine, *media, kind).await.0,
                OperationStatus::FailedTerminal,
                "{kind}"
            );
        }
    }
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_photo_turned_by_exif_orientation_6_gets_an_upright_thumbnail_and_the_hash_of_the_upright_original() {
    let folder = tempfile::tempdir().unwrap();
    let thumbnails = folder.path().join("thumbnails");
    let upright = asymmetric(1280, 960);
    // Stored a quarter turn counter-clockwise; orientation 6 says "turn it
    // a quarter clockwise to display".
    let stored = DynamicImage::ImageRgb8(upright.clone()).rotate270().to_rgb8();
    assert_eq!((stored.width(), stored.height()), (960, 1280));
    let upright_path = folder.path().join("upright.jpg");
    let turned_path = folder.path().join("turned.jpg");
    std::fs::write(&upright_path, jpeg_with_exif(&upright, None)).unwrap();
    let facts = CameraFacts {
        orientation: Some(6),
        ..CameraFacts::default()
    };
    std::fs::write(&turned_path, jpeg_with_exif(&stored, Some(&facts))).unwrap();

    let engine = engine_at(folder.path()).await;
    let paths: Paths = Arc::default();
    let upright_media = register(&engine, &paths, &upright_path, json!({})).await;
    let turned_media = register(&engine, &paths, &turned_path, json!({})).await;
    let cache = Arc::new(DecodeCache::default());
    run(&engine, &paths, &thumbnails, &cache).await;
    assert_eq!(cache.decodes(), 2);

    let (_, metadata) = outcome(&engine, turned_media, "metadata").await;
    assert_eq!(
        (metadata["width"].clone(), metadata["height"].clone()),
        (json!(1280), json!(960))
    );
    assert_eq!(metadata["exif"]["orientation"], json!(6));
    let (status, thumbnail) = outcome(&engine, turned_media, "thumbnail").await;
    assert_eq!(status, OperationStatus::Succeeded);
    assert_eq!(
        (thumbnail["width"].clone(), thumbnail["height"].clone()),
        (json!(256), json!(192))
    );
    let pixels = decode_image(&std::fs::read(thumbnail["path"].as_str().unwrap()).unwrap())
        .unwrap()
        .image
        .to_rgb8();
    let red = |x: u32, y: u32| {
        let Rgb([r, g, b]) = *pixels.get_pixel(x, y);
        r > 180 && g < 80 && b < 80
    };
    assert!(
        red(20, 20),
        "the red block is at the top left: {:?}",
        pixels.get_pixel(20, 20)
    );
    for (x, y) in [(235, 20), (20, 170), (235, 170)] {
        assert!(!red(x, y), "no red at ({x}, {y}): {:?}", pixels.get_pixel(x, y));
    }
    assert!(
        pixels.get_pixel(250, 100)[0] > pixels.get_pixel(80, 100)[0] + 80,
        "brighter to the right"
    );

    let (_, turned_hash) = outcome(&engine, turned_media, "perceptual_hash").await;
    let (_, upright_hash) = outcome(&engine, upright_media, "perceptual_hash").await;
    assert_eq!(turned_hash["hash"], upright_hash["hash"]);
    let verify = engine.verify().await.unwrap();
    assert!(verify.is_identical(), "{}", verify.render());
}

#[test]
fn a_large_jpeg_is_decoded_at_the_smallest_dct_scale_still_twice_the_thumbnail() {
    let picture = asymmetric(2400, 1600);
    let bytes = jpeg_with_exif(&picture, None);
    let working = decode_working(&bytes, &DecodeLimits::default(), 512).unwrap();
    assert_eq!(working.decoded, (600, 400), "1/4: 1/8 would be 300 wide, under 512");
    assert_eq!(
        (working.width, working.height),
        (2400, 1600),
        "the full size is reported"
    );
    assert_eq!((working.image.width(), working.image.height()), (512, 341));
    let thumbnail = working.thumbnail(256).unwrap();
    assert_eq!((thumbnail.width(), thumbnail.height()), (256, 171));
    // The same picture as a full decode, to within a few hash bits.
    let full = decode_image(&bytes).unwrap();
    assert!(dhash(&full.image).distance(dhash(&working.image)) <= 2);

    let small = jpeg_with_exif(&asymmetric(600, 400), None);
    let working = decode_working(&small, &DecodeLimits::default(), 512).unwrap();
    assert_eq!(working.decoded, (600, 400), "no scale keeps 512 px: decoded whole");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_reports_the_exif_facts_and_the_coordinates_only_when_asked() {
    let folder = tempfile::tempdir().unwrap();
    let facts = CameraFacts {
        taken_at: Some("2023-08-14T09:30:05".into()),
        make: Some("Opledger".into()),
        model: Some("Field Camera".into()),
        lens: Some("35mm f/2".into()),
        f_number: Some(4.0),
        iso: Some(400),
        orientation: Some(1),
        coordinates: Some((35.6586, 139.7454)),
        gps_present: true,
        ..CameraFacts::default()
    };
    let plain_path = folder.path().join("plain.jpg");
    let located_path = folder.path().join("located.jpg");
    std::fs::write(&plain_path, jpeg_with_exif(&asymmetric(320, 240), Some(&facts))).unwrap();
    // Other bytes (a different picture) so the two are two media items.
    std::fs::write(&located_path, jpeg_with_exif(&asymmetric(300, 240), Some(&facts))).unwrap();
    let engine = engine_at(folder.path()).await;
    let paths: Paths = Arc::default();
    let plain = register(&engine, &paths, &plain_path, json!({})).await;
    let located = register(&engine, &paths, &located_path, json!({"gps_coordinates": true})).await;
    run(&engine, &paths, &folder.path().join("thumbnails"), &Arc::default()).await;

    let (status, metadata) = outcome(&engine, plain, "metadata").await;
    assert_eq!(status, OperationStatus::Succeeded);
    assert_eq!(
        metadata["exif"],
        json!({"taken_at": "2023-08-14T09:30:05", "make": "Opledger", "model": "Field Camera",
               "lens": "35mm f/2", "f_number": 4.0, "iso": 400, "orientation": 1, "gps_present": true})
    );
    let (_, metadata) = outcome(&engine, located, "metadata").await;
    let gps = &metadata["exif"]["gps"];
    assert!((gps["latitude"].as_f64().unwrap() - 35.6586).abs() < 1e-4, "{gps}");
    assert!((gps["longitude"].as_f64().unwrap() - 139.7454).abs() < 1e-4, "{gps}");
}
