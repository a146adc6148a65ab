//! What each crate is built with, read from the manifests: the domain's
//! dependencies are a short allowlist and none of them can read the clock
//! or make ids; the explanations build on the domain and plain data crates
//! alone; only the backends link a database driver; the testkit and the
//! conformance suite are test-only; no product crate links the benchmarks
//! or builds with `tempfile`.

use std::collections::{BTreeMap, BTreeSet};
use toml_edit::Item;

use super::{build_dependencies, library_dependency_closure, manifest, string_array, workspace_members};

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

/// The only crates the explanations may depend on: the domain, whose rows
/// and events they put into words, and the data crates the words are made
/// with (serializable answers, payloads summed up, times in a zone).
const EXPLAIN_ALLOWED: &[&str] = &["opledger-domain", "serde", "serde_json", "chrono"];

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

/// The dependencies the library of the crate in `dir` is built with, which
/// must all be in `allowed` (`rule` says why, in the failure message).
fn dependencies_within(dir: &str, allowed: &[&str], rule: &str) -> BTreeMap<String, Item> {
    let dependencies = build_dependencies(&manifest(&format!("{dir}/Cargo.toml")));
    assert!(
        !dependencies.is_empty(),
        "the {dir} manifest lists no dependencies at all: is the parser broken?"
    );
    let outside: Vec<&String> = dependencies
        .keys()
        .filter(|name| !allowed.contains(&name.as_str()))
        .collect();
    assert!(
        outside.is_empty(),
        "{dir} {rule}; it may depend only on {allowed:?}, but it also depends on {outside:?}"
    );
    dependencies
}

#[test]
fn domain_depends_only_on_the_pure_allowlist() {
    dependencies_within("crates/domain", DOMAIN_ALLOWED, "must stay pure");
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

/// The explanations sit right above the domain: every reader (the engine's
/// `describe`, the HTTP routes, the binary) says the same sentence through
/// them, so they must not know a database, an async runtime or HTTP, nor
/// read the clock (the present and the reader's zone are arguments). The
/// domain, beneath them, does not depend on them.
#[test]
fn explain_depends_only_on_the_domain_and_plain_data_crates() {
    let dependencies = dependencies_within(
        "crates/explain",
        EXPLAIN_ALLOWED,
        "must know no database, async runtime or HTTP",
    );
    let chrono = dependencies
        .get("chrono")
        .expect("the explanations use chrono for times in the reader's zone");
    let (features, default_features) = effective_features(chrono, "chrono");
    assert!(
        !default_features && !features.contains("clock"),
        "crates/explain gets chrono with its `clock` feature ({features:?}); the present is an argument"
    );
    assert!(
        !library_dependency_closure("opledger-domain").contains("opledger-explain"),
        "the domain depends on opledger-explain; the words sit above the domain, never beneath it"
    );
}

#[test]
fn only_backend_crates_depend_on_database_drivers() {
    for member in [
        "opledger-domain",
        "opledger-explain",
        "opledger-store",
        "opledger-engine",
        "opledger-worker",
        "opledger-media",
        "opledger-ingest",
        "opledger-http",
        "opledger-supervise",
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

/// Asserts that `test_crate` is a workspace member that no member's library
/// (but its own and those of the test-only crates in `test_only`) and not
/// the binary depends on, directly or through another workspace crate: it
/// reaches the product only as a dev-dependency.
fn assert_only_tests_use(test_crate: &str, test_only: &[&str]) {
    let members = workspace_members();
    assert!(
        members.contains_key(test_crate),
        "{test_crate} is not a workspace member: update this test"
    );
    for member in members
        .keys()
        .filter(|name| name.as_str() != test_crate && !test_only.contains(&name.as_str()))
    {
        let closure = library_dependency_closure(member);
        assert!(
            !closure.contains(test_crate),
            "{member}'s library depends on {test_crate}; it is for tests only (dev-dependencies)"
        );
    }
    let binary = build_dependencies(&manifest("Cargo.toml"));
    assert!(
        !binary.contains_key(test_crate),
        "the opledger binary depends on {test_crate}; it is for tests only (dev-dependencies)"
    );
}

#[test]
fn the_testkit_is_only_ever_a_dev_dependency() {
    // The testkit opens databases of every backend; a library that depended
    // on it would know every driver, and the engine's tests would link a
    // second copy of anything the testkit depended on.
    assert_only_tests_use("opledger-testkit", &[]);
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
fn only_the_binary_builds_with_anyhow() {
    // A library's callers branch on its typed errors (domain or store, and
    // their kinds); an `anyhow::Error` would hide the kind they need. The
    // binary adds context with it, and `exit_code` finds the error beneath.
    let members = workspace_members();
    for (member, path) in &members {
        let direct = build_dependencies(&manifest(&format!("{path}/Cargo.toml")));
        assert!(
            !direct.contains_key("anyhow"),
            "{member} builds its library with anyhow; only the binary (src/) may: return a typed error"
        );
    }
    let binary = build_dependencies(&manifest("Cargo.toml"));
    assert!(
        binary.contains_key("anyhow"),
        "the binary no longer uses anyhow: update this test and docs/architecture.md"
    );
}

#[test]
fn the_conformance_suite_is_a_test_crate_that_knows_no_driver() {
    // The suite reaches a database only through the harness a backend's
    // tests give it, and no product library links it (the testkit, itself
    // test-only, re-exports its `Harness`).
    assert_only_tests_use("opledger-store-conformance", &["opledger-testkit"]);
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
