//! Deterministic sample images for trying the pipeline (and testing it)
//! without shipping binary files: PNG and JPEG pictures of varied sizes and
//! patterns in nested folders, and optionally some corrupt files.
//!
//! The same `(count, seed)` writes the same files byte for byte on every
//! machine with this build (a small fixed PRNG, no randomness from outside,
//! pure integer drawing), so a test can name what it expects. Drawing is
//! integer arithmetic per pixel and PNGs use fast compression: a thousand
//! images take a few seconds in a release build.

use crate::error::MediaError;
use crate::image_ops::{encode_image, ThumbnailFormat};
use image::{DynamicImage, Rgb, RgbImage};
use std::path::{Path, PathBuf};

/// What [`generate_samples_with`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleOptions {
    /// How many valid images.
    pub count: usize,
    pub seed: u64,
    /// How many corrupt files to add beside them, cycling through: a PNG
    /// cut off in the middle of its pixel data (its header still reads), a
    /// text file named `.jpg`, an empty `.png`.
    pub corrupt: usize,
    /// Sides are drawn uniformly from this range (inclusive).
    pub min_side: u32,
    pub max_side: u32,
}

impl SampleOptions {
    pub fn new(count: usize, seed: u64) -> Self {
        SampleOptions {
            count,
            seed,
            corrupt: 0,
            min_side: 64,
            max_side: 640,
        }
    }

    pub fn with_corrupt(mut self, corrupt: usize) -> Self {
        self.corrupt = corrupt;
        self
    }

    pub fn with_sides(mut self, min_side: u32, max_side: u32) -> Self {
        self.min_side = min_side;
        self.max_side = max_side;
        self
    }
}

/// The files written, in the order they were generated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SampleSet {
    pub images: Vec<PathBuf>,
    pub corrupt: Vec<PathBuf>,
}

impl SampleSet {
    /// Every file, images first.
    pub fn all(&self) -> Vec<PathBuf> {
        self.images.iter().chain(&self.corrupt).cloned().collect()
    }
}

/// Writes `count` valid sample images (sides 64–640 px, PNG or JPEG) under
/// `dir`, in nested folders, and returns their paths.
pub fn generate_samples(dir: &Path, count: usize, seed: u64) -> Result<Vec<PathBuf>, MediaError> {
    Ok(generate_samples_with(dir, &SampleOptions::new(count, seed))?.images)
}

/// Writes the samples `options` describe under `dir`.
pub fn generate_samples_with(dir: &Path, options: &SampleOptions) -> Result<SampleSet, MediaError> {
    if options.min_side == 0 || options.min_side > options.max_side {
        return Err(MediaError::Invalid(format!(
            "sample sides must satisfy 1 <= min ({}) <= max ({})",
            options.min_side, options.max_side
        )));
    }
    let mut rng = SplitMix64::new(options.seed);
    let mut set = SampleSet::default();
    for index in 0..options.count {
        let width = rng.between(options.min_side, options.max_side);
        let height = rng.between(options.min_side, options.max_side);
        let format = if rng.below(2) == 0 {
            ThumbnailFormat::Png
        } else {
            ThumbnailFormat::Jpeg
        };
        let picture = DynamicImage::ImageRgb8(draw(&mut rng, width, height));
        let bytes = encode_image(&picture, format)?;
        let path = folder_for(dir, index).join(format!("sample-{index:05}.{}", format.extension()));
        write(&path, &bytes)?;
        set.images.push(path);
    }
    for index in 0..options.corrupt {
        let folder = folder_for(dir, index);
        let (path, bytes) = match index % 3 {
            0 => {
                let picture = DynamicImage::ImageRgb8(draw(&mut rng, 96, 64));
                let mut bytes = encode_image(&picture, ThumbnailFormat::Png)?;
                // Keep the signature and IHDR (the first 33 bytes) and part of
                // the pixel data: the header reads, the pixels do not.
                bytes.truncate((bytes.len() / 2).max(40));
                (folder.join(format!("broken-{index:03}.png")), bytes)
            }
            1 => (
                folder.join(format!("notes-{index:03}.jpg")),
                b"This is a text file with an image's name, not an image.\n".to_vec(),
            ),
            _ => (folder.join(format!("empty-{index:03}.png")), Vec::new()),
        };
        write(&path, &bytes)?;
        set.corrupt.push(path);
    }
    Ok(set)
}

/// Nested folders, two levels deep, so a walk has to recurse.
fn folder_for(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("set-{}", index % 8))
        .join(format!("roll-{}", (index / 8) % 4))
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), MediaError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| MediaError::io("creating", parent, source))?;
    }
    std::fs::write(path, bytes).map_err(|source| MediaError::io("writing", path, source))
}

