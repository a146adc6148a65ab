//! The support and operator listings as a user runs them, on a folder
//! ingested by `opledger ingest`: from a file's path to its item, its
//! operations and why they failed (`media show --path`); operations and
//! media paged to their end with `--after`; the review queue and batches
//! paged, printing operation ids and paths; bad flags refused with exit 2
//! naming the flag and quoting little. `replay --verify` passes after.

use crate::common;

use common::{assert_exit, describe, json, opledger, run, stdout};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A folder of four sample images and one corrupt file, ingested.
fn ingested() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["sample-media", "photos", "--count", "4", "--corrupt", "1"],
        vec!["ingest", "photos", "--workers", "2"],
    ] {
        assert_exit(&run(opledger(dir.path()).args(&args)), 0);
    }
    let photos = dir.path().join("photos").canonicalize().unwrap();
    (dir, photos)
}

fn ok(dir: &Path, args: &[&str]) -> Value {
    let output = run(opledger(dir).args(args).arg("--json"));
    assert_exit(&output, 0);
    json(&output)
}

fn text(dir: &Path, args: &[&str]) -> String {
    let output = run(opledger(dir).args(args));
    assert_exit(&output, 0);
    stdout(&output)
}

/// Every page of a listing, `limit` rows a page, through `--after`.
fn all_pages(dir: &Path, args: &[&str], limit: usize) -> Vec<Value> {
    let mut items = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..1_000 {
        let limit = limit.to_string();
        let mut page_args = args.to_vec();
        page_args.extend(["--limit", &limit]);
        if let Some(after) = &after {
            page_args.extend(["--after", after]);
        }
        let page = ok(dir, &page_args);
        let page_items = page["items"].as_array().expect("items").clone();
        assert!(page_items.len() <= limit.parse().unwrap(), "{page}");
        items.extend(page_items);
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => {
                assert!(page["next"].is_null(), "{page}");
                return items;
            }
        }
    }
    panic!("the listing never ended");
}

