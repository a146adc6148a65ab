//! File paths as the ledger's text, reversibly.
//!
//! The ledger records paths as text (UTF-8), while a Unix file name is any
//! bytes but `/` and NUL. A name that is valid UTF-8 is recorded as it is;
//! a byte that is not part of valid UTF-8 is recorded as U+FFFD (the
//! replacement character a lossy conversion would show) followed by the
//! byte's value in two uppercase hex digits, and a U+FFFD that is really
//! in the name is doubled. So `caf\xE9.jpg` (Latin-1) is recorded as
//! `caf\u{FFFD}E9.jpg`, reads like its lossy form with the byte beside it,
//! and [`text_path`] gives back the exact bytes: every file is ingested,
//! and two names that differ only in their invalid bytes never share a
//! ledger path.
//!
//! *Why not a refusal:* the file is the user's, and nothing about it is
//! wrong; *why not another escape (`%E9`, `\xE9`):* those are common in
//! real UTF-8 names and would have to be escaped in every such name,
//! changing paths the ledger already holds; a real U+FFFD in a file name
//! is all but unheard of (it is what a broken conversion leaves).

use std::path::{Path, PathBuf};

/// The escape: U+FFFD.
const ESCAPE: char = '\u{FFFD}';

/// The ledger's text for `path` (see the module documentation).
pub fn path_text(path: &Path) -> String {
    encode(path.as_os_str().as_encoded_bytes())
}

/// The path a ledger text names: the inverse of [`path_text`]. A U+FFFD
/// not followed by two hex digits or another U+FFFD (text not written by
/// [`path_text`]) stands for itself.
pub fn text_path(text: &str) -> PathBuf {
    if !text.contains(ESCAPE) {
        return PathBuf::from(text);
    }
    bytes_path(decode(text))
}

fn encode(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for character in chunk.valid().chars() {
            if character == ESCAPE {
                text.push(ESCAPE);
            }
            text.push(character);
        }
        for byte in chunk.invalid() {
            text.push(ESCAPE);
            text.push_str(&format!("{byte:02X}"));
        }
    }
    text
}

fn decode(text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(ESCAPE) {
        bytes.extend_from_slice(&rest.as_bytes()[..at]);
        let after = &rest[at + ESCAPE.len_utf8()..];
        if let Some(doubled) = after.strip_prefix(ESCAPE) {
            bytes.extend_from_slice(ESCAPE.to_string().as_bytes());
            rest = doubled;
        } else if let Some(byte) = after.get(..2).and_then(hex_byte) {
            bytes.push(byte);
            rest = &after[2..];
        } else {
            bytes.extend_from_slice(ESCAPE.to_string().as_bytes());
            rest = after;
        }
    }
    bytes.extend_from_slice(rest.as_bytes());
    bytes
}

/// Two uppercase hex digits, as [`encode`] writes them.
fn hex_byte(digits: &str) -> Option<u8> {
    if digits
        .bytes()
        .all(|digit| digit.is_ascii_digit() || (b'A'..=b'F').contains(&digit))
    {
        u8::from_str_radix(digits, 16).ok()
    } else {
        None
    }
}

#[cfg(unix)]
fn bytes_path(bytes: Vec<u8>) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(bytes))
}

#[cfg(not(unix))]
fn bytes_path(bytes: Vec<u8>) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    fn of(bytes: &[u8]) -> PathBuf {
        PathBuf::from(OsStr::from_bytes(bytes))
    }

    #[test]
    fn a_utf8_path_is_its_own_text() {
        let path = Path::new("/photos/été/café 1%E9.jpg");
        assert_eq!(path_text(path), "/photos/été/café 1%E9.jpg");
        assert_eq!(text_path("/photos/été/café 1%E9.jpg"), path);
    }

    #[test]
    fn a_byte_that_is_not_utf8_becomes_the_replacement_character_and_its_hex() {
        let path = of(b"/photos/caf\xE9.jpg");
        assert_eq!(path_text(&path), "/photos/caf\u{FFFD}E9.jpg");
        assert_eq!(text_path(&path_text(&path)), path);
    }

    #[test]
    fn a_real_replacement_character_is_doubled_so_it_cannot_be_taken_for_a_byte() {
        let real = Path::new("/a/\u{FFFD}E9");
        let escaped = of(b"/a/\xE9");
        assert_ne!(path_text(real), path_text(&escaped));
        assert_eq!(text_path(&path_text(real)), real);
        assert_eq!(text_path(&path_text(&escaped)), escaped);
    }

    #[test]
    fn a_lone_replacement_character_in_foreign_text_stands_for_itself() {
        assert_eq!(text_path("/a/\u{FFFD}x"), Path::new("/a/\u{FFFD}x"));
        assert_eq!(text_path("/a/\u{FFFD}"), Path::new("/a/\u{FFFD}"));
    }

    proptest! {
        #[test]
        fn every_path_comes_back_from_its_text(bytes in proptest::collection::vec(1u8..=255, 0..40)) {
            let path = of(&bytes);
            prop_assert_eq!(text_path(&path_text(&path)), path);
        }

        #[test]
        fn different_paths_have_different_texts(
            a in proptest::collection::vec(prop_oneof![Just(0xE9u8), Just(0xEFu8), Just(0xBFu8), Just(0xBDu8), Just(b'E'), Just(b'9')], 0..8),
            b in proptest::collection::vec(prop_oneof![Just(0xE9u8), Just(0xEFu8), Just(0xBFu8), Just(0xBDu8), Just(b'E'), Just(b'9')], 0..8),
        ) {
            if a != b {
                prop_assert_ne!(path_text(&of(&a)), path_text(&of(&b)));
            }
        }
    }
}
