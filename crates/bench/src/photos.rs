//! `ingest --photos N [--megapixels 12]`: the main job on a camera
//! library. N generated camera-sized JPEGs (gradients, shapes and sensor
//! noise, quality 88, EXIF with camera facts on all and a quarter turn on
//! every fourth) ingested with one image worker per core, against the
//! floor measured in the same run on as many threads: per file a read, its
//! SHA-256 and one reduced-size decode to the thumbnail's working size
//! with the same JPEG library (jpeg-decoder's DCT scaling), nothing else.
//!
//! Besides wall time it measures CPU: the process's CPU seconds per file
//! for both, and which share of the ingest's CPU ran outside the image
//! threads (the engine's commands, the SQLite writer, the pipeline's own
//! bookkeeping: [`crate::cpu`]).

use crate::backend::store_at;
use crate::cpu::{process_seconds, ThreadSampler};
use crate::stats::{median, round3};
use crate::{BenchError, Options};
use opledger_engine::Engine;
use opledger_ingest::{IngestOptions, NoProgress};
use opledger_media::image::codecs::jpeg::JpegEncoder;
use opledger_media::image::{ExtendedColorType, ImageEncoder, RgbImage};
use opledger_media::{sha256_hex, CameraFacts, DEFAULT_WORKING_SIDE};
use opledger_store_sqlite::SqliteConfig;
use opledger_worker::ComputeThreads;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// JPEG quality of the generated photos: what phones and cameras write.
const QUALITY: u8 = 88;

pub async fn photos(template: &SqliteConfig, dir: &Path, options: &Options) -> Result<Value, BenchError> {
    let count = options.photos.unwrap_or(0).max(1);
    if !(0.1..=100.0).contains(&options.megapixels) {
        return Err(BenchError::Invalid(format!(
            "--megapixels takes 0.1 to 100, not {}",
            options.megapixels
        )));
    }
    let (width, height) = size_of(options.megapixels);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let photos = dir.join(format!("photos-{count}-{width}x{height}"));
    let generating = Instant::now();
    let files = generate(&photos, count, (width, height), cores)?;
    let generated_seconds = generating.elapsed().as_secs_f64();
    let bytes: u64 = files
        .iter()
        .map(|file| std::fs::metadata(file).map_or(0, |metadata| metadata.len()))
        .sum();
    // Settled long ago as far as the quiet period is concerned.
    tokio::time::sleep(Duration::from_millis(600)).await;

    let runs_dir = dir.join("photo-runs");
    if runs_dir.exists() {
        std::fs::remove_dir_all(&runs_dir).map_err(BenchError::io(format!("removing {}", runs_dir.display())))?;
    }
    let (mut walls, mut cpus, mut ledger_shares) = (Vec::new(), Vec::new(), Vec::new());
    let (mut floor_walls, mut floor_cpus) = (Vec::new(), Vec::new());
    let mut tasks_run = 0;
    for round in 0..options.rounds.max(1) {
        // Ingest and floor alternate round by round, so a drift of the
        // machine's speed falls on both.
        let run_dir = runs_dir.join(format!("round-{round}"));
        std::fs::create_dir_all(&run_dir).map_err(BenchError::io(format!("creating {}", run_dir.display())))?;
        let store = store_at(template, run_dir.join("ledger.db")).await?;
        let (engine, _) = Engine::open(store).await?;
        let mut ingest_options = IngestOptions::new(&photos, run_dir.join("thumbnails"));
        ingest_options.workers = cores;
        ingest_options.settle_quiet = Duration::from_millis(500);
        let sampler = ThreadSampler::start();
        let cpu_before = process_seconds();
        let started = Instant::now();
        let summary = opledger_ingest::ingest(engine.clone(), ingest_options, Arc::new(NoProgress)).await?;
        let wall = started.elapsed();
        let cpu = process_seconds() - cpu_before;
        let outside_images = sampler.stop();
        drop(engine);
        if summary.failed > 0 {
            return Err(BenchError::Invalid(format!(
                "{} of the generated photos failed to ingest",
                summary.failed
            )));
        }
        tasks_run = summary.tasks_run;
        walls.push(wall);
        cpus.push(Duration::from_secs_f64(cpu));
        ledger_shares.push(Duration::from_secs_f64(
            (outside_images / cpu.max(1e-9)).clamp(0.0, 1.0),
        ));

        let cpu_before = process_seconds();
        floor_walls.push(floor(&files, cores).await?);
        floor_cpus.push(Duration::from_secs_f64(process_seconds() - cpu_before));
    }
    let _ = std::fs::remove_dir_all(&runs_dir);
    let per_file = |seconds: f64| (seconds / count as f64 * 1e6).round() / 1e6;
    let wall = median(&mut walls).as_secs_f64();
    let cpu = median(&mut cpus).as_secs_f64();
    let floor_wall = median(&mut floor_walls).as_secs_f64();
    let floor_cpu = median(&mut floor_cpus).as_secs_f64();
    let ledger_share = median(&mut ledger_shares).as_secs_f64();
    Ok(json!({
        "workload": "ingest",
        "mode": "photos",
        "backend": "sqlite",
        "files": count,
        "width": width,
        "height": height,
        "megapixels": round3(f64::from(width) * f64::from(height) / 1e6),
        "mean_file_mb": round3(bytes as f64 / count as f64 / 1e6),
        "cores": cores,
        "workers": cores,
        "tasks_run": tasks_run,
        "seconds": round3(wall),
        "files_per_sec": round3(count as f64 / wall),
        "cpu_seconds_per_file": per_file(cpu),
        "floor_seconds": round3(floor_wall),
        "floor_files_per_sec": round3(count as f64 / floor_wall),
        "floor_cpu_seconds_per_file": per_file(floor_cpu),
        "wall_ratio_to_floor": round3(wall / floor_wall),
        "cpu_ratio_to_floor": round3(cpu / floor_cpu),
        "ledger_share_of_cpu": round3(ledger_share),
        "rounds_seconds": walls.iter().map(|wall| round3(wall.as_secs_f64())).collect::<Vec<_>>(),
        "rounds_floor_seconds": floor_walls.iter().map(|wall| round3(wall.as_secs_f64())).collect::<Vec<_>>(),
        "generated_seconds": round3(generated_seconds),
        "floor": "per file on as many threads as the ingest's image workers: read, SHA-256, and one jpeg-decoder decode DCT-scaled to the smallest of 1/2, 1/4, 1/8 whose longest side is still the working side (twice the 256 px thumbnail); no checks, no thumbnail, no hash, no ledger",
        "ledger_share": "CPU of the threads other than the image threads (the async runtime running the engine's commands and the pipeline, the SQLite writer), over the process's CPU during the ingest",
    }))
}

