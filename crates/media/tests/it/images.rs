//! The image work on real files in temporary folders: content hashes,
//! generated samples, metadata, thumbnails, dHash, and corrupt input.

use image::{DynamicImage, GenericImageView, ImageFormat, Rgb, RgbImage};
use opledger_media::{
    decode_image, dhash, encode_image, generate_samples, generate_samples_with, hash_file, image_metadata,
    read_metadata, sha256_hex, thumbnail, thumbnail_size, DHash, MediaError, SampleOptions, ThumbnailFormat,
    DEFAULT_THUMBNAIL_SIDE,
};
use std::path::{Path, PathBuf};

fn extension(path: &Path) -> &str {
    path.extension().and_then(|extension| extension.to_str()).unwrap()
}

fn decode_file(path: &Path) -> DynamicImage {
    decode_image(&std::fs::read(path).unwrap()).unwrap().image
}

#[test]
fn content_hash_of_known_bytes() {
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("abc.txt");
    std::fs::write(&path, b"abc").unwrap();
    let hashed = hash_file(&path).unwrap();
    assert_eq!(
        hashed.sha256,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(hashed.byte_size, 3);
    assert_eq!(
        hashed.digest(),
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );

    let empty = folder.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    let hashed = hash_file(&empty).unwrap();
    assert_eq!(
        hashed.sha256,
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(hashed.byte_size, 0);
}

#[test]
fn samples_are_deterministic_nested_and_of_both_formats() {
    let (one, two, other) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let first = generate_samples(one.path(), 40, 7).unwrap();
    let second = generate_samples(two.path(), 40, 7).unwrap();
    let different = generate_samples(other.path(), 40, 8).unwrap();
    assert_eq!(first.len(), 40);
    for (a, b) in first.iter().zip(&second) {
        assert_eq!(a.strip_prefix(one.path()).unwrap(), b.strip_prefix(two.path()).unwrap());
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap(), "{}", a.display());
    }
    let differing = first
        .iter()
        .zip(&different)
        .filter(|(a, b)| std::fs::read(a).unwrap() != std::fs::read(b).unwrap())
        .count();
    assert!(
        differing > 30,
        "another seed draws other pictures ({differing} of 40 differ)"
    );

    let pngs = first.iter().filter(|path| extension(path) == "png").count();
    let jpegs = first.iter().filter(|path| extension(path) == "jpg").count();
    assert_eq!(pngs + jpegs, 40);
    assert!(pngs > 5 && jpegs > 5, "{pngs} PNGs, {jpegs} JPEGs");
    for path in &first {
        let depth = path.strip_prefix(one.path()).unwrap().components().count();
        assert_eq!(depth, 3, "set/roll/file: {}", path.display());
    }
    // Visually varied: the 40 pictures have (nearly) 40 different dHashes.
    let mut hashes: Vec<DHash> = first.iter().map(|path| dhash(&decode_file(path))).collect();
    hashes.sort();
    hashes.dedup();
    assert!(
        hashes.len() >= 36,
        "only {} distinct dHashes among 40 samples",
        hashes.len()
    );
}

#[test]
fn metadata_of_generated_png_and_jpeg() {
    let folder = tempfile::tempdir().unwrap();
    let samples = generate_samples(folder.path(), 24, 11).unwrap();
    for path in &samples {
        let bytes = std::fs::read(path).unwrap();
        let from_header = read_metadata(path).unwrap();
        let from_bytes = image_metadata(&bytes).unwrap();
        let decoded = decode_image(&bytes).unwrap();
        let expected_format = match extension(path) {
            "png" => "png",
            "jpg" => "jpeg",
            other => panic!("unexpected sample extension {other}"),
        };
        assert_eq!(from_header.format, expected_format);
        assert_eq!(from_header.byte_size, bytes.len() as u64);
        assert_eq!(from_header, from_bytes, "{}", path.display());
        assert_eq!(decoded.metadata(), from_header, "the header tells the decoded size");
        for side in [from_header.width, from_header.height] {
            assert!((64..=640).contains(&side), "{side} px in {}", path.display());
        }
    }
}

#[test]
fn sample_sides_follow_the_options() {
    let folder = tempfile::tempdir().unwrap();
    let set = generate_samples_with(folder.path(), &SampleOptions::new(10, 3).with_sides(300, 310)).unwrap();
    for path in &set.images {
        let metadata = read_metadata(path).unwrap();
        assert!((300..=310).contains(&metadata.width) && (300..=310).contains(&metadata.height));
    }
    let refused = generate_samples_with(folder.path(), &SampleOptions::new(1, 3).with_sides(10, 5));
    assert!(matches!(refused, Err(MediaError::Invalid(_))));
}

#[test]
fn thumbnails_decode_at_the_right_size_in_both_formats() {
    let folder = tempfile::tempdir().unwrap();
    // Sides from 64 to 640: some samples are smaller than 256, most larger.
    let samples = generate_samples(folder.path(), 30, 5).unwrap();
    let mut shrunk = 0;
    let mut kept = 0;
    for path in &samples {
        let original = decode_file(path);
        let (width, height) = original.dimensions();
        for format in [ThumbnailFormat::Png, ThumbnailFormat::Jpeg] {
            let small = thumbnail(&original, DEFAULT_THUMBNAIL_SIDE).unwrap();
            let encoded = encode_image(&small, format).unwrap();
            let decoded = decode_image(&encoded).unwrap();
            assert_eq!(decoded.format, format.image_format());
            let (w, h) = decoded.image.dimensions();
            if width.max(height) <= 256 {
                assert_eq!((w, h), (width, height), "never upscaled: {}", path.display());
                kept += 1;
            } else {
                assert_eq!(w.max(h), 256, "longest side 256: {}", path.display());
                // Aspect kept: the short side is the rounded proportional one.
                let long = width.max(height);
                let short = width.min(height);
                let expected_short = ((u64::from(short) * 256 + u64::from(long) / 2) / u64::from(long)) as u32;
                assert_eq!(w.min(h), expected_short.max(1), "{}", path.display());
                assert_eq!(width >= height, w >= h, "orientation kept: {}", path.display());
                shrunk += 1;
            }
        }
    }
    assert!(
        shrunk > 0 && kept > 0,
        "{shrunk} shrunk, {kept} kept: the seed covers both cases"
    );
}

#[test]
fn small_images_are_not_upscaled_and_other_sides_work() {
    let small = DynamicImage::ImageRgb8(RgbImage::from_pixel(100, 60, Rgb([10, 20, 30])));
    assert_eq!(thumbnail(&small, 256).unwrap().dimensions(), (100, 60));
    assert_eq!(thumbnail(&small, 50).unwrap().dimensions(), (50, 30));
    assert_eq!(thumbnail_size(3000, 2000, 128), (128, 85));
    assert!(matches!(thumbnail(&small, 0), Err(MediaError::Invalid(_))));
    // An image with alpha becomes a JPEG without it, and a PNG with it.
    let rgba = DynamicImage::ImageRgba8(image::RgbaImage::from_pixel(40, 30, image::Rgba([1, 2, 3, 128])));
    let jpeg = decode_image(&encode_image(&rgba, ThumbnailFormat::Jpeg).unwrap()).unwrap();
    assert_eq!(
        (jpeg.format, jpeg.image.color().has_alpha()),
        (ImageFormat::Jpeg, false)
    );
    let png = decode_image(&encode_image(&rgba, ThumbnailFormat::Png).unwrap()).unwrap();
    assert_eq!((png.format, png.image.color().has_alpha()), (ImageFormat::Png, true));
}

/// Samples of at least 128 px a side, so alterations stay "slight".
fn sample_pictures(folder: &Path, count: usize) -> Vec<(PathBuf, DynamicImage)> {
    let set = generate_samples_with(folder, &SampleOptions::new(count, 21).with_sides(160, 480)).unwrap();
    set.images
        .into_iter()
        .map(|path| {
            let image = decode_file(&path);
            (path, image)
        })
        .collect()
}

#[test]
fn dhash_is_stable_and_near_for_slight_changes() {
    let folder = tempfile::tempdir().unwrap();
    for (path, picture) in sample_pictures(folder.path(), 12) {
        let hash = dhash(&picture);
        assert_eq!(dhash(&decode_file(&path)), hash, "same file, same hash");
        assert_eq!(hash.to_string().len(), 16);
        assert_eq!(hash.to_string().parse::<DHash>().unwrap(), hash);

        // Slightly brighter.
        let mut brighter = picture.to_rgb8();
        for pixel in brighter.pixels_mut() {
            pixel.0 = pixel.0.map(|channel| channel.saturating_add(6));
        }
        // Re-encoded as JPEG.
        let reencoded = decode_image(&encode_image(&picture, ThumbnailFormat::Jpeg).unwrap())
            .unwrap()
            .image;
        // Resized to 3/4.
        let resized = picture.thumbnail_exact(picture.width() * 3 / 4, picture.height() * 3 / 4);
        for (what, altered) in [
            ("brightened", DynamicImage::ImageRgb8(brighter)),
            ("re-encoded", reencoded),
            ("resized", resized),
        ] {
            let distance = hash.distance(dhash(&altered));
            assert!(distance <= 10, "{what} {}: distance {distance}", path.display());
        }
    }
}

#[test]
fn dhash_is_far_for_different_images() {
    let folder = tempfile::tempdir().unwrap();
    let pictures = sample_pictures(folder.path(), 12);
    let hashes: Vec<DHash> = pictures.iter().map(|(_, picture)| dhash(picture)).collect();
    let mut distances = Vec::new();
    for (index, a) in hashes.iter().enumerate() {
        for b in &hashes[index + 1..] {
            distances.push(a.distance(*b));
        }
    }
    distances.sort_unstable();
    let median = distances[distances.len() / 2];
    assert!(
        median >= 20,
        "unrelated samples should differ in many bits: {distances:?}"
    );
    assert!(
        distances[0] > 10,
        "every pair of different samples is farther apart than any slight change: {distances:?}"
    );
    // A mirrored picture reverses every gradient.
    let (path, picture) = &pictures[0];
    let mirrored = image::imageops::flip_horizontal(picture);
    let distance = dhash(picture).distance(dhash(&DynamicImage::ImageRgba8(mirrored)));
    assert!(distance >= 20, "mirrored {}: distance {distance}", path.display());
}

#[test]
fn corrupt_files_give_clear_terminal_errors() {
    let folder = tempfile::tempdir().unwrap();
    let set = generate_samples_with(folder.path(), &SampleOptions::new(2, 1).with_corrupt(3)).unwrap();
    assert_eq!(set.corrupt.len(), 3);
    assert_eq!(set.all().len(), 5);
    let names: Vec<String> = set
        .corrupt
        .iter()
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["broken-000.png", "notes-001.jpg", "empty-002.png"]);
    for path in &set.corrupt {
        let bytes = std::fs::read(path).unwrap();
        let error = decode_image(&bytes).unwrap_err();
        assert!(!error.is_retryable(), "{error}");
        assert!(
            error.to_string().starts_with("not a decodable image: "),
            "{}: {error}",
            path.display()
        );
    }
    // The truncated PNG's header is intact: a header-only read answers,
    // which is why the metadata task decodes fully by default.
    let truncated = &set.corrupt[0];
    let header = read_metadata(truncated).unwrap();
    assert_eq!((header.format, header.width, header.height), ("png", 96, 64));
    // A text file named .jpg is recognised as not an image either way.
    let error = read_metadata(&set.corrupt[1]).unwrap_err();
    assert!(!error.is_retryable(), "{error}");
    let empty_error = decode_image(&std::fs::read(&set.corrupt[2]).unwrap()).unwrap_err();
    assert!(empty_error.to_string().contains("empty"), "{empty_error}");
    // A file that is not there is I/O trouble, not a verdict on the image.
    let missing = read_metadata(&folder.path().join("missing.png")).unwrap_err();
    assert!(missing.is_retryable(), "{missing}");
    assert_eq!(sha256_hex(&std::fs::read(&set.images[0]).unwrap()).len(), 64);
}

