//! Mechanical checks of the crate boundaries that the code relies on but the
//! compiler does not enforce: the domain crate stays pure (no async runtime,
//! no database, no I/O, no clock, no randomness), only the engine reads the
//! wall clock and makes ids, only the backend crates know a database
//! driver, the testkit stays a test-only dependency, and no product crate
//! links the benchmarks.
//!
//! Manifests are read with `toml_edit`, so inline tables, dotted keys,
//! `[dependencies.x]` tables and target-specific sections are all seen.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use toml_edit::{DocumentMut, Item, TableLike};

/// The only crates the domain may depend on.
const DOMAIN_ALLOWED: &[&str] = &[
    "serde",
    "serde_json",
    "sha2",
    "chrono",
    "uuid",
    "thiserror",
    // ECMAScript number-to-string for RFC 8785 canonical JSON (revisions):
    // pure arithmetic on an f64 into a stack buffer, no dependencies, no I/O.
    "ryu-js",
    // A fast hasher for the working set, with its fixed seed only (its
    // RandomState is a disallowed type in crates/domain/clippy.toml).
    "foldhash",
];

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

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn manifest(relative: &str) -> DocumentMut {
    let path = root().join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
    text.parse()
        .unwrap_or_else(|error| panic!("{} is not valid TOML: {error}", path.display()))
}

/// Every dependency a crate builds its library with, by name, with its
/// manifest entry: `[dependencies]`, `[build-dependencies]` and their
/// `[target.'cfg(..)'.*]` forms. Dev-dependencies only build tests.
fn build_dependencies(doc: &DocumentMut) -> BTreeMap<String, Item> {
    let mut found = BTreeMap::new();
    let mut collect = |table: Option<&dyn TableLike>| {
        if let Some(table) = table {
            for (name, item) in table.iter() {
                // `package = "real-name"` renames a dependency; the real name counts.
                let real = item
                    .as_table_like()
                    .and_then(|entry| entry.get("package"))
                    .and_then(Item::as_str)
                    .unwrap_or(name);
                found.insert(real.to_string(), item.clone());
            }
        }
    };
    for section in ["dependencies", "build-dependencies"] {
        collect(doc.get(section).and_then(Item::as_table_like));
    }
    if let Some(targets) = doc.get("target").and_then(Item::as_table_like) {
        for (_, target) in targets.iter() {
            for section in ["dependencies", "build-dependencies"] {
                collect(target.get(section).and_then(Item::as_table_like));
            }
        }
    }
    found
}