/// SplitMix64: tiny, fast, and fixed forever, unlike a library's default
/// generator (samples must not change when a dependency is upgraded).
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (bound > 0); the tiny modulo bias is harmless
    /// for pictures.
    fn below(&mut self, bound: u32) -> u32 {
        (self.next() % u64::from(bound.max(1))) as u32
    }

    /// Uniform in `low..=high`.
    fn between(&mut self, low: u32, high: u32) -> u32 {
        low + self.below(high - low + 1)
    }

    fn colour(&mut self) -> [u8; 3] {
        let bits = self.next();
        [bits as u8, (bits >> 8) as u8, (bits >> 16) as u8]
    }
}

/// `a` + (`b` − `a`) · t/255, per channel.
fn mix(a: [u8; 3], b: [u8; 3], t: u32) -> Rgb<u8> {
    let t = t.min(255) as i32;
    let channel = |i: usize| (i32::from(a[i]) + (i32::from(b[i]) - i32::from(a[i])) * t / 255) as u8;
    Rgb([channel(0), channel(1), channel(2)])
}

/// One picture: a background (a gradient, rings, stripes or a
/// checkerboard, each with its own colours and geometry) with a few
/// shapes on it. The shapes matter: a plain gradient or a fine pattern
/// looks alike to a perceptual hash (all bits set, or none), and sample
/// folders should hold pictures that a dHash tells apart.
fn draw(rng: &mut SplitMix64, width: u32, height: u32) -> RgbImage {
    let (a, b) = (rng.colour(), rng.colour());
    let mut picture = match rng.below(4) {
        0 => linear_gradient(rng, width, height, a, b),
        1 => {
            let (cx, cy) = (rng.below(width) as i64, rng.below(height) as i64);
            let period = i64::from(rng.between(12, 96));
            RgbImage::from_fn(width, height, |x, y| {
                let (dx, dy) = (i64::from(x) - cx, i64::from(y) - cy);
                // Rings by squared distance: no square root per pixel; the
                // rings narrow outwards, which is fine for a picture.
                let phase = ((dx * dx + dy * dy) / (period * 4)) % 510;
                mix(a, b, (if phase > 255 { 510 - phase } else { phase }) as u32)
            })
        }
        2 => {
            let (fx, fy) = (i64::from(rng.between(0, 8)), i64::from(rng.between(1, 8)));
            let period = i64::from(rng.between(6, 48));
            RgbImage::from_fn(width, height, |x, y| {
                let band = (i64::from(x) * fx + i64::from(y) * fy) / (period * 4);
                if band % 2 == 0 {
                    Rgb(a)
                } else {
                    Rgb(b)
                }
            })
        }
        _ => {
            let cell = rng.between(8, 64);
            let (ox, oy) = (rng.below(cell), rng.below(cell));
            RgbImage::from_fn(width, height, |x, y| {
                if ((x + ox) / cell + (y + oy) / cell).is_multiple_of(2) {
                    Rgb(a)
                } else {
                    Rgb(b)
                }
            })
        }
    };
    let smaller = width.min(height);
    for _ in 0..rng.between(3, 7) {
        let colour = Rgb(rng.colour());
        let (cx, cy) = (rng.below(width) as i64, rng.below(height) as i64);
        let radius = i64::from(rng.between(smaller / 10 + 2, smaller / 3 + 4));
        let round = rng.below(2) == 0;
        let (x0, x1) = ((cx - radius).max(0), (cx + radius).min(i64::from(width) - 1));
        let (y0, y1) = ((cy - radius).max(0), (cy + radius).min(i64::from(height) - 1));
        for y in y0..=y1 {
            for x in x0..=x1 {
                let (dx, dy) = (x - cx, y - cy);
                if !round || dx * dx + dy * dy <= radius * radius {
                    picture.put_pixel(x as u32, y as u32, colour);
                }
            }
        }
    }
    picture
}

fn linear_gradient(rng: &mut SplitMix64, width: u32, height: u32, a: [u8; 3], b: [u8; 3]) -> RgbImage {
    // A direction with integer components; the projection of each pixel on
    // it, scaled so the picture spans the whole a..b range.
    let (dx, dy) = (rng.between(0, 16) as i64 - 8, rng.between(0, 16) as i64 - 8);
    let (dx, dy) = if (dx, dy) == (0, 0) { (1, 0) } else { (dx, dy) };
    let corners = [
        (0, 0),
        (i64::from(width), 0),
        (0, i64::from(height)),
        (i64::from(width), i64::from(height)),
    ];
    let projections = corners.map(|(x, y)| x * dx + y * dy);
    let low = *projections.iter().min().unwrap_or(&0);
    let span = (*projections.iter().max().unwrap_or(&1) - low).max(1);
    RgbImage::from_fn(width, height, |x, y| {
        let t = (i64::from(x) * dx + i64::from(y) * dy - low) * 255 / span;
        mix(a, b, t as u32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_the_published_sequence() {
        // First outputs for seed 0 (the reference implementation's values):
        // samples depend on this sequence never changing.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next(), 0x6e78_9e6a_a1b9_65f4);
    }
}
