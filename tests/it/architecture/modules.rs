//! No crate's modules form a cycle: each file's `crate::`, `super::` and
//! `self::` paths are read from its code (comments and literals blanked)
//! and followed as edges between the modules of its crate, for every
//! workspace crate and the binary.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::lexer::{blank, Blank};
use super::{crate_source_texts, line_at, workspace_members};

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

/// Each file's module: by its place under `src`, or, for a file that a
/// `#[path = "…"] mod name;` loads, `name` under the module that declares
/// it (the path read from the declaring file's directory, as rustc does
/// for a file that is not a `mod.rs`).
fn modules_of(files: &[(PathBuf, String)]) -> BTreeMap<PathBuf, ModulePath> {
    let mut modules: BTreeMap<PathBuf, ModulePath> = files
        .iter()
        .map(|(path, _)| (path.clone(), module_of_file(path)))
        .collect();
    for (path, source) in files {
        let code = blank(source, Blank::Comments);
        for (loaded, name) in path_declarations(&code) {
            let file = path.parent().unwrap_or(Path::new("")).join(loaded);
            if modules.contains_key(&file) {
                let mut module = modules[path].clone();
                module.push(name);
                modules.insert(file, module);
            }
        }
    }
    modules
}

/// The `#[path = "file"] mod name;` declarations of a file's code: each
/// file with the module name it is loaded as.
fn path_declarations(code: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("#[path") {
        let rest = &code[at..];
        let Some(open) = rest.find('"') else { continue };
        let Some(close) = rest[open + 1..].find('"') else {
            continue;
        };
        let file = rest[open + 1..open + 1 + close].to_string();
        let after = &rest[open + 1 + close..];
        let Some(declared) = after.find("mod ") else { continue };
        let name: String = after[declared + 4..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            found.push((file, name));
        }
    }
    found
}

/// Every path a file's code names through `crate::`, `super::` or `self::`
/// (use declarations with their `{…}` groups, and paths in expressions and
/// types), resolved against the file's module `at`, with its line.
fn named_paths(source: &str, at: &[String]) -> Vec<(ModulePath, usize)> {
    // A path in a doc comment or an error message names nothing.
    let code = blank(source, Blank::CommentsAndLiterals);
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
        let line = line_at(&code, tokens[i].0);
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
/// x::…`) only ever name the file's own children. A module that names a
/// parent from outside reaches its children too, since what a parent
/// shares is mostly theirs: a parent counts as depending on each child it
/// declares, so `tx` naming `work` while `work::claim` names `tx` is a
/// cycle (a child naming its parent still counts for nothing).
fn module_cycles(files: &[(PathBuf, String)]) -> Vec<String> {
    let module_of = modules_of(files);
    let modules: BTreeSet<ModulePath> = module_of.values().cloned().collect();
    // from → to → the first place `from` names `to`.
    let mut edges: BTreeMap<ModulePath, BTreeMap<ModulePath, String>> = BTreeMap::new();
    for (path, source) in files {
        let from = module_of[path].clone();
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
    for (path, _) in files {
        let child = module_of[path].clone();
        if let Some((_, parent)) = child.split_last() {
            let declared_in = files
                .iter()
                .map(|(path, _)| path)
                .find(|path| module_of[*path] == parent)
                .map_or_else(|| "its parent".to_string(), |path| path.display().to_string());
            edges
                .entry(parent.to_vec())
                .or_default()
                .entry(child.clone())
                .or_insert_with(|| format!("declared in {declared_in}"));
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

/// Every crate's modules form layers: a module names only modules beneath
/// it, as the engine's command modules commit through the transaction
/// plumbing beneath them (`tx`, `reactions`, `load`), which imports none of
/// them. A cycle would let a change in any module of it reach every other,
/// and leaves no order to read or test them in; the rule that decides what
/// counts is on [`module_cycles`]. The binary's `src/` is a crate too.
#[test]
fn no_crates_modules_import_each_other_in_a_circle() {
    let mut crates: Vec<(String, String)> = workspace_members().into_iter().map(|(name, dir)| (dir, name)).collect();
    crates.push((".".to_string(), "opledger".to_string()));
    let mut found = Vec::new();
    for (dir, name) in &crates {
        let files = crate_source_texts(dir);
        assert!(
            files
                .iter()
                .any(|(path, _)| path == Path::new("lib.rs") || path == Path::new("main.rs")),
            "found no lib.rs or main.rs under {dir}/src: is the scan looking in the right place?"
        );
        let cycles = module_cycles(&files);
        if !cycles.is_empty() {
            let place = if dir == "." { "src" } else { dir.as_str() };
            found.push(format!(
                "modules of {place} ({name}) import each other in a circle:\n  {}",
                cycles.join("\n  ")
            ));
        }
    }
    assert!(crates.len() > 10, "found too few crates: is the workspace read right?");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check passes vacuously if the reader misses paths.
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

#[test]
fn the_module_cycle_check_counts_a_named_parent_as_reaching_its_children() {
    let file = |path: &str, text: &str| (PathBuf::from(path), text.to_string());
    let through_parent = [
        file("lib.rs", "mod tx;\nmod work;\npub struct Engine;\n"),
        file("tx.rs", "use crate::work;\npub struct Stamp;\n"),
        file("work/mod.rs", "mod claim;\npub use claim::Claim;\n"),
        file("work/claim.rs", "use crate::tx::Stamp;\npub struct Claim;\n"),
    ];
    assert_eq!(
        module_cycles(&through_parent),
        vec![
            "tx → work → work::claim → tx: tx → work (tx.rs:1), work → work::claim (declared in work/mod.rs), \
             work::claim → tx (work/claim.rs:1)"
                .to_string()
        ]
    );
}

#[test]
fn the_module_cycle_check_reads_a_file_a_path_attribute_loads_as_the_module_it_declares() {
    let file = |path: &str, text: &str| (PathBuf::from(path), text.to_string());
    let through_tests = [
        file("lib.rs", "mod a;\nmod b;\n"),
        file(
            "a.rs",
            "pub struct A;\n#[cfg(test)]\n#[path = \"a_tests.rs\"]\nmod tests;\n",
        ),
        file("a_tests.rs", "use super::A;\nuse crate::b::B;\n"),
        file("b.rs", "use crate::a::A;\npub struct B;\n"),
    ];
    assert_eq!(
        module_cycles(&through_tests),
        vec![
            "a → a::tests → b → a: a → a::tests (declared in a.rs), a::tests → b (a_tests.rs:2), \
             b → a (b.rs:1)"
                .to_string()
        ]
    );
}
