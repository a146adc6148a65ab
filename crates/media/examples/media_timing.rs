//! How long the image work of the ingest pipeline takes without a ledger,
//! on one thread: generating N sample images, then per file what the three
//! image tasks do (read and SHA-256 check; metadata with a full decode;
//! decode, thumbnail at 256 px, PNG encode; decode and dHash). Figures, not
//! a test: `cargo run --release -p opledger-media --example media_timing -- 1000`.
//!
//! Prints one JSON object; the ingest's "share of wall time in the ledger"
//! is measured against these numbers.

use opledger_media::{
    decode_image, dhash, encode_image, generate_samples, sha256_hex, thumbnail, ThumbnailFormat, DEFAULT_THUMBNAIL_SIDE,
};
use std::time::{Duration, Instant};

fn main() {
    let count: usize = std::env::args()
        .nth(1)
        .map(|arg| arg.parse().expect("the sample count is a whole number"))
        .unwrap_or(1000);
    let folder = tempfile::tempdir().expect("a temporary folder");

    let started = Instant::now();
    let samples = generate_samples(folder.path(), count, 1).expect("samples");
    let generate = started.elapsed();

    let (mut read, mut metadata, mut thumbnails, mut hashes) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut bytes_total = 0_u64;
    for path in &samples {
        // Each task reads and checks the file itself: three reads per file.
        let step = Instant::now();
        let mut bytes = Vec::new();
        for _ in 0..3 {
            bytes = std::fs::read(path).expect("read");
            std::hint::black_box(sha256_hex(&bytes));
        }
        read += step.elapsed();
        bytes_total += bytes.len() as u64;

        let step = Instant::now();
        let decoded = decode_image(&bytes).expect("decode");
        std::hint::black_box(decoded.metadata());
        metadata += step.elapsed();

        let step = Instant::now();
        let decoded = decode_image(&bytes).expect("decode");
        let small = thumbnail(&decoded.image, DEFAULT_THUMBNAIL_SIDE).expect("thumbnail");
        std::hint::black_box(encode_image(&small, ThumbnailFormat::Png).expect("encode"));
        thumbnails += step.elapsed();

        let step = Instant::now();
        let decoded = decode_image(&bytes).expect("decode");
        std::hint::black_box(dhash(&decoded.image));
        hashes += step.elapsed();
    }
    let tasks = read + metadata + thumbnails + hashes;
    let seconds = |duration: Duration| (duration.as_secs_f64() * 1000.0).round() / 1000.0;
    println!(
        "{{\"files\":{count},\"bytes\":{bytes_total},\"generate_s\":{},\"read_and_check_s\":{},\
         \"metadata_s\":{},\"thumbnail_s\":{},\"perceptual_hash_s\":{},\"tasks_total_s\":{},\
         \"tasks_files_per_s\":{:.1}}}",
        seconds(generate),
        seconds(read),
        seconds(metadata),
        seconds(thumbnails),
        seconds(hashes),
        seconds(tasks),
        count as f64 / tasks.as_secs_f64().max(1e-9),
    );
}
