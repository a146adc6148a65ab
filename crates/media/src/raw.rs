//! Camera RAW photos (CR2, NEF, ARW, DNG, ORF, RW2, PEF, RAF): their image
//! kinds read the largest JPEG preview the camera embedded in the file.
//!
//! *Why the preview:* demosaicing a sensor's raw data is a RAW developer's
//! job, and every camera stores a JPEG of the picture beside it (most a
//! full-size one), the one its own screen shows. So a RAW's thumbnail and
//! perceptual hash are those of that preview, turned upright by the RAW's
//! own orientation tag; its metadata gives the preview's size (which for
//! most cameras is the picture's) and the camera facts of the RAW's EXIF.
//!
//! The TIFF-based RAWs are walked as TIFF: IFD0, the IFDs it chains to and
//! their SubIFDs. A preview is a JPEG named by a JPEGInterchangeFormat and
//! length pair, a single JPEG-compressed strip whose photometric is not the
//! sensor's (CFA, LinearRaw), or Panasonic's JpgFromRaw; only a baseline,
//! extended or progressive JPEG counts (a lossless-JPEG strip is raw data).
//! A TIFF is a RAW when its header says so (CR2, ORF, RW2), it carries
//! DNGVersion, or one of its IFDs holds sensor data; any other TIFF is an
//! ordinary picture. RAF names its JPEG at fixed header offsets.

use image::metadata::Orientation;

/// IFDs visited at most: a camera writes a handful; a loop or a hostile
/// file stops here.
const MAX_IFDS: usize = 32;
/// Entries read per IFD at most.
const MAX_ENTRIES: usize = 512;

/// The RAF header's first bytes.
const RAF_MAGIC: &[u8] = b"FUJIFILMCCD-RAW ";

/// A camera RAW's embedded preview.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawPreview<'a> {
    /// The RAW format's name (`cr2`, `nef`, ..., `raw` for a make not told
    /// apart).
    pub format: &'static str,
    /// The preview's JPEG bytes.
    pub jpeg: &'a [u8],
    /// The preview's stored size.
    pub size: (u32, u32),
    /// The RAW's own orientation tag, when it has one (the preview's
    /// pixels are stored as the sensor saw them).
    pub orientation: Option<Orientation>,
}

/// The RAW format the first bytes name, if they name one by themselves:
/// what classification can tell from a file's head. A TIFF-based RAW of
/// another make is told apart only by [`preview`].
pub(crate) fn raw_magic(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(RAF_MAGIC) {
        Some("raf")
    } else if head.starts_with(b"IIRO") || head.starts_with(b"IIRS") || head.starts_with(b"MMOR") {
        Some("orf")
    } else if head.starts_with(b"IIU\0") {
        Some("rw2")
    } else if head.len() >= 10 && head.starts_with(b"II*\0") && &head[8..10] == b"CR" {
        Some("cr2")
    } else {
        None
    }
}

/// The largest embedded preview of a camera RAW; `None` for anything
/// else, an ordinary TIFF included, and for a RAW with no preview found.
pub(crate) fn preview(bytes: &[u8]) -> Option<RawPreview<'_>> {
    if bytes.starts_with(RAF_MAGIC) {
        let offset = read_u32(bytes, 84, true)? as usize;
        let length = read_u32(bytes, 88, true)? as usize;
        let jpeg = slice(bytes, offset, length)?;
        let size = jpeg_size(jpeg)?;
        return Some(RawPreview {
            format: "raf",
            jpeg,
            size,
            orientation: None,
        });
    }
    let tiff = Tiff::new(bytes)?;
    let walked = tiff.walk();
    let format = match raw_magic(bytes) {
        Some(format) => format,
        None if walked.dng => "dng",
        None if walked.sensor_data => match walked.make.as_deref().map(str::to_ascii_uppercase) {
            Some(make) if make.starts_with("NIKON") => "nef",
            Some(make) if make.starts_with("SONY") => "arw",
            Some(make) if make.starts_with("PENTAX") || make.starts_with("RICOH") => "pef",
            Some(make) if make.starts_with("SAMSUNG") => "srw",
            _ => "raw",
        },
        None => return None,
    };
    let (jpeg, size) = walked
        .candidates
        .iter()
        .filter_map(|&(offset, length)| {
            let jpeg = slice(bytes, offset, length)?;
            Some((jpeg, jpeg_size(jpeg)?))
        })
        .max_by_key(|(_, (width, height))| u64::from(*width) * u64::from(*height))?;
    Some(RawPreview {
        format,
        jpeg,
        size,
        orientation: walked.orientation.and_then(|value| Orientation::from_exif(value as u8)),
    })
}

