//! The revision rule of the work protocol (`docs/revision.md`).
//!
//! A task's revision is a fingerprint of everything that determines its result:
//! the lowercase-hex SHA-256 of the canonical JSON text of the document
//! `{"inputs": <inputs>, "task_kind": <kind>, "task_version": <version>}`.
//! Canonical JSON follows RFC 8785 (the JSON Canonicalization Scheme), so the
//! same inputs give the same revision on every machine, backend and language:
//!
//! - object members sorted by their keys' UTF-16 code units, at every level;
//!   arrays keep their order;
//! - no insignificant whitespace;
//! - strings escaped as ECMAScript `JSON.stringify` does: only `"`, `\` and
//!   the control characters U+0000..U+001F (`\b \t \n \f \r` in short form,
//!   the others as `\u00xx` with lowercase hex); everything else, non-ASCII
//!   included, is written as raw UTF-8;
//! - numbers written as ECMAScript `Number.prototype.toString` writes the IEEE
//!   double they denote (`1.0` → `1`, `1e21` → `1e+21`, `1e-7` → `1e-7`,
//!   `-0` → `0`).
//!
//! One deliberate strictness on top of RFC 8785: a JSON integer (a number
//! written without fraction or exponent) beyond 2^53 in magnitude, which an f64
//! cannot carry digit for digit, is refused with
//! [`RevisionError::UnsafeInteger`] instead of being rounded, because two
//! different inputs must never silently share a revision. Precisely: an
//! integer is accepted when its canonical text is the very same integer. Every
//! integer with `|n| <= 2^53` is; beyond that, `123456789012345678` and
//! `2^53 + 1` are refused, and so is `1152921504606846976` (2^60, which the
//! double rendering writes `1152921504606847000`), while integers that already
//! are a double's rendering (`10000000000000000000`, `1152921504606847000`)
//! are kept. That way canonical text always canonicalizes again to itself.
//!
//! Everything here is a pure function of its arguments.

use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use thiserror::Error;

/// Why a document has no canonical form (and so no revision).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RevisionError {
    /// The task inputs must be a JSON object (`{...}`); `found` names what they were.
    #[error("task inputs must be a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    /// An integer beyond 2^53 that an IEEE double cannot carry digit for
    /// digit: canonicalizing it would write a different number, so it is
    /// refused. `path` names where it sits, for example `inputs.model.size`
    /// or `inputs.sizes[2]` (`$` is the root); `value` is the integer as given.
    #[error(
        "the integer {value} at {path} is beyond 2^53 and would not come out of a double \
         unchanged; pass it as a string"
    )]
    UnsafeInteger { path: String, value: String },
    /// A number that is not finite. `serde_json::Value` cannot hold one, so
    /// this is a guard rather than a reachable case.
    #[error("the number at {path} is not finite")]
    NonFiniteNumber { path: String },
}

/// The RFC 8785 canonical JSON text of `value` (see the module documentation
/// for the rules).
///
/// # Errors
///
/// [`RevisionError::UnsafeInteger`] when an integer in `value` cannot be
/// represented exactly as an f64 (only possible for `|n| > 2^53`, e.g.
/// `123456789012345678`; precisely, when its canonical text would not be the
/// same integer): it is refused, never silently rounded. The error's `path`
/// locates the number (`model.size`, `sizes[2]`; the root is `$`).
pub fn canonical_json(value: &Value) -> Result<String, RevisionError> {
    let mut out = String::new();
    let mut path = Vec::new();
    write_value(&mut out, value, &mut path)?;
    Ok(out)
}

/// Lowercase hex of the SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in digest {
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// The revision of a task: the lowercase-hex SHA-256 of the canonical JSON of
/// `{"inputs": inputs, "task_kind": task_kind, "task_version": task_version}`.
///
/// # Errors
///
/// [`RevisionError::NotAnObject`] when `inputs` is not a JSON object, and
/// [`RevisionError::UnsafeInteger`] when it holds an integer an f64 cannot
/// represent exactly (its path then starts with `inputs`, e.g.
/// `inputs.model.size`).
pub fn compute_revision(task_kind: &str, task_version: &str, inputs: &Value) -> Result<String, RevisionError> {
    if !inputs.is_object() {
        return Err(RevisionError::NotAnObject {
            found: kind_name(inputs),
        });
    }
    let mut document = Map::new();
    document.insert("inputs".to_string(), inputs.clone());
    document.insert("task_kind".to_string(), Value::String(task_kind.to_string()));
    document.insert("task_version".to_string(), Value::String(task_version.to_string()));
    let text = canonical_json(&Value::Object(document))?;
    Ok(sha256_hex(text.as_bytes()))
}

fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One step of the path to the value being written, for error messages.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

fn write_value<'a>(out: &mut String, value: &'a Value, path: &mut Vec<Step<'a>>) -> Result<(), RevisionError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => write_number(out, number, path)?,
        Value::String(text) => write_string(out, text),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                path.push(Step::Index(index));
                write_value(out, item, path)?;
                path.pop();
            }
            out.push(']');
        }
        Value::Object(members) => {
            // RFC 8785 §3.2.3: sort by the keys' UTF-16 code units, whatever
            // order the map iterates in (serde_json's may be UTF-8 byte order
            // or insertion order depending on its features).
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (index, (key, member)) in sorted.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                path.push(Step::Key(key));
                write_value(out, member, path)?;
                path.pop();
            }
            out.push('}');
        }
    }
    Ok(())
}

/// RFC 8785 §3.2.2.3: the ECMAScript rendering of the IEEE double, with
/// integers refused when that rendering would not be the same integer.
fn write_number(out: &mut String, number: &Number, path: &[Step<'_>]) -> Result<(), RevisionError> {
    let mut buffer = ryu_js::Buffer::new();
    // A JSON number without fraction or exponent arrives as a u64 or i64.
    let integer = match (number.as_u64(), number.as_i64()) {
        (Some(n), _) => Some((n as f64, n.to_string())),
        (None, Some(n)) => Some((n as f64, n.to_string())),
        (None, None) => None,
    };
    if let Some((double, digits)) = integer {
        // `as` rounds to the nearest double, as JSON parsers do. Up to 2^53
        // every integer is exact and comes back digit for digit; beyond it
        // the shortest rendering usually differs (2^53 + 1 becomes
        // 9007199254740992), and then the integer is refused, not rounded.
        let text = buffer.format_finite(double);
        if text != digits {
            return Err(RevisionError::UnsafeInteger {
                path: render_path(path),
                value: digits,
            });
        }
        out.push_str(text);
        return Ok(());
    }
    // Without serde_json's arbitrary_precision every other number is an f64.
    let double = number.as_f64().unwrap_or(f64::NAN);
    if !double.is_finite() {
        return Err(RevisionError::NonFiniteNumber {
            path: render_path(path),
        });
    }
    // Number.prototype.toString writes -0 as "0".
    let double = if double == 0.0 { 0.0 } else { double };
    out.push_str(buffer.format_finite(double));
    Ok(())
}

/// RFC 8785 §3.2.2.2: JSON.stringify's string escaping.
fn write_string(out: &mut String, text: &str) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{0c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            control if u32::from(control) < 0x20 => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{:04x}", u32::from(control));
            }
            other => out.push(other),
        }
    }
    out.push('"');
}

/// `inputs.model.size`, `inputs.sizes[2]`, `inputs["odd key"]`; `$` for the root.
fn render_path(path: &[Step<'_>]) -> String {
    if path.is_empty() {
        return "$".to_string();
    }
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(key) if is_plain_key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Step::Key(key) => {
                out.push('[');
                write_string(&mut out, key);
                out.push(']');
            }
            Step::Index(index) => {
                let _ = write!(out, "[{index}]");
            }
        }
    }
    out
}

