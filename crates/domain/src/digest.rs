//! Content digests: `sha256:` followed by the 64 lowercase hex digits of
//! the content's SHA-256, the one form a media item's digest (and a
//! request's `content_digest` input) takes. *Why one form:* digests are
//! compared as text (has the content changed? which revision was it?), so
//! `SHA256:ABC…` and `sha256:abc…` would be two different contents.

use crate::quote::quoted;

/// The prefix every content digest has.
pub const PREFIX: &str = "sha256:";

/// Whether `text` is a content digest; `Err` says what it must be,
/// quoting the text short.
pub fn check(text: &str) -> Result<(), String> {
    let well_formed = text.strip_prefix(PREFIX).is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    });
    if well_formed {
        Ok(())
    } else {
        Err(format!(
            "a content digest is `sha256:` and 64 lowercase hex digits, not {}",
            quoted(text)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sha256_with_64_lowercase_hex_digits_is_a_digest() {
        let hex = "0123456789abcdef".repeat(4);
        assert!(check(&format!("sha256:{hex}")).is_ok());
        for refused in [
            String::new(),
            "sha256:".to_string(),
            "sha256:ab".to_string(),
            format!("sha256:{}", hex.to_uppercase()),
            format!("SHA256:{hex}"),
            format!("md5:{hex}"),
            format!("sha256:{hex}0"),
            format!("sha256:{}g", &hex[..63]),
            hex.clone(),
        ] {
            let message = check(&refused).unwrap_err();
            assert!(message.contains("64 lowercase hex digits"), "{refused}: {message}");
        }
        assert!(check(&"x".repeat(1_000_000)).unwrap_err().len() < 400);
    }
}
