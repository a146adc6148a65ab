//! The working image: one checked decode of a file at the size its tasks
//! need, upright, which the thumbnail, the perceptual hash and the
//! metadata of that file all read.
//!
//! *Why a working size:* a thumbnail of 256 pixels needs no 12-megapixel
//! picture. A JPEG is decoded by DCT scaling ([`mod@crate::jpeg_scaled`])
//! at the smallest of 1/2, 1/4 and 1/8 whose longest side is still at
//! least the working side, and every image is then averaged down to fit
//! the working side. The default working side is twice the default
//! thumbnail's ([`DEFAULT_WORKING_SIDE`]), so a thumbnail is an average of
//! at least 2 × 2 working pixels, and the perceptual hash (9 × 8 pixels)
//! reads the same working image whichever task decoded it.
//!
//! The checks are those of [`crate::decode_image_with`]: the same limits,
//! the same strictness, so a file is refused the same way at any size.

use crate::camera::{camera_facts, CameraFacts};
use crate::decode::{decode_with_image, DecodeLimits};
use crate::error::MediaError;
use crate::image_ops::{format_name, oriented, reader, shrink, thumbnail_size, ImageMetadata, DEFAULT_THUMBNAIL_SIDE};
use image::{DynamicImage, ImageFormat};

/// The working side the image tasks decode at unless a thumbnail asks for
/// more: twice the default thumbnail's longest side.
pub const DEFAULT_WORKING_SIDE: u32 = 2 * DEFAULT_THUMBNAIL_SIDE;

/// A file decoded once for its image tasks.
#[derive(Debug, Clone)]
pub struct WorkingImage {
    /// The format's name (see [`format_name`]; `heif` and `avif` too in a
    /// build with the `heif` feature).
    pub format: &'static str,
    /// The full size as displayed (after the EXIF orientation).
    pub width: u32,
    pub height: u32,
    pub byte_size: u64,
    /// The size the decoder produced, as stored: a JPEG's DCT-scaled size,
    /// or the full size of the other formats.
    pub decoded: (u32, u32),
    /// Upright, with its longest side at most the working side (never
    /// enlarged).
    pub image: DynamicImage,
    /// What its EXIF block records, if it has one.
    pub camera: Option<CameraFacts>,
}

impl WorkingImage {
    /// The full image's metadata (format, displayed size, byte size).
    pub fn metadata(&self) -> ImageMetadata {
        ImageMetadata {
            format: self.format,
            width: self.width,
            height: self.height,
            byte_size: self.byte_size,
        }
    }

    /// A thumbnail of the full image whose longest side is at most
    /// `max_side`, sized from the full image's size (so it is the size a
    /// full decode would give), averaged from the working image.
    pub fn thumbnail(&self, max_side: u32) -> Result<DynamicImage, MediaError> {
        if max_side == 0 {
            return Err(MediaError::Invalid(
                "a thumbnail's longest side must be at least 1 px".into(),
            ));
        }
        let (width, height) = thumbnail_size(self.width, self.height, max_side);
        if (width, height) == (self.image.width(), self.image.height()) {
            return Ok(self.image.clone());
        }
        Ok(shrink(&self.image, width, height))
    }
}

/// Decodes `bytes` under `limits` into a [`WorkingImage`] whose longest
/// side is at most `side` (see the module documentation).
pub fn decode_working(bytes: &[u8], limits: &DecodeLimits, side: u32) -> Result<WorkingImage, MediaError> {
    let side = side.max(1);
    #[cfg(feature = "heif")]
    if let Some(name) = crate::heif::heif_format(bytes) {
        let image = crate::heif::decode_heif(bytes, name, limits)?;
        return Ok(fitted(
            bytes,
            name,
            image,
            side,
            image::metadata::Orientation::NoTransforms,
        ));
    }
    if let Some(raw) = crate::raw::preview(bytes) {
        let reduced = crate::jpeg_scaled::decode_reduced(raw.jpeg, limits, side)?;
        let orientation = raw.orientation.unwrap_or(reduced.orientation);
        let mut working = fitted(bytes, raw.format, reduced.image, side, orientation);
        (working.width, working.height) = oriented(reduced.stored, orientation);
        if working.camera.is_none() {
            working.camera = camera_facts(raw.jpeg);
        }
        return Ok(working);
    }
    let (reader, format) = reader(bytes)?;
    let (image, orientation, stored) = match format {
        ImageFormat::Jpeg => {
            let reduced = crate::jpeg_scaled::decode_reduced(bytes, limits, side)?;
            (reduced.image, reduced.orientation, reduced.stored)
        }
        _ => {
            let (image, orientation) = decode_with_image(reader, format, bytes.len() as u64, limits)?;
            let stored = (image.width(), image.height());
            (image, orientation, stored)
        }
    };
    let mut working = fitted(bytes, format_name(format), image, side, orientation);
    // The full size as displayed: a JPEG decoded at reduced size was
    // stored larger than it was decoded.
    (working.width, working.height) = oriented(stored, orientation);
    Ok(working)
}

/// The working image of a decoded picture as stored: fitted to `side`,
/// then turned upright by `orientation`.
fn fitted(
    bytes: &[u8],
    format: &'static str,
    mut image: DynamicImage,
    side: u32,
    orientation: image::metadata::Orientation,
) -> WorkingImage {
    let decoded = (image.width(), image.height());
    let (fit_width, fit_height) = thumbnail_size(image.width(), image.height(), side);
    if (fit_width, fit_height) != decoded {
        image = shrink(&image, fit_width, fit_height);
    }
    image.apply_orientation(orientation);
    let (width, height) = oriented(decoded, orientation);
    WorkingImage {
        format,
        width,
        height,
        byte_size: bytes.len() as u64,
        decoded,
        image,
        camera: camera_facts(bytes),
    }
}
