//! Mechanical checks of the crate boundaries that the code relies on but the
//! compiler does not enforce: the domain crate stays pure (no async runtime,
//! no database, no I/O, no clock, no randomness), only the backend crates
//! know a database driver, the testkit stays a test-only dependency, and
//! no product crate links the benchmarks.
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
    let src = root().join("crates/domain/src");
    let mut files = Vec::new();
    files_under(&src, &mut files);
    assert!(
        files.iter().any(|file| file.ends_with("lib.rs")),
        "found no lib.rs under {}: is the scan looking in the right place?",
        src.display()
    );
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