fn string_array(item: Option<&Item>) -> Vec<String> {
    item.and_then(Item::as_array)
        .map(|array| {
            array
                .iter()
                .filter_map(|value| value.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The features a member's dependency entry turns on, with whether default
/// features stay on, after merging `workspace = true` with the workspace's
/// `[workspace.dependencies]` entry the way Cargo does (features add up;
/// `default-features` comes from the workspace entry).
fn effective_features(entry: &Item, name: &str) -> (BTreeSet<String>, bool) {
    let mut features: BTreeSet<String> = BTreeSet::new();
    let mut default_features = true;
    let Some(table) = entry.as_table_like() else {
        // `name = "1"`: default features, nothing more.
        return (features, default_features);
    };
    features.extend(string_array(table.get("features")));
    if let Some(flag) = table.get("default-features").and_then(Item::as_bool) {
        default_features = flag;
    }
    if table.get("workspace").and_then(Item::as_bool) == Some(true) {
        let workspace = manifest("Cargo.toml");
        let inherited = workspace
            .get("workspace")
            .and_then(|item| item.get("dependencies"))
            .and_then(|item| item.get(name))
            .unwrap_or_else(|| panic!("{name} says workspace = true but the workspace does not declare it"));
        if let Some(inherited) = inherited.as_table_like() {
            features.extend(string_array(inherited.get("features")));
            default_features = inherited
                .get("default-features")
                .and_then(Item::as_bool)
                .unwrap_or(true);
        } else {
            default_features = true;
        }
    }
    (features, default_features)
}

#[test]
fn domain_depends_only_on_the_pure_allowlist() {
    let doc = manifest("crates/domain/Cargo.toml");
    let dependencies = build_dependencies(&doc);
    assert!(
        !dependencies.is_empty(),
        "the domain manifest lists no dependencies at all: is the parser broken?"
    );
    let outside: Vec<&String> = dependencies
        .keys()
        .filter(|name| !DOMAIN_ALLOWED.contains(&name.as_str()))
        .collect();
    assert!(
        outside.is_empty(),
        "crates/domain must stay pure; it may depend only on {DOMAIN_ALLOWED:?}, but it also depends on {outside:?}"
    );
}

#[test]
fn domain_chrono_cannot_read_the_clock() {
    let doc = manifest("crates/domain/Cargo.toml");
    let dependencies = build_dependencies(&doc);
    let chrono = dependencies
        .get("chrono")
        .expect("the domain uses chrono for timestamps");
    let (features, default_features) = effective_features(chrono, "chrono");
    // chrono's default features include `clock`, which pulls in `now`.
    assert!(
        !default_features,
        "crates/domain gets chrono with default features, which include `clock`; set default-features = false"
    );
    for forbidden in ["clock", "now"] {
        assert!(
            !features.contains(forbidden),
            "crates/domain enables chrono's `{forbidden}` feature ({features:?}); time must arrive in commands"
        );
    }
}

#[test]
fn domain_uuid_cannot_generate_ids() {
    let doc = manifest("crates/domain/Cargo.toml");
    let dependencies = build_dependencies(&doc);
    let uuid = dependencies.get("uuid").expect("the domain uses uuid for ids");
    let (features, _) = effective_features(uuid, "uuid");
    // uuid's default features are only `std`; generators are opt-in.
    for forbidden in ["v1", "v3", "v4", "v5", "v6", "v7", "v8", "rng", "fast-rng"] {
        assert!(
            !features.contains(forbidden),
            "crates/domain enables uuid's `{forbidden}` feature ({features:?}); ids must arrive in commands"
        );
    }
}

fn files_under(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|error| panic!("listing {}: {error}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            files_under(&path, found);
        } else {
            found.push(path);
        }
    }
}

/// Every file under a crate's source folder (`relative` to the workspace),
/// which must hold a `lib.rs`: a scan that finds none looks in the wrong place.
fn crate_sources(relative: &str) -> Vec<PathBuf> {
    let src = root().join(relative);
    let mut files = Vec::new();
    files_under(&src, &mut files);
    assert!(
        files.iter().any(|file| file.ends_with("lib.rs")),
        "found no lib.rs under {}: is the scan looking in the right place?",
        src.display()
    );
    files
}

/// Where `needle` occurs in `text` as the start of a token (not inside a
/// longer identifier such as `brand::`).
fn token_occurrences(text: &str, needle: &str) -> Vec<usize> {
    text.match_indices(needle)
        .filter(|(at, _)| {
            !text[..*at]
                .chars()
                .next_back()
                .is_some_and(|before| before.is_alphanumeric() || before == '_')
        })
        .map(|(at, _)| at)
        .collect()
}

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
                let line = text[..at].matches('\n').count() + 1;
                violations.push(format!(
                    "{}:{line}: {needle}",
                    file.strip_prefix(root()).unwrap_or(file).display()
                ));
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
        for file in files
            .iter()
            .filter(|file| file.extension().is_some_and(|ext| ext == "rs"))
        {
            let text =
                std::fs::read_to_string(file).unwrap_or_else(|error| panic!("reading {}: {error}", file.display()));
            let relative = file.strip_prefix(root()).unwrap_or(file).display().to_string();
            for needle in ENGINE_ONLY {
                if ENGINE_ONLY_ALLOWED
                    .iter()
                    .any(|(allowed, text, _)| *allowed == relative && text == needle)
                {
                    continue;
                }
                for at in token_occurrences(&text, needle) {
                    let line = text[..at].matches('\n').count() + 1;
                    violations.push(format!("{relative}:{line}: {needle}"));
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

/// The workspace members by package name, with their folders.
fn workspace_members() -> BTreeMap<String, String> {
    let workspace = manifest("Cargo.toml");
    let members = string_array(workspace.get("workspace").and_then(|item| item.get("members")));
    assert!(
        !members.is_empty(),
        "the workspace lists no members: is the parser broken?"
    );
    members
        .into_iter()
        .map(|dir| {
            let doc = manifest(&format!("{dir}/Cargo.toml"));
            let name = doc
                .get("package")
                .and_then(|package| package.get("name"))
                .and_then(Item::as_str)
                .unwrap_or_else(|| panic!("{dir}/Cargo.toml has no package name"))
                .to_string();
            (name, dir)
        })
        .collect()
}

/// Every crate a member's library is built with, directly or through other
/// workspace members (external crates are listed, not followed).
fn library_dependency_closure(member: &str) -> BTreeSet<String> {
    let members = workspace_members();
    let mut seen = BTreeSet::new();
    let mut pending = vec![member.to_string()];
    while let Some(name) = pending.pop() {
        let dir = members
            .get(&name)
            .unwrap_or_else(|| panic!("{name} is not a workspace member"));
        let doc = manifest(&format!("{dir}/Cargo.toml"));
        for dependency in build_dependencies(&doc).into_keys() {
            if seen.insert(dependency.clone()) && members.contains_key(&dependency) {
                pending.push(dependency);
            }
        }
    }
    seen
}

#[test]
fn only_backend_crates_depend_on_database_drivers() {
    for member in [
        "opledger-domain",
        "opledger-store",
        "opledger-engine",
        "opledger-worker",
        "opledger-media",
        "opledger-ingest",
    ] {
        let closure = library_dependency_closure(member);
        for forbidden in [
            "sqlx",
            "opledger-store-sqlite",
            "opledger-store-postgres",
            "rusqlite",
            "libsqlite3-sys",
        ] {
            assert!(
                !closure.contains(forbidden),
                "{member} must not know a database driver or backend, but its library depends on {forbidden} \
                 (directly or through another workspace crate): {closure:?}"
            );
        }
    }
    // The backends do, which also shows the closure sees real dependencies.
    for backend in ["opledger-store-sqlite", "opledger-store-postgres"] {
        assert!(
            library_dependency_closure(backend).contains("sqlx"),
            "{backend} should depend on sqlx; if it no longer does, update this test"
        );
    }
}

#[test]
fn the_testkit_is_only_ever_a_dev_dependency() {
    // The testkit opens databases of every backend; a library that depended
    // on it would know every driver, and the engine's tests would link a
    // second copy of anything the testkit depended on.
    let members = workspace_members();
    assert!(
        members.contains_key("opledger-testkit"),
        "the testkit is not a workspace member: update this test"
    );
    for member in members.keys().filter(|name| name.as_str() != "opledger-testkit") {
        let closure = library_dependency_closure(member);
        assert!(
            !closure.contains("opledger-testkit"),
            "{member}'s library depends on opledger-testkit; it is for tests only (dev-dependencies)"
        );
    }
    let binary = build_dependencies(&manifest("Cargo.toml"));
    assert!(
        !binary.contains_key("opledger-testkit"),
        "the opledger binary depends on opledger-testkit; it is for tests only (dev-dependencies)"
    );
    // Nor may the testkit know the engine: the engine's tests depend on it.
    let testkit = library_dependency_closure("opledger-testkit");
    for forbidden in ["opledger-engine", "opledger-worker"] {
        assert!(
            !testkit.contains(forbidden),
            "opledger-testkit must not depend on {forbidden}: {testkit:?}"
        );
    }
}

#[test]
fn no_product_crate_depends_on_the_benchmarks_or_builds_with_tempfile() {
    // Measurement code, its raw SQL and its temporary folders stay out of
    // what a library user links; only the binary runs `opledger bench`.
    let members = workspace_members();
    assert!(
        members.contains_key("opledger-bench"),
        "the bench crate is not a workspace member: update this test"
    );
    let product = members
        .keys()
        .filter(|name| !["opledger-bench", "opledger-testkit"].contains(&name.as_str()));
    for member in product {
        let closure = library_dependency_closure(member);
        assert!(
            !closure.contains("opledger-bench"),
            "{member}'s library depends on opledger-bench (directly or through another workspace crate); \
             measurement belongs in crates/bench, which only the binary uses: {closure:?}"
        );
        let direct = build_dependencies(&manifest(&format!("{}/Cargo.toml", members[member])));
        assert!(
            !direct.contains_key("tempfile"),
            "{member} builds its library with tempfile; temporary folders are for tests and benchmarks"
        );
    }
    let binary = build_dependencies(&manifest("Cargo.toml"));
    assert!(
        binary.contains_key("opledger-bench"),
        "the binary no longer depends on opledger-bench: is `opledger bench` gone? update this test"
    );
    assert!(
        !binary.contains_key("tempfile"),
        "the opledger binary builds with tempfile directly; its benchmark folders are opledger-bench's"
    );
}

#[test]
fn readme_test_command_is_exactly_what_ci_runs() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let ci = std::fs::read_to_string(root().join(".ci/run")).expect(".ci/run");
    // The README opens with a shell block: the main job, then the tests.
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README.md opens with a ```sh block");
    let commands: Vec<&str> = block
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|line| !line.is_empty())
        .collect();
    assert_eq!(
        commands.len(),
        2,
        "README's first block should hold exactly two commands: {commands:?}"
    );
    let test_command = commands[1];
    assert!(
        test_command.starts_with("cargo test"),
        "README's second command is not the tests: {test_command}"
    );
    let ci_tests: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("cargo test"))
        .collect();
    assert_eq!(
        ci_tests,
        vec![test_command],
        ".ci/run must run exactly README's test command, and only it"
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

/// `text` with every comment blanked out (line comments, doc comments and
/// block comments) and everything else kept, string literals included, so
/// a scan sees code and strings on their own lines.
fn without_comments(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut index = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while index < chars.len() {
        let c = chars[index];
        let next = chars.get(index + 1).copied();
        if c == '/' && next == Some('/') {
            while index < chars.len() && chars[index] != '\n' {
                out.push(' ');
                index += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while index < chars.len() {
                if chars[index] == '/' && chars.get(index + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    index += 2;
                } else if chars[index] == '*' && chars.get(index + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    index += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[index]));
                    index += 1;
                }
            }
        } else if c == '"' || (c == 'r' && matches!(next, Some('"') | Some('#'))) {
            // A string literal, raw or not: kept whole, so a `//` inside it
            // is not taken for a comment.
            let raw = c == 'r';
            let mut hashes = 0;
            out.push(c);
            index += 1;
            if raw {
                while chars.get(index) == Some(&'#') {
                    hashes += 1;
                    out.push('#');
                    index += 1;
                }
                if chars.get(index) != Some(&'"') {
                    continue; // `r#ident` or a name ending in r: not a string
                }
                out.push('"');
                index += 1;
            }
            while index < chars.len() {
                let c = chars[index];
                out.push(c);
                index += 1;
                if !raw && c == '\\' {
                    if let Some(&escaped) = chars.get(index) {
                        out.push(escaped);
                        index += 1;
                    }
                } else if c == '"' && chars[index..].iter().take(hashes).filter(|c| **c == '#').count() == hashes {
                    for _ in 0..hashes {
                        out.push('#');
                        index += 1;
                    }
                    break;
                }
            }
        } else if c == '\'' {
            // A char literal ('"', '\'') is kept as it is; a lifetime is
            // just the quote.
            let length = match (next, chars.get(index + 2)) {
                (Some('\\'), _) => chars[(index + 3).min(chars.len())..]
                    .iter()
                    .position(|c| *c == '\'')
                    .map_or(1, |end| end + 4),
                (Some(_), Some('\'')) => 3,
                _ => 1,
            };
            for c in &chars[index..(index + length).min(chars.len())] {
                out.push(*c);
            }
            index += length;
        } else {
            out.push(c);
            index += 1;
        }
        // Identifiers that end in `r` (`for`, `ptr`) are not raw strings.
        if c.is_alphanumeric() || c == '_' {
            while let Some(&c) = chars.get(index) {
                if c.is_alphanumeric() || c == '_' {
                    out.push(c);
                    index += 1;
                } else {
                    break;
                }
            }
        }
    }
    out
}

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
fn the_store_crate_holds_no_sql_outside_comments() {
    // The contract crate knows no database: SQL lives in the backends (and
    // the conformance suite's probes, a crate of its own).
    let files = crate_sources("crates/store/src");
    let mut violations = Vec::new();
    for file in files
        .iter()
        .filter(|file| file.extension().is_some_and(|ext| ext == "rs"))
    {
        let text = std::fs::read_to_string(file).unwrap_or_else(|error| panic!("reading {}: {error}", file.display()));
        for (line, keyword) in sql_keywords(&without_comments(&text)) {
            violations.push(format!(
                "{}:{line}: {keyword}",
                file.strip_prefix(root()).unwrap_or(file).display()
            ));
        }
    }
    assert!(
        violations.is_empty(),
        "crates/store/src must hold no SQL (the backends keep their statements):\n{}",
        violations.join("\n")
    );
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
    let found = sql_keywords(&without_comments(source));
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
    let stripped = without_comments("a // b\n/* c\n d */ e\n\"// f\"");
    assert_eq!(
        stripped.lines().collect::<Vec<_>>(),
        vec!["a     ", "    ", "      e", "\"// f\""]
    );
}

#[test]
fn the_conformance_suite_is_a_test_crate_that_knows_no_driver() {
    // The suite reaches a database only through the harness a backend's
    // tests give it, and no product library links it (the testkit, itself
    // test-only, re-exports its `Harness`).
    let members = workspace_members();
    assert!(
        members.contains_key("opledger-store-conformance"),
        "the conformance suite is not a workspace member: update this test"
    );
    for member in members
        .keys()
        .filter(|name| !["opledger-store-conformance", "opledger-testkit"].contains(&name.as_str()))
    {
        let closure = library_dependency_closure(member);
        assert!(
            !closure.contains("opledger-store-conformance"),
            "{member}'s library depends on opledger-store-conformance; it is for tests only (dev-dependencies)"
        );
    }
    let binary = build_dependencies(&manifest("Cargo.toml"));
    assert!(
        !binary.contains_key("opledger-store-conformance"),
        "the opledger binary depends on opledger-store-conformance; it is for tests only"
    );
    let suite = library_dependency_closure("opledger-store-conformance");
    assert!(
        suite.contains("opledger-store"),
        "the closure sees no dependencies: {suite:?}"
    );
    for forbidden in [
        "sqlx",
        "rusqlite",
        "libsqlite3-sys",
        "opledger-store-sqlite",
        "opledger-store-postgres",
    ] {
        assert!(
            !suite.contains(forbidden),
            "opledger-store-conformance must not know a driver or backend, but depends on {forbidden}"
        );
    }
}

/// A module of a crate, by its path from the crate root (`[]` is the root).
type ModulePath = Vec<String>;

/// The module a source file under a crate's `src` holds: `lib.rs` is the
/// root, `foo.rs` and `foo/mod.rs` are `foo`, `foo/bar.rs` is `foo::bar`.
fn module_of_file(relative: &Path) -> ModulePath {
    let mut parts: Vec<String> = relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap_or_default();
    match file.strip_suffix(".rs") {
        Some("mod" | "lib" | "main") => {}
        Some(stem) => parts.push(stem.to_string()),
        None => parts.push(file),
    }
    parts
}

/// `text` with comments, string and character literals blanked out
/// (newlines kept, so offsets still give line numbers): a path in a doc
/// comment or an error message names nothing.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let rest = |n: usize| chars.get(i + n).copied();
        if chars[i] == '/' && rest(1) == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if chars[i] == '/' && rest(1) == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if chars[i] == 'r'
            && matches!(rest(1), Some('"' | '#'))
            && !chars[..i].last().is_some_and(|c| c.is_alphanumeric() || *c == '_')
        {
            // A raw string: r"…", r#"…"#, …
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(chars[i]);
                i += 1;
                continue;
            }
            let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let start = i;
            i += 2 + hashes;
            while i < chars.len() && !chars[i..].starts_with(&close) {
                i += 1;
            }
            i = (i + close.len()).min(chars.len());
            out.extend(chars[start..i].iter().map(|c| blank(*c)));
        } else if chars[i] == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if chars[i] == '\'' && (rest(1) == Some('\\') || rest(2) == Some('\'')) {
            // A character literal ('a', '\n', '\u{1F600}'); a lifetime
            // ('a) has no closing quote right after one character.
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(chars.len());
            out.extend(chars[start..i].iter().map(|c| blank(*c)));
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// Every path a file's code names through `crate::`, `super::` or `self::`
/// (use declarations with their `{…}` groups, and paths in expressions and
/// types), resolved against the file's module `at`, with its line.
fn named_paths(source: &str, at: &[String]) -> Vec<(ModulePath, usize)> {
    let code = code_only(source);
    let tokens: Vec<(usize, String)> = {
        let mut tokens = Vec::new();
        let bytes: Vec<(usize, char)> = code.char_indices().collect();
        let mut i = 0;
        while i < bytes.len() {
            let (offset, c) = bytes[i];
            if c.is_alphanumeric() || c == '_' {
                let start = i;
                while i < bytes.len() && (bytes[i].1.is_alphanumeric() || bytes[i].1 == '_') {
                    i += 1;
                }
                tokens.push((offset, bytes[start..i].iter().map(|(_, c)| *c).collect()));
            } else if c == ':' && bytes.get(i + 1).map(|b| b.1) == Some(':') {
                tokens.push((offset, "::".to_string()));
                i += 2;
            } else if c.is_whitespace() {
                i += 1;
            } else {
                tokens.push((offset, c.to_string()));
                i += 1;
            }
        }
        tokens
    };
    let line_of = |offset: usize| code[..offset].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let word = tokens[i].1.as_str();
        let preceded_by_path = i > 0 && tokens[i - 1].1 == "::";
        if preceded_by_path
            || !matches!(word, "crate" | "super" | "self")
            || tokens.get(i + 1).map(|t| t.1.as_str()) != Some("::")
        {
            i += 1;
            continue;
        }
        let mut base: ModulePath = at.to_vec();
        let mut j = i;
        if word == "crate" {
            base.clear();
            j += 2;
        } else {
            while j + 1 < tokens.len() && matches!(tokens[j].1.as_str(), "super" | "self") && tokens[j + 1].1 == "::" {
                if tokens[j].1 == "super" {
                    base.pop();
                }
                j += 2;
            }
        }
        let line = line_of(tokens[i].0);
        let end = use_tree(&tokens, j, base, line, &mut found);
        i = end.max(i + 1);
    }
    found
}

/// Reads one use tree (or plain path) starting at token `i` under `prefix`,
/// pushing each complete path; returns the index after it.
fn use_tree(
    tokens: &[(usize, String)],
    mut i: usize,
    prefix: ModulePath,
    line: usize,
    found: &mut Vec<(ModulePath, usize)>,
) -> usize {
    let is_ident = |i: usize| {
        tokens
            .get(i)
            .is_some_and(|t| t.1.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_'))
    };
    match tokens.get(i).map(|t| t.1.as_str()) {
        Some("{") => {
            i += 1;
            loop {
                match tokens.get(i).map(|t| t.1.as_str()) {
                    None => return i,
                    Some("}") => return i + 1,
                    Some(",") => i += 1,
                    _ => i = use_tree(tokens, i, prefix.clone(), line, found),
                }
            }
        }
        Some("*") => {
            found.push((prefix, line));
            i + 1
        }
        Some("self") => {
            found.push((prefix, line));
            i + 1
        }
        _ if is_ident(i) => {
            let mut path = prefix;
            path.push(tokens[i].1.clone());
            match tokens.get(i + 1).map(|t| t.1.as_str()) {
                Some("::") => use_tree(tokens, i + 2, path, line, found),
                // `x as y`: the name it is given is no path.
                Some("as") => {
                    found.push((path, line));
                    i + 3
                }
                _ => {
                    found.push((path, line));
                    i + 1
                }
            }
        }
        _ => {
            found.push((prefix, line));
            i + 1
        }
    }
}

/// The module cycles among a crate's source files (paths relative to its
/// `src`, with their text), each named as `a → b → a` with where each step
/// is named.
///
/// The rule: a module depends on another when its code names a path into
/// it through `crate::`, `super::` or `self::`; the path's longest prefix
/// that is a module is the one it names (`crate::Engine`, an item of the
/// root, names the root). A module and its own ancestors are one room with
/// respect to each other, so those edges are not counted: a parent declares
/// and re-exports its children, and children use what their parent shares
/// (the crate root declares every module and holds `Engine`, which every
/// command module extends). Submodules are otherwise modules of their own:
/// two siblings that name each other, directly or around a longer circle,
/// are a cycle. Paths without those prefixes (a parent's `mod x; pub use
/// x::…`) only ever name the file's own children.
fn module_cycles(files: &[(PathBuf, String)]) -> Vec<String> {
    let modules: BTreeSet<ModulePath> = files.iter().map(|(path, _)| module_of_file(path)).collect();
    // from → to → the first place `from` names `to`.
    let mut edges: BTreeMap<ModulePath, BTreeMap<ModulePath, String>> = BTreeMap::new();
    for (path, source) in files {
        let from = module_of_file(path);
        for (named, line) in named_paths(source, &from) {
            let to = (0..=named.len())
                .rev()
                .map(|len| named[..len].to_vec())
                .find(|prefix| modules.contains(prefix))
                .unwrap_or_default();
            let related = from.starts_with(&to) || to.starts_with(&from);
            if !related {
                edges
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| format!("{}:{line}", path.display()));
            }
        }
    }
    let name = |module: &ModulePath| {
        if module.is_empty() {
            "crate".to_string()
        } else {
            module.join("::")
        }
    };
    // For each module, the shortest way back to itself (breadth first);
    // a cycle is reported once, from its smallest module.
    let mut cycles = Vec::new();
    let mut reported: BTreeSet<BTreeSet<ModulePath>> = BTreeSet::new();
    for start in &modules {
        let mut came_from: BTreeMap<ModulePath, ModulePath> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.clone()]);
        let mut closing = None;
        while let Some(module) = queue.pop_front() {
            for next in edges.get(&module).into_iter().flat_map(BTreeMap::keys) {
                if next == start {
                    closing = Some(module.clone());
                    break;
                }
                if !came_from.contains_key(next) {
                    came_from.insert(next.clone(), module.clone());
                    queue.push_back(next.clone());
                }
            }
            if closing.is_some() {
                break;
            }
        }
        let Some(mut last) = closing else { continue };
        let mut path = vec![start.clone()];
        while &last != start {
            path.push(last.clone());
            last = came_from[&last].clone();
        }
        // Walked backwards from the module that closes the circle.
        path[1..].reverse();
        path.push(start.clone());
        if !reported.insert(path.iter().cloned().collect()) {
            continue;
        }
        let steps: Vec<String> = path
            .windows(2)
            .map(|step| {
                format!(
                    "{} → {} ({})",
                    name(&step[0]),
                    name(&step[1]),
                    edges[&step[0]][&step[1]]
                )
            })
            .collect();
        cycles.push(format!(
            "{}: {}",
            path.iter().map(name).collect::<Vec<_>>().join(" → "),
            steps.join(", ")
        ));
    }
    cycles
}

