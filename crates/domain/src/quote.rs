//! Short quotes of caller text for messages. Whatever a caller hands in (a
//! path, a URL, JSON, a token, a name) may be megabytes long; a message
//! shows at most [`QUOTE_BYTES`] of it and says how long the rest was, so
//! an error never floods a terminal or a log with the input it refuses.

/// The most bytes of caller text a message quotes.
pub const QUOTE_BYTES: usize = 200;

/// `text`, or its first [`QUOTE_BYTES`] bytes (cut at a character
/// boundary) followed by how many bytes the whole text had.
pub fn quote(text: &str) -> String {
    if text.len() <= QUOTE_BYTES {
        return text.to_string();
    }
    let mut end = QUOTE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

/// [`quote`] in double quotes, with the characters a terminal would act on
/// escaped (as `{:?}` does).
pub fn quoted(text: &str) -> String {
    if text.len() <= QUOTE_BYTES {
        return format!("{text:?}");
    }
    let mut end = QUOTE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes in all)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_quoted_whole_and_long_text_is_cut_with_its_length() {
        assert_eq!(quote("abc"), "abc");
        assert_eq!(quoted("a\nb"), "\"a\\nb\"");
        let long = "x".repeat(10_000_000);
        let cut = quote(&long);
        assert!(cut.len() < QUOTE_BYTES + 40, "{}", cut.len());
        assert!(cut.ends_with("(10000000 bytes in all)"), "{cut}");
        assert!(quoted(&long).len() < QUOTE_BYTES + 40);
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        let long = "é".repeat(1_000);
        let cut = quote(&long);
        assert!(cut.starts_with(&"é".repeat(QUOTE_BYTES / 2)));
        assert!(quoted(&long).contains("(2000 bytes in all)"));
    }
}
