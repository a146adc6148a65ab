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
use crate::limits::pixels_and_copy;
pub use crate::limits::DecodeLimits;
use image::metadata::Orientation;
use image::{ColorType, DynamicImage, ImageDecoder, ImageFormat, Limits};

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
}