/// A minimal little-endian EXIF (TIFF) block with one entry: orientation.
fn exif_orientation(value: u16) -> Vec<u8> {
    let mut exif = b"II\x2a\x00\x08\x00\x00\x00".to_vec();
    exif.extend_from_slice(&1_u16.to_le_bytes()); // one entry
    exif.extend_from_slice(&0x0112_u16.to_le_bytes()); // Orientation
    exif.extend_from_slice(&3_u16.to_le_bytes()); // SHORT
    exif.extend_from_slice(&1_u32.to_le_bytes()); // one value
    exif.extend_from_slice(&value.to_le_bytes());
    exif.extend_from_slice(&[0, 0]);
    exif.extend_from_slice(&0_u32.to_le_bytes()); // no next IFD
    exif
}

#[test]
fn a_photo_stored_sideways_is_reported_and_thumbnailed_upright() {
    use image::codecs::jpeg::JpegEncoder;
    use image::ImageEncoder;
    // Stored 40 × 20, red left half, blue right half; EXIF orientation 6
    // says "rotate 90° clockwise to display": 20 × 40, red on top.
    let stored = RgbImage::from_fn(40, 20, |x, _| if x < 20 { Rgb([255, 0, 0]) } else { Rgb([0, 0, 255]) });
    let mut bytes = Vec::new();
    let mut encoder = JpegEncoder::new_with_quality(&mut bytes, 95);
    encoder.set_exif_metadata(exif_orientation(6)).unwrap();
    DynamicImage::ImageRgb8(stored).write_with_encoder(encoder).unwrap();

    let header = image_metadata(&bytes).unwrap();
    assert_eq!((header.width, header.height), (20, 40));
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("portrait.jpg");
    std::fs::write(&path, &bytes).unwrap();
    let from_file = read_metadata(&path).unwrap();
    assert_eq!((from_file.width, from_file.height), (20, 40));

    let decoded = decode_image(&bytes).unwrap();
    assert_eq!(decoded.metadata(), header);
    let upright = decoded.image.to_rgb8();
    assert!(
        upright.get_pixel(10, 5).0[0] > 200,
        "red on top: {:?}",
        upright.get_pixel(10, 5)
    );
    assert!(
        upright.get_pixel(10, 35).0[2] > 200,
        "blue below: {:?}",
        upright.get_pixel(10, 35)
    );
    let small = thumbnail(&decoded.image, 16).unwrap();
    assert_eq!(small.dimensions(), (8, 16));
}

