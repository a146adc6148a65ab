//! Image metadata from headers, thumbnails and encoding, on the `image`
//! crate with only the codecs the pipeline needs (PNG, JPEG, GIF, WebP,
//! TIFF).
//! Decoding every pixel, under limits, is [`mod@crate::decode`]'s.

use crate::classify::Classified;
use crate::error::MediaError;
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::{CompressionType, FilterType as PngFilter, PngEncoder};
use image::metadata::Orientation;
use image::{
    DynamicImage, GrayAlphaImage, GrayImage, ImageDecoder, ImageError, ImageFormat, ImageReader, ImageResult, RgbImage,
    RgbaImage,
};
use std::io::{self, BufRead, Cursor, Seek};
use std::path::Path;

/// JPEG quality of encoded thumbnails: small files without visible blocks
/// at 256 px.
const JPEG_QUALITY: u8 = 85;

/// The thumbnail size the reference pipeline asks for.
pub const DEFAULT_THUMBNAIL_SIDE: u32 = 256;

/// What the metadata task reports about an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageMetadata {
    /// `png`, `jpeg`, `gif`, `webp`, `tiff` (see [`format_name`]).
    pub format: &'static str,
    /// As displayed: after the EXIF orientation, so a portrait photo a
    /// phone stored sideways is reported (and decoded) as portrait.
    pub width: u32,
    pub height: u32,
    pub byte_size: u64,
}

/// The format written the way the ledger's outputs write it: lowercase,
/// `jpeg` rather than `jpg`.
pub fn format_name(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Png => "png",
        ImageFormat::Jpeg => "jpeg",
        ImageFormat::Gif => "gif",
        ImageFormat::WebP => "webp",
        other => other.extensions_str().first().copied().unwrap_or("unknown"),
    }
}

pub(crate) type BytesReader<'a> = ImageReader<Cursor<&'a [u8]>>;

/// A reader over `bytes` whose format comes from the bytes themselves (a
/// file's name may lie: a text file called `photo.jpg`).
pub(crate) fn reader(bytes: &[u8]) -> Result<(BytesReader<'_>, ImageFormat), MediaError> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|error| MediaError::NotAnImage(error.to_string()))?;
    let Some(format) = reader.format() else {
        let what = if bytes.is_empty() {
            "the file is empty".to_string()
        } else {
            format!(
                "its contents match no known image format (first bytes: {})",
                first_bytes(bytes)
            )
        };
        return Err(MediaError::NotAnImage(what));
    };
    Ok((reader, format))
}

