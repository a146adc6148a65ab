//! What the product's source text may name: the domain names no runtime,
//! database, I/O, clock or randomness (not even in comments); only the
//! engine reads the wall clock or makes ids; the store crate's code holds
//! no SQL.

use std::path::PathBuf;
use toml_edit::Item;

use super::lexer::{blank, Blank};
use super::{
    crate_sources, files_under, is_rust, line_at, manifest, read, relative, root, token_occurrences, workspace_members,
};

/// Text that must not appear anywhere under `crates/domain/src`: async
/// runtimes, databases, files, sockets, the clock, and id generators (which
/// read the clock or randomness).
const DOMAIN_FORBIDDEN: &[&str] = &[
    "tokio",
    "sqlx",
    "std::fs",
    "std::net",
    "std::env",
    "std::process",
    "SystemTime",
    "Instant::now",
    "Utc::now",
    "Local::now",
    "now_v7",
    "new_v4",
    "rand::",
    "getrandom",
];

#[test]
fn domain_source_mentions_no_runtime_database_io_clock_or_randomness() {
    let files = crate_sources("crates/domain/src");
    let mut violations = Vec::new();
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue; // not text; cannot name a Rust item
        };
        for needle in DOMAIN_FORBIDDEN {
            for at in token_occurrences(&text, needle) {
                violations.push(format!("{}:{}: {needle}", relative(file), line_at(&text, at)));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "crates/domain/src must not mention async runtimes, databases, I/O, the clock or id generators \
         (not even in comments; crates/domain/clippy.toml is the one place that names them):\n{}",
        violations.join("\n")
    );
}

#[test]
fn token_scan_finds_forbidden_names_and_ignores_longer_identifiers() {
    // The purity scan above passes vacuously if the matcher never matches.
    assert_eq!(token_occurrences("use tokio::spawn;", "tokio"), vec![4]);
    assert_eq!(token_occurrences("let t = chrono::Utc::now();", "Utc::now"), vec![16]);
    assert_eq!(token_occurrences("// std::fs::read", "std::fs"), vec![3]);
    assert!(token_occurrences("brand::new()", "rand::").is_empty());
    assert!(token_occurrences("my_tokio_like", "tokio").is_empty());
}

/// Text that only the engine's library may hold among the product's
/// sources: the wall clock and id generators. The engine reads the clock
/// and makes ids through its `Clock` and `Ids`, which tests replace; a
/// crate above it that read the clock or made an id itself would record
/// times and ids no test can fix. `Instant::now` stays allowed: it only
/// measures durations, and nothing it reads is recorded.
const ENGINE_ONLY: &[&str] = &[
    "SystemTime::now",
    "Utc::now",
    "Local::now",
    "now_v1",
    "now_v6",
    "now_v7",
    "new_v4",
    "new_v7",
];

/// Occurrences of [`ENGINE_ONLY`] text outside the engine that are right
/// where they are: (file, text, why).
const ENGINE_ONLY_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "crates/media/src/settle.rs",
        "SystemTime::now",
        "settling compares a file's modification time, which the file system stamps from the wall \
         clock, with the wall clock: it decides when a file is read, and records no time",
    ),
    (
        "crates/store-postgres/src/scratch.rs",
        "new_v4",
        "a scratch schema's name, unique among concurrent replays and dropped with the schema: \
         never an id in the log",
    ),
];

/// The source folders of the product outside the engine: the binary's and
/// every published workspace member's library, tests, examples and
/// benches left out. Members with `publish = false` are tooling (the
/// testkit), not product.
fn product_sources_outside_the_engine() -> Vec<PathBuf> {
    let mut folders = vec![root().join("src")];
    for (name, dir) in workspace_members() {
        let doc = manifest(&format!("{dir}/Cargo.toml"));
        let published = doc
            .get("package")
            .and_then(|package| package.get("publish"))
            .and_then(Item::as_bool)
            != Some(false);
        if name != "opledger-engine" && published {
            folders.push(root().join(dir).join("src"));
        }
    }
    folders
}