#[test]
fn a_png_named_jpg_and_a_jpeg_named_png_are_read_by_their_contents() {
    let picture = DynamicImage::ImageRgb8(RgbImage::from_fn(64, 48, |x, y| Rgb([x as u8 * 4, y as u8 * 5, 90])));
    let folder = tempfile::tempdir().unwrap();
    for (name, format, expected) in [
        ("really-a-png.jpg", ImageFormat::Png, "png"),
        ("really-a-jpeg.png", ImageFormat::Jpeg, "jpeg"),
    ] {
        let path = folder.path().join(name);
        picture.save_with_format(&path, format).unwrap();
        assert_eq!(read_metadata(&path).unwrap().format, expected, "{name}");
        let bytes = std::fs::read(&path).unwrap();
        let working = opledger_media::decode_working(
            &bytes,
            &opledger_media::DecodeLimits::default(),
            opledger_media::DEFAULT_WORKING_SIDE,
        )
        .unwrap();
        assert_eq!(working.format, expected, "{name}");
        assert_eq!((working.width, working.height), (64, 48));
    }
}

#[test]
fn webp_and_the_first_frame_of_an_animated_gif_give_metadata_a_thumbnail_and_a_hash() {
    use image::codecs::gif::GifEncoder;
    use image::{Delay, Frame, RgbaImage};
    let limits = opledger_media::DecodeLimits::default();
    let side = opledger_media::DEFAULT_WORKING_SIDE;

    let picture = DynamicImage::ImageRgb8(RgbImage::from_fn(1200, 900, |x, y| {
        Rgb([(x / 5) as u8, (y / 4) as u8, if x < 300 { 250 } else { 10 }])
    }));
    let mut webp = Vec::new();
    picture
        .write_to(&mut std::io::Cursor::new(&mut webp), ImageFormat::WebP)
        .unwrap();
    let working = opledger_media::decode_working(&webp, &limits, side).unwrap();
    assert_eq!(working.format, "webp");
    assert_eq!((working.width, working.height), (1200, 900));
    assert_eq!(
        (working.image.width(), working.image.height()),
        (512, 384),
        "averaged to the working side"
    );
    assert_eq!(working.thumbnail(256).unwrap().dimensions(), (256, 192));
    assert!(dhash(&working.image).distance(dhash(&picture)) <= 2);

    let red = RgbaImage::from_pixel(40, 30, image::Rgba([230, 10, 10, 255]));
    let blue = RgbaImage::from_pixel(40, 30, image::Rgba([10, 10, 230, 255]));
    let mut gif = Vec::new();
    {
        let mut encoder = GifEncoder::new(&mut gif);
        for frame in [red, blue] {
            encoder
                .encode_frame(Frame::from_parts(frame, 0, 0, Delay::from_numer_denom_ms(100, 1)))
                .unwrap();
        }
    }
    let working = opledger_media::decode_working(&gif, &limits, side).unwrap();
    assert_eq!(working.format, "gif");
    assert_eq!((working.width, working.height), (40, 30));
    let first = working.image.to_rgba8();
    assert!(
        first.get_pixel(20, 15)[0] > 200,
        "the first frame: {:?}",
        first.get_pixel(20, 15)
    );
    assert_eq!(working.thumbnail(256).unwrap().dimensions(), (40, 30), "never enlarged");
}