fn first_bytes(bytes: &[u8]) -> String {
    bytes
        .iter()
        .take(8)
        .map(|byte| format!("{byte:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Dimensions as displayed: the stored ones, swapped when the EXIF
/// orientation turns the picture by a quarter.
pub(crate) fn oriented((width, height): (u32, u32), orientation: Orientation) -> (u32, u32) {
    match orientation {
        Orientation::Rotate90 | Orientation::Rotate270 | Orientation::Rotate90FlipH | Orientation::Rotate270FlipH => {
            (height, width)
        }
        _ => (width, height),
    }
}

/// The orientation a decoder reports; a damaged EXIF block means "as
/// stored", since it should not make a readable picture unreadable.
pub(crate) fn orientation_of(decoder: &mut impl ImageDecoder) -> Orientation {
    decoder.orientation().unwrap_or(Orientation::NoTransforms)
}

/// The orientation named by an EXIF block; a damaged one means "as
/// stored", since it should not make a readable picture unreadable.
pub(crate) fn exif_orientation(exif: Option<&[u8]>) -> Orientation {
    exif.and_then(Orientation::from_exif_chunk)
        .unwrap_or(Orientation::NoTransforms)
}

/// Displayed dimensions from the header (and EXIF block) only.
fn header_dimensions<R: BufRead + Seek>(reader: ImageReader<R>) -> ImageResult<(u32, u32)> {
    let mut decoder = reader.into_decoder()?;
    let orientation = orientation_of(&mut decoder);
    Ok(oriented(decoder.dimensions(), orientation))
}

/// Format and dimensions from the header only (no pixel is decoded):
/// cheap, but a file truncated after its header still answers. Use
/// [`crate::decode_image`] to know the whole image is readable. No limit
/// applies: nothing is allocated for pixels, so a decompression bomb's
/// header reads like any other (the decode refuses it).
pub fn image_metadata(bytes: &[u8]) -> Result<ImageMetadata, MediaError> {
    #[cfg(feature = "heif")]
    if let Some(format) = crate::heif::heif_format(bytes) {
        let (width, height) = crate::heif::heif_dimensions(bytes)?;
        return Ok(ImageMetadata {
            format,
            width,
            height,
            byte_size: bytes.len() as u64,
        });
    }
    if let Some(raw) = crate::raw::preview(bytes) {
        // The preview's own EXIF block turns it when the RAW's does not.
        let (width, height) = match raw.orientation {
            Some(orientation) => oriented(raw.size, orientation),
            None => header_dimensions(ImageReader::with_format(Cursor::new(raw.jpeg), ImageFormat::Jpeg))
                .map_err(not_an_image)?,
        };
        return Ok(ImageMetadata {
            format: raw.format,
            width,
            height,
            byte_size: bytes.len() as u64,
        });
    }
    let (reader, format) = reader(bytes)?;
    let (width, height) = header_dimensions(reader).map_err(not_an_image)?;
    Ok(ImageMetadata {
        format: format_name(format),
        width,
        height,
        byte_size: bytes.len() as u64,
    })
}

/// [`image_metadata`] of a file, reading only as far as its header.
pub fn read_metadata(path: &Path) -> Result<ImageMetadata, MediaError> {
    read_classified_metadata(path, &crate::classify::classify_file(path)?)
}

/// [`read_metadata`] of a file its caller has classified already, so its
/// head is not read a second time to tell the formats read whole.
pub fn read_classified_metadata(path: &Path, classified: &Classified) -> Result<ImageMetadata, MediaError> {
    // A HEIF container's boxes and a RAW's preview may sit anywhere in the
    // file, and a TIFF is told from a RAW only by its IFDs: such files are
    // read whole.
    if (cfg!(feature = "heif") && classified.needs_heif()) || classified.may_be_raw() {
        let bytes = std::fs::read(path).map_err(|source| MediaError::io("reading", path, source))?;
        return image_metadata(&bytes);
    }
    let byte_size = std::fs::metadata(path)
        .map_err(|source| MediaError::io("reading the size of", path, source))?
        .len();
    let reader = ImageReader::open(path)
        .and_then(ImageReader::with_guessed_format)
        .map_err(|source| MediaError::io("opening", path, source))?;
    let Some(format) = reader.format() else {
        return Err(MediaError::NotAnImage(format!(
            "{}: its contents match no known image format",
            path.display()
        )));
    };
    let (width, height) = header_dimensions(reader).map_err(|error| match error {
        // A header cut short is the file's fault, not the disk's.
        ImageError::IoError(source) if source.kind() != io::ErrorKind::UnexpectedEof => {
            MediaError::io("reading", path, source)
        }
        other => not_an_image(other),
    })?;
    Ok(ImageMetadata {
        format: format_name(format),
        width,
        height,
        byte_size,
    })
}

pub(crate) fn not_an_image(error: ImageError) -> MediaError {
    MediaError::NotAnImage(match error {
        ImageError::IoError(source) if source.kind() == io::ErrorKind::UnexpectedEof => {
            format!("the data ends early (truncated?): {source}")
        }
        other => other.to_string(),
    })
}

/// The size of a thumbnail of a `width` × `height` image whose longest side
/// may be at most `max_side`: the longest side becomes `max_side`, the other
/// keeps the aspect ratio (rounded, at least 1 px). An image that already
/// fits keeps its size: thumbnails are never upscaled.
pub fn thumbnail_size(width: u32, height: u32, max_side: u32) -> (u32, u32) {
    let long = width.max(height);
    if long <= max_side || max_side == 0 {
        return (width, height);
    }
    let scale = |side: u32| -> u32 {
        let scaled = (u64::from(side) * u64::from(max_side) + u64::from(long) / 2) / u64::from(long);
        u32::try_from(scaled).unwrap_or(max_side).max(1)
    };
    if width >= height {
        (max_side, scale(height))
    } else {
        (scale(width), max_side)
    }
}

/// A thumbnail whose longest side is at most `max_side` ([`thumbnail_size`]),
/// by area averaging ([`shrink`]). Deep or float images come out with 8 bits
/// per channel.
pub fn thumbnail(image: &DynamicImage, max_side: u32) -> Result<DynamicImage, MediaError> {
    if max_side == 0 {
        return Err(MediaError::Invalid(
            "a thumbnail's longest side must be at least 1 px".into(),
        ));
    }
    let (width, height) = thumbnail_size(image.width(), image.height(), max_side);
    if (width, height) == (image.width(), image.height()) {
        return Ok(image.clone());
    }
    Ok(shrink(image, width, height))
}

/// `image` at `width` × `height` (aspect not kept), each target pixel the
/// rounded mean of the source pixels whose box it covers; a target larger
/// than the source repeats the nearest pixel. 8-bit images keep their
/// channels; others are brought to 8-bit RGB(A) first.
///
/// Written here rather than taken from `image::imageops`, which samples
/// through a generic pixel interface: this integer loop over rows is several
/// times faster, and the thumbnail and dHash of every ingested file run it.
pub fn shrink(image: &DynamicImage, width: u32, height: u32) -> DynamicImage {
    let (source_width, source_height) = (image.width(), image.height());
    match image {
        DynamicImage::ImageLuma8(pixels) => DynamicImage::ImageLuma8(
            GrayImage::from_raw(
                width,
                height,
                shrink_raw::<1>(pixels, source_width, source_height, width, height),
            )
            .expect("the buffer has the target's size"),
        ),
        DynamicImage::ImageLumaA8(pixels) => DynamicImage::ImageLumaA8(
            GrayAlphaImage::from_raw(
                width,
                height,
                shrink_raw::<2>(pixels, source_width, source_height, width, height),
            )
            .expect("the buffer has the target's size"),
        ),
        DynamicImage::ImageRgb8(pixels) => DynamicImage::ImageRgb8(
            RgbImage::from_raw(
                width,
                height,
                shrink_raw::<3>(pixels, source_width, source_height, width, height),
            )
            .expect("the buffer has the target's size"),
        ),
        DynamicImage::ImageRgba8(pixels) => DynamicImage::ImageRgba8(
            RgbaImage::from_raw(
                width,
                height,
                shrink_raw::<4>(pixels, source_width, source_height, width, height),
            )
            .expect("the buffer has the target's size"),
        ),
        other if other.color().has_alpha() => shrink(&DynamicImage::ImageRgba8(other.to_rgba8()), width, height),
        other => shrink(&DynamicImage::ImageRgb8(other.to_rgb8()), width, height),
    }
}

/// The source span `[start, end)` that target index `index` of `target`
/// covers in a source of `source` pixels: consecutive, disjoint, together
/// the whole source; one pixel at least (the nearest) when enlarging.
fn span(index: u32, source: u32, target: u32) -> (usize, usize) {
    let start = (u64::from(index) * u64::from(source) / u64::from(target)) as usize;
    let end = (u64::from(index + 1) * u64::from(source) / u64::from(target)) as usize;
    (start, end.max(start + 1))
}

/// Area averaging over interleaved 8-bit samples with `N` channels.
fn shrink_raw<const N: usize>(
    source: &[u8],
    source_width: u32,
    source_height: u32,
    width: u32,
    height: u32,
) -> Vec<u8> {
    let columns: Vec<(usize, usize)> = (0..width).map(|x| span(x, source_width, width)).collect();
    let row_len = source_width as usize * N;
    let mut out = Vec::with_capacity(width as usize * height as usize * N);
    // Sums fit in u64 whatever the image; u32 would overflow for a target
    // pixel covering more than 16 million source pixels.
    let mut sums = vec![0_u64; width as usize * N];
    for y in 0..height {
        let (top, bottom) = span(y, source_height, height);
        sums.fill(0);
        for row in source[top * row_len..bottom * row_len].chunks_exact(row_len) {
            for (sum, &(left, right)) in sums.chunks_exact_mut(N).zip(&columns) {
                let mut acc = [0_u32; N];
                for pixel in row[left * N..right * N].chunks_exact(N) {
                    for channel in 0..N {
                        acc[channel] += u32::from(pixel[channel]);
                    }
                }
                for channel in 0..N {
                    sum[channel] += u64::from(acc[channel]);
                }
            }
        }
        let rows = (bottom - top) as u64;
        for (sum, &(left, right)) in sums.chunks_exact(N).zip(&columns) {
            let count = rows * (right - left) as u64;
            out.extend(sum.iter().map(|total| ((total + count / 2) / count) as u8));
        }
    }
    out
}

/// The formats thumbnails are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThumbnailFormat {
    Png,
    Jpeg,
}

impl ThumbnailFormat {
    /// `png`, or `jpeg` / `jpg`, in any case.
    pub fn parse(name: &str) -> Result<Self, MediaError> {
        match name.to_ascii_lowercase().as_str() {
            "png" => Ok(ThumbnailFormat::Png),
            "jpeg" | "jpg" => Ok(ThumbnailFormat::Jpeg),
            _ => Err(MediaError::Invalid(format!(
                "thumbnails are written as png or jpeg, not {name:?}"
            ))),
        }
    }

    /// The format's name in outputs: `png`, `jpeg`.
    pub fn name(self) -> &'static str {
        match self {
            ThumbnailFormat::Png => "png",
            ThumbnailFormat::Jpeg => "jpeg",
        }
    }

    /// The file extension: `png`, `jpg`.
    pub fn extension(self) -> &'static str {
        match self {
            ThumbnailFormat::Png => "png",
            ThumbnailFormat::Jpeg => "jpg",
        }
    }

    pub fn image_format(self) -> ImageFormat {
        match self {
            ThumbnailFormat::Png => ImageFormat::Png,
            ThumbnailFormat::Jpeg => ImageFormat::Jpeg,
        }
    }
}

