//! JPEG decoding under [`DecodeLimits`], with zune-jpeg (the decoder the
//! `image` crate wraps) used directly.
//!
//! The wrapper decodes leniently: data that ends early becomes grey
//! pixels, damaged data is skipped, and either way the decode "succeeds".
//! Here:
//!
//! - The **layout** of the file is read first, from its markers alone
//!   ([`layout`]): the frame header's size, components and sampling, and
//!   how many bytes of entropy-coded data its scans hold. The limits are
//!   checked on it before the decoder is even created, and a file whose
//!   scans hold fewer bytes than any image of its declared size needs (at
//!   least one bit per 8 × 8 block: each block codes its DC difference) is
//!   refused as truncated without decoding a pixel.
//! - The decoder runs in **strict mode**, so data that runs out, an
//!   unknown or misplaced marker, or a bad Huffman code is an error.
//! - Strict mode still accepts an end-of-image marker that comes before the
//!   last block: from there it decodes zero bits. So the decoder is given
//!   the bytes up to the end of the last scan followed by 16 bytes of
//!   1-bits, then the end-of-image marker. A whole image never reads them
//!   (its scan ends where its data does; they are at most read ahead); an
//!   image that is missing blocks decodes them, and a run of sixteen 1-bits
//!   is no Huffman code in any JPEG table, so the decode fails. Anything
//!   after the first image's end (a second image some cameras append) is
//!   not decoded.

use crate::error::MediaError;
use crate::image_ops::exif_orientation;
use crate::jpeg_scan::{self, Huffman, Scan};
use crate::limits::{pixels_and_copy, DecodeLimits};
use image::metadata::Orientation;
use image::{DynamicImage, GrayAlphaImage, GrayImage, RgbImage, RgbaImage};
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::errors::DecodeErrors;
use zune_jpeg::JpegDecoder;

/// What follows the last scan's data in the bytes handed to the decoder:
/// stuffed 0xFF bytes (all 1-bits), then end of image.
const TAIL: [u8; 18] = [
    0xFF, 0x00, 0xFF, 0x00, 0xFF, 0x00, 0xFF, 0x00, 0xFF, 0x00, 0xFF, 0x00, 0xFF, 0x00, 0xFF, 0x00, 0xFF, 0xD9,
];

/// A JPEG's frame and scans, read from its markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub width: u32,
    pub height: u32,
    /// Each component's id and its horizontal and vertical sampling
    /// factors.
    pub ids: Vec<u8>,
    pub sampling: Vec<(u8, u8)>,
    /// Huffman-coded DCT (baseline, extended or progressive): the codings
    /// whose every block takes at least one bit.
    pub huffman_dct: bool,
    pub progressive: bool,
    pub scans: usize,
    /// The scans whose length is checked exactly ([`jpeg_scan::check`]):
    /// every scan of a sequential Huffman frame.
    pub sequential_scans: Vec<Scan>,
    /// Bytes between the scans' headers and the marker that ends each.
    pub entropy_bytes: u64,
    /// Where the first image ends: its end-of-image marker, or the end of
    /// the bytes when there is none.
    pub end: usize,
}

impl Layout {
    fn max_sampling(&self) -> (u64, u64) {
        let h = self.sampling.iter().map(|&(h, _)| u64::from(h)).max().unwrap_or(1);
        let v = self.sampling.iter().map(|&(_, v)| u64::from(v)).max().unwrap_or(1);
        (h, v)
    }

    /// 8 × 8 blocks of all components, as coded (without MCU padding).
    pub fn blocks(&self) -> u64 {
        let (h_max, v_max) = self.max_sampling();
        let (width, height) = (u64::from(self.width), u64::from(self.height));
        self.sampling
            .iter()
            .map(|&(h, v)| {
                let columns = (width * u64::from(h)).div_ceil(h_max);
                let rows = (height * u64::from(v)).div_ceil(v_max);
                columns.div_ceil(8) * rows.div_ceil(8)
            })
            .sum()
    }

    /// 8 × 8 blocks of all components with MCU padding: what a decoder
    /// that keeps every coefficient holds.
    fn padded_blocks(&self) -> u64 {
        let (h_max, v_max) = self.max_sampling();
        let mcu_columns = u64::from(self.width).div_ceil(8 * h_max);
        let mcu_rows = u64::from(self.height).div_ceil(8 * v_max);
        self.sampling
            .iter()
            .map(|&(h, v)| mcu_columns * u64::from(h) * mcu_rows * u64::from(v))
            .sum()
    }

