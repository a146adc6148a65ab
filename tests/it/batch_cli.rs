//! `opledger batch` on the command line: `create --media-file` (ids one a
//! line, from a file or standard input; a bad line named by its number,
//! quoted short, nothing recorded) and `cancel`, which prints counts and
//! the items only with `--verbose`.

use crate::common;

use common::{assert_exit, at, binary, declare_pipeline, describe, digest, ok_json_at, run, temp_db};

fn sqlite_ledger() -> (tempfile::TempDir, String) {
    let (folder, db) = temp_db();
    (folder, format!("sqlite:{}", db.display()))
}

/// A ledger with the pipeline declared and `count` media items: their ids.
fn ledger_with_media(url: &str, count: u64) -> Vec<String> {
    declare_pipeline(url);
    (0..count)
        .map(|n| {
            let added = ok_json_at(
                url,
                &[
                    "media",
                    "add",
                    "--path",
                    &format!("/photos/{n}.png"),
                    "--digest",
                    &digest(n + 1),
                    "--json",
                ],
            );
            added["media_id"].as_str().expect("a media id").to_string()
        })
        .collect()
}

fn head(url: &str) -> serde_json::Value {
    ok_json_at(url, &["status", "--json"])["head"].clone()
}

#[test]
fn batch_create_takes_media_ids_one_a_line_from_a_file_or_standard_input() {
    let (folder, url) = sqlite_ledger();
    let media = ledger_with_media(&url, 3);
    // Blank lines, spaces around an id and CRLF line ends are all right.
    let file = folder.path().join("ids.txt");
    std::fs::write(&file, format!("{}\r\n\n  {}  \n\n{}", media[0], media[1], media[2])).unwrap();
    let created = ok_json_at(
        &url,
        &[
            "batch",
            "create",
            "--name",
            "from a file",
            "--kind",
            "metadata",
            "--media-file",
            file.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(created["total"], 3, "{created}");

    // `-` reads standard input; ids on argv join the file's.
    let output = common::run_with_stdin(
        binary().args([
            "batch",
            "create",
            "--name",
            "from stdin",
            "--kind",
            "thumbnail",
            "--media",
            &media[0],
            "--media-file",
            "-",
            "--json",
            "--database-url",
            &url,
        ]),
        format!("{}\n{}\n", media[1], media[2]).as_bytes(),
    );
    assert_exit(&output, 0);
    let created = common::json(&output);
    assert_eq!(created["total"], 3, "{created}");
    let labels: Vec<&str> = created["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["label"].as_str().unwrap())
        .collect();
    for (label, id) in labels.iter().zip(&media) {
        assert!(label.starts_with(id.as_str()), "{label} is not {id}'s");
    }
    common::assert_verify_identical(&url);
}

#[test]
fn a_bad_line_in_a_media_file_is_named_by_its_number_quoted_short_and_nothing_is_recorded() {
    let (folder, url) = sqlite_ledger();
    let media = ledger_with_media(&url, 1);
    let before = head(&url);
    let file = folder.path().join("ids.txt");
    let junk = format!("\u{1b}[31m{}", "x".repeat(100_000));
    std::fs::write(&file, format!("{}\n\n{junk}\n", media[0])).unwrap();
    let output = at(
        &url,
        &[
            "batch",
            "create",
            "--name",
            "bad",
            "--kind",
            "metadata",
            "--media-file",
            file.to_str().unwrap(),
        ],
    );
    assert_exit(&output, 2);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("line 3:"), "{}", describe(&output));
    assert!(stderr.contains("is not a media id"), "{}", describe(&output));
    assert!(stderr.contains("(100005 bytes in all)"), "{}", describe(&output));
    assert!(
        output.stderr.len() < 1_000,
        "{} bytes: {}",
        output.stderr.len(),
        describe(&output)
    );
    assert!(!stderr.contains('\u{1b}'), "the escape is escaped: {stderr}");
    assert_eq!(head(&url), before, "nothing was appended");

    // A file that is not there, an empty one and one that is not UTF-8.
    let empty = folder.path().join("empty.txt");
    std::fs::write(&empty, "\n\n").unwrap();
    let binary_file = folder.path().join("binary.txt");
    std::fs::write(&binary_file, [b'\n', 0xff, 0xfe]).unwrap();
    for (file, said) in [
        (folder.path().join("missing.txt"), "cannot read it"),
        (empty, "holds no media id"),
        (binary_file, "line 2: not UTF-8 text"),
    ] {
        let output = at(
            &url,
            &[
                "batch",
                "create",
                "--name",
                "bad",
                "--kind",
                "metadata",
                "--media-file",
                file.to_str().unwrap(),
            ],
        );
        assert_exit(&output, 2);
        assert!(
            String::from_utf8_lossy(&output.stderr).contains(said),
            "{}",
            describe(&output)
        );
    }
    assert_eq!(head(&url), before, "nothing was appended");
}

#[test]
fn batch_cancel_prints_counts_and_the_items_only_when_verbose() {
    let (_folder, url) = sqlite_ledger();
    let media = ledger_with_media(&url, 3);
    let mut create = vec![
        "batch", "create", "--name", "run", "--kind", "metadata", "--json", "--media",
    ];
    create.extend(media.iter().map(String::as_str));
    let batch = ok_json_at(&url, &create);
    let batch_id = batch["batch_id"].as_str().unwrap().to_string();
    // One item runs (its claim held), one is done, one waits.
    let claimed = ok_json_at(
        &url,
        &[
            "task", "claim", "--kind", "metadata", "--worker", "w1", "--lease", "600", "--limit", "2", "--json",
        ],
    );
    let claims = claimed["claims"].as_array().unwrap_or_else(|| panic!("{claimed}"));
    let done = &claims[0];
    let output = run(binary().args([
        "task",
        "complete",
        done["claim_token"].as_str().unwrap(),
        "--output",
        "{}",
        "--database-url",
        &url,
    ]));
    assert_exit(&output, 0);

    let output = at(&url, &["batch", "cancel", &batch_id]);
    assert_exit(&output, 0);
    let printed = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        printed.lines().count(),
        2,
        "a progress line and a count line: {printed}"
    );
    assert!(
        printed.contains("cancel: 1 of 3 items cancelled now, 1 running asked to stop, 1 already settled"),
        "{printed}"
    );

    let again = ok_json_at(&url, &["batch", "cancel", &batch_id, "--json"]);
    assert_eq!(again["cancel"]["already_stopping"], 1, "{again}");
    assert_eq!(again["cancel"]["already_settled"], 2, "{again}");
    assert_eq!(again["cancel"]["items"], 3, "{again}");
    assert!(again.get("items").is_none(), "no items without --verbose: {again}");
    assert_eq!(again["status"], "cancelling");

    let verbose = ok_json_at(&url, &["batch", "cancel", &batch_id, "--json", "--verbose"]);
    assert_eq!(verbose["items"].as_array().map(Vec::len), Some(3), "{verbose}");
    let output = at(&url, &["batch", "cancel", &batch_id, "--verbose"]);
    assert_exit(&output, 0);
    assert_eq!(String::from_utf8_lossy(&output.stdout).lines().count(), 5);
    common::assert_verify_identical(&url);
}
