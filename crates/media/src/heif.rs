//! HEIF/HEIC and AVIF photos (what phones write), decoded by the system's
//! libheif through `libheif-rs`. Built only with the `heif` feature: the
//! default build needs no system library, and classifies such photos as
//! images whose image kinds are blocked ([`crate::NO_HEIF_SUPPORT`]).
//!
//! The decode follows the others' rules: the primary image's declared size
//! is checked against the [`DecodeLimits`] before any pixel is decoded,
//! and a file libheif refuses is [`MediaError::NotAnImage`]. libheif turns
//! the picture upright itself (the container's rotation and mirror
//! properties), so no EXIF orientation is applied after it.

use crate::error::MediaError;
use crate::limits::{pixels_and_copy, DecodeLimits};
use image::{DynamicImage, RgbImage, RgbaImage};
use libheif_rs::{ColorSpace, HeifContext, LibHeif, RgbChroma};

/// The format name of `bytes` when they are a HEIF or AVIF file.
pub(crate) fn heif_format(bytes: &[u8]) -> Option<&'static str> {
    if infer::image::is_avif(bytes) {
        Some("avif")
    } else if infer::image::is_heif(bytes) {
        Some("heif")
    } else {
        None
    }
}

/// The primary image's displayed size, from the container alone.
pub(crate) fn heif_dimensions(bytes: &[u8]) -> Result<(u32, u32), MediaError> {
    let context = HeifContext::read_from_bytes(bytes).map_err(refused)?;
    let handle = context.primary_image_handle().map_err(refused)?;
    Ok((handle.width(), handle.height()))
}

/// Decodes the primary image of a HEIF/AVIF file, upright, under `limits`.
pub(crate) fn decode_heif(bytes: &[u8], name: &'static str, limits: &DecodeLimits) -> Result<DynamicImage, MediaError> {
    let context = HeifContext::read_from_bytes(bytes).map_err(refused)?;
    let handle = context.primary_image_handle().map_err(refused)?;
    let (width, height) = (handle.width(), handle.height());
    let alpha = handle.has_alpha_channel();
    let channels: u64 = if alpha { 4 } else { 3 };
    let pixels = u64::from(width) * u64::from(height);
    limits.admit(name, (width, height), pixels_and_copy(pixels, pixels * channels, false))?;
    let chroma = if alpha { RgbChroma::Rgba } else { RgbChroma::Rgb };
    let decoded = LibHeif::new()
        .decode(&handle, ColorSpace::Rgb(chroma), None)
        .map_err(refused)?;
    let planes = decoded.planes();
    let plane = planes
        .interleaved
        .ok_or_else(|| MediaError::NotAnImage(format!("{name}: libheif gave no interleaved picture")))?;
    let (width, height, stride) = (plane.width, plane.height, plane.stride);
    let row = width as usize * channels as usize;
    let mut packed = Vec::with_capacity(row * height as usize);
    for line in plane.data.chunks(stride).take(height as usize) {
        packed.extend_from_slice(line.get(..row).unwrap_or(line));
    }
    let short = || MediaError::NotAnImage(format!("{name}: libheif's picture is shorter than its size"));
    Ok(if alpha {
        DynamicImage::ImageRgba8(RgbaImage::from_raw(width, height, packed).ok_or_else(short)?)
    } else {
        DynamicImage::ImageRgb8(RgbImage::from_raw(width, height, packed).ok_or_else(short)?)
    })
}

fn refused(error: libheif_rs::HeifError) -> MediaError {
    MediaError::NotAnImage(format!("libheif refused it: {error}"))
}
