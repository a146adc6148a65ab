//! Hostile images against the checked decode: each is an error about the
//! file — not a decodable image, or too large to decode — never a grey
//! success, and a bomb is refused from its header without allocating its
//! pixels.
//!
//! This binary counts every allocation of the thread that measures
//! ([`held_at_most`]) and refuses any beyond the measurement's cap, so a
//! decode that would allocate gigabytes fails here at once (the process
//! aborts on the refused allocation) instead of swapping the machine.

use crate::support;

use opledger_media::{
    decode_image, decode_image_with, dhash, image_metadata, thumbnail, DecodeLimits, MediaError, DEFAULT_THUMBNAIL_SIDE,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use support::*;

struct Counting;

thread_local! {
    /// Bytes this thread allocated and has not freed since the measurement
    /// began (frees of older memory take it below zero).
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static CAP: Cell<isize> = const { Cell::new(isize::MAX) };
}

/// Whether this thread may take `size` more bytes; counts them if so.
fn take(size: usize) -> bool {
    HELD.try_with(|held| {
        let now = held.get().saturating_add(size as isize);
        if now > CAP.with(Cell::get) {
            return false;
        }
        held.set(now);
        PEAK.with(|peak| peak.set(peak.get().max(now)));
        true
    })
    .unwrap_or(true)
}

fn give_back(size: usize) {
    let _ = HELD.try_with(|held| held.set(held.get() - size as isize));
}

// SAFETY: every method forwards to `System` with the caller's own layout
// and pointer, unchanged; refusing an allocation returns null, which
// `GlobalAlloc` allows.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !take(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller upholds `alloc`'s contract for `layout`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !take(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        give_back(layout.size());
        // SAFETY: `pointer` was allocated by `System` with `layout`.
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && !take(new_size - layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: `pointer` was allocated by `System` with `layout`; the
        // caller upholds `realloc`'s contract for `new_size`.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if new_size < layout.size() && !moved.is_null() {
            give_back(layout.size() - new_size);
        }
        moved
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

const MIB: usize = 1 << 20;

/// Runs `work` on this thread, allowing it at most `cap` bytes held at
/// once; returns its result and the most it held.
fn held_at_most<T>(cap: usize, work: impl FnOnce() -> T) -> (T, usize) {
    HELD.with(|held| held.set(0));
    PEAK.with(|peak| peak.set(0));
    CAP.with(|limit| limit.set(cap as isize));
    let result = work();
    CAP.with(|limit| limit.set(isize::MAX));
    (result, PEAK.with(Cell::get).max(0) as usize)
}

fn not_an_image(result: Result<opledger_media::DecodedImage, MediaError>) -> String {
    match result {
        Err(error @ MediaError::NotAnImage(_)) => error.to_string(),
        Err(other) => panic!("expected not an image, got {other:?}"),
        Ok(decoded) => panic!(
            "a damaged file decoded into a {}x{} picture with dHash {}",
            decoded.image.width(),
            decoded.image.height(),
            dhash(&decoded.image)
        ),
    }
}

fn too_large(result: Result<opledger_media::DecodedImage, MediaError>) -> String {
    match result {
        Err(error @ MediaError::TooLarge(_)) => {
            assert!(!error.is_retryable());
            error.to_string()
        }
        Err(other) => panic!("expected too large, got {other:?}"),
        Ok(decoded) => panic!(
            "a bomb decoded into {}x{}",
            decoded.image.width(),
            decoded.image.height()
        ),
    }
}

#[test]
fn a_whole_photo_decodes_strictly_and_a_jpeg_cut_to_its_first_third_is_not_an_image() {
    let photo = photo_jpeg(1200, 800);
    assert!(photo.len() > 500_000, "a dense scan: {} bytes", photo.len());
    let whole = decode_image(&photo).unwrap();
    assert_eq!((whole.image.width(), whole.image.height()), (1200, 800));
    let error = not_an_image(decode_image(&first_third(&photo)));
    assert!(error.contains("truncated"), "{error}");
}

#[test]
fn a_jpeg_cut_short_and_given_an_end_marker_is_not_an_image() {
    // The strict decoder alone reads zero bits after an early end marker.
    let mut cut = first_third(&photo_jpeg(1200, 800));
    cut.extend([0xFF, 0xD9]);
    let error = not_an_image(decode_image(&cut));
    assert!(error.contains("before its last block"), "{error}");
}

#[test]
fn a_jpeg_declaring_10000_squared_in_21_kb_is_refused_as_truncated_without_decoding() {
    let lying = declaring(&photo_jpeg(160, 120), 10_000, 10_000);
    assert!((15_000..30_000).contains(&lying.len()), "{} bytes", lying.len());
    let (result, held) = held_at_most(4 * MIB, || decode_image(&lying));
    let error = not_an_image(result);
    assert!(error.contains("declares 10000 x 10000 pixels but holds"), "{error}");
    assert!(held < MIB, "refused before the decoder allocated: held {held} bytes");
}

#[test]
fn a_jpeg_of_only_its_header_is_not_an_image() {
    let header = only_its_header(&photo_jpeg(640, 480));
    let error = not_an_image(decode_image(&header));
    assert!(error.contains("truncated"), "{error}");
}

#[test]
fn a_jpeg_with_200_random_bytes_in_its_image_data_is_not_an_image() {
    let photo = photo_jpeg(1200, 800);
    for seed in [1, 2, 3, 4] {
        not_an_image(decode_image(&with_random_bytes(&photo, 200, seed)));
    }
}

#[test]
fn a_jpeg_declaring_65000_squared_is_refused_from_its_header_without_allocating() {
    let bomb = declaring(&photo_jpeg(160, 120), 65_000, 65_000);
    let (result, held) = held_at_most(4 * MIB, || decode_image(&bomb));
    let error = too_large(result);
    assert!(
        error.contains("declares 65000 x 65000 pixels (4225.0 megapixels)"),
        "{error}"
    );
    assert!(held < MIB, "held {held} bytes");
    // Its header still reads: metadata allocates nothing for pixels.
    let header = image_metadata(&bomb).unwrap();
    assert_eq!((header.format, header.width, header.height), ("jpeg", 65_000, 65_000));
}

#[test]
fn a_png_whose_zlib_stream_inflates_to_20000_squared_is_refused_without_allocating() {
    let bomb = png_bomb(20_000, png::ColorType::Rgb, png::BitDepth::Eight);
    assert!(bomb.len() < 4 * MIB, "{} bytes for 1.2 GB of pixels", bomb.len());
    let (result, held) = held_at_most(16 * MIB, || decode_image(&bomb));
    let error = too_large(result);
    assert!(error.contains("png header declares 20000 x 20000 pixels"), "{error}");
    assert!(held < 4 * MIB, "held {held} bytes");
}

#[test]
fn a_16_bit_grey_png_of_16383_squared_is_refused_without_allocating() {
    let bomb = png_bomb(16_383, png::ColorType::Grayscale, png::BitDepth::Sixteen);
    let (result, held) = held_at_most(16 * MIB, || decode_image(&bomb));
    let error = too_large(result);
    assert!(error.contains("16383 x 16383"), "{error}");
    assert!(held < 4 * MIB, "held {held} bytes");
}

#[test]
fn a_gif_declaring_a_65535_squared_screen_is_refused_without_allocating() {
    let bomb = gif_screen(65_535, 65_535);
    let (result, held) = held_at_most(4 * MIB, || decode_image(&bomb));
    let error = too_large(result);
    assert!(error.contains("gif header declares 65535 x 65535"), "{error}");
    assert!(held < MIB, "held {held} bytes");
}

/// The byte bound is an upper bound of everything one decode and the
/// thumbnail and hash after it hold at once: the least bound that admits
/// an image is enough to decode it, thumbnail it and hash it with the
/// allocator refusing anything beyond.
#[test]
fn the_byte_bound_covers_every_buffer_of_one_decode_and_its_copy() {
    let deep = png_bomb(1024, png::ColorType::Grayscale, png::BitDepth::Sixteen);
    let wide = png_bomb(2000, png::ColorType::Rgba, png::BitDepth::Eight);
    for (name, bytes) in [
        ("baseline jpeg", photo_jpeg(1200, 800)),
        ("16-bit grey png", deep),
        ("rgba png", wide),
    ] {
        let admits = |mib: u64| decode_image_with(&bytes, &DecodeLimits::default().with_max_bytes(mib << 20)).is_ok();
        let least = (1..=256).find(|&mib| admits(mib)).expect("admitted under 256 MiB");
        let refused = decode_image_with(&bytes, &DecodeLimits::default().with_max_bytes((least - 1) << 20));
        assert!(too_large(refused).contains("would hold"), "{name}");
        let limits = DecodeLimits::default().with_max_bytes(least << 20);
        let (side, held) = held_at_most((least as usize) << 20, || {
            let decoded = decode_image_with(&bytes, &limits).unwrap();
            let small = thumbnail(&decoded.image, DEFAULT_THUMBNAIL_SIDE).unwrap();
            dhash(&decoded.image);
            small.width().max(small.height())
        });
        assert_eq!(side, DEFAULT_THUMBNAIL_SIDE, "{name}");
        assert!(
            held <= (least as usize) << 20,
            "{name}: held {held} bytes under {least} MiB"
        );
    }
}

#[test]
fn a_lower_pixel_limit_refuses_what_the_default_decodes() {
    let photo = photo_jpeg(640, 480);
    assert!(decode_image(&photo).is_ok());
    let limits = DecodeLimits::default().with_max_pixels(640 * 480 - 1);
    let error = too_large(decode_image_with(&photo, &limits));
    assert!(
        error.contains("640 x 480 pixels (0.3 megapixels), more than the 0.3 megapixels"),
        "{error}"
    );
}
