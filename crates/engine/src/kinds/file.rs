//! The declaration file: TOML, one `[[kind]]` table per task kind, read
//! with serde so that a malformed file, an unknown field or a value of the
//! wrong type is refused with its line and column.

use crate::error::EngineError;
use opledger_domain::kinds::KindDeclaration;
use serde::Deserialize;
use std::collections::BTreeMap;

/// A parsed declaration file: its kinds as written (not yet normalized),
/// each with where its table starts.
#[derive(Debug, Clone, PartialEq)]
pub struct KindsDocument {
    pub kinds: Vec<LocatedKind>,
}

/// One `[[kind]]` table of a declaration file.
#[derive(Debug, Clone, PartialEq)]
pub struct LocatedKind {
    pub declaration: KindDeclaration,
    /// 1-based line and column of the table in the file (0 for a kind
    /// that was not read from a file).
    pub line: usize,
    pub column: usize,
}

impl LocatedKind {
    /// "line L, column C: " for a message about this kind, or nothing.
    pub(crate) fn at(&self) -> String {
        if self.line == 0 {
            String::new()
        } else {
            format!("line {}, column {}: ", self.line, self.column)
        }
    }
}

impl KindsDocument {
    /// Kinds declared in code rather than read from a file.
    pub fn of(declarations: Vec<KindDeclaration>) -> Self {
        KindsDocument {
            kinds: declarations
                .into_iter()
                .map(|declaration| LocatedKind {
                    declaration,
                    line: 0,
                    column: 0,
                })
                .collect(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    kind: Vec<toml::Spanned<KindDeclaration>>,
}

/// The longest declaration file read.
pub const MAX_KINDS_FILE_BYTES: usize = 1 << 20;

/// Parses a declaration file. Refuses, naming the line and column, a file
/// that is not TOML, an unknown field, a value of the wrong type, and a
/// kind named twice; what a declaration means is checked when it is
/// applied.
pub fn parse_kinds(text: &str) -> Result<KindsDocument, EngineError> {
    if text.len() > MAX_KINDS_FILE_BYTES {
        return Err(EngineError::invalid(format!(
            "a declaration file holds at most {MAX_KINDS_FILE_BYTES} bytes, not {}",
            text.len()
        )));
    }
    let file: File = toml::from_str(text).map_err(|error| {
        let at = error
            .span()
            .map(|span| {
                let (line, column) = line_column(text, span.start);
                format!("line {line}, column {column}: ")
            })
            .unwrap_or_default();
        EngineError::invalid(format!("{at}{}", bounded(error.message().trim())))
    })?;
    let mut kinds = Vec::with_capacity(file.kind.len());
    let mut seen: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for spanned in file.kind {
        let (line, column) = line_column(text, spanned.span().start);
        let declaration = spanned.into_inner();
        if let Some((first_line, _)) = seen.insert(declaration.name.clone(), (line, column)) {
            return Err(EngineError::invalid(format!(
                "line {line}, column {column}: task kind {:?} is declared twice (first at line {first_line})",
                declaration.name.chars().take(64).collect::<String>()
            )));
        }
        kinds.push(LocatedKind {
            declaration,
            line,
            column,
        });
    }
    Ok(KindsDocument { kinds })
}

/// The longest parser message shown: serde's messages quote the bad value
/// (an unknown variant, a wrong type), and a value may be as long as the file.
const MAX_MESSAGE_CHARS: usize = 200;

fn bounded(message: &str) -> String {
    if message.chars().count() <= MAX_MESSAGE_CHARS {
        message.to_string()
    } else {
        let head: String = message.chars().take(MAX_MESSAGE_CHARS).collect();
        format!("{head}…")
    }
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |last| last.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_read_with_where_they_start() {
        let text = "# pipeline\n[[kind]]\nname = \"caption\"\ntarget = \"media\"\nversion = \"2\"\n\
                    inputs.max_words = { type = \"integer\", min = 1, max = 200, default = 30 }\n\
                    retry = { max_attempts = 5, jitter = 0.25, exhausted = \"dead_lettered\" }\n\n\
                    [[kind]]\nname = \"lyrics\"\ntarget = \"media\"\nversion = \"1\"\nrequired = false\n";
        let document = parse_kinds(text).unwrap();
        assert_eq!(document.kinds.len(), 2);
        let caption = &document.kinds[0];
        assert_eq!(caption.declaration.name, "caption");
        assert_eq!(caption.declaration.retry.jitter_per_mille, 250);
        assert_eq!(caption.declaration.inputs["max_words"].max, Some(200));
        assert_eq!((caption.line, document.kinds[1].line), (2, 9));
        assert!(!document.kinds[1].declaration.required);
    }

    #[test]
    fn a_bad_file_is_refused_with_its_line_and_column() {
        let cases = [
            (
                "[[kind]]\nname = \"a\"\ntarget = \"media\"\nversion = \"1\"\ncolour = \"red\"\n",
                "line 5",
            ),
            ("[[kind]]\nname = \"a\"\ntarget = \"disk\"\nversion = \"1\"\n", "line 3"),
            ("[[kind]\nname = \"a\"\n", "line 1"),
            (
                "[[kind]]\nname = \"a\"\ntarget = \"media\"\nversion = \"1\"\n\
              [[kind]]\nname = \"a\"\ntarget = \"media\"\nversion = \"2\"\n",
                "declared twice (first at line 1)",
            ),
            ("[[kinds]]\nname = \"a\"\n", "line 1"),
        ];
        for (text, expected) in cases {
            let message = parse_kinds(text).unwrap_err().to_string();
            assert!(message.contains(expected), "{text:?}: {message}");
        }
    }

    #[test]
    fn a_long_bad_value_is_quoted_short() {
        let long = "d".repeat(100_000);
        let text = format!("[[kind]]\nname = \"a\"\ntarget = \"{long}\"\nversion = \"1\"\n");
        let message = parse_kinds(&text).unwrap_err().to_string();
        assert!(message.contains("line 3"), "{message}");
        assert!(message.len() < 400, "{} bytes echoed", message.len());
    }
}