    /// The bytes a decode holds at once with `channels` output channels:
    /// its copy of the input, the coefficients of every block when it must
    /// keep them (progressive, or components in scans of their own; else a
    /// row of MCUs), the pixels and their copy.
    pub fn footprint(&self, channels: u64) -> u64 {
        let pixels = u64::from(self.width) * u64::from(self.height);
        let coefficients = if self.progressive || self.scans > 1 {
            self.padded_blocks() * 64 * 2
        } else {
            let (_, v_max) = self.max_sampling();
            self.padded_blocks() / u64::from(self.height).div_ceil(8 * v_max).max(1) * 64 * 4
        };
        let input = self.end as u64 + TAIL.len() as u64;
        input + coefficients + (1 << 20) + pixels_and_copy(pixels, pixels * channels, false)
    }
}

pub(crate) fn damaged(what: impl Into<String>) -> MediaError {
    MediaError::NotAnImage(what.into())
}

fn truncated() -> MediaError {
    damaged("the data ends early (truncated?) inside the JPEG's headers")
}

/// Reads the markers of the first image in `bytes`, skipping over each
/// scan's entropy-coded data. Only what the limits and the truncation check
/// need is checked; everything else is the decoder's to judge.
pub(crate) fn layout(bytes: &[u8]) -> Result<Layout, MediaError> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return Err(damaged("no JPEG start-of-image marker"));
    }
    let mut frame: Option<Layout> = None;
    let (mut scans, mut entropy_bytes) = (0, 0_u64);
    // The Huffman tables (DC, then AC) and restart interval in force.
    let mut tables: [[Option<Huffman>; 4]; 2] = Default::default();
    let mut restart_interval = 0;
    let mut sequential_scans = Vec::new();
    let mut at = 2;
    let end = loop {
        // A marker is 0xFF (any number of them: fill bytes) and a code.
        while at < bytes.len() && bytes[at] != 0xFF {
            at += 1;
        }
        while at < bytes.len() && bytes[at] == 0xFF {
            at += 1;
        }
        let Some(&code) = bytes.get(at) else {
            break bytes.len();
        };
        let marker = at - 1;
        at += 1;
        match code {
            0xD9 => break marker,
            // Markers without a segment (and a stray stuffed zero).
            0x00 | 0x01 | 0xD0..=0xD8 => continue,
            _ => {}
        }
        let length = match bytes.get(at..at + 2) {
            Some(&[high, low]) => usize::from(u16::from_be_bytes([high, low])),
            _ => return Err(truncated()),
        };
        let body = bytes
            .get(at + 2..at + length)
            .filter(|_| length >= 2)
            .ok_or_else(truncated)?;
        at += length;
        match code {
            // The first frame header is the image's (a JPEG has one).
            0xC0..=0xCF if !matches!(code, 0xC4 | 0xC8 | 0xCC) && frame.is_none() => {
                frame = Some(frame_header(code, body)?);
            }
            0xC4 => huffman_tables(body, &mut tables)?,
            0xDD => {
                let &[high, low, ..] = body else {
                    return Err(damaged("the JPEG's restart interval is invalid"));
                };
                restart_interval = u32::from(u16::from_be_bytes([high, low]));
            }
            0xDA => {
                scans += 1;
                let start = at;
                at = scan_end(bytes, at);
                entropy_bytes += (at - start) as u64;
                let frame = frame
                    .as_ref()
                    .ok_or_else(|| damaged("the JPEG has image data before its frame header"))?;
                if frame.huffman_dct && !frame.progressive {
                    // Each component is in exactly one sequential scan; a
                    // file claiming more scans must not make this list grow
                    // with its size.
                    if sequential_scans.len() == frame.sampling.len() {
                        return Err(damaged(
                            "the JPEG has more scans than its sequential frame has components",
                        ));
                    }
                    let components = scan_components(body, frame, &tables)?;
                    sequential_scans.push(Scan {
                        components,
                        restart_interval,
                        data: start..at,
                    });
                }
            }
            _ => {}
        }
    };
    let mut layout = frame.ok_or_else(|| damaged("the JPEG has no frame header before its image data"))?;
    if scans == 0 {
        return Err(damaged("the JPEG has no image data (no scan)"));
    }
    layout.scans = scans;
    layout.entropy_bytes = entropy_bytes;
    layout.end = end;
    layout.sequential_scans = sequential_scans;
    Ok(layout)
}

