//! The README's test command is the one CI runs, so a contributor who
//! follows the README runs what CI checks.

use crate::root;

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
