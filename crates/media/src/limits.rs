//! How large an image a decode accepts ([`DecodeLimits`]) and the bytes a
//! decode holds at once, which every decoder of this crate (`decode`,
//! `jpeg`, `jpeg_scaled`, `heif`) counts the same way; the steps a decode
//! goes through are [`mod@crate::decode`]'s.

use crate::error::MediaError;

/// How large an image a decode accepts. One value per worker, given to
/// every image task (`with_limits`), not a task input: a limit is about the
/// worker's machine, not about what a thumbnail or a hash *is*, so it must
/// not change a revision. Work refused under one limit is final there; a
/// review `retry` runs it again, e.g. on a worker with higher limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Declared width × height above which an image is refused unread.
    pub max_pixels: u64,
    /// The most bytes one decode may hold at once (see
    /// [`mod@crate::decode`] for what is counted).
    pub max_bytes: u64,
}

impl DecodeLimits {
    /// 100 megapixels: beyond any camera the pipeline expects (a 61 MP
    /// full-frame sensor, a stitched panorama of a few frames), far below
    /// what a bomb declares.
    pub const DEFAULT_MAX_PIXELS: u64 = 100_000_000;
    /// 1 GiB: room for a 100 MP 8-bit picture in any of the formats read
    /// here, progressive JPEG included, with its copy. A deep (16-bit)
    /// image of that size is refused by this bound before the pixel limit.
    /// Each image thread decodes one image at a time, so a worker holds at
    /// most its thread count times this.
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

    pub const fn new(max_pixels: u64, max_bytes: u64) -> Self {
        DecodeLimits { max_pixels, max_bytes }
    }

    pub const fn with_max_pixels(mut self, max_pixels: u64) -> Self {
        self.max_pixels = max_pixels;
        self
    }

    pub const fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Step 2 of a decode ([`mod@crate::decode`]) for a header that declares `width` × `height` and a decode
    /// that would hold `footprint` bytes at once.
    pub(crate) fn admit(&self, format: &str, (width, height): (u32, u32), footprint: u64) -> Result<(), MediaError> {
        let pixels = u64::from(width) * u64::from(height);
        if pixels > self.max_pixels {
            return Err(MediaError::TooLarge(format!(
                "the {format} header declares {width} x {height} pixels ({}), more than the {} this worker decodes",
                megapixels(pixels),
                megapixels(self.max_pixels)
            )));
        }
        if footprint > self.max_bytes {
            return Err(MediaError::TooLarge(format!(
                "decoding this {width} x {height} {format} would hold {} at once, more than the {} this worker \
                 allows one image",
                mebibytes(footprint),
                mebibytes(self.max_bytes)
            )));
        }
        Ok(())
    }
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits::new(Self::DEFAULT_MAX_PIXELS, Self::DEFAULT_MAX_BYTES)
    }
}

fn megapixels(pixels: u64) -> String {
    format!("{:.1} megapixels", pixels as f64 / 1e6)
}

fn mebibytes(bytes: u64) -> String {
    format!("{:.0} MiB", (bytes as f64 / f64::from(1 << 20)).ceil())
}

/// The bytes a decode holds at once besides the decoder's own working
/// memory: its `decoded` pixels (`pixels` of them) and, while they exist,
/// the copy the tasks make next — the picture turned upright, a thumbnail
/// that is the picture itself, or the 8-bit copy of a deep image (at most
/// four bytes a pixel), whichever is larger.
pub(crate) fn pixels_and_copy(pixels: u64, decoded: u64, deep: bool) -> u64 {
    let copy = if deep { decoded.max(pixels * 4) } else { decoded };
    decoded + copy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_refuse_pixels_first_then_bytes_and_name_both_figures() {
        let limits = DecodeLimits::new(1_000_000, 8 << 20);
        assert!(
            limits.admit("png", (1000, 1000), 8 << 20).is_ok(),
            "both bounds are inclusive"
        );
        let pixels = limits.admit("jpeg", (65_000, 65_000), 0).unwrap_err().to_string();
        assert_eq!(
            pixels,
            "too large to decode: the jpeg header declares 65000 x 65000 pixels (4225.0 megapixels), \
             more than the 1.0 megapixels this worker decodes"
        );
        let bytes = limits.admit("png", (500, 500), (8 << 20) + 1).unwrap_err();
        assert!(matches!(bytes, MediaError::TooLarge(_)));
        assert!(!bytes.is_retryable(), "the same bytes are refused the same way");
        assert!(
            bytes
                .to_string()
                .contains("would hold 9 MiB at once, more than the 8 MiB"),
            "{bytes}"
        );
    }

    #[test]
    fn a_deep_image_counts_its_eight_bit_copy() {
        // 16-bit grey: two bytes a pixel decoded, then an 8-bit RGB(A) copy.
        assert_eq!(pixels_and_copy(100, 200, true), 200 + 400);
        assert_eq!(pixels_and_copy(100, 300, false), 600);
    }
}