fn slice(bytes: &[u8], offset: usize, length: usize) -> Option<&[u8]> {
    bytes.get(offset..offset.checked_add(length)?)
}

fn read_u16(bytes: &[u8], at: usize, big: bool) -> Option<u16> {
    let raw: [u8; 2] = bytes.get(at..at.checked_add(2)?)?.try_into().ok()?;
    Some(if big {
        u16::from_be_bytes(raw)
    } else {
        u16::from_le_bytes(raw)
    })
}

fn read_u32(bytes: &[u8], at: usize, big: bool) -> Option<u32> {
    let raw: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(if big {
        u32::from_be_bytes(raw)
    } else {
        u32::from_le_bytes(raw)
    })
}

/// The stored size of a baseline, extended or progressive JPEG, from its
/// frame header; `None` for anything else (a lossless JPEG is sensor data).
pub(crate) fn jpeg_size(jpeg: &[u8]) -> Option<(u32, u32)> {
    if !jpeg.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut at = 2;
    for _ in 0..MAX_ENTRIES {
        if *jpeg.get(at)? != 0xFF {
            return None;
        }
        let marker = *jpeg.get(at + 1)?;
        match marker {
            0xFF => at += 1,
            0x01 | 0xD0..=0xD7 => at += 2,
            0xC0..=0xC2 => {
                let height = read_u16(jpeg, at + 5, true)?;
                let width = read_u16(jpeg, at + 7, true)?;
                return (width > 0 && height > 0).then_some((u32::from(width), u32::from(height)));
            }
            // Another frame type (lossless, hierarchical, arithmetic), or
            // the scan or the end before any frame.
            0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF | 0xDA | 0xD9 => return None,
            _ => at += 2 + usize::from(read_u16(jpeg, at + 2, true)?),
        }
    }
    None
}

/// A TIFF container: its byte order and IFD0's offset.
struct Tiff<'a> {
    bytes: &'a [u8],
    big: bool,
    first: u32,
}

/// What a walk of a TIFF's IFDs found.
#[derive(Default)]
struct Walked {
    /// (offset, length) of each JPEG an IFD names.
    candidates: Vec<(usize, usize)>,
    /// IFD0's orientation tag.
    orientation: Option<u32>,
    make: Option<String>,
    dng: bool,
    /// An IFD holds the sensor's data (photometric CFA or LinearRaw).
    sensor_data: bool,
}

/// One IFD entry: tag, type, count and its value field's offset.
struct Entry {
    tag: u16,
    kind: u16,
    count: u32,
    at: usize,
}

const PHOTOMETRIC_CFA: u32 = 32803;
const PHOTOMETRIC_LINEAR_RAW: u32 = 34892;

impl<'a> Tiff<'a> {
    fn new(bytes: &'a [u8]) -> Option<Self> {
        let big = match bytes.get(..2)? {
            b"II" => false,
            b"MM" => true,
            _ => return None,
        };
        // 42 for TIFF, "RO"/"RS" for ORF, 0x55 for RW2.
        let magic = read_u16(bytes, 2, big)?;
        if !matches!(magic, 42 | 0x4F52 | 0x5352 | 0x0055) {
            return None;
        }
        Some(Tiff {
            bytes,
            big,
            first: read_u32(bytes, 4, big)?,
        })
    }

