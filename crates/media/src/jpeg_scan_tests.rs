//! The fast walk of a JPEG's scans ([`mod@crate::jpeg_scan`]) judged
//! against its step-by-step walk, on JPEGs whose scans the marker walk
//! ([`mod@crate::jpeg`]) finds: both accept whole files and refuse damaged
//! scans with the same verdict.

use crate::jpeg;
use crate::jpeg_scan::walk;
use image::codecs::jpeg::JpegEncoder;
use image::ExtendedColorType;
use proptest::prelude::*;

/// A noisy `width` × `height` JPEG (colour, or grey with one
/// component), so its AC codes run from short to long.
fn noisy_jpeg(width: u32, height: u32, grey: bool, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let channels = if grey { 1 } else { 3 };
    let pixels: Vec<u8> = (0..width * height * channels)
        .map(|index| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((index % (width * channels)) as u64 * 2 + (state & 63)) as u8
        })
        .collect();
    let mut bytes = Vec::new();
    let colour = if grey {
        ExtendedColorType::L8
    } else {
        ExtendedColorType::Rgb8
    };
    JpegEncoder::new_with_quality(&mut bytes, 90)
        .encode(&pixels, width, height, colour)
        .unwrap();
    bytes
}

/// Both walks' verdicts on `bytes` (`None` when its markers are no
/// sequential JPEG at all).
fn verdicts(bytes: &[u8]) -> Option<(Result<(), String>, Result<(), String>)> {
    let layout = jpeg::layout(bytes).ok()?;
    let run = |fast: bool| {
        layout.sequential_scans.iter().try_for_each(|scan| {
            let (width, height, sampling) = (layout.width, layout.height, &layout.sampling);
            if fast {
                walk::<true>(bytes, scan, width, height, sampling)
            } else {
                walk::<false>(bytes, scan, width, height, sampling)
            }
            .map_err(|error| error.to_string())
        })
    };
    Some((run(true), run(false)))
}

#[test]
fn the_fast_walk_accepts_whole_files_as_the_step_by_step_walk_does() {
    for (width, height, grey) in [(96, 80, false), (333, 101, false), (64, 64, true), (17, 9, true)] {
        let bytes = noisy_jpeg(width, height, grey, u64::from(width));
        let (fast, slow) = verdicts(&bytes).expect("a sequential JPEG");
        assert_eq!(fast, Ok(()), "{width}x{height}");
        assert_eq!(slow, Ok(()), "{width}x{height}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_fast_walk_refuses_damaged_scans_with_the_step_by_step_walks_verdict(
        seed in 1_u64..1_000,
        grey in any::<bool>(),
        edits in prop::collection::vec((0.0_f64..1.0, any::<u8>()), 1..4),
        cut in prop::option::of(0.0_f64..1.0),
    ) {
        let mut bytes = noisy_jpeg(120, 72, grey, seed);
        let data = jpeg::layout(&bytes).unwrap().sequential_scans[0].data.clone();
        for (at, byte) in edits {
            let at = data.start + ((data.len() - 1) as f64 * at) as usize;
            bytes[at] = byte;
        }
        if let Some(cut) = cut {
            bytes.truncate(data.start + (data.len() as f64 * cut) as usize);
            bytes.extend([0xFF, 0xD9]);
        }
        if let Some((fast, slow)) = verdicts(&bytes) {
            prop_assert_eq!(fast, slow);
        }
    }
}