#[test]
fn a_tiff_gives_metadata_a_thumbnail_and_a_hash() {
    let picture = DynamicImage::ImageRgb8(RgbImage::from_fn(800, 600, |x, y| {
        Rgb([(x / 4) as u8, (y / 3) as u8, if y < 150 { 240 } else { 20 }])
    }));
    let mut tiff = Vec::new();
    picture
        .write_to(&mut std::io::Cursor::new(&mut tiff), ImageFormat::Tiff)
        .unwrap();
    assert_eq!(image_metadata(&tiff).unwrap().format, "tiff");
    let working = opledger_media::decode_working(
        &tiff,
        &opledger_media::DecodeLimits::default(),
        opledger_media::DEFAULT_WORKING_SIDE,
    )
    .unwrap();
    assert_eq!((working.width, working.height), (800, 600));
    assert_eq!((working.image.width(), working.image.height()), (512, 384));
    assert_eq!(working.thumbnail(256).unwrap().dimensions(), (256, 192));
    assert!(dhash(&working.image).distance(dhash(&picture)) <= 2);
    let cut = &tiff[..tiff.len() / 2];
    assert!(
        opledger_media::decode_working(cut, &opledger_media::DecodeLimits::default(), 512).is_err(),
        "a TIFF cut in half is not an image"
    );
}