    /// A number an entry holds: its first SHORT or LONG.
    fn number(&self, entry: &Entry) -> Option<u32> {
        match entry.kind {
            3 => read_u16(self.bytes, entry.at, self.big).map(u32::from),
            4 | 13 => read_u32(self.bytes, entry.at, self.big),
            _ => None,
        }
    }

    /// The LONG offsets an entry holds (inline when one, else at its
    /// value's offset).
    fn offsets(&self, entry: &Entry) -> Vec<u32> {
        let count = (entry.count as usize).min(MAX_IFDS);
        if !matches!(entry.kind, 4 | 13) {
            return Vec::new();
        }
        let start = if count == 1 {
            entry.at
        } else {
            match read_u32(self.bytes, entry.at, self.big) {
                Some(offset) => offset as usize,
                None => return Vec::new(),
            }
        };
        (0..count)
            .filter_map(|index| read_u32(self.bytes, start.checked_add(4 * index)?, self.big))
            .collect()
    }

    fn ascii(&self, entry: &Entry) -> Option<String> {
        if entry.kind != 2 {
            return None;
        }
        let count = entry.count as usize;
        let start = if count <= 4 {
            entry.at
        } else {
            read_u32(self.bytes, entry.at, self.big)? as usize
        };
        let text = slice(self.bytes, start, count.min(64))?;
        let text = text.split(|byte| *byte == 0).next()?;
        Some(String::from_utf8_lossy(text).trim().to_string())
    }

    fn entries(&self, ifd: u32) -> Option<(Vec<Entry>, u32)> {
        let ifd = ifd as usize;
        let count = usize::from(read_u16(self.bytes, ifd, self.big)?).min(MAX_ENTRIES);
        let mut entries = Vec::with_capacity(count);
        for index in 0..count {
            let at = ifd + 2 + 12 * index;
            entries.push(Entry {
                tag: read_u16(self.bytes, at, self.big)?,
                kind: read_u16(self.bytes, at + 2, self.big)?,
                count: read_u32(self.bytes, at + 4, self.big)?,
                at: at + 8,
            });
        }
        let next = read_u32(self.bytes, ifd + 2 + 12 * count, self.big).unwrap_or(0);
        Some((entries, next))
    }

    fn walk(&self) -> Walked {
        let mut walked = Walked::default();
        let mut queue = vec![self.first];
        let mut seen = Vec::new();
        while let Some(ifd) = queue.pop() {
            if ifd == 0 || seen.contains(&ifd) || seen.len() >= MAX_IFDS {
                continue;
            }
            seen.push(ifd);
            let Some((entries, next)) = self.entries(ifd) else {
                continue;
            };
            queue.push(next);
            let first = ifd == self.first;
            let (mut compression, mut photometric) = (None, None);
            let (mut strips, mut strip_lengths) = (Vec::new(), Vec::new());
            let (mut jpeg_offset, mut jpeg_length) = (None, None);
            for entry in &entries {
                match entry.tag {
                    0x0103 => compression = self.number(entry),
                    0x0106 => photometric = self.number(entry),
                    0x0111 => strips = self.offsets(entry),
                    0x0117 => strip_lengths = self.offsets(entry),
                    0x0201 => jpeg_offset = self.number(entry),
                    0x0202 => jpeg_length = self.number(entry),
                    0x010F if first => walked.make = self.ascii(entry),
                    0x0112 if first => walked.orientation = self.number(entry),
                    0x014A => queue.extend(self.offsets(entry)),
                    0xC612 => walked.dng = true,
                    // Panasonic's JpgFromRaw: the JPEG is the value itself.
                    0x002E if entry.kind == 7 => {
                        if let Some(offset) = read_u32(self.bytes, entry.at, self.big) {
                            walked.candidates.push((offset as usize, entry.count as usize));
                        }
                    }
                    _ => {}
                }
            }
            let sensor = matches!(photometric, Some(PHOTOMETRIC_CFA | PHOTOMETRIC_LINEAR_RAW));
            walked.sensor_data |= sensor;
            if let (Some(offset), Some(length)) = (jpeg_offset, jpeg_length) {
                walked.candidates.push((offset as usize, length as usize));
            }
            if !sensor && matches!(compression, Some(6 | 7)) && strips.len() == 1 && strip_lengths.len() == 1 {
                walked.candidates.push((strips[0] as usize, strip_lengths[0] as usize));
            }
        }
        walked
    }
}