/// The tables a DHT segment defines (one or more), into `tables`.
fn huffman_tables(mut body: &[u8], tables: &mut [[Option<Huffman>; 4]; 2]) -> Result<(), MediaError> {
    let invalid = || damaged("the JPEG's Huffman table is invalid");
    while let Some((&class_id, rest)) = body.split_first() {
        let (counts, rest) = rest.split_first_chunk::<16>().ok_or_else(invalid)?;
        let total = counts.iter().map(|&count| usize::from(count)).sum::<usize>();
        let symbols = rest.get(..total).ok_or_else(invalid)?;
        let (class, id) = (usize::from(class_id >> 4), usize::from(class_id & 0x0F));
        if class > 1 || id > 3 {
            return Err(invalid());
        }
        tables[class][id] = Some(Huffman::new(counts, symbols).ok_or_else(invalid)?);
        body = &rest[total..];
    }
    Ok(())
}

/// A scan header's components: each one's index in the frame and the
/// tables it names.
fn scan_components(
    body: &[u8],
    frame: &Layout,
    tables: &[[Option<Huffman>; 4]; 2],
) -> Result<Vec<(usize, Huffman, Huffman)>, MediaError> {
    let invalid = || damaged("the JPEG's scan header names no component or table of its frame");
    let (&count, rest) = body.split_first().ok_or_else(invalid)?;
    let selectors = rest
        .get(..2 * usize::from(count))
        .filter(|_| count > 0)
        .ok_or_else(invalid)?;
    selectors
        .chunks_exact(2)
        .map(|selector| {
            let index = frame.ids.iter().position(|&id| id == selector[0]).ok_or_else(invalid)?;
            let dc = tables[0][usize::from(selector[1] >> 4) & 3]
                .clone()
                .ok_or_else(invalid)?;
            let ac = tables[1][usize::from(selector[1] & 0x0F) & 3]
                .clone()
                .ok_or_else(invalid)?;
            Ok((index, dc, ac))
        })
        .collect()
}

/// Where the entropy-coded data starting at `at` ends: at the first marker
/// that is not a stuffed zero or a restart marker (or at the end).
fn scan_end(bytes: &[u8], mut at: usize) -> usize {
    loop {
        let Some(offset) = memchr::memchr(0xFF, &bytes[at..]) else {
            return bytes.len();
        };
        let marker = at + offset;
        match bytes.get(marker + 1) {
            None => return bytes.len(),
            Some(0x00 | 0xD0..=0xD7) => at = marker + 2,
            Some(0xFF) => at = marker + 1,
            Some(_) => return marker,
        }
    }
}

/// A start-of-frame segment: precision, height, width, then per component
/// its id, sampling factors and quantization table.
fn frame_header(code: u8, body: &[u8]) -> Result<Layout, MediaError> {
    let invalid = || damaged("the JPEG's frame header is invalid");
    let (&[_precision, h1, h0, w1, w0, count], components) = body.split_first_chunk::<6>().ok_or_else(invalid)?;
    let count = usize::from(count);
    if !(1..=4).contains(&count) || components.len() < 3 * count {
        return Err(invalid());
    }
    let components = components.chunks_exact(3).take(count);
    let ids = components.clone().map(|component| component[0]).collect();
    let sampling: Vec<(u8, u8)> = components
        .map(|component| (component[1] >> 4, component[1] & 0x0F))
        .collect();
    if sampling
        .iter()
        .any(|&(h, v)| !(1..=4).contains(&h) || !(1..=4).contains(&v))
    {
        return Err(damaged("the JPEG's frame header has invalid sampling factors"));
    }
    Ok(Layout {
        width: u32::from(u16::from_be_bytes([w1, w0])),
        height: u32::from(u16::from_be_bytes([h1, h0])),
        ids,
        sampling,
        huffman_dct: matches!(code, 0xC0..=0xC2),
        progressive: matches!(code, 0xC2 | 0xC6 | 0xCA | 0xCE),
        scans: 0,
        sequential_scans: Vec::new(),
        entropy_bytes: 0,
        end: 0,
    })
}

