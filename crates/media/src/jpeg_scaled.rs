//! JPEG decoding at reduced size: the inverse DCT of each 8 × 8 block
//! computed at 4 × 4, 2 × 2 or 1 × 1 (jpeg-decoder's `scale`), so a
//! 12-megapixel photo wanted as a 256-pixel thumbnail is never held, turned
//! or averaged at full size.
//!
//! The checks come first and are the same as for a full decode
//! ([`crate::jpeg::check`]: the layout, the limits, the least data, the
//! exact length of every sequential scan), so a truncated or damaged file
//! is refused just as strictly. Only a sequential Huffman JPEG (what
//! cameras and phones write) is decoded scaled: its scans' lengths are
//! checked exactly before decoding, which is what makes jpeg-decoder's
//! leniency (it reads zero bits past the end of data) harmless. A
//! progressive JPEG, a colour model jpeg-decoder would not hand back as
//! grey or RGB, and any file jpeg-decoder refuses go to the strict
//! full-size decode, whose judgement (and error message) is then the
//! answer.

use crate::error::MediaError;
use crate::image_ops::exif_orientation;
use crate::jpeg::{self, Checked};
use crate::limits::DecodeLimits;
use image::metadata::Orientation;
use image::{DynamicImage, GrayImage, RgbImage};
use jpeg_decoder::{Decoder, PixelFormat};

/// A JPEG decoded as stored (not turned upright), possibly at reduced
/// size, with its orientation and its full stored size.
pub(crate) struct Reduced {
    pub image: DynamicImage,
    pub orientation: Orientation,
    pub stored: (u32, u32),
}

/// The largest of 8, 4 and 2 by which a `width` × `height` image can be
/// divided with its longest side still at least `min_side` (rounded up, as
/// the scaled decode rounds), or 1.
pub(crate) fn scale_denominator((width, height): (u32, u32), min_side: u32) -> u32 {
    let long = width.max(height);
    [8, 4, 2]
        .into_iter()
        .find(|&denominator| long.div_ceil(denominator) >= min_side.max(1))
        .unwrap_or(1)
}

/// Decodes a JPEG under `limits` at the smallest DCT scale whose longest
/// side is at least `min_side` (see the module documentation).
pub(crate) fn decode_reduced(bytes: &[u8], limits: &DecodeLimits, min_side: u32) -> Result<Reduced, MediaError> {
    let checked = jpeg::check(bytes, limits)?;
    let stored = (checked.layout.width, checked.layout.height);
    let denominator = scale_denominator(stored, min_side);
    if denominator > 1 && checked.layout.huffman_dct && !checked.layout.progressive {
        if let Some((image, orientation)) = scaled(&checked, limits, denominator)? {
            return Ok(Reduced {
                image,
                orientation,
                stored,
            });
        }
    }
    let (image, orientation) = jpeg::decode_checked(checked, limits)?;
    Ok(Reduced {
        image,
        orientation,
        stored,
    })
}

/// The scaled decode; `None` when jpeg-decoder cannot or will not decode
/// this file, so the strict decoder judges it. A refusal by the limits is
/// an answer.
fn scaled(
    checked: &Checked,
    limits: &DecodeLimits,
    denominator: u32,
) -> Result<Option<(DynamicImage, Orientation)>, MediaError> {
    let layout = &checked.layout;
    let mut decoder = Decoder::new(checked.input.as_slice());
    decoder.set_max_decoding_buffer_size(usize::try_from(limits.max_bytes).unwrap_or(usize::MAX));
    if decoder.read_info().is_err() {
        return Ok(None);
    }
    let Some(info) = decoder.info() else {
        return Ok(None);
    };
    if (u32::from(info.width), u32::from(info.height)) != (layout.width, layout.height) {
        return Ok(None);
    }
    let channels = match info.pixel_format {
        PixelFormat::L8 => 1,
        PixelFormat::RGB24 => 3,
        _ => return Ok(None),
    };
    // The full decode's bound: what a worker accepts does not depend on
    // the size a task happens to ask for.
    limits.admit("jpeg", (layout.width, layout.height), layout.footprint(channels))?;
    let orientation = exif_orientation(decoder.exif_data());
    let wanted = (
        layout.width.div_ceil(denominator) as u16,
        layout.height.div_ceil(denominator) as u16,
    );
    let Ok((width, height)) = decoder.scale(wanted.0, wanted.1) else {
        return Ok(None);
    };
    let Ok(pixels) = decoder.decode() else {
        return Ok(None);
    };
    let (width, height) = (u32::from(width), u32::from(height));
    let image = match channels {
        1 => GrayImage::from_raw(width, height, pixels).map(DynamicImage::ImageLuma8),
        _ => RgbImage::from_raw(width, height, pixels).map(DynamicImage::ImageRgb8),
    };
    Ok(image.map(|image| (image, orientation)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_is_the_smallest_whose_longest_side_is_still_at_least_the_minimum() {
        assert_eq!(scale_denominator((4000, 3000), 512), 4, "1/8 would be 500");
        assert_eq!(scale_denominator((4096, 3072), 512), 8);
        assert_eq!(scale_denominator((3000, 4000), 512), 4, "portrait alike");
        assert_eq!(scale_denominator((1200, 800), 512), 2);
        assert_eq!(scale_denominator((1000, 800), 512), 1);
        assert_eq!(scale_denominator((640, 480), 0), 8);
    }
}
