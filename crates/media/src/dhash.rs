//! A 64-bit difference hash (dHash) for near-duplicate detection.
//!
//! The algorithm, fixed because stored hashes are compared with new ones:
//!
//! 1. Shrink the image to 9 × 8 pixels by area averaging (each target
//!    pixel is the mean of the source box it covers), ignoring the aspect
//!    ratio; alpha is ignored.
//! 2. Convert those 72 pixels to 8-bit grayscale with the Rec. 709 luma
//!    weights, in integers: (2126 R + 7152 G + 722 B + 5000) / 10000.
//!    (Luma is linear, so this is the grayscale-then-shrink of the usual
//!    description, up to rounding, at a fraction of the cost.)
//! 3. For each of the 8 rows, compare the 8 pairs of horizontally adjacent
//!    pixels: the bit is 1 when the right pixel is brighter than the left.
//! 4. The 64 bits are read row by row, top to bottom, left to right, the
//!    first comparison being the most significant bit; the hash is written
//!    as 16 lowercase hex digits.
//!
//! It depends on gradients, not on absolute brightness, size or encoding,
//! so a re-encoded, resized or slightly retouched copy differs in a few bits
//! ([`hamming_distance`]); unrelated images differ in about half of them.

use crate::image_ops::shrink;
use image::DynamicImage;
use std::fmt;
use std::str::FromStr;

/// The algorithm's name in outputs.
pub const DHASH_ALGORITHM: &str = "dhash64";

/// A 64-bit dHash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DHash(pub u64);

impl DHash {
    /// How many of the 64 bits differ: 0 for the same picture, roughly up
    /// to 10 for near duplicates, about 32 for unrelated images.
    pub fn distance(self, other: DHash) -> u32 {
        hamming_distance(self.0, other.0)
    }
}

/// The number of bits in which `a` and `b` differ.
pub fn hamming_distance(a: u64, b: u64) -> u32 {
    (a ^ b).count_ones()
}

impl fmt::Display for DHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl FromStr for DHash {
    type Err = String;

    /// Exactly 16 hex digits, as [`fmt::Display`] writes them.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() != 16 || !text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return Err(format!("a dHash is 16 hex digits, not {text:?}"));
        }
        u64::from_str_radix(text, 16)
            .map(DHash)
            .map_err(|error| format!("{text:?}: {error}"))
    }
}

/// The dHash of `image` (see the module documentation for the algorithm).
pub fn dhash(image: &DynamicImage) -> DHash {
    let small = shrink(image, 9, 8);
    let luma = |x: u32, y: u32| -> u32 {
        match &small {
            DynamicImage::ImageLuma8(pixels) => u32::from(pixels.get_pixel(x, y).0[0]),
            DynamicImage::ImageLumaA8(pixels) => u32::from(pixels.get_pixel(x, y).0[0]),
            DynamicImage::ImageRgba8(pixels) => rec709(&pixels.get_pixel(x, y).0[..3]),
            DynamicImage::ImageRgb8(pixels) => rec709(&pixels.get_pixel(x, y).0),
            // shrink returns 8-bit images only; this arm is never taken.
            other => rec709(&other.to_rgb8().get_pixel(x, y).0),
        }
    };
    let mut bits = 0_u64;
    for y in 0..8 {
        for x in 0..8 {
            bits = (bits << 1) | u64::from(luma(x + 1, y) > luma(x, y));
        }
    }
    DHash(bits)
}

/// Rec. 709 luma of an 8-bit RGB pixel, rounded.
fn rec709(rgb: &[u8]) -> u32 {
    (2126 * u32::from(rgb[0]) + 7152 * u32::from(rgb[1]) + 722 * u32::from(rgb[2]) + 5000) / 10_000
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, Luma};

    #[test]
    fn hex_round_trips_and_refuses_bad_text() {
        let hash = DHash(0x00ff_10a0_0000_0001);
        assert_eq!(hash.to_string(), "00ff10a000000001");
        assert_eq!("00ff10a000000001".parse::<DHash>().unwrap(), hash);
        assert!("00ff10a0".parse::<DHash>().is_err());
        assert!("00ff10a00000000g".parse::<DHash>().is_err());
        assert!("+0ff10a000000001".parse::<DHash>().is_err());
    }

    #[test]
    fn hamming_distance_counts_differing_bits() {
        assert_eq!(hamming_distance(0, 0), 0);
        assert_eq!(hamming_distance(0, u64::MAX), 64);
        assert_eq!(DHash(0b1011).distance(DHash(0b0110)), 3);
    }

    #[test]
    fn brightening_to_the_right_sets_every_bit() {
        // A horizontal ramp: each pixel brighter than its left neighbour.
        let ramp = GrayImage::from_fn(90, 80, |x, _| Luma([(x * 2) as u8]));
        assert_eq!(dhash(&DynamicImage::ImageLuma8(ramp)), DHash(u64::MAX));
        let flat = GrayImage::from_pixel(90, 80, Luma([128]));
        assert_eq!(dhash(&DynamicImage::ImageLuma8(flat)), DHash(0));
    }
}