/// A JPEG that passed every check made before decoding: its layout, and
/// the bytes a decoder is given (the first image, then the 1-bit tail).
pub(crate) struct Checked {
    pub layout: Layout,
    pub input: Vec<u8>,
}

/// The checks before any decoder runs (see the module documentation): the
/// layout, the pixel limit, the least data any image of its size needs,
/// and the exact length of every sequential scan.
pub(crate) fn check(bytes: &[u8], limits: &DecodeLimits) -> Result<Checked, MediaError> {
    let layout = layout(bytes)?;
    let size = (layout.width, layout.height);
    // The least any channel count needs: the pixel limit and an early look
    // at the bytes, before the decoder exists.
    limits.admit("jpeg", size, 0)?;
    let needed = layout.blocks().div_ceil(8);
    if layout.huffman_dct && layout.entropy_bytes < needed {
        return Err(damaged(format!(
            "the JPEG declares {} x {} pixels but holds {} bytes of image data, fewer than the {needed} \
             any image of that size needs (truncated?)",
            layout.width, layout.height, layout.entropy_bytes
        )));
    }

    for scan in &layout.sequential_scans {
        jpeg_scan::check(bytes, scan, layout.width, layout.height, &layout.sampling)?;
    }

    let mut input = Vec::with_capacity(layout.end + TAIL.len());
    input.extend_from_slice(&bytes[..layout.end]);
    input.extend_from_slice(&TAIL);
    Ok(Checked { layout, input })
}

/// Decodes a JPEG under `limits` (see the module documentation): the
/// picture as stored, and the orientation its EXIF block asks for.
pub(crate) fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<(DynamicImage, Orientation), MediaError> {
    decode_checked(check(bytes, limits)?, limits)
}

/// The full-size decode of a checked JPEG, with zune-jpeg in strict mode.
pub(crate) fn decode_checked(
    checked: Checked,
    limits: &DecodeLimits,
) -> Result<(DynamicImage, Orientation), MediaError> {
    let Checked { layout, input } = checked;
    let size = (layout.width, layout.height);
    let options = DecoderOptions::default()
        .set_strict_mode(true)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX));
    let mut decoder = JpegDecoder::new_with_options(ZCursor::new(input.as_slice()), options);
    decoder.decode_headers().map_err(decode_error)?;
    let (width, height) = decoder
        .dimensions()
        .ok_or_else(|| damaged("the JPEG decoder read no dimensions"))?;
    if (width, height) != (layout.width as usize, layout.height as usize) {
        return Err(damaged("the JPEG's frame headers disagree on its size"));
    }
    // The colours `image` works in; others (CMYK, YCbCr, YCCK) become RGB.
    let colorspace = match decoder.input_colorspace() {
        Some(space @ (ColorSpace::Luma | ColorSpace::LumaA | ColorSpace::RGB | ColorSpace::RGBA)) => space,
        _ => ColorSpace::RGB,
    };
    decoder.set_options(decoder.options().jpeg_set_out_colorspace(colorspace));
    limits.admit("jpeg", size, layout.footprint(colorspace.num_components() as u64))?;
    let orientation = exif_orientation(decoder.exif().map(Vec::as_slice));
    let pixels = decoder.decode().map_err(decode_error)?;
    let image = match colorspace {
        ColorSpace::Luma => GrayImage::from_raw(layout.width, layout.height, pixels).map(DynamicImage::ImageLuma8),
        ColorSpace::LumaA => {
            GrayAlphaImage::from_raw(layout.width, layout.height, pixels).map(DynamicImage::ImageLumaA8)
        }
        ColorSpace::RGBA => RgbaImage::from_raw(layout.width, layout.height, pixels).map(DynamicImage::ImageRgba8),
        _ => RgbImage::from_raw(layout.width, layout.height, pixels).map(DynamicImage::ImageRgb8),
    };
    let image = image.ok_or_else(|| damaged("the JPEG decoder returned fewer pixels than the image has"))?;
    Ok((image, orientation))
}

