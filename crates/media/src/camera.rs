//! What people look for in a photo's EXIF block: when it was taken, the
//! camera and lens, the exposure, its orientation, and whether it records
//! where it was taken — read with kamadak-exif from the file's container
//! (JPEG, TIFF, PNG, WebP, HEIF), never from its pixels.
//!
//! A missing or damaged EXIF block means no facts, never a failure: it
//! should not make a readable picture unreadable. The coordinates are
//! read, but reported only when the caller asks ([`CameraFacts::to_json`]),
//! since where a photo was taken is personal and most users of a media
//! ledger do not need it.

use exif::{Exif, Field, In, Reader, Tag, Value};
use serde_json::{json, Map, Value as Json};
use std::io::Cursor;

/// The EXIF facts of one photo; each is absent when the block does not
/// record it (or records it in a form that cannot be read).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CameraFacts {
    /// `DateTimeOriginal` as ISO 8601 (`2024-05-01T14:03:22`), with the
    /// offset from `OffsetTimeOriginal` when the camera wrote one.
    pub taken_at: Option<String>,
    pub make: Option<String>,
    pub model: Option<String>,
    /// `LensModel`.
    pub lens: Option<String>,
    /// Seconds as the camera wrote them (`1/125`, `2`).
    pub exposure_time: Option<String>,
    pub f_number: Option<f64>,
    pub iso: Option<u32>,
    pub focal_length_mm: Option<f64>,
    /// 1 to 8, as the EXIF block names it (1: as stored).
    pub orientation: Option<u16>,
    /// Latitude and longitude in degrees (south and west negative).
    pub coordinates: Option<(f64, f64)>,
    /// Whether the block has a GPS position at all (even one that cannot be
    /// read as coordinates).
    pub gps_present: bool,
}

/// The facts of the EXIF block in `bytes` (any container kamadak-exif
/// reads); `None` when there is none or it cannot be read.
pub fn camera_facts(bytes: &[u8]) -> Option<CameraFacts> {
    let exif = Reader::new().read_from_container(&mut Cursor::new(bytes)).ok()?;
    Some(facts_of(&exif))
}

fn facts_of(exif: &Exif) -> CameraFacts {
    let field = |tag: Tag| exif.get_field(tag, In::PRIMARY);
    let text = |tag: Tag| field(tag).and_then(ascii);
    let taken_at = text(Tag::DateTimeOriginal)
        .or_else(|| text(Tag::DateTime))
        .and_then(|stamp| iso_stamp(&stamp))
        .map(|stamp| match text(Tag::OffsetTimeOriginal) {
            Some(offset) if offset.len() == 6 => format!("{stamp}{offset}"),
            _ => stamp,
        });
    let exposure_time = field(Tag::ExposureTime).and_then(|field| match &field.value {
        Value::Rational(values) => values
            .first()
            .filter(|value| value.denom != 0 && value.num != 0)
            .map(|value| {
                if value.num % value.denom == 0 {
                    (value.num / value.denom).to_string()
                } else if value.denom % value.num == 0 {
                    format!("1/{}", value.denom / value.num)
                } else {
                    trim(value.to_f64())
                }
            }),
        _ => None,
    });
    let latitude = coordinate(field(Tag::GPSLatitude), field(Tag::GPSLatitudeRef), b'S');
    let longitude = coordinate(field(Tag::GPSLongitude), field(Tag::GPSLongitudeRef), b'W');
    CameraFacts {
        taken_at,
        make: text(Tag::Make),
        model: text(Tag::Model),
        lens: text(Tag::LensModel),
        exposure_time,
        f_number: field(Tag::FNumber).and_then(rational),
        iso: field(Tag::PhotographicSensitivity).and_then(|field| field.value.get_uint(0)),
        focal_length_mm: field(Tag::FocalLength).and_then(rational),
        orientation: field(Tag::Orientation)
            .and_then(|field| field.value.get_uint(0))
            .and_then(|value| u16::try_from(value).ok())
            .filter(|value| (1..=8).contains(value)),
        coordinates: latitude.zip(longitude),
        gps_present: field(Tag::GPSLatitude).is_some() || field(Tag::GPSLongitude).is_some(),
    }
}

