//! The ingest under faults found adversarially (issue: "Proven under
//! faults"), each with a regression test named after what it guards:
//!
//! - The ingest lock belongs to the ledger, not to the name it was reached
//!   by: two `opledger ingest` processes started at once on one ledger — on
//!   SQLite through the database file and a symlink to it, on PostgreSQL
//!   from two working folders — run one after the other, and every file is
//!   registered as exactly one media item.
//! - A disk that fills while the image workers run: the ingest backs off,
//!   stops within its `--give-up-after` with exit 5 and says the disk is
//!   full; once there is room, the next run resumes and finishes.
//!
//! - An ingest whose PostgreSQL lock session ends under it (a server
//!   restart, a failover: the server releases the lock) stops at once with
//!   exit 5 saying the lock was lost, instead of going on beside the next
//!   ingest, which takes the lock; that one finishes with one media item
//!   per file.
//!
//! `replay --verify` after each.

use crate::common;

use common::{binary, describe};
use opledger_domain::projections::{Row, MEDIA_TABLE};
use opledger_media::{generate_samples_with, SampleOptions};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend, Harness};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Stdio};

const FILES: usize = 60;

/// `opledger --json --database-url URL ingest FOLDER` in `cwd`, in the
/// background.
fn start(cwd: &Path, url: &str, folder: &Path) -> Child {
    binary()
        .current_dir(cwd)
        .arg("--json")
        .arg("--database-url")
        .arg(url)
        .arg("ingest")
        .arg(folder)
        .args(["--workers", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn summary(child: Child) -> Value {
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{error}: {}", describe(&output)))
}

/// The second name of the ledger: a symlink to the SQLite file, or the
/// same PostgreSQL URL (the other process runs in another folder).
fn second_name(backend_url: &str, dir: &Path) -> String {
    match backend_url.strip_prefix("sqlite:") {
        Some(file) => {
            let link = dir.join("alias.db");
            std::os::unix::fs::symlink(file, &link).unwrap();
            format!("sqlite:{}", link.display())
        }
        None => backend_url.to_string(),
    }
}

async fn two_ingests_of_one_ledger_by_two_names_run_one_at_a_time_and_register_each_file_once<B: Backend>(backend: &B) {
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    generate_samples_with(&photos, &SampleOptions::new(FILES, 11)).unwrap();
    let (first_cwd, second_cwd) = (dir.path().join("one"), dir.path().join("two"));
    std::fs::create_dir_all(&first_cwd).unwrap();
    std::fs::create_dir_all(&second_cwd).unwrap();
    let url = backend.url();
    // The ledger exists before the race (both would otherwise create it).
    drop(backend.open().await);
    let alias = second_name(&url, dir.path());

    let first = start(&first_cwd, &url, &photos);
    let second = start(&second_cwd, &alias, &photos);
    let (first, second) = (summary(first), summary(second));
    let new = first["new"].as_u64().unwrap() + second["new"].as_u64().unwrap();
    assert_eq!(new, FILES as u64, "each file is new once:\n{first}\n{second}");

    let store = backend.open().await;
    let mut by_path: BTreeMap<String, usize> = BTreeMap::new();
    for row in store.scan_table(&MEDIA_TABLE).await.unwrap() {
        if let Row::Media(item) = row {
            *by_path.entry(item.path).or_default() += 1;
        }
    }
    let doubled: Vec<_> = by_path.iter().filter(|(_, count)| **count > 1).collect();
    assert!(doubled.is_empty(), "paths registered twice: {doubled:?}");
    assert_eq!(by_path.len(), FILES);
    let verify = binary()
        .arg("--database-url")
        .arg(&url)
        .args(["replay", "--verify"])
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(0), "{}", describe(&verify));
}

backend_tests!(
    worker_threads = 2;
    two_ingests_of_one_ledger_by_two_names_run_one_at_a_time_and_register_each_file_once
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingest_whose_lock_session_ends_stops_with_exit_5_instead_of_running_beside_the_next() {
    let Some(backend) = opledger_testkit::postgres::backend().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    generate_samples_with(&photos, &SampleOptions::new(FILES, 12)).unwrap();
    let (first_cwd, second_cwd) = (dir.path().join("one"), dir.path().join("two"));
    std::fs::create_dir_all(&first_cwd).unwrap();
    std::fs::create_dir_all(&second_cwd).unwrap();
    let url = backend.url();
    drop(backend.open().await);

    let first = start(&first_cwd, &url, &photos);
    // The session holding the ingest lock, found by its key (the
    // migrator's startup lock is advisory too, and ending its session
    // instead lets the first ingest carry on and wait for the second):
    // idle between its holder's looks at it. Ended as a restart or an
    // operator would end it.
    let key = opledger_store_postgres::ledger_lock_key("ingest") as u64;
    let mut connection = backend.connect().await;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (terminated,): (i64,) = sqlx::query_as(
            "SELECT COUNT(pg_terminate_backend(l.pid)) FROM pg_locks l \
             JOIN pg_database d ON d.oid = l.database JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
             AND l.classid::bigint = $1 AND l.objid::bigint = $2 \
             AND d.datname = current_database() AND a.state = 'idle'",
        )
        .bind((key >> 32) as i64)
        .bind((key & 0xFFFF_FFFF) as i64)
        .fetch_one(&mut connection)
        .await
        .unwrap();
        if terminated > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the first ingest never held its lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let _ = sqlx::Connection::close(connection).await;
    let second = start(&second_cwd, &url, &photos);

    let first = first.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(5), "{}", describe(&first));
    let said = String::from_utf8_lossy(&first.stderr);
    assert!(said.contains("the ingest lock was lost"), "{}", describe(&first));
    let second = summary(second);
    assert_eq!(second["failed"].as_u64(), Some(0), "{second}");

    // What the first left, the second or a third run finishes; each file
    // is one media item.
    let third = summary(start(&second_cwd, &url, &photos));
    assert_eq!(third["new"].as_u64(), Some(0), "{third}");
    let store = backend.open().await;
    let mut by_path: BTreeMap<String, usize> = BTreeMap::new();
    for row in store.scan_table(&MEDIA_TABLE).await.unwrap() {
        if let Row::Media(item) = row {
            *by_path.entry(item.path).or_default() += 1;
        }
    }
    assert!(by_path.values().all(|count| *count == 1), "{by_path:?}");
    assert_eq!(by_path.len(), FILES);
    let verify = binary()
        .arg("--database-url")
        .arg(&url)
        .args(["replay", "--verify"])
        .output()
        .unwrap();
    assert_eq!(verify.status.code(), Some(0), "{}", describe(&verify));
}

/// Runs `script` in a mount namespace of its own (its mounts vanish with
/// it), or None when this machine does not allow one: a loud skip, a
/// failure under `CI=true`.
fn in_own_mount_namespace(script: &str) -> Option<std::process::Output> {
    let probe = std::process::Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs -o size=64k tmpfs /mnt",
        ])
        .output();
    if !probe.as_ref().is_ok_and(|output| output.status.success()) {
        let why = format!("cannot mount a small filesystem in a mount namespace here ({probe:?})");
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{why}");
        }
        eprintln!("SKIPPED: {why}");
        return None;
    }
    Some(common::run(
        std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "bash", "-c"])
            .arg(script),
    ))
}