/// A decoder error as the reason a file is not an image.
fn decode_error(error: DecodeErrors) -> MediaError {
    match error {
        DecodeErrors::ExhaustedData => damaged("the data ends early (truncated?): the JPEG's image data ran out"),
        // The tail's 1-bits decoded as data: blocks were missing.
        DecodeErrors::Format(message) if message.contains("0xFFFF") => damaged(format!(
            "the JPEG's image data ends before its last block (truncated or damaged): {message}"
        )),
        other => damaged(format!("JPEG: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SOI, a frame header of `width` × `height` with 4:2:0 YCbCr, a DC
    /// and an AC table of one code each, a scan header, `data` and EOI:
    /// only what [`layout`] reads.
    fn skeleton(width: u16, height: u16, data: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0xFF, 0xD8, 0xFF, 0xC0, 0x00, 17, 8];
        bytes.extend(height.to_be_bytes());
        bytes.extend(width.to_be_bytes());
        bytes.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        bytes.extend([0xFF, 0xC4, 0x00, 38]);
        for class in [0x00, 0x10] {
            bytes.push(class);
            bytes.extend([1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        }
        bytes.extend([0xFF, 0xDA, 0x00, 12, 3, 1, 0x00, 2, 0x00, 3, 0x00, 0, 63, 0]);
        bytes.extend(data);
        bytes.extend([0xFF, 0xD9]);
        bytes
    }

    #[test]
    fn the_layout_reads_the_frame_and_skips_stuffing_and_restarts_in_the_scan() {
        // A stuffed zero, a restart marker, and a fill byte before the end.
        let data = [0x12, 0xFF, 0x00, 0x34, 0xFF, 0xD0, 0x56, 0xFF];
        let bytes = skeleton(640, 480, &data);
        let layout = layout(&bytes).unwrap();
        assert_eq!((layout.width, layout.height), (640, 480));
        assert_eq!(layout.sampling, vec![(2, 2), (1, 1), (1, 1)]);
        assert!(layout.huffman_dct && !layout.progressive);
        assert_eq!((layout.scans, layout.entropy_bytes), (1, data.len() as u64));
        assert_eq!(layout.end, bytes.len() - 2, "the end is the EOI marker");
        // 80 × 60 luma blocks, 40 × 30 of each chroma.
        assert_eq!(layout.blocks(), 4800 + 2 * 1200);
    }

    #[test]
    fn what_follows_the_first_image_is_not_part_of_it() {
        let mut bytes = skeleton(16, 16, &[1, 2, 3]);
        let first = bytes.len();
        bytes.extend(skeleton(9000, 9000, &[4; 100]));
        let layout = layout(&bytes).unwrap();
        assert_eq!((layout.width, layout.end), (16, first - 2));
    }

    #[test]
    fn a_header_cut_short_or_without_a_frame_is_not_an_image() {
        let bytes = skeleton(64, 64, &[]);
        for cut in [3, 8, 20] {
            assert!(matches!(layout(&bytes[..cut]), Err(MediaError::NotAnImage(_))), "{cut}");
        }
        assert!(layout(&[0xFF, 0xD8, 0xFF, 0xD9]).is_err());
        let mut no_scan = bytes[..bytes.len() - 16].to_vec();
        no_scan.extend([0xFF, 0xD9]);
        assert!(layout(&no_scan).unwrap_err().to_string().contains("no image data"));
    }

    #[test]
    fn a_sequential_jpeg_with_more_scans_than_components_is_not_an_image() {
        let mut bytes = skeleton(16, 16, &[1]);
        bytes.truncate(bytes.len() - 2);
        let scan = [0xFF, 0xDA, 0x00, 12, 3, 1, 0x00, 2, 0x00, 3, 0x00, 0, 63, 0, 1];
        for _ in 0..3 {
            bytes.extend(scan);
        }
        bytes.extend([0xFF, 0xD9]);
        let error = layout(&bytes).unwrap_err().to_string();
        assert!(
            error.contains("more scans than its sequential frame has components"),
            "{error}"
        );
    }

    #[test]
    fn progressive_and_multi_scan_decodes_count_every_coefficient() {
        let mut layout = layout(&skeleton(1024, 1024, &[0; 4])).unwrap();
        let pixels = 1024 * 1024;
        let sequential = layout.footprint(3);
        layout.progressive = true;
        let progressive = layout.footprint(3);
        // 4:2:0: 1.5 samples a pixel, two bytes a coefficient.
        assert!(
            progressive - sequential >= pixels * 3 - pixels / 2,
            "{progressive} vs {sequential}"
        );
        assert!(sequential >= pixels * 6, "the pixels and their copy");
    }
}