/// Encodes `image` as PNG (fast compression: a thumbnail is written once
/// and is small anyway) or JPEG (quality 85). Deep or float images are
/// brought to 8 bits per channel first; JPEG has no alpha, so the alpha
/// channel is dropped.
pub fn encode_image(image: &DynamicImage, format: ThumbnailFormat) -> Result<Vec<u8>, MediaError> {
    let mut out = Vec::new();
    let result = match format {
        ThumbnailFormat::Png => {
            let encoder = PngEncoder::new_with_quality(&mut out, CompressionType::Fast, PngFilter::Adaptive);
            match image {
                DynamicImage::ImageLuma8(_)
                | DynamicImage::ImageLumaA8(_)
                | DynamicImage::ImageRgb8(_)
                | DynamicImage::ImageRgba8(_) => image.write_with_encoder(encoder),
                other if other.color().has_alpha() => DynamicImage::from(other.to_rgba8()).write_with_encoder(encoder),
                other => DynamicImage::from(other.to_rgb8()).write_with_encoder(encoder),
            }
        }
        ThumbnailFormat::Jpeg => {
            let encoder = JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY);
            match image {
                DynamicImage::ImageLuma8(_) | DynamicImage::ImageRgb8(_) => image.write_with_encoder(encoder),
                other => DynamicImage::from(other.to_rgb8()).write_with_encoder(encoder),
            }
        }
    };
    result.map_err(|error| {
        MediaError::Invalid(format!(
            "encoding a {}x{} image as {}: {error}",
            image.width(),
            image.height(),
            format.name()
        ))
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbnail_sizes_keep_the_aspect_and_never_upscale() {
        assert_eq!(thumbnail_size(640, 480, 256), (256, 192));
        assert_eq!(thumbnail_size(480, 640, 256), (192, 256));
        assert_eq!(thumbnail_size(512, 512, 256), (256, 256));
        assert_eq!(thumbnail_size(1000, 333, 256), (256, 85));
        assert_eq!(thumbnail_size(10_000, 1, 256), (256, 1), "at least one pixel");
        assert_eq!(
            thumbnail_size(200, 100, 256),
            (200, 100),
            "small images keep their size"
        );
        assert_eq!(thumbnail_size(256, 64, 256), (256, 64));
    }

    #[test]
    fn shrinking_averages_boxes_and_enlarging_repeats_pixels() {
        // 4 × 2 grey values shrunk to 2 × 1: each target is the mean of a 2 × 2 box.
        let source = GrayImage::from_raw(4, 2, vec![0, 10, 100, 200, 20, 30, 255, 255]).unwrap();
        let small = shrink(&DynamicImage::ImageLuma8(source.clone()), 2, 1).to_luma8();
        assert_eq!(small.into_raw(), vec![15, 203]); // (0+10+20+30)/4, (100+200+255+255)/4 rounded
        let large = shrink(&DynamicImage::ImageLuma8(source), 8, 2).to_luma8();
        assert_eq!(large.get_pixel(7, 1).0, [255]);
        assert_eq!(large.get_pixel(0, 0).0, [0]);
        // Uneven boxes: 5 columns into 2 (2 and 3 wide), channels apart.
        let rgb = RgbImage::from_fn(5, 1, |x, _| image::Rgb([x as u8 * 10, 7, 255 - x as u8]));
        let shrunk = shrink(&DynamicImage::ImageRgb8(rgb), 2, 1).to_rgb8();
        assert_eq!(shrunk.get_pixel(0, 0).0, [5, 7, 255]);
        assert_eq!(shrunk.get_pixel(1, 0).0, [30, 7, 252]);
        // 16-bit images come out as 8-bit.
        let deep = DynamicImage::ImageRgb16(image::ImageBuffer::from_pixel(10, 10, image::Rgb([65535_u16, 0, 0])));
        assert_eq!(shrink(&deep, 3, 3).to_rgb8().get_pixel(1, 1).0, [255, 0, 0]);
    }

    #[test]
    fn format_names_parse_and_print() {
        assert_eq!(ThumbnailFormat::parse("PNG").unwrap(), ThumbnailFormat::Png);
        assert_eq!(ThumbnailFormat::parse("jpg").unwrap().name(), "jpeg");
        assert_eq!(ThumbnailFormat::Jpeg.extension(), "jpg");
        assert!(!ThumbnailFormat::parse("tiff").unwrap_err().is_retryable());
        assert_eq!(format_name(ImageFormat::Jpeg), "jpeg");
        assert_eq!(format_name(ImageFormat::WebP), "webp");
    }
}