/// Width and height of a 4:3 photo of about `megapixels`, in whole 16-pixel
/// blocks (as camera sensors' outputs are).
fn size_of(megapixels: f64) -> (u32, u32) {
    let width = (megapixels * 1e6 * 4.0 / 3.0).sqrt();
    let width = ((width / 16.0).round() as u32).max(1) * 16;
    (width, (width * 3 / 4).div_ceil(16) * 16)
}

/// Generates the photos into `folder` (kept between runs: the same count
/// and size find them there), on `threads` threads.
fn generate(folder: &Path, count: usize, size: (u32, u32), threads: usize) -> Result<Vec<PathBuf>, BenchError> {
    std::fs::create_dir_all(folder).map_err(BenchError::io(format!("creating {}", folder.display())))?;
    let files: Vec<PathBuf> = (0..count)
        .map(|index| folder.join(format!("IMG_{index:05}.jpg")))
        .collect();
    let missing: Vec<(usize, PathBuf)> = files
        .iter()
        .cloned()
        .enumerate()
        .filter(|(_, file)| !file.exists())
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures: Vec<BenchError> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut failures = Vec::new();
                    loop {
                        let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((index, file)) = missing.get(at) else {
                            break;
                        };
                        let bytes = photo(*index, size);
                        // Written whole under another name, then renamed: an
                        // interrupted generation leaves no half photo.
                        let partial = file.with_extension("partial");
                        if let Err(source) =
                            std::fs::write(&partial, bytes).and_then(|()| std::fs::rename(&partial, file))
                        {
                            failures.push(BenchError::Io {
                                context: format!("writing {}", file.display()),
                                source,
                            });
                        }
                    }
                    failures
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|worker| worker.join().unwrap_or_default())
            .collect()
    });
    match failures.into_iter().next() {
        Some(failure) => Err(failure),
        None => Ok(files),
    }
}

