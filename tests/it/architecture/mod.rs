//! Mechanical checks of the crate boundaries that the code relies on but the
//! compiler does not enforce: the domain crate stays pure (no async runtime,
//! no database, no I/O, no clock, no randomness), only the engine reads the
//! wall clock and makes ids, only the backend crates know a database
//! driver, the store crate holds no SQL, the testkit and the conformance
//! suite stay test-only dependencies, no product crate links the
//! benchmarks, no crate's modules (the binary's included) form a cycle, and
//! the README's test command is what CI runs.
//!
//! By idea: `dependencies` reads manifests, `sources` scans source text
//! for names and SQL, `modules` follows each crate's module paths, `ci`
//! compares the README with CI; `lexer` tells code from comments and
//! literals for the scans that need it. The helpers they share are here.
//!
//! Manifests are read with `toml_edit`, so inline tables, dotted keys,
//! `[dependencies.x]` tables and target-specific sections are all seen.

mod ci;
mod dependencies;
mod lexer;
mod modules;
mod sources;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use toml_edit::{DocumentMut, Item, TableLike};

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

fn is_rust(file: &Path) -> bool {
    file.extension().is_some_and(|ext| ext == "rs")
}

fn read(file: &Path) -> String {
    std::fs::read_to_string(file).unwrap_or_else(|error| panic!("reading {}: {error}", file.display()))
}

/// A file's path from the workspace root, for messages.
fn relative(file: &Path) -> String {
    file.strip_prefix(root()).unwrap_or(file).display().to_string()
}

/// The line of `text` that byte `offset` is on, from 1.
fn line_at(text: &str, offset: usize) -> usize {
    text[..offset].matches('\n').count() + 1
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

/// The Rust source files of one crate's `src`, relative to it, with their text.
fn crate_source_texts(crate_dir: &str) -> Vec<(PathBuf, String)> {
    let src = root().join(crate_dir).join("src");
    let mut files = Vec::new();
    files_under(&src, &mut files);
    files
        .into_iter()
        .filter(|file| is_rust(file))
        .map(|file| {
            let text = read(&file);
            (file.strip_prefix(&src).expect("under src").to_path_buf(), text)
        })
        .collect()
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