/// The Rust source files of one crate's `src`, relative to it, with their text.
fn crate_source_texts(crate_dir: &str) -> Vec<(PathBuf, String)> {
    let src = root().join(crate_dir).join("src");
    let mut files = Vec::new();
    files_under(&src, &mut files);
    files
        .into_iter()
        .filter(|file| file.extension().is_some_and(|ext| ext == "rs"))
        .map(|file| {
            let text = std::fs::read_to_string(&file).unwrap_or_else(|error| panic!("{}: {error}", file.display()));
            (file.strip_prefix(&src).expect("under src").to_path_buf(), text)
        })
        .collect()
}

/// The engine's modules form layers: the command modules commit through
/// the transaction plumbing beneath them (`tx`, `reactions`, `load`), which
/// imports none of them. A cycle would let a change in one command module
/// reach any other; the rule that decides what counts is on
/// [`module_cycles`].
#[test]
fn engine_modules_form_no_cycle() {
    let files = crate_source_texts("crates/engine");
    assert!(
        files.iter().any(|(path, _)| path == Path::new("lib.rs")) && files.len() > 5,
        "found too few engine sources: is the scan looking in the right place?"
    );
    let cycles = module_cycles(&files);
    assert!(
        cycles.is_empty(),
        "modules of crates/engine import each other in a circle:\n{}",
        cycles.join("\n")
    );
}

