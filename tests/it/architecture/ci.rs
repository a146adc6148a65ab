//! The README's test command is the one CI runs, so a contributor who
//! follows the README runs what CI checks; it runs every test of the
//! workspace (directly, or through `scripts/test`), with cargo's runner or
//! with cargo-nextest, which gives each test a process of its own.

use super::root;

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
    // The tests are cargo's, run directly or by the repository's script
    // (which installs a system library the build needs first).
    let cargo_line = if let Some(script) = test_command.strip_prefix("scripts/") {
        let script = script.split_whitespace().next().unwrap_or_default();
        let text = std::fs::read_to_string(root().join("scripts").join(script))
            .unwrap_or_else(|error| panic!("README's test command names scripts/{script}: {error}"));
        let runs: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter_map(|line| line.strip_prefix("exec "))
            .filter(|line| line.starts_with("cargo test") || line.starts_with("cargo nextest run"))
            .map(str::to_string)
            .collect();
        assert_eq!(
            runs.len(),
            1,
            "scripts/{script} must end by exec'ing one cargo test or cargo nextest run: {runs:?}"
        );
        runs[0].clone()
    } else {
        test_command.to_string()
    };
    assert!(
        cargo_line.starts_with("cargo test --workspace") || cargo_line.starts_with("cargo nextest run --workspace"),
        "README's test command does not run every test: {cargo_line}"
    );
    let ci_tests: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("cargo test") || line.starts_with("scripts/") || *line == test_command)
        .collect();
    assert_eq!(
        ci_tests,
        vec![test_command],
        ".ci/run must run exactly README's test command, and only it"
    );
}
