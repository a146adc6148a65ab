//! A 64-bit difference hash (dHash) for near-duplicate detection.
//!
//! The algorithm, fixed because stored hashes are compared with new ones:
//!
//! 1. Convert the image to 8-bit grayscale (the `image` crate's luma: Rec. 709
//!    weights 0.2126 R + 0.7152 G + 0.0722 B; alpha is ignored).
//! 2. Shrink it to 9 × 8 pixels by area averaging (each source pixel counts
//!    towards exactly one target pixel), ignoring the aspect ratio.
//! 3. For each of the 8 rows, compare the 8 pairs of horizontally adjacent
//!    pixels: the bit is 1 when the right pixel is brighter than the left.
//! 4. The 64 bits are read row by row, top to bottom, left to right, the
//!    first comparison being the most significant bit; the hash is written
//!    as 16 lowercase hex digits.
//!
//! It depends on gradients, not on absolute brightness, size or encoding,
//! so a re-encoded, resized or slightly retouched copy differs in a few bits
//! ([`hamming_distance`]); unrelated images differ in about half of them.

use image::{imageops, DynamicImage};
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
    let gray = image.to_luma8();
    let small = imageops::thumbnail(&gray, 9, 8);
    let mut bits = 0_u64;
    for y in 0..8 {
        for x in 0..8 {
            let left = small.get_pixel(x, y).0[0];
            let right = small.get_pixel(x + 1, y).0[0];
            bits = (bits << 1) | u64::from(right > left);
        }
    }
    DHash(bits)
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