/// One photo: a sky-to-ground gradient, a few discs and bars whose places
/// depend on `index`, sensor noise on every pixel, and an EXIF block with
/// camera facts (every fourth turned a quarter: orientation 6).
fn photo(index: usize, (width, height): (u32, u32)) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64 ^ (index as u64).wrapping_mul(0xD134_2543_DE82_EF95);
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let shapes: Vec<(f64, f64, f64, [u8; 3])> = (0..6)
        .map(|_| {
            let x = (next() % u64::from(width)) as f64;
            let y = (next() % u64::from(height)) as f64;
            let radius = (next() % u64::from(height / 4).max(1)) as f64 + f64::from(height) / 20.0;
            let colour = [(next() % 256) as u8, (next() % 256) as u8, (next() % 256) as u8];
            (x, y, radius, colour)
        })
        .collect();
    let mut noise = next();
    let picture = RgbImage::from_fn(width, height, |x, y| {
        noise ^= noise << 13;
        noise ^= noise >> 7;
        noise ^= noise << 17;
        let grain = |shift: u32| ((noise >> shift) & 31) as i32 - 16;
        let sky = y * 200 / height;
        let mut pixel = [(40 + sky / 2) as i32, (90 + sky / 3) as i32, (230 - sky) as i32];
        for (cx, cy, radius, colour) in &shapes {
            let (dx, dy) = (f64::from(x) - cx, f64::from(y) - cy);
            if dx * dx + dy * dy < radius * radius || (dx.abs() < radius / 6.0 && dy.abs() < radius * 1.5) {
                pixel = [i32::from(colour[0]), i32::from(colour[1]), i32::from(colour[2])];
            }
        }
        opledger_media::image::Rgb([
            (pixel[0] + grain(0)).clamp(0, 255) as u8,
            (pixel[1] + grain(8)).clamp(0, 255) as u8,
            (pixel[2] + grain(16)).clamp(0, 255) as u8,
        ])
    });
    let facts = CameraFacts {
        taken_at: Some(format!(
            "2024-06-{:02}T{:02}:{:02}:00",
            1 + index % 28,
            index % 24,
            index % 60
        )),
        make: Some("Opledger".into()),
        model: Some("Bench Camera".into()),
        lens: Some("4.2mm f/1.8".into()),
        f_number: Some(1.8),
        iso: Some(100),
        orientation: Some(if index % 4 == 3 { 6 } else { 1 }),
        ..CameraFacts::default()
    };
    let mut bytes = Vec::new();
    let mut encoder = JpegEncoder::new_with_quality(&mut bytes, QUALITY);
    let _ = encoder.set_exif_metadata(facts.exif_block());
    // Encoding an RGB picture into memory does not fail.
    let _ = encoder.write_image(picture.as_raw(), width, height, ExtendedColorType::Rgb8);
    bytes
}

/// The floor: read, SHA-256 and one DCT-scaled decode per file, every file
/// queued at once on `threads` threads.
async fn floor(files: &[PathBuf], threads: usize) -> Result<Duration, BenchError> {
    use futures::StreamExt;
    let compute =
        ComputeThreads::new(threads, "floor-image").map_err(BenchError::io("starting the floor's threads"))?;
    let started = Instant::now();
    let results: Vec<Result<(), BenchError>> = futures::stream::iter(files.iter().cloned())
        .map(|file| {
            let compute = compute.clone();
            async move {
                compute
                    .run(move || -> Result<(), BenchError> {
                        let bytes =
                            std::fs::read(&file).map_err(BenchError::io(format!("reading {}", file.display())))?;
                        let _digest = sha256_hex(&bytes);
                        let mut decoder = jpeg_decoder::Decoder::new(bytes.as_slice());
                        let failed = |error: jpeg_decoder::Error| {
                            BenchError::Invalid(format!("the floor could not decode {}: {error}", file.display()))
                        };
                        decoder.read_info().map_err(failed)?;
                        let info = decoder
                            .info()
                            .ok_or_else(|| BenchError::Invalid("no JPEG header".into()))?;
                        let (width, height) = (u32::from(info.width), u32::from(info.height));
                        let long = width.max(height);
                        let denominator = [8, 4, 2]
                            .into_iter()
                            .find(|&denominator| long.div_ceil(denominator) >= DEFAULT_WORKING_SIDE)
                            .unwrap_or(1);
                        decoder
                            .scale(width.div_ceil(denominator) as u16, height.div_ceil(denominator) as u16)
                            .map_err(failed)?;
                        decoder.decode().map_err(failed)?;
                        Ok(())
                    })
                    .await
                    .map_err(BenchError::from)
                    .and_then(|result| result)
            }
        })
        .buffer_unordered(files.len().max(1))
        .collect()
        .await;
    for result in results {
        result?;
    }
    Ok(started.elapsed())
}