fn is_plain_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn canon(text: &str) -> String {
        let value: Value = serde_json::from_str(text).expect("test JSON parses");
        canonical_json(&value).expect("canonicalizes")
    }

    #[test]
    fn key_order_does_not_matter() {
        assert_eq!(canon(r#"{"b":1,"a":2}"#), r#"{"a":2,"b":1}"#);
        assert_eq!(canon(r#"{"a":2,"b":1}"#), r#"{"a":2,"b":1}"#);
        let first = compute_revision("metadata", "1", &json!({"b": 1, "a": 2})).unwrap();
        let second = compute_revision("metadata", "1", &json!({"a": 2, "b": 1})).unwrap();
        assert_eq!(first, second);
    }

    #[test]
    fn nested_objects_are_sorted_at_every_level_and_arrays_keep_order() {
        assert_eq!(
            canon(r#"{ "z": {"y": [3, 1, 2], "x": {"d": null, "c": [{"b": 1, "a": 0}]}}, "a": [] }"#),
            r#"{"a":[],"z":{"x":{"c":[{"a":0,"b":1}],"d":null},"y":[3,1,2]}}"#
        );
        assert_eq!(canon(r#"[3, "b", "a", 1]"#), r#"[3,"b","a",1]"#);
        assert_eq!(canon("{}"), "{}");
        assert_eq!(canon("[]"), "[]");
        assert_eq!(canon(" [ true , false , null ] "), "[true,false,null]");
    }

    #[test]
    fn non_ascii_is_raw_utf8() {
        assert_eq!(canon(r#""\u00e9""#), "\"é\"");
        assert_eq!(
            canon(r#"["é", "日本", "😀", "\ud83d\ude00"]"#),
            "[\"é\",\"日本\",\"😀\",\"😀\"]"
        );
        // DEL and the line/paragraph separators are not escaped either.
        assert_eq!(canon(r#""\u007f\u2028\u2029""#), "\"\u{7f}\u{2028}\u{2029}\"");
    }

    #[test]
    fn keys_sort_by_utf16_code_units_not_by_code_points() {
        // U+FF61 is one code unit 0xFF61; U+1F600 is the surrogate pair
        // 0xD83D 0xDE00. By code point (and UTF-8 bytes) the emoji comes last;
        // by UTF-16 code units (RFC 8785) it comes first.
        let value = json!({"\u{ff61}": 1, "\u{1f600}": 2, "é": 3, "a": 4, "日本": 5});
        assert_eq!(
            canonical_json(&value).unwrap(),
            "{\"a\":4,\"é\":3,\"日本\":5,\"😀\":2,\"｡\":1}"
        );
        // The RFC 8785 §3.2.3 sorting example.
        assert_eq!(
            canon(
                r#"{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
                    "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control",
                    "\u00f6": "Latin Small Letter O With Diaeresis"}"#
            ),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
             \"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\
             \"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    #[test]
    fn control_characters_are_escaped_as_json_stringify_does() {
        assert_eq!(
            canonical_json(&json!("\u{8}\t\n\u{c}\r\"\\/")).unwrap(),
            r#""\b\t\n\f\r\"\\/""#
        );
        assert_eq!(
            canonical_json(&json!("\u{0}\u{1}\u{f}\u{1a}\u{1f} ")).unwrap(),
            r#""\u0000\u0001\u000f\u001a\u001f ""#
        );
        assert_eq!(canonical_json(&json!({"\n": "\u{1b}"})).unwrap(), r#"{"\n":"\u001b"}"#);
    }

    #[test]
    fn numbers_are_written_as_ecmascript_does() {
        let cases = [
            ("1.0", "1"),
            ("1", "1"),
            ("-1.50", "-1.5"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("123e18", "123000000000000000000"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("0.1", "0.1"),
            ("-0.0", "0"),
            ("-0", "0"),
            ("0", "0"),
            ("1E30", "1e+30"),
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
            ("333333333.33333329", "333333333.3333333"),
            ("0.000000000000000000000000001", "1e-27"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("5e-324", "5e-324"),
            ("-1e-7", "-1e-7"),
            ("9007199254740992", "9007199254740992"),
            ("-9007199254740992", "-9007199254740992"),
            ("9007199254740991", "9007199254740991"),
            // Integers beyond 2^53 that already are a double's rendering.
            ("9007199254740994", "9007199254740994"),
            ("10000000000000000000", "10000000000000000000"),
            ("1152921504606847000", "1152921504606847000"),
            ("-1152921504606847000", "-1152921504606847000"),
            // Doubles beyond 2^53 (written with a fraction or exponent).
            ("1e19", "10000000000000000000"),
            ("1152921504606846976.0", "1152921504606847000"),
            ("123456789012345678.0", "123456789012345680"),
        ];
        for (input, expected) in cases {
            assert_eq!(canon(input), expected, "canonical form of {input}");
        }
    }

    #[test]
    fn integers_a_double_cannot_hold_are_refused() {
        let value: Value = serde_json::from_str("123456789012345678").unwrap();
        assert_eq!(
            canonical_json(&value),
            Err(RevisionError::UnsafeInteger {
                path: "$".into(),
                value: "123456789012345678".into()
            })
        );
        for text in [
            "9007199254740993",
            "-9007199254740993",
            // 2^60 exactly: a double holds it, but writes it 1152921504606847000.
            "1152921504606846976",
            "18446744073709551615",
            "-9223372036854775808",
            "-9223372036854775807",
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            assert!(
                matches!(canonical_json(&value), Err(RevisionError::UnsafeInteger { .. })),
                "{text} must be refused"
            );
        }
        // 2^53 itself is fine.
        assert_eq!(
            canonical_json(&json!(9_007_199_254_740_992_u64)).unwrap(),
            "9007199254740992"
        );

        let inputs = json!({"model": {"size": 123_456_789_012_345_678_u64}});
        let error = compute_revision("auto_tagging", "1", &inputs).unwrap_err();
        assert_eq!(
            error,
            RevisionError::UnsafeInteger {
                path: "inputs.model.size".into(),
                value: "123456789012345678".into()
            }
        );
        assert_eq!(
            error.to_string(),
            "the integer 123456789012345678 at inputs.model.size is beyond 2^53 and would not come out of a double \
             unchanged; pass it as a string"
        );
        let inputs =
            json!({"sizes": [1, 2, 9_007_199_254_740_993_u64], "odd key": {"k": [-9_007_199_254_740_995_i64]}});
        assert_eq!(
            canonical_json(&inputs).unwrap_err(),
            RevisionError::UnsafeInteger {
                path: "[\"odd key\"].k[0]".into(),
                value: "-9007199254740995".into()
            }
        );
        assert_eq!(
            canonical_json(&json!({"sizes": [1, 2, 9_007_199_254_740_993_u64]})).unwrap_err(),
            RevisionError::UnsafeInteger {
                path: "sizes[2]".into(),
                value: "9007199254740993".into()
            }
        );
    }

    #[test]
    fn rfc_8785_sample() {
        // RFC 8785 §3.2.2, the input object and its canonical form.
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        assert_eq!(
            canon(input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn sha256_hex_is_lowercase_hex() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn inputs_must_be_an_object() {
        for (inputs, found) in [
            (json!(null), "null"),
            (json!(true), "a boolean"),
            (json!(1), "a number"),
            (json!("x"), "a string"),
            (json!([1]), "an array"),
        ] {
            let error = compute_revision("metadata", "1", &inputs).unwrap_err();
            assert_eq!(error, RevisionError::NotAnObject { found });
            assert_eq!(
                error.to_string(),
                format!("task inputs must be a JSON object, found {found}")
            );
        }
        assert!(compute_revision("metadata", "1", &json!({})).is_ok());
    }

    // Golden revisions. The expected hex was computed independently of this
    // code, with `printf '%s' '<canonical text>' | sha256sum`; a change here
    // changes every stored revision, so it must be deliberate.

    const DIGEST: &str = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn golden_revision_thumbnail() {
        // The worked example in docs/revision.md.
        let inputs = json!({"max_side": 256, "format": "png", "content_digest": DIGEST});
        let expected_text = "{\"inputs\":{\"content_digest\":\"sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\",\
             \"format\":\"png\",\"max_side\":256},\"task_kind\":\"thumbnail\",\"task_version\":\"1\"}";
        let document = json!({"task_version": "1", "task_kind": "thumbnail", "inputs": inputs});
        assert_eq!(canonical_json(&document).unwrap(), expected_text);
        assert_eq!(
            compute_revision("thumbnail", "1", &inputs).unwrap(),
            "47ff383d80e8959c9c67f8c08fc446ce8519fc7fbd74723472c4bf249de494ab"
        );
        // 256.0 is the same number as 256.
        let float_side = json!({"max_side": 256.0, "format": "png", "content_digest": DIGEST});
        assert_eq!(
            compute_revision("thumbnail", "1", &float_side).unwrap(),
            compute_revision("thumbnail", "1", &inputs).unwrap()
        );
    }

    #[test]
    fn golden_revision_metadata() {
        // {"inputs":{"content_digest":"sha256:ba78…15ad"},"task_kind":"metadata","task_version":"1"}
        let inputs = json!({"content_digest": DIGEST});
        assert_eq!(
            compute_revision("metadata", "1", &inputs).unwrap(),
            "ecbcfd3631c6119b7f4725b0754e40b2a1a1e0ac42c821d3c1d55ffd22e15f0a"
        );
    }

    #[test]
    fn golden_revision_crop_embedding() {
        // {"inputs":{"bbox":{"height":48,"width":64,"x":10,"y":20},"content_digest":"sha256:ba78…15ad",
        //  "embedding_version":"2","model":"clip-vit-b32","model_revision":"é日本😀","region_revision":3},
        //  "task_kind":"crop_embedding","task_version":"1"}
        let inputs = json!({
            "region_revision": 3,
            "model_revision": "\u{e9}\u{65e5}\u{672c}\u{1f600}",
            "model": "clip-vit-b32",
            "embedding_version": "2",
            "content_digest": DIGEST,
            "bbox": {"y": 20.0, "x": 10, "width": 64, "height": 4.8e1},
        });
        assert_eq!(
            compute_revision("crop_embedding", "1", &inputs).unwrap(),
            "27380653c3a376116b0e1854371b662a74a8056e018ba506ce7902e6dbf98b04"
        );
        // Fractions and -0 inside inputs:
        // {"inputs":{"bbox":{"height":0.25,"width":0.5,"x":0.1,"y":0},"content_digest":"sha256:ba78…15ad",
        //  "embedding_version":"2","model":"clip-vit-b32","model_revision":"é日本😀","region_revision":3},
        //  "task_kind":"crop_embedding","task_version":"1"}
        let mut fractional = inputs;
        fractional["bbox"] = json!({"y": -0.0, "x": 0.1, "width": 0.50, "height": 2.5e-1});
        assert_eq!(
            compute_revision("crop_embedding", "1", &fractional).unwrap(),
            "063e7e16ae4844de8e1d36dba4c989d8564d4a071c2e7b0002263d74c394edd2"
        );
    }

    #[test]
    fn golden_revision_rfc_sample_inputs() {
        // The RFC 8785 sample as inputs:
        // {"inputs":{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],
        //  "string":"€$\u000f\nA'B\"\\\\\"/"},"task_kind":"auto_tagging","task_version":"1"}
        let inputs: Value = serde_json::from_str(
            r#"{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
                "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/", "literals": [null, true, false]}"#,
        )
        .unwrap();
        assert_eq!(
            compute_revision("auto_tagging", "1", &inputs).unwrap(),
            "aab68ae05b6ed2244d29831ada89bb2771645b4fd34ffa97b0774e8ae07cfe3b"
        );
    }

    #[test]
    fn revision_depends_on_kind_version_and_every_input() {
        let inputs = json!({"content_digest": DIGEST, "algorithm": "dhash64"});
        let base = compute_revision("perceptual_hash", "1", &inputs).unwrap();
        assert_ne!(base, compute_revision("perceptual_hash", "2", &inputs).unwrap());
        assert_ne!(base, compute_revision("metadata", "1", &inputs).unwrap());
        let other = json!({"content_digest": DIGEST, "algorithm": "phash64"});
        assert_ne!(base, compute_revision("perceptual_hash", "1", &other).unwrap());
        assert_eq!(base.len(), 64);
        assert!(base.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    /// Arbitrary JSON within the canonicalizable domain: finite doubles and
    /// integers up to 2^53, any strings (controls and astral characters
    /// included), nested arrays and objects.
    fn json_value() -> impl Strategy<Value = Value> {
        const SAFE: i64 = 1 << 53;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-SAFE..=SAFE).prop_map(|n| json!(n)),
            (prop::num::f64::NORMAL
                | prop::num::f64::SUBNORMAL
                | prop::num::f64::ZERO
                | prop::num::f64::POSITIVE
                | prop::num::f64::NEGATIVE)
                .prop_map(|f| Value::Number(Number::from_f64(f).expect("finite"))),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((any::<String>(), inner), 0..6)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    /// The same value with every object's members inserted in reverse order.
    fn reinsert_reversed(value: &Value) -> Value {
        match value {
            Value::Array(items) => Value::Array(items.iter().map(reinsert_reversed).collect()),
            Value::Object(members) => {
                let mut reversed = Map::new();
                for (key, member) in members.iter().rev() {
                    reversed.insert(key.clone(), reinsert_reversed(member));
                }
                Value::Object(reversed)
            }
            other => other.clone(),
        }
    }

    proptest! {
        #[test]
        fn canonical_text_is_a_fixed_point_of_reparsing(value in json_value()) {
            let text = canonical_json(&value).unwrap();
            let reparsed: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(canonical_json(&reparsed).unwrap(), text);
        }

        #[test]
        fn canonical_text_ignores_member_order(
            members in prop::collection::btree_map(any::<String>(), json_value(), 0..8)
                .prop_map(|m| m.into_iter().collect::<Vec<_>>())
                .prop_shuffle()
        ) {
            let in_order: Map<String, Value> = members.iter().cloned().collect();
            let reversed = reinsert_reversed(&Value::Object(in_order.clone()));
            let text = canonical_json(&Value::Object(in_order)).unwrap();
            prop_assert_eq!(canonical_json(&reversed).unwrap(), text.clone());
            // And the members come out in UTF-16 key order, each canonical on its own.
            let mut sorted = members.clone();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            let expected: Vec<String> = sorted
                .iter()
                .map(|(key, member)| {
                    format!("{}:{}", canonical_json(&json!(key)).unwrap(), canonical_json(member).unwrap())
                })
                .collect();
            prop_assert_eq!(text, format!("{{{}}}", expected.join(",")));
        }
    }
}