fn after_fill_ms(text: &str) -> u64 {
    text.trim().parse().unwrap_or_else(|error| panic!("{error}: {text:?}"))
}

#[test]
fn a_disk_that_fills_while_the_workers_run_stops_the_ingest_with_exit_5_saying_so_and_the_next_run_resumes() {
    const PHOTOS: usize = 150;
    let dir = tempfile::tempdir().unwrap();
    let photos = dir.path().join("photos");
    generate_samples_with(&photos, &SampleOptions::new(PHOTOS, 5)).unwrap();
    let disk = dir.path().join("disk");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&disk).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    // The ledger and its thumbnails on a filesystem of their own; once the
    // workers have written a few thumbnails, a filler takes the rest of
    // it. The first run must end by itself (`timeout` would end a run that
    // retries for ever: exit 124); then the filler goes and a second run
    // resumes.
    let script = format!(
        r#"set -u
mount -t tmpfs -o size=64m tmpfs '{disk}' || exit 90
url='sqlite:{disk}/opledger.db'
timeout 120 '{bin}' --json --database-url "$url" ingest '{photos}' --workers 1 --give-up-after 3 \
    > '{out}/first.json' 2> '{out}/first.err' &
run=$!
for _ in $(seq 1 600); do
    [ "$(ls '{disk}/thumbnails' 2>/dev/null | grep -c '\.png$')" -ge 3 ] && break
    sleep 0.05
done
dd if=/dev/zero of='{disk}/filler' bs=64k 2> /dev/null
filled=$(date +%s%N)
wait $run
echo $? > '{out}/first.code'
echo $(( ($(date +%s%N) - filled) / 1000000 )) > '{out}/first.ms'
rm '{disk}/filler'
'{bin}' --json --database-url "$url" ingest '{photos}' --workers 2 > '{out}/second.json' 2> '{out}/second.err'
echo $? > '{out}/second.code'
'{bin}' --database-url "$url" replay --verify > '{out}/verify.out' 2>&1
echo $? > '{out}/verify.code'
'{bin}' --json --database-url "$url" media list --limit 1000 > '{out}/media.json' 2> '{out}/media.err'
"#,
        disk = disk.display(),
        photos = photos.display(),
        out = out.display(),
        bin = common::BIN,
    );
    let Some(output) = in_own_mount_namespace(&script) else {
        return;
    };
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let first_code = read("first.code");
    let first_err = read("first.err");
    assert_eq!(
        first_code.trim(),
        "5",
        "the run on a full disk ends by itself with exit 5 (124: it was still retrying after 120 s)\n{first_err}"
    );
    assert!(first_err.contains("opledger: disk full: "), "{first_err}");
    assert!(
        first_err.contains("stopped trying)"),
        "it waited out the full disk before it stopped: {first_err}"
    );
    assert!(
        after_fill_ms(&read("first.ms")) >= 3_000,
        "it waited its --give-up-after"
    );
    let after_fill = after_fill_ms(&read("first.ms"));
    assert!(after_fill < 60_000, "stopped {after_fill} ms after the disk filled");
    let warnings = first_err.matches("claim failed").count();
    assert!(
        warnings < 40,
        "claims back off: {warnings} failed claims logged\n{first_err}"
    );

    assert_eq!(read("second.code").trim(), "0", "{}", read("second.err"));
    let second: Value = serde_json::from_str(&read("second.json")).unwrap();
    assert_eq!(second["files"].as_u64(), Some(PHOTOS as u64), "{second}");
    assert_eq!(second["failed"].as_u64(), Some(0), "{second}");
    assert_eq!(
        second["new"].as_u64().unwrap() + second["changed"].as_u64().unwrap(),
        0,
        "{second}"
    );
    assert_eq!(read("verify.code").trim(), "0", "{}", read("verify.out"));
    let media: Value =
        serde_json::from_str(&read("media.json")).unwrap_or_else(|error| panic!("{error}: {}", read("media.err")));
    let paths: std::collections::BTreeSet<&str> = media["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), PHOTOS, "one media item per file");
    assert_eq!(
        media["items"].as_array().unwrap().len(),
        PHOTOS,
        "one media item per file"
    );
}