#[test]
fn a_camera_raw_is_read_through_its_preview_upright_with_its_camera_facts() {
    use image::codecs::jpeg::JpegEncoder;
    use opledger_media::{classify_file, decode_working, raw_samples, DecodeLimits, MediaKind, DEFAULT_WORKING_SIDE};
    // The preview as the sensor saw it: 800 × 600, red left half, blue
    // right half. The RAW's orientation 6 displays it 600 × 800, red on top.
    let stored = RgbImage::from_fn(800, 600, |x, y| {
        if x < 400 {
            Rgb([230, 20, (y / 3) as u8])
        } else {
            Rgb([20, 30, 230])
        }
    });
    let upright = DynamicImage::ImageRgb8(stored.clone()).rotate90();
    let encode = |exif: Option<Vec<u8>>| {
        let mut bytes = Vec::new();
        let mut encoder = JpegEncoder::new_with_quality(&mut bytes, 90);
        if let Some(exif) = exif {
            image::ImageEncoder::set_exif_metadata(&mut encoder, exif).unwrap();
        }
        DynamicImage::ImageRgb8(stored.clone())
            .write_with_encoder(encoder)
            .unwrap();
        bytes
    };
    let preview = encode(None);
    let folder = tempfile::tempdir().unwrap();
    let raws = [
        (
            "DSC_0001.NEF",
            raw_samples::tiff_raw(&preview, "NIKON CORPORATION", 6, false),
            "nef",
            Some("NIKON CORPORATION"),
        ),
        (
            "IMG_0001.CR2",
            raw_samples::tiff_raw(&preview, "Canon", 6, true),
            "cr2",
            Some("Canon"),
        ),
        // A RAF's preview carries the orientation in its own EXIF block.
        (
            "DSCF0001.RAF",
            raw_samples::raf(&encode(Some(exif_orientation(6)))),
            "raf",
            None,
        ),
    ];
    for (name, bytes, format, make) in &raws {
        let header = image_metadata(bytes).unwrap();
        assert_eq!(
            (header.format, header.width, header.height),
            (*format, 600, 800),
            "{name}"
        );
        let path = folder.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(read_metadata(&path).unwrap(), header, "{name}");
        assert_eq!(classify_file(&path).unwrap().kind, MediaKind::Image, "{name}");

        let working = decode_working(bytes, &DecodeLimits::default(), DEFAULT_WORKING_SIDE).unwrap();
        assert_eq!(
            (working.format, working.width, working.height),
            (*format, 600, 800),
            "{name}"
        );
        let image = working.image.to_rgb8();
        let (width, height) = image.dimensions();
        assert!(height > width, "{name}: upright {width} × {height}");
        assert!(image.get_pixel(width / 2, height / 8).0[0] > 180, "{name}: red on top");
        assert!(
            image.get_pixel(width / 2, height * 7 / 8).0[2] > 180,
            "{name}: blue below"
        );
        assert!(
            dhash(&working.image).distance(dhash(&upright)) <= 2,
            "{name}: the hash of the upright picture"
        );
        assert_eq!(working.thumbnail(256).unwrap().dimensions(), (192, 256), "{name}");
        let found = working.camera.as_ref().and_then(|camera| camera.make.as_deref());
        assert_eq!(found, *make, "{name}: the RAW's own EXIF");
        // A RAW whose preview is cut off is refused, not read as a TIFF.
        let cut = &bytes[..bytes.len() - preview.len() / 2 - 600];
        assert!(
            decode_working(cut, &DecodeLimits::default(), DEFAULT_WORKING_SIDE).is_err(),
            "{name}"
        );
    }
}
