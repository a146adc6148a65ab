//! Checked decoding: the one way this crate turns bytes into pixels, under
//! [`DecodeLimits`], so that a hostile file ends as an error about that
//! file, never as a worker that hangs, dies or swaps.
//!
//! Decoding works on bytes in memory: a task reads the file once, checks
//! its digest on those bytes, and decodes the very bytes it checked, so a
//! file replaced between the check and the decode cannot slip through. It
//! also means every decoder error is about the bytes (corrupt, truncated,
//! not an image, too large) and therefore terminal; I/O trouble can only
//! come from the read before, and stays retryable.
//!
//! Every decode goes through the same three steps:
//!
//! 1. **Read the header only** and learn the declared size.
//! 2. **Refuse before decoding** ([`MediaError::TooLarge`]) when it
//!    declares more pixels than [`DecodeLimits::max_pixels`], or when the
//!    buffers the decode would hold at once — the decoder's own working
//!    memory, the pixels, and the copy the tasks make next (an upright or
//!    8-bit copy) — add up to more than [`DecodeLimits::max_bytes`]. *Why
//!    both:* a pixel count is what an operator can reason about; bytes are
//!    what runs out, and one image's bytes differ by format and depth (a
//!    16-bit grey PNG holds two bytes a pixel before its 8-bit copy, a
//!    progressive JPEG its coefficients beside its pixels). The bound is
//!    per image, over all buffers of one decode, not per allocation: many
//!    allocations that each pass a per-allocation limit can still exhaust
//!    the machine.
//! 3. **Decode strictly**: a decoder warning is an error. JPEG is decoded
//!    by [`mod@crate::jpeg`] (zune-jpeg in strict mode, checked against its
//!    own header), since the `image` crate's wrapper turns missing or
//!    damaged data into grey pixels and a success; the other formats by the
//!    `image` crate with its allocation limit set to the same bound, which
//!    its PNG and GIF decoders also apply to their own buffers.

use crate::error::MediaError;
use crate::image_ops::{format_name, not_an_image, orientation_of, reader, BytesReader, ImageMetadata};
use image::metadata::Orientation;
use image::{ColorType, DynamicImage, ImageDecoder, ImageFormat, Limits};

/// How large an image a decode accepts. One value per worker, given to
/// every image task (`with_limits`), not a task input: a limit is about the
/// worker's machine, not about what a thumbnail or a hash *is*, so it must
/// not change a revision. Work refused under one limit is final there; a
/// review `retry` runs it again, e.g. on a worker with higher limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Declared width × height above which an image is refused unread.
    pub max_pixels: u64,
    /// The most bytes one decode may hold at once (see the module
    /// documentation for what is counted).
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

    /// Step 2 for a header that declares `width` × `height` and a decode
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

/// A decoded image and the format its bytes were in.
#[derive(Debug, Clone)]
pub struct DecodedImage {
    pub format: ImageFormat,
    pub image: DynamicImage,
    pub byte_size: u64,
}

impl DecodedImage {
    pub fn metadata(&self) -> ImageMetadata {
        ImageMetadata {
            format: format_name(self.format),
            width: self.image.width(),
            height: self.image.height(),
            byte_size: self.byte_size,
        }
    }
}

/// [`decode_image_with`] under the default [`DecodeLimits`].
pub fn decode_image(bytes: &[u8]) -> Result<DecodedImage, MediaError> {
    decode_image_with(bytes, &DecodeLimits::default())
}

/// Decodes every pixel, under `limits`, and turns the picture upright by
/// its EXIF orientation. Fails with [`MediaError::TooLarge`] before any
/// pixel is decoded when the header declares more than `limits` allow, and
/// with [`MediaError::NotAnImage`] when the bytes are not a whole, intact
/// image (truncated, damaged, another kind of file): the bytes are in
/// memory, so an error can only be about them.
pub fn decode_image_with(bytes: &[u8], limits: &DecodeLimits) -> Result<DecodedImage, MediaError> {
    let (reader, format) = reader(bytes)?;
    let (mut image, orientation) = match format {
        ImageFormat::Jpeg => crate::jpeg::decode(bytes, limits)?,
        _ => decode_with_image(reader, format, bytes.len() as u64, limits)?,
    };
    image.apply_orientation(orientation);
    Ok(DecodedImage {
        format,
        image,
        byte_size: bytes.len() as u64,
    })
}

/// Decodes a format other than JPEG with the `image` crate, under
/// `limits`: the picture as stored and its orientation.
pub(crate) fn decode_with_image(
    mut reader: BytesReader<'_>,
    format: ImageFormat,
    input: u64,
    limits: &DecodeLimits,
) -> Result<(DynamicImage, Orientation), MediaError> {
    let mut allocation = Limits::default();
    allocation.max_alloc = Some(limits.max_bytes);
    reader.limits(allocation);
    let mut decoder = reader.into_decoder().map_err(not_an_image)?;
    let footprint = footprint(format, &decoder, input);
    limits.admit(format_name(format), decoder.dimensions(), footprint)?;
    let orientation = orientation_of(&mut decoder);
    Ok((DynamicImage::from_decoder(decoder).map_err(not_an_image)?, orientation))
}

/// The bytes a decode of a PNG, GIF, WebP or TIFF holds at once, from its
/// header: the pixels and their copy ([`pixels_and_copy`]) plus the
/// decoder's working memory, which is small for PNG (a few rows and the
/// inflate window) and a frame for GIF (a frame smaller than the screen is
/// read into a buffer of its own), and counted as four bytes a pixel for
/// WebP (planes or colour-indexed pixels beside the output) and TIFF (a
/// strip or tile decompressed before it is copied out).
fn footprint(format: ImageFormat, decoder: &impl ImageDecoder, input: u64) -> u64 {
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    let decoded = decoder.total_bytes();
    let color = decoder.color_type();
    let deep = !matches!(
        color,
        ColorType::L8 | ColorType::La8 | ColorType::Rgb8 | ColorType::Rgba8
    );
    let row = u64::from(width) * u64::from(color.bytes_per_pixel()) + 1;
    let working = match format {
        ImageFormat::Png => 4 * row + (1 << 20),
        ImageFormat::Gif => decoded,
        _ => 4 * pixels,
    };
    input + working + pixels_and_copy(pixels, decoded, deep)
}

/// The orientation named by an EXIF block; a damaged one means "as
/// stored", since it should not make a readable picture unreadable.
pub(crate) fn exif_orientation(exif: Option<&[u8]>) -> Orientation {
    exif.and_then(Orientation::from_exif_chunk)
        .unwrap_or(Orientation::NoTransforms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_unknown_bytes_are_not_images() {
        for bytes in [&b""[..], b"hello, this is text", b"\x89PNG\r\n\x1a\n"] {
            let error = decode_image(bytes).unwrap_err();
            assert!(matches!(error, MediaError::NotAnImage(_)), "{error}");
            assert!(error.to_string().starts_with("not a decodable image: "), "{error}");
            assert!(!error.is_retryable());
        }
    }

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