fn ids(items: &[Value], key: &str) -> Vec<String> {
    items
        .iter()
        .map(|item| item[key].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn support_goes_from_a_files_path_to_its_item_operations_and_review_entries() {
    let (dir, photos) = ingested();
    let dir = dir.path();
    let media = all_pages(dir, &["media", "list"], 2);
    assert_eq!(media.len(), 5);
    let corrupt = media
        .iter()
        .find(|item| item["path"].as_str().unwrap().contains("broken"))
        .expect("the corrupt file is registered");
    let corrupt_path = corrupt["path"].as_str().unwrap();
    assert!(corrupt_path.starts_with(photos.to_str().unwrap()), "{corrupt_path}");

    let detail = ok(dir, &["media", "show", "--path", corrupt_path]);
    assert_eq!(detail["media"]["media_id"], corrupt["media_id"]);
    assert_eq!(
        detail,
        ok(dir, &["media", "show", corrupt["media_id"].as_str().unwrap()]),
        "by path and by id show the same"
    );
    let kinds: BTreeSet<&str> = detail["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|operation| operation["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["ingestion.file", "metadata", "perceptual_hash", "thumbnail"]),
        "its tasks and the ingestion of its file"
    );
    let review = detail["review"].as_array().unwrap();
    assert_eq!(review.len(), 3, "one open entry per image task: {detail}");
    assert!(detail["thumbnail"].is_null());
    for capability in detail["capabilities"].as_array().unwrap() {
        assert_eq!(capability["status"], "failed_terminal", "{capability}");
        assert!(capability["reason"].as_str().unwrap().contains("not a decodable image"));
    }
    assert_eq!(detail["batches"].as_array().unwrap().len(), 1);

    // The plain detail shows the same, operation ids included.
    let plain = text(dir, &["media", "show", "--path", corrupt_path]);
    assert!(plain.contains(corrupt_path), "{plain}");
    for entry in review {
        assert!(plain.contains(entry["operation_id"].as_str().unwrap()), "{plain}");
    }
    assert!(plain.contains("failed_terminal"), "{plain}");

    // A good file: its thumbnail was written where the detail says.
    let good = media.iter().find(|item| item != &corrupt).unwrap();
    let detail = ok(dir, &["media", "show", "--path", good["path"].as_str().unwrap()]);
    let thumbnail = detail["thumbnail"].as_str().expect("a thumbnail path");
    let thumbnail = if Path::new(thumbnail).is_absolute() {
        PathBuf::from(thumbnail)
    } else {
        dir.join(thumbnail)
    };
    assert!(thumbnail.is_file(), "{}", thumbnail.display());
    assert!(detail["review"].as_array().unwrap().is_empty());

    // The review queue, paged, names the operations and the file.
    let entries = all_pages(dir, &["review", "list"], 1);
    assert_eq!(entries.len(), 3);
    assert!(entries.iter().all(|entry| entry["path"] == corrupt["path"]));
    let plain = text(dir, &["review", "list", "--limit", "2"]);
    assert!(plain.contains(corrupt_path), "{plain}");
    assert!(plain.contains(entries[0]["operation_id"].as_str().unwrap()), "{plain}");
    assert!(plain.contains("next page: --after "), "{plain}");

    assert_exit(&run(opledger(dir).args(["replay", "--verify"])), 0);
}

#[test]
fn operators_page_operations_newest_first_with_filters_and_batches_with_their_items() {
    let (dir, _) = ingested();
    let dir = dir.path();
    let status = ok(dir, &["status"]);
    let every = all_pages(dir, &["ops", "list"], 3);
    assert_eq!(every.len() as i64, status["operations"].as_i64().unwrap());
    let every_ids = ids(&every, "operation_id");
    assert_eq!(
        every_ids.iter().collect::<BTreeSet<_>>().len(),
        every_ids.len(),
        "no operation twice"
    );
    let times: Vec<&str> = every.iter().map(|item| item["created_at"].as_str().unwrap()).collect();
    assert!(
        times.windows(2).all(|pair| pair[0] >= pair[1]),
        "newest first: {times:?}"
    );
    assert_eq!(
        ids(&all_pages(dir, &["ops", "list"], 1_000), "operation_id"),
        every_ids,
        "one page or many, the same listing"
    );

    let failed = all_pages(dir, &["ops", "list", "--status", "failed_terminal"], 2);
    assert_eq!(failed.len(), 3, "the corrupt file's image tasks");
    let thumbnails = all_pages(dir, &["ops", "list", "--kind", "thumbnail"], 2);
    assert_eq!(thumbnails.len(), 5);
    let media_id = failed[0]["media_id"].as_str().unwrap();
    let on_item = all_pages(
        dir,
        &[
            "ops",
            "list",
            "--media",
            media_id,
            "--kind",
            "thumbnail",
            "--kind",
            "metadata",
        ],
        1,
    );
    assert_eq!(on_item.len(), 2);
    let since = times[times.len() / 2];
    let recent = all_pages(dir, &["ops", "list", "--since", since], 2);
    assert_eq!(
        recent.len(),
        times.iter().filter(|time| **time >= since).count(),
        "created at or after {since}"
    );
    assert!(all_pages(dir, &["ops", "list", "--worker", "nobody"], 5).is_empty());

    // Batches and a batch's items, paged; items with operation and path.
    let batches = all_pages(dir, &["batch", "list"], 1);
    assert_eq!(batches.len(), 1);
    let batch = batches[0]["batch_id"].as_str().unwrap();
    let in_batch = all_pages(dir, &["ops", "list", "--batch", batch], 2);
    assert_eq!(in_batch.len(), 5, "one ingestion per file");
    assert!(in_batch.iter().all(|item| item["kind"] == "ingestion.file"));
    let shown = ok(dir, &["batch", "show", batch, "--limit", "2"]);
    assert_eq!(shown["items"].as_array().unwrap().len(), 2);
    let next = shown["next"].as_str().expect("more items");
    let rest = ok(dir, &["batch", "show", batch, "--limit", "10", "--after", next]);
    assert_eq!(rest["items"].as_array().unwrap().len(), 3);
    assert!(rest["next"].is_null());
    let plain = text(dir, &["batch", "show", batch, "--limit", "2"]);
    let first = &shown["items"][0];
    assert!(plain.contains(first["operation_id"].as_str().unwrap()), "{plain}");
    assert!(plain.contains(first["path"].as_str().unwrap()), "{plain}");
    assert!(plain.contains("next page: --after "), "{plain}");
    let plain = text(dir, &["ops", "list", "--limit", "2"]);
    assert!(plain.contains(&every_ids[0]), "{plain}");

    assert_exit(&run(opledger(dir).args(["replay", "--verify"])), 0);
}

#[test]
fn bad_listing_flags_exit_2_naming_the_flag_and_an_unknown_path_exits_4() {
    let (dir, _) = ingested();
    let dir = dir.path();
    let media_cursor = ok(dir, &["media", "list", "--limit", "1"])["next"]
        .as_str()
        .unwrap()
        .to_string();
    let long = "x".repeat(10_000);
    for (args, flag) in [
        (vec!["ops", "list", "--after", "garbage"], "--after"),
        (vec!["ops", "list", "--after", media_cursor.as_str()], "--after"),
        (vec!["ops", "list", "--after", long.as_str()], "--after"),
        (vec!["ops", "list", "--status", "sleeping"], "--status"),
        (vec!["ops", "list", "--since", "yesterday"], "--since"),
        (vec!["ops", "list", "--until", long.as_str()], "--until"),
        (vec!["ops", "list", "--media", "not-an-id"], "--media"),
        (vec!["ops", "list", "--limit", "0"], "--limit"),
        (vec!["ops", "list", "--limit", "1001"], "--limit"),
        (
            vec!["media", "list", "--capability-status", "succeeded"],
            "--capability",
        ),
        (
            vec![
                "media",
                "list",
                "--capability",
                "thumbnail",
                "--capability-status",
                "done",
            ],
            "--capability-status",
        ),
        (vec!["review", "list", "--after", media_cursor.as_str()], "--after"),
        (vec!["batch", "list", "--after", "%%"], "--after"),
    ] {
        let output = run(opledger(dir).args(&args));
        assert_exit(&output, 2);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{args:?}: {}", describe(&output));
        assert!(stderr.len() < 400, "{args:?} quotes little: {} bytes", stderr.len());
    }
    let since_after_until = run(opledger(dir).args([
        "ops",
        "list",
        "--since",
        "2030-01-01T00:00:00Z",
        "--until",
        "2020-01-01T00:00:00Z",
    ]));
    assert_exit(&since_after_until, 2);
    let unknown = run(opledger(dir).args(["media", "show", "--path", "/no/such/file.png"]));
    assert_exit(&unknown, 4);
    assert_exit(&run(opledger(dir).args(["replay", "--verify"])), 0);
}