/// The engine's check passes vacuously if the reader misses paths.
#[test]
fn the_module_cycle_check_finds_a_small_cycle_and_names_it() {
    let file = |path: &str, text: &str| (PathBuf::from(path), text.to_string());
    let two = [
        file("lib.rs", "mod a;\nmod b;\npub struct Engine;\n"),
        file("a.rs", "use crate::Engine;\n\nfn f() { crate::b::g(); }\n"),
        file(
            "b.rs",
            "use crate::{\n    a::{self, Thing as Other},\n    Engine,\n};\n",
        ),
    ];
    assert_eq!(
        module_cycles(&two),
        vec!["a → b → a: a → b (a.rs:3), b → a (b.rs:1)".to_string()]
    );
    // Siblings inside a directory module are modules of their own.
    let siblings = [
        file("lib.rs", "mod work;\n"),
        file("work/mod.rs", "mod claim;\nmod report;\npub use claim::Claim;\n"),
        file("work/claim.rs", "use super::report::Report;\npub struct Claim;\n"),
        file("work/report.rs", "use crate::work::claim::Claim;\n"),
    ];
    assert_eq!(
        module_cycles(&siblings),
        vec![
            "work::claim → work::report → work::claim: work::claim → work::report (work/claim.rs:1), \
             work::report → work::claim (work/report.rs:1)"
                .to_string()
        ]
    );
}

#[test]
fn the_module_cycle_check_ignores_comments_strings_and_a_module_and_its_ancestors() {
    let file = |path: &str, text: &str| (PathBuf::from(path), text.to_string());
    let quiet = [
        file("lib.rs", "mod a;\nmod b;\nmod c;\nuse crate::a::A;\npub struct Engine;\n"),
        file("a.rs", "use crate::{b::B, Engine};\npub struct A;\n"),
        file(
            "b.rs",
            "//! Unlike crate::a, this names c only.\n/* crate::a::A */\nuse crate::c::*;\n\
             const TEXT: &str = \"crate::a::A\";\nconst RAW: &str = r#\"crate::a\"#;\nfn f<'a>(x: &'a str) -> char { 'a' }\n\
             mod tests { use super::*; }\n",
        ),
        file("c.rs", "use super::Engine;\n"),
    ];
    assert_eq!(module_cycles(&quiet), Vec::<String>::new());
}
