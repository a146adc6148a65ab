//! Hostile image files, made in memory by the tests that use them (no
//! binary file is committed): JPEGs cut short, lying about their size,
//! damaged inside, or nothing but headers; and decompression bombs in JPEG,
//! PNG and GIF whose headers declare billions of pixels.

use image::codecs::jpeg::JpegEncoder;
use image::{Rgb, RgbImage};

/// A photo-like JPEG (gradients under per-pixel noise, quality 90): its
/// scan is dense, as a camera's is, so a third of it is a third of the
/// picture.
pub fn photo_jpeg(width: u32, height: u32) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let picture = RgbImage::from_fn(width, height, |x, y| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let noise = (state >> 58) as u32;
        Rgb([
            (x * 255 / width + noise) as u8,
            (y * 255 / height + noise) as u8,
            (((x ^ y) & 0xFF) + noise) as u8,
        ])
    });
    let mut bytes = Vec::new();
    JpegEncoder::new_with_quality(&mut bytes, 90)
        .encode_image(&picture)
        .unwrap();
    bytes
}

/// The offsets of a JPEG's frame header marker and of the first byte after
/// its (first) scan header.
fn markers(jpeg: &[u8]) -> (usize, usize) {
    let (mut at, mut frame) = (2, None);
    loop {
        assert_eq!(jpeg[at], 0xFF, "a marker at {at}");
        let code = jpeg[at + 1];
        let length = usize::from(u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]));
        if code == 0xC0 {
            frame = Some(at);
        }
        if code == 0xDA {
            return (frame.expect("a frame header before the scan"), at + 2 + length);
        }
        at += 2 + length;
    }
}

/// The first third of `jpeg`: headers whole, image data cut short.
pub fn first_third(jpeg: &[u8]) -> Vec<u8> {
    jpeg[..jpeg.len() / 3].to_vec()
}

/// `jpeg` up to the end of its scan header: no image data at all.
pub fn only_its_header(jpeg: &[u8]) -> Vec<u8> {
    jpeg[..markers(jpeg).1].to_vec()
}

/// `jpeg` with `count` bytes in the middle of its image data overwritten by
/// pseudo-random ones drawn from `seed`.
pub fn with_random_bytes(jpeg: &[u8], count: usize, seed: u64) -> Vec<u8> {
    let start = markers(jpeg).1;
    let middle = start + (jpeg.len() - 2 - start) / 2 - count / 2;
    let mut damaged = jpeg.to_vec();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for byte in &mut damaged[middle..middle + count] {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *byte = state as u8;
    }
    damaged
}

/// `jpeg` whose frame header declares `width` × `height`, its data left
/// as it was.
pub fn declaring(jpeg: &[u8], width: u16, height: u16) -> Vec<u8> {
    let frame = markers(jpeg).0;
    let mut lying = jpeg.to_vec();
    lying[frame + 5..frame + 7].copy_from_slice(&height.to_be_bytes());
    lying[frame + 7..frame + 9].copy_from_slice(&width.to_be_bytes());
    lying
}

/// A `side` × `side` PNG of zero pixels, written row by row: the zlib
/// stream really inflates to every row of the declared size, and the file
/// is a thousandth of it.
pub fn png_bomb(side: u32, color: png::ColorType, depth: png::BitDepth) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, side, side);
    encoder.set_color(color);
    encoder.set_depth(depth);
    encoder.set_deflate_compression(png::DeflateCompression::Level(6));
    let mut writer = encoder.write_header().unwrap();
    let samples = match color {
        png::ColorType::Grayscale => 1,
        png::ColorType::GrayscaleAlpha => 2,
        png::ColorType::Rgb => 3,
        _ => 4,
    };
    let row = vec![0_u8; side as usize * samples * if depth == png::BitDepth::Sixteen { 2 } else { 1 }];
    {
        let mut stream = writer.stream_writer().unwrap();
        for _ in 0..side {
            std::io::Write::write_all(&mut stream, &row).unwrap();
        }
        stream.finish().unwrap();
    }
    writer.finish().unwrap();
    bytes
}

/// A GIF whose logical screen is `width` × `height`, holding one 1 × 1
/// frame.
pub fn gif_screen(width: u16, height: u16) -> Vec<u8> {
    let mut bytes = b"GIF89a".to_vec();
    bytes.extend(width.to_le_bytes());
    bytes.extend(height.to_le_bytes());
    bytes.extend([0x00, 0x00, 0x00]); // no global colour table
    bytes.extend([0x2C, 0, 0, 0, 0, 1, 0, 1, 0, 0x80]); // a 1 × 1 frame, 2 local colours
    bytes.extend([0, 0, 0, 255, 255, 255]);
    // LZW, minimum code size 2: clear (4), pixel 0, end (5), 3 bits each.
    bytes.extend([0x02, 0x02, 0x44, 0x01, 0x00, 0x3B]);
    bytes
}
