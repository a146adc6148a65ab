//! Just enough of Rust's lexical grammar to tell code from comments and
//! literals, for the scans that read source text: the SQL scan looks at
//! code and string literals (a statement is a string), the module cycle
//! check at code alone (a path in a doc comment or an error message names
//! nothing).

use std::ops::Range;

/// What a stretch of source text is, as far as the scans care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Code,
    /// Line, doc and (nested) block comments.
    Comment,
    /// String, raw string, byte string and character literals.
    Literal,
}

/// What [`blank`] turns into spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blank {
    /// Comments only: code and literals stay.
    Comments,
    /// Comments and literals: code alone stays.
    CommentsAndLiterals,
}

/// `text` with the pieces `what` names replaced by spaces, byte for byte,
/// newlines kept: offsets into the result are offsets into `text`, and its
/// lines are `text`'s lines.
pub fn blank(text: &str, what: Blank) -> String {
    let mut out = String::with_capacity(text.len());
    for (kind, range) in pieces(text) {
        let gone = match what {
            Blank::Comments => kind == Kind::Comment,
            Blank::CommentsAndLiterals => kind != Kind::Code,
        };
        if gone {
            for c in text[range].chars() {
                if c == '\n' {
                    out.push('\n');
                } else {
                    out.extend(std::iter::repeat_n(' ', c.len_utf8()));
                }
            }
        } else {
            out.push_str(&text[range]);
        }
    }
    out
}

/// `text` cut into consecutive pieces of code, comments and literals, as
/// byte ranges that together cover it. Unterminated comments and literals
/// run to the end of the text.
pub fn pieces(text: &str) -> Vec<(Kind, Range<usize>)> {
    let chars: Vec<char> = text.chars().collect();
    let offsets: Vec<usize> = text
        .char_indices()
        .map(|(offset, _)| offset)
        .chain([text.len()])
        .collect();
    let mut pieces = Vec::new();
    let mut code_from = 0;
    let mut i = 0;
    while i < chars.len() {
        let Some((kind, end)) = special_at(&chars, i) else {
            i += 1;
            continue;
        };
        if code_from < i {
            pieces.push((Kind::Code, offsets[code_from]..offsets[i]));
        }
        pieces.push((kind, offsets[i]..offsets[end]));
        i = end;
        code_from = end;
    }
    if code_from < chars.len() {
        pieces.push((Kind::Code, offsets[code_from]..text.len()));
    }
    pieces
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The comment or literal that starts at char `i`, with the index after
/// it; None when code starts there.
fn special_at(chars: &[char], i: usize) -> Option<(Kind, usize)> {
    let at = |n: usize| chars.get(n).copied();
    let starts_token = |n: usize| n == 0 || !is_ident(chars[n - 1]);
    match chars[i] {
        '/' if at(i + 1) == Some('/') => {
            let end = chars[i..]
                .iter()
                .position(|c| *c == '\n')
                .map_or(chars.len(), |n| i + n);
            Some((Kind::Comment, end))
        }
        '/' if at(i + 1) == Some('*') => {
            let mut depth = 0;
            let mut j = i;
            while j < chars.len() {
                if chars[j] == '/' && at(j + 1) == Some('*') {
                    depth += 1;
                    j += 2;
                } else if chars[j] == '*' && at(j + 1) == Some('/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            Some((Kind::Comment, j.min(chars.len())))
        }
        // A raw string, r"…", r#"…"#, …, or br"…" and cr"…" (an identifier
        // that ends in r, `for` or `ptr`, starts none; `r#ident` is a raw
        // identifier, not a string).
        'r' if starts_token(i) || (i > 0 && matches!(chars[i - 1], 'b' | 'c') && starts_token(i - 1)) => {
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            if at(i + 1 + hashes) != Some('"') {
                return None;
            }
            let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let mut j = i + 2 + hashes;
            while j < chars.len() && !chars[j..].starts_with(&close) {
                j += 1;
            }
            Some((Kind::Literal, (j + close.len()).min(chars.len())))
        }
        '"' => Some((Kind::Literal, quoted_end(chars, i, '"'))),
        // A character literal ('a', '\'', '\u{1F600}'); a lifetime ('a)
        // has no closing quote right after one character.
        '\'' if at(i + 1) == Some('\\') || at(i + 2) == Some('\'') => Some((Kind::Literal, quoted_end(chars, i, '\''))),
        _ => None,
    }
}

/// The index after the literal that opens with `quote` at `i` and closes
/// with the next unescaped `quote`.
fn quoted_end(chars: &[char], i: usize, quote: char) -> usize {
    let mut j = i + 1;
    while j < chars.len() && chars[j] != quote {
        j += if chars[j] == '\\' { 2 } else { 1 };
    }
    (j + 1).min(chars.len())
}

#[test]
fn the_lexer_tells_comments_and_literals_from_code() {
    let source = concat!(
        "let url = \"http://host/db\"; // a comment\n",
        "/* outer /* inner */ still outer */ let x = 1;\n",
        "let raw = r##\"a \"# quote and // no comment\"##; let y = 2;\n",
        "let bytes = br#\"b\"#; for_r(1); r#type;\n",
        "fn f<'a>(s: &'a str) -> (char, char, char) { ('\"', '\\'', '\\u{e9}') }\n",
        "let s = \"esc \\\" // still a string\"; // é\n",
    );
    let kinds: Vec<(Kind, &str)> = pieces(source)
        .into_iter()
        .filter(|(kind, _)| *kind != Kind::Code)
        .map(|(kind, range)| (kind, &source[range]))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (Kind::Literal, "\"http://host/db\""),
            (Kind::Comment, "// a comment"),
            (Kind::Comment, "/* outer /* inner */ still outer */"),
            (Kind::Literal, "r##\"a \"# quote and // no comment\"##"),
            (Kind::Literal, "r#\"b\"#"),
            (Kind::Literal, "'\"'"),
            (Kind::Literal, "'\\''"),
            (Kind::Literal, "'\\u{e9}'"),
            (Kind::Literal, "\"esc \\\" // still a string\""),
            (Kind::Comment, "// é"),
        ]
    );
    let comments_gone = blank(source, Blank::Comments);
    let code_only = blank(source, Blank::CommentsAndLiterals);
    for blanked in [&comments_gone, &code_only] {
        assert_eq!(blanked.len(), source.len(), "offsets must stay those of the source");
        assert_eq!(blanked.lines().count(), source.lines().count());
    }
    assert_eq!(
        comments_gone.lines().collect::<Vec<_>>(),
        vec![
            "let url = \"http://host/db\";             ",
            "                                    let x = 1;",
            "let raw = r##\"a \"# quote and // no comment\"##; let y = 2;",
            "let bytes = br#\"b\"#; for_r(1); r#type;",
            "fn f<'a>(s: &'a str) -> (char, char, char) { ('\"', '\\'', '\\u{e9}') }",
            "let s = \"esc \\\" // still a string\";      ",
        ]
    );
    assert_eq!(
        code_only.lines().map(str::trim_end).collect::<Vec<_>>(),
        vec![
            "let url =                 ;",
            "                                    let x = 1;",
            "let raw =                                    ; let y = 2;",
            "let bytes = b      ; for_r(1); r#type;",
            "fn f<'a>(s: &'a str) -> (char, char, char) { (   ,     ,         ) }",
            "let s =                           ;",
        ]
    );
}