/// Synthetic camera RAWs, laid out as cameras lay them out, for tests.
#[doc(hidden)]
pub mod synthetic {
    /// A little-endian TIFF-based RAW: IFD0 names the `preview` JPEG
    /// (JPEGInterchangeFormat), carries `make` and `orientation`, and a
    /// SubIFD holds CFA sensor data (noise, not a picture). `cr2` writes
    /// Canon's header and stores the preview as IFD0's JPEG strip instead.
    pub fn tiff_raw(preview: &[u8], make: &str, orientation: u16, cr2: bool) -> Vec<u8> {
        let mut make = make.as_bytes().to_vec();
        make.push(0);
        let sensor: Vec<u8> = (0..4096u32)
            .map(|index| (index.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        // Layout: header (16), IFD0, SubIFD, make, sensor, preview.
        let ifd0 = 16u32;
        let ifd0_entries = 6u32;
        let sub = ifd0 + 2 + 12 * ifd0_entries + 4;
        let sub_entries = 5u32;
        let make_at = sub + 2 + 12 * sub_entries + 4;
        let sensor_at = make_at + make.len() as u32;
        let preview_at = sensor_at + sensor.len() as u32;
        let mut out = Vec::new();
        out.extend_from_slice(b"II*\0");
        out.extend_from_slice(&ifd0.to_le_bytes());
        if cr2 {
            out.extend_from_slice(b"CR\x02\0\0\0\0\0");
        } else {
            out.extend_from_slice(&[0; 8]);
        }
        let entry = |out: &mut Vec<u8>, tag: u16, kind: u16, count: u32, value: u32| {
            out.extend_from_slice(&tag.to_le_bytes());
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
        };
        let preview_length = preview.len() as u32;
        out.extend_from_slice(&(ifd0_entries as u16).to_le_bytes());
        if cr2 {
            entry(&mut out, 0x0103, 3, 1, 6);
        } else {
            entry(&mut out, 0x00FE, 4, 1, 1);
        }
        entry(&mut out, 0x010F, 2, make.len() as u32, make_at);
        if cr2 {
            entry(&mut out, 0x0111, 4, 1, preview_at);
        } else {
            entry(&mut out, 0x0201, 4, 1, preview_at);
        }
        entry(&mut out, 0x0112, 3, 1, u32::from(orientation));
        if cr2 {
            entry(&mut out, 0x0117, 4, 1, preview_length);
        } else {
            entry(&mut out, 0x0202, 4, 1, preview_length);
        }
        entry(&mut out, 0x014A, 4, 1, sub);
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(sub_entries as u16).to_le_bytes());
        entry(&mut out, 0x0100, 4, 1, 64);
        entry(&mut out, 0x0101, 4, 1, 64);
        entry(&mut out, 0x0106, 3, 1, 32803);
        entry(&mut out, 0x0111, 4, 1, sensor_at);
        entry(&mut out, 0x0117, 4, 1, sensor.len() as u32);
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&make);
        out.extend_from_slice(&sensor);
        out.extend_from_slice(preview);
        out
    }

