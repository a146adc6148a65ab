//! HEIF/HEIC and AVIF photos through libheif, in a build with the `heif`
//! feature (which links the system's libheif): files made here with
//! libheif's own encoders get their metadata, a thumbnail and a perceptual
//! hash from one decode at the working size. Without the feature this file
//! holds no test: such photos are then blocked at request, which
//! `tests/it/ingest_media.rs` checks.
#![cfg(feature = "heif")]

use libheif_rs::{Channel, ColorSpace, CompressionFormat, EncoderQuality, HeifContext, Image, LibHeif, RgbChroma};
use opledger_media::{classify_bytes, decode_working, dhash, image, image_metadata, DecodeLimits, MediaKind};
use std::path::Path;

/// The test picture's pixel at `x`: red on the left half, blue on the
/// right, with green rising from left to right (so its perceptual hash has
/// gradients to record).
fn pixel(x: u32, width: u32) -> [u8; 3] {
    let green = (x * 255 / width) as u8;
    if x < width / 2 {
        [220, green, 20]
    } else {
        [20, green, 220]
    }
}

/// A 640 × 480 picture ([`pixel`]), encoded by libheif as `format`.
fn encode(format: CompressionFormat) -> Vec<u8> {
    let (width, height) = (640u32, 480u32);
    let mut image = Image::new(width, height, ColorSpace::Rgb(RgbChroma::Rgb)).unwrap();
    image.create_plane(Channel::Interleaved, width, height, 8).unwrap();
    {
        let planes = image.planes_mut();
        let plane = planes.interleaved.unwrap();
        let stride = plane.stride;
        for y in 0..height as usize {
            for x in 0..width as usize {
                let at = y * stride + x * 3;
                plane.data[at..at + 3].copy_from_slice(&pixel(x as u32, width));
            }
        }
    }
    let library = LibHeif::new();
    let mut encoder = library.encoder_for_format(format).unwrap();
    encoder.set_quality(EncoderQuality::Lossy(90)).unwrap();
    let mut context = HeifContext::new().unwrap();
    context.encode_image(&image, &mut encoder, None).unwrap();
    context.write_to_bytes().unwrap()
}

#[test]
fn heic_and_avif_photos_get_metadata_a_thumbnail_and_a_hash_from_one_decode_at_the_working_size() {
    for (format, name, file) in [
        (CompressionFormat::Hevc, "heif", "IMG_0001.HEIC"),
        (CompressionFormat::Av1, "avif", "IMG_0002.avif"),
    ] {
        let bytes = encode(format);
        let classified = classify_bytes(&bytes, Path::new(file));
        assert_eq!((classified.kind, classified.format), (MediaKind::Image, Some(name)));

        let header = image_metadata(&bytes).unwrap();
        assert_eq!((header.format, header.width, header.height), (name, 640, 480));

        let working = decode_working(&bytes, &DecodeLimits::default(), 512).unwrap();
        assert_eq!((working.format, working.width, working.height), (name, 640, 480));
        assert_eq!((working.image.width(), working.image.height()), (512, 384), "{name}");
        let thumbnail = working.thumbnail(256).unwrap().to_rgb8();
        assert_eq!((thumbnail.width(), thumbnail.height()), (256, 192));
        let (left, right) = (thumbnail.get_pixel(40, 96), thumbnail.get_pixel(216, 96));
        assert!(left[0] > 180 && left[2] < 70, "{name}: the left half is red: {left:?}");
        assert!(
            left[1] < right[1],
            "{name}: green rises to the right: {left:?} {right:?}"
        );
        assert!(
            right[2] > 180 && right[0] < 70,
            "{name}: the right half is blue: {right:?}"
        );
        // The hash is the original picture's, but for what lossy coding moved.
        let original =
            image::DynamicImage::ImageRgb8(image::RgbImage::from_fn(640, 480, |x, _| image::Rgb(pixel(x, 640))));
        let distance = dhash(&working.image).distance(dhash(&original));
        assert!(distance <= 6, "{name}: {distance} bits from the original's hash");

        // A picture larger than the limits is refused before decoding.
        let small = DecodeLimits::new(640 * 479, DecodeLimits::DEFAULT_MAX_BYTES);
        let refused = decode_working(&bytes, &small, 512).unwrap_err();
        assert!(refused.to_string().starts_with("too large to decode"), "{refused}");
    }
}