#[test]
fn only_the_engine_reads_the_wall_clock_or_makes_ids() {
    let folders = product_sources_outside_the_engine();
    assert!(
        folders.iter().any(|folder| folder.ends_with("crates/ingest/src")),
        "the scan does not cover crates/ingest/src: is it looking in the right place? {folders:?}"
    );
    assert!(
        !folders.iter().any(|folder| folder.ends_with("crates/engine/src")),
        "the scan covers the engine, the one crate allowed to read the clock and make ids"
    );
    let mut violations = Vec::new();
    for folder in &folders {
        let mut files = Vec::new();
        files_under(folder, &mut files);
        for file in files.iter().filter(|file| is_rust(file)) {
            let text = read(file);
            let relative = relative(file);
            for needle in ENGINE_ONLY {
                if ENGINE_ONLY_ALLOWED
                    .iter()
                    .any(|(allowed, text, _)| *allowed == relative && text == needle)
                {
                    continue;
                }
                for at in token_occurrences(&text, needle) {
                    violations.push(format!("{relative}:{}: {needle}", line_at(&text, at)));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "only the engine reads the wall clock and makes ids (through Clock and Ids; `Engine::ids` \
         hands its id source to callers that name what they give a command); allow an occurrence \
         in ENGINE_ONLY_ALLOWED only with the reason it records nothing:\n{}",
        violations.join("\n")
    );
}

/// SQL keywords the store crate's code must not hold, as whole uppercase
/// words. A pair is a keyword that counts only with its second word later
/// on the same line (`UPDATE … SET`), where the word alone may be plain
/// English or a protocol's name; None: the word alone is SQL enough.
const SQL_KEYWORDS: &[(&str, Option<&str>)] = &[
    ("SELECT", None),
    ("INSERT", None),
    ("UPDATE", Some("SET")),
    ("DELETE", Some("FROM")),
    ("CREATE", Some("TABLE")),
    ("CREATE", Some("INDEX")),
    ("DROP", None),
    ("ALTER", None),
    ("WHERE", None),
];

/// The SQL keywords of [`SQL_KEYWORDS`] in `code` (comments already
/// removed), as (line, keyword) pairs.
fn sql_keywords(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in code.lines().enumerate() {
        let words: Vec<&str> = line
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|word| !word.is_empty())
            .collect();
        for (at, word) in words.iter().enumerate() {
            for (keyword, then) in SQL_KEYWORDS {
                if word != keyword {
                    continue;
                }
                match then {
                    None => found.push((number + 1, keyword.to_string())),
                    Some(then) if words[at + 1..].contains(then) => {
                        found.push((number + 1, format!("{keyword} … {then}")))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    found
}

#[test]
fn the_store_and_http_crates_hold_no_sql_outside_comments() {
    // The contract crate knows no database: SQL lives in the backends (and
    // the conformance suite's probes, a crate of its own). The HTTP service
    // calls the engine as the CLI does and never reaches under it.
    for folder in ["crates/store/src", "crates/http/src", "crates/supervise/src"] {
        let files = crate_sources(folder);
        assert!(!files.is_empty(), "{folder} has no sources: update this test");
        let mut violations = Vec::new();
        for file in files.iter().filter(|file| is_rust(file)) {
            // Comments go; string literals stay, since a statement is a string.
            for (line, keyword) in sql_keywords(&blank(&read(file), Blank::Comments)) {
                violations.push(format!("{}:{line}: {keyword}", relative(file)));
            }
        }
        assert!(
            violations.is_empty(),
            "{folder} must hold no SQL (the backends keep their statements):\n{}",
            violations.join("\n")
        );
    }
}

#[test]
fn sql_scan_finds_keywords_in_code_and_strings_and_skips_comments() {
    // The store scan above passes vacuously if the scanner never matches.
    let source = r####"
/// SELECT in a doc comment is prose.
// DELETE FROM t; in a line comment too.
/* UPDATE t SET x = 1 in a block comment */
let url = "postgres://host/db"; let sql = "SELECT seq FROM log WHERE seq > ?";
let quote = '"'; let raw = r#"DELETE FROM "log""#; // INSERT
let update = "UPDATE media SET path = ?";
fn for_each<'a>(items: &'a [u8]) { Update::Set; DROP_LIMIT; Select }
let ddl = "CREATE TABLE t (id TEXT)"; let lower = "update t set x"; let slash = '\\'; let tick = '\''; let s = "a \" WHERE";
"####;
    let found = sql_keywords(&blank(source, Blank::Comments));
    assert_eq!(
        found,
        vec![
            (5, "SELECT".to_string()),
            (5, "WHERE".to_string()),
            (6, "DELETE … FROM".to_string()),
            (7, "UPDATE … SET".to_string()),
            (9, "CREATE … TABLE".to_string()),
            (9, "WHERE".to_string()),
        ]
    );
    // Comments go, line by line, and code stays where it was.
    let stripped = blank("a // b\n/* c\n d */ e\n\"// f\"", Blank::Comments);
    assert_eq!(
        stripped.lines().collect::<Vec<_>>(),
        vec!["a     ", "    ", "      e", "\"// f\""]
    );
}