    /// A RAF: Fujifilm's header naming the `preview` JPEG at bytes 84 and 88.
    pub fn raf(preview: &[u8]) -> Vec<u8> {
        let mut out = b"FUJIFILMCCD-RAW 0201FF383501".to_vec();
        out.resize(100, 0);
        let offset = out.len() as u32;
        out[84..88].copy_from_slice(&offset.to_be_bytes());
        out[88..92].copy_from_slice(&(preview.len() as u32).to_be_bytes());
        out.extend_from_slice(preview);
        out.extend_from_slice(&[0x5A; 512]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::synthetic::{raf, tiff_raw};
    use super::*;
    use image::{DynamicImage, ImageFormat, RgbImage};
    use std::io::Cursor;

    fn jpeg(width: u32, height: u32) -> Vec<u8> {
        let image = RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([(x * 255 / width) as u8, (y * 255 / height) as u8, 90])
        });
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(image)
            .write_to(&mut out, ImageFormat::Jpeg)
            .unwrap();
        out.into_inner()
    }

    #[test]
    fn a_tiff_raw_gives_its_jpeg_preview_its_make_and_its_orientation() {
        let preview_jpeg = jpeg(120, 80);
        let bytes = tiff_raw(&preview_jpeg, "NIKON CORPORATION", 6, false);
        let found = preview(&bytes).expect("a preview");
        assert_eq!(found.format, "nef");
        assert_eq!(found.jpeg, preview_jpeg.as_slice());
        assert_eq!(found.size, (120, 80));
        assert_eq!(found.orientation, Some(Orientation::Rotate90));
        assert_eq!(raw_magic(&bytes), None, "a NEF's header is a plain TIFF's");
    }

    #[test]
    fn a_cr2_preview_is_its_jpeg_strip_and_its_header_names_it() {
        let bytes = tiff_raw(&jpeg(96, 64), "Canon", 1, true);
        assert_eq!(raw_magic(&bytes), Some("cr2"));
        let found = preview(&bytes).expect("a preview");
        assert_eq!((found.format, found.size), ("cr2", (96, 64)));
    }

    #[test]
    fn a_raf_names_its_preview_in_its_header() {
        let bytes = raf(&jpeg(64, 48));
        assert_eq!(raw_magic(&bytes), Some("raf"));
        assert_eq!(preview(&bytes).map(|found| found.size), Some((64, 48)));
    }

    #[test]
    fn an_ordinary_tiff_is_no_raw() {
        let mut tiff = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(RgbImage::new(8, 8))
            .write_to(&mut tiff, ImageFormat::Tiff)
            .unwrap();
        assert!(preview(tiff.get_ref()).is_none());
    }

    #[test]
    fn a_lossless_jpeg_strip_is_sensor_data_not_a_preview() {
        // SOI, then a lossless frame header (SOF3).
        let lossless = [0xFF, 0xD8, 0xFF, 0xC3, 0, 11, 8, 0, 64, 0, 64, 1, 1, 0x11, 0];
        assert_eq!(jpeg_size(&lossless), None);
        assert_eq!(jpeg_size(&jpeg(10, 20)), Some((10, 20)));
    }

    proptest::proptest! {
        /// Whatever follows a RAW's header, the walk ends without a panic,
        /// and a preview it finds lies inside the file.
        #[test]
        fn any_bytes_after_a_raw_header_are_walked_without_a_panic(
            header in proptest::sample::select(vec![&b"II*\0"[..], b"MM\0*", b"IIRO", b"IIU\0", b"FUJIFILMCCD-RAW "]),
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
        ) {
            let mut bytes = header.to_vec();
            bytes.extend_from_slice(&body);
            if let Some(found) = preview(&bytes) {
                proptest::prop_assert!(found.jpeg.len() <= bytes.len());
            }
            let _ = raw_magic(&bytes);
        }
    }

    #[test]
    fn a_truncated_or_looping_raw_finds_nothing_and_does_not_panic() {
        let bytes = tiff_raw(&jpeg(32, 32), "SONY", 1, false);
        for cut in [4, 10, 17, 40, 120, bytes.len() - 10] {
            let _ = preview(&bytes[..cut]);
        }
        // IFD0 chaining to itself.
        let mut looping = b"II*\0\x08\0\0\0\x00\x00\x08\0\0\0".to_vec();
        looping.extend_from_slice(&[0; 8]);
        assert!(preview(&looping).is_none());
    }
}