/// An ASCII field's first value, trimmed; `None` when empty.
fn ascii(field: &Field) -> Option<String> {
    let Value::Ascii(values) = &field.value else {
        return None;
    };
    let text = String::from_utf8_lossy(values.first()?).trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// `2024:05:01 14:03:22` as `2024-05-01T14:03:22`; `None` for anything
/// else (cameras without a clock write blanks or zeros).
fn iso_stamp(stamp: &str) -> Option<String> {
    let bytes = stamp.as_bytes();
    let shape = bytes.len() == 19
        && bytes.iter().enumerate().all(|(index, &byte)| match index {
            4 | 7 => byte == b':',
            10 => byte == b' ',
            13 | 16 => byte == b':',
            _ => byte.is_ascii_digit(),
        });
    if !shape || stamp.starts_with("0000") {
        return None;
    }
    Some(format!(
        "{}-{}-{}T{}",
        &stamp[0..4],
        &stamp[5..7],
        &stamp[8..10],
        &stamp[11..19]
    ))
}

fn rational(field: &Field) -> Option<f64> {
    match &field.value {
        Value::Rational(values) => values
            .first()
            .filter(|value| value.denom != 0)
            .map(|value| value.to_f64()),
        _ => None,
    }
}

/// Degrees, minutes and seconds with their hemisphere; `negative` is the
/// reference letter that makes it negative.
fn coordinate(value: Option<&Field>, reference: Option<&Field>, negative: u8) -> Option<f64> {
    let Value::Rational(parts) = &value?.value else {
        return None;
    };
    if parts.len() < 3 || parts.iter().any(|part| part.denom == 0) {
        return None;
    }
    let degrees = parts[0].to_f64() + parts[1].to_f64() / 60.0 + parts[2].to_f64() / 3600.0;
    let south_or_west = reference
        .and_then(ascii)
        .is_some_and(|letter| letter.as_bytes().first() == Some(&negative));
    Some(if south_or_west { -degrees } else { degrees })
}

/// A number without trailing zeros (`0.5`, `4.2`).
fn trim(value: f64) -> String {
    let text = format!("{value:.4}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl CameraFacts {
    /// An EXIF block (TIFF structure, as `image`'s encoders take it) that
    /// records these facts: what the sample generator and the benchmark
    /// write into their photos. `taken_at` must be ISO 8601 without an
    /// offset (`2024-05-01T14:03:22`); the exposure is not written.
    pub fn exif_block(&self) -> Vec<u8> {
        let ascii = |text: &str| Value::Ascii(vec![text.as_bytes().to_vec()]);
        let rational = |value: f64| exif::Rational {
            num: (value * 1000.0).round() as u32,
            denom: 1000,
        };
        let dms = |degrees: f64| {
            let degrees = degrees.abs();
            let whole = degrees.floor();
            let minutes = ((degrees - whole) * 60.0).floor();
            let seconds = ((degrees - whole) * 60.0 - minutes) * 60.0;
            Value::Rational(vec![rational(whole), rational(minutes), rational(seconds)])
        };
        let field = |tag: Tag, value: Value| Field {
            tag,
            ifd_num: In::PRIMARY,
            value,
        };
        let mut fields = Vec::new();
        if let Some(orientation) = self.orientation {
            fields.push(field(Tag::Orientation, Value::Short(vec![orientation])));
        }
        for (tag, text) in [
            (Tag::Make, &self.make),
            (Tag::Model, &self.model),
            (Tag::LensModel, &self.lens),
        ] {
            if let Some(text) = text {
                fields.push(field(tag, ascii(text)));
            }
        }
        if let Some(taken_at) = &self.taken_at {
            fields.push(field(
                Tag::DateTimeOriginal,
                ascii(&taken_at.replacen('-', ":", 2).replace('T', " ")),
            ));
        }
        if let Some(f_number) = self.f_number {
            fields.push(field(Tag::FNumber, Value::Rational(vec![rational(f_number)])));
        }
        if let Some(iso) = self.iso {
            fields.push(field(
                Tag::PhotographicSensitivity,
                Value::Short(vec![u16::try_from(iso).unwrap_or(u16::MAX)]),
            ));
        }
        if let Some((latitude, longitude)) = self.coordinates {
            fields.push(field(
                Tag::GPSLatitudeRef,
                ascii(if latitude < 0.0 { "S" } else { "N" }),
            ));
            fields.push(field(Tag::GPSLatitude, dms(latitude)));
            fields.push(field(
                Tag::GPSLongitudeRef,
                ascii(if longitude < 0.0 { "W" } else { "E" }),
            ));
            fields.push(field(Tag::GPSLongitude, dms(longitude)));
        }
        let mut writer = exif::experimental::Writer::new();
        for field in &fields {
            writer.push_field(field);
        }
        let mut out = Cursor::new(Vec::new());
        // Writing into memory fails only for fields the writer cannot
        // encode, and these are all plain TIFF types.
        match writer.write(&mut out, false) {
            Ok(()) => out.into_inner(),
            Err(_) => Vec::new(),
        }
    }

    /// The facts as the metadata task reports them: only those present,
    /// and `gps_present` always; the coordinates only when
    /// `with_coordinates`.
    pub fn to_json(&self, with_coordinates: bool) -> Json {
        let mut out = Map::new();
        let mut put = |key: &str, value: Option<Json>| {
            if let Some(value) = value {
                out.insert(key.to_string(), value);
            }
        };
        put("taken_at", self.taken_at.clone().map(Json::from));
        put("make", self.make.clone().map(Json::from));
        put("model", self.model.clone().map(Json::from));
        put("lens", self.lens.clone().map(Json::from));
        put("exposure_time", self.exposure_time.clone().map(Json::from));
        put("f_number", self.f_number.map(Json::from));
        put("iso", self.iso.map(Json::from));
        put("focal_length_mm", self.focal_length_mm.map(Json::from));
        put("orientation", self.orientation.map(Json::from));
        put("gps_present", Some(Json::from(self.gps_present)));
        if with_coordinates {
            put(
                "gps",
                self.coordinates
                    .map(|(latitude, longitude)| json!({"latitude": latitude, "longitude": longitude})),
            );
        }
        Json::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exif_stamps_become_iso_and_blank_clocks_are_absent() {
        assert_eq!(iso_stamp("2024:05:01 14:03:22").as_deref(), Some("2024-05-01T14:03:22"));
        assert_eq!(iso_stamp("0000:00:00 00:00:00"), None);
        assert_eq!(iso_stamp("    :  :     :  :  "), None);
        assert_eq!(iso_stamp("2024-05-01"), None);
    }

    #[test]
    fn facts_written_into_a_jpeg_are_read_back() {
        use image::ImageEncoder;
        let written = CameraFacts {
            taken_at: Some("2024-05-01T14:03:22".into()),
            make: Some("Opledger".into()),
            model: Some("Test Camera".into()),
            lens: Some("24mm".into()),
            f_number: Some(2.8),
            iso: Some(200),
            orientation: Some(6),
            coordinates: Some((48.8584, -2.2945)),
            gps_present: true,
            ..CameraFacts::default()
        };
        let mut jpeg = Vec::new();
        let mut encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 80);
        encoder.set_exif_metadata(written.exif_block()).unwrap();
        encoder
            .write_image(&[128; 16 * 8 * 3], 16, 8, image::ExtendedColorType::Rgb8)
            .unwrap();
        let read = camera_facts(&jpeg).expect("facts");
        let (latitude, longitude) = read.coordinates.unwrap();
        assert!(
            (latitude - 48.8584).abs() < 1e-4 && (longitude + 2.2945).abs() < 1e-4,
            "{latitude} {longitude}"
        );
        assert_eq!(
            CameraFacts {
                coordinates: written.coordinates,
                ..read.clone()
            },
            written
        );
        let reported = read.to_json(false);
        assert_eq!(reported["gps_present"], json!(true));
        assert!(reported.get("gps").is_none(), "no coordinates unless asked: {reported}");
        assert_eq!(
            read.to_json(true)["gps"]["longitude"].as_f64().map(f64::round),
            Some(-2.0)
        );
    }

    #[test]
    fn bytes_without_an_exif_block_have_no_facts() {
        assert_eq!(camera_facts(b"not a photo"), None);
        assert_eq!(camera_facts(&[0xFF, 0xD8, 0xFF, 0xD9]), None);
    }
}
