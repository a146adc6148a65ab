//! The dashboard in a real browser: Debian's headless `chromium` driven
//! through `chromedriver` with fantoccini, against a real `opledger serve`
//! on a seeded SQLite ledger whose names, paths and errors carry
//! `<script>` and `onerror=` payloads. It enters an admin token, watches a
//! batch's bar move again and again while a CLI worker completes tasks
//! (its events closer together than the page's refresh delay), resolves a review
//! entry with a click, and checks that no payload ran (a global the
//! payloads would set stays unset, and a `securitypolicyviolation` counter
//! installed before any data arrives is shown to count by a control).
//!
//! Without chromium and chromedriver it says SKIPPED loudly, except under
//! `CI=true`, where it fails. `OPLEDGER_UPDATE_SCREENSHOT=1` writes
//! `docs/dashboard.png`. Every child (serve, chromedriver, the worker) is
//! killed when the test ends, however it ends.

use crate::common;

use common::{assert_exit, binary, declare_pipeline, digest, ok_json_at, run};
use fantoccini::{ClientBuilder, Locator};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A payload that sets `window.__pwned` if it ever runs.
const SCRIPT_PAYLOAD: &str = "<script>window.__pwned=1</script>";
const IMG_PAYLOAD: &str = "<img src=x onerror=window.__pwned=1>";
/// A right-to-left override: shown raw, "/adv/\u{202E}evil" reads "/adv/live".
const BIDI_PAYLOAD: &str = "/adv/\u{202E}evil";
/// Media items in the batch: one task fails for good, the rest a CLI worker
/// completes while the page watches.
const ITEMS: usize = 16;
/// The worker's pause after each completion: shorter than the page's
/// refresh delay (300 ms), so a refresh timer restarted by every event
/// would never fire, and long enough that the run spans several refreshes.
const PACE: Duration = Duration::from_millis(120);

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// A child process killed (and reaped) when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A worker thread stopped when dropped.
struct StopFlag(Arc<AtomicBool>);

impl Drop for StopFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn on_path(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

/// Claims and completes one `metadata` task; false when none was claimable.
fn work_one(url: &str) -> bool {
    let claimed = ok_json_at(
        url,
        &[
            "task",
            "claim",
            "--kind",
            "metadata",
            "--worker",
            "cli-worker",
            "--lease",
            "30",
            "--json",
        ],
    );
    let Some(token) = claimed["claim_token"].as_str() else {
        return false;
    };
    let done = run(binary().args([
        "task",
        "complete",
        token,
        "--output",
        r#"{"width": 1, "height": 1}"#,
        "--database-url",
        url,
    ]));
    assert_exit(&done, 0);
    true
}

#[test]
fn the_dashboard_shows_live_progress_resolves_a_review_entry_and_runs_no_payload() {
    if !on_path("chromium") || !on_path("chromedriver") {
        if std::env::var("CI").is_ok_and(|value| value == "true") {
            panic!("chromium and chromedriver are needed under CI=true (apt-get install chromium chromium-driver)");
        }
        eprintln!("SKIPPED the_dashboard_…: chromium or chromedriver is not installed (apt-get install chromium chromium-driver)");
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let url = dir.path().join("ledger.db").display().to_string();

    // A ledger with payloads in paths, a batch name and an error.
    declare_pipeline(&url);
    let mut media = Vec::new();
    for item in 0..ITEMS as u64 {
        let payload = if item % 2 == 0 { SCRIPT_PAYLOAD } else { IMG_PAYLOAD };
        let path = format!("/photos/{item}{payload}.png");
        let added = ok_json_at(
            &url,
            &["media", "add", "--path", &path, "--digest", &digest(item + 1), "--json"],
        );
        media.push(added["media_id"].as_str().expect("a media id").to_string());
    }
    let mut create = vec![
        "batch",
        "create",
        "--name",
        IMG_PAYLOAD,
        "--kind",
        "metadata",
        "--json",
        "--media",
    ];
    create.extend(media.iter().map(String::as_str));
    let batch = ok_json_at(&url, &create);
    let batch_id = batch["batch_id"].as_str().expect("a batch id").to_string();
    // One task fails for good: a review entry whose error is a payload.
    let claimed = ok_json_at(
        &url,
        &[
            "task", "claim", "--kind", "metadata", "--worker", "w", "--lease", "30", "--json",
        ],
    );
    let token = claimed["claim_token"].as_str().expect("a claim");
    let error = format!("{IMG_PAYLOAD} {BIDI_PAYLOAD}");
    assert_exit(
        &run(binary().args([
            "task",
            "fail",
            token,
            "--error",
            &error,
            "--terminal",
            "--database-url",
            &url,
        ])),
        0,
    );

    // The service, with an admin token.
    let tokens = dir.path().join("tokens.toml");
    let made = run(binary()
        .args(["token", "new", "--role", "admin", "--name", "browser"])
        .arg("--tokens-file")
        .arg(&tokens));
    assert_exit(&made, 0);
    let admin = String::from_utf8(made.stdout).unwrap().trim().to_string();
    let mut serve = Killed(
        binary()
            .args([
                "serve",
                "--bind",
                "127.0.0.1:0",
                "--recovery-interval",
                "1",
                "--database-url",
                &url,
            ])
            .arg("--tokens")
            .arg(&tokens)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("serve.log")).expect("a log file"))
            .spawn()
            .expect("opledger serve starts"),
    );
    let mut first = String::new();
    BufReader::new(serve.0.stdout.take().unwrap())
        .read_line(&mut first)
        .expect("serve prints its address");
    let base = first
        .trim()
        .strip_prefix("opledger serving on ")
        .unwrap_or_else(|| {
            let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
            panic!("unexpected first line {first:?}; serve said:\n{log}")
        })
        .to_string();

    let port = free_port();
    let _driver = Killed(
        Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts"),
    );

    let runtime = common::runtime();
    runtime.block_on(async {
        let client = connect(port).await;
        // Driven in a task so that the browser session closes (and chromium
        // exits) even when a check fails; the failure is raised after.
        let driving = {
            let client = client.clone();
            let (base, batch_id, url) = (base.clone(), batch_id.clone(), url.clone());
            tokio::spawn(async move { drive(&client, &base, &admin, &batch_id, &url).await })
        };
        let outcome = driving.await;
        let _ = client.close().await;
        if let Err(failed) = outcome {
            std::panic::resume_unwind(failed.into_panic());
        }
    });
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "took {:?}",
        started.elapsed()
    );
}

async fn connect(port: u16) -> fantoccini::Client {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"]}),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(capabilities.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(client) => return client,
            Err(error) if Instant::now() > deadline => panic!("chromedriver did not answer: {error}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn eval(client: &fantoccini::Client, script: &str) -> Value {
    client.execute(script, vec![]).await.expect("the script runs")
}

/// Clicks the element `css` finds, as a person would (a WebDriver click).
/// The page re-renders lists from the event stream, so an element found a
/// moment ago may be replaced before the click lands: find it again then.
async fn click(client: &fantoccini::Client, css: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let clicked = match client.find(Locator::Css(css)).await {
            Ok(element) => element.click().await.map(|_| ()),
            Err(error) => Err(error),
        };
        match clicked {
            Ok(()) => return,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(error) => panic!("cannot click {css}: {error}"),
        }
    }
}

/// Waits until `script` returns true.
async fn until(client: &fantoccini::Client, what: &str, script: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let check = format!("return ({script});");
    while eval(client, &check).await != Value::Bool(true) {
        if Instant::now() > deadline {
            let page = eval(client, "return document.body.innerText.slice(0, 2000)").await;
            panic!(
                "timed out waiting for {what}; the page shows:\n{}",
                page.as_str().unwrap_or("")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn drive(client: &fantoccini::Client, base: &str, admin: &str, batch_id: &str, url: &str) {
    client.goto(base).await.expect("the page loads");
    // Before any ledger data is on the page: count what the policy blocks.
    eval(
        client,
        "window.__violations = 0; document.addEventListener('securitypolicyviolation', () => { window.__violations += 1; }); return true;",
    )
    .await;
    client
        .find(Locator::Id("token"))
        .await
        .expect("the token field")
        .send_keys(admin)
        .await
        .unwrap();
    click(client, "#login button[type=submit]").await;

    // The batch's bar, then a worker completing tasks moves it live.
    let bar = format!("document.querySelector('progress[data-batch=\"{batch_id}\"]')");
    until(client, "the batch's bar", &format!("{bar} !== null")).await;
    until(
        client,
        "the live badge",
        "document.getElementById('live').textContent === 'live'",
    )
    .await;
    let before = eval(client, &format!("return Number({bar}.value)")).await;
    // The worker's events come closer together than the page's refresh
    // delay (claim and completion back to back, then a pause shorter than
    // the delay): the bar must move while it works, again and again, not
    // only once it stops.
    let stop = Arc::new(AtomicBool::new(false));
    let _stopping = StopFlag(Arc::clone(&stop));
    let completed = Arc::new(AtomicUsize::new(0));
    let worker = {
        let url = url.to_string();
        let (stop, completed) = (Arc::clone(&stop), Arc::clone(&completed));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) && work_one(&url) {
                completed.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(PACE);
            }
        })
    };
    let mut seen = vec![before.as_f64().unwrap_or(-1.0)];
    let mut moves_while_working = 0;
    let mut worker_done_at = None;
    loop {
        let now = eval(client, &format!("const b = {bar}; return b ? Number(b.value) : -1")).await;
        let now = now.as_f64().unwrap_or(-1.0);
        let working = !worker.is_finished();
        if now >= 0.0 && seen.last() != Some(&now) {
            seen.push(now);
            if working && seen.len() >= 2 {
                moves_while_working += 1;
            }
        }
        // Done: the batch left the active list, or its bar is full.
        let finished = eval(
            client,
            &format!("const b = {bar}; return !b || Number(b.value) >= Number(b.max)"),
        )
        .await;
        if finished == Value::Bool(true) && !working {
            break;
        }
        if !working {
            // The page has 10 s to show the last completion.
            let since = *worker_done_at.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(10) {
                let error = eval(client, "return document.getElementById('error').textContent").await;
                let live = eval(client, "return document.getElementById('live').textContent").await;
                let outcome = match worker.join() {
                    Ok(()) => "ended".to_string(),
                    Err(panic) => format!("panicked: {}", panic_text(&panic)),
                };
                panic!(
                    "the bar did not reach the end: it showed {seen:?}; the worker completed {} tasks and {outcome}; \
                     the page's badge says {live}, its error box {error}",
                    completed.load(Ordering::SeqCst)
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.join().expect("the worker thread");
    assert_eq!(
        completed.load(Ordering::SeqCst),
        ITEMS - 1,
        "the worker completed every task but the failed one"
    );
    assert!(
        moves_while_working >= 2,
        "the bar moved at least twice while the worker was still completing tasks: {seen:?}"
    );
    assert!(
        seen.windows(2).all(|pair| pair[0] < pair[1]),
        "the bar only moves forward: {seen:?}"
    );

    if std::env::var("OPLEDGER_UPDATE_SCREENSHOT").is_ok_and(|value| value == "1") {
        let png = client.screenshot().await.expect("a screenshot");
        std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/dashboard.png"), png).expect("docs/dashboard.png");
    }

    // The review entry, resolved with a click; the list refreshes live.
    click(client, "#nav button[data-view=review]").await;
    until(
        client,
        "a review entry",
        "document.querySelector('#review-list button[data-action=retry]') !== null",
    )
    .await;
    let shown = eval(client, "return document.getElementById('review-list').textContent").await;
    assert!(
        shown.as_str().unwrap_or("").contains(IMG_PAYLOAD),
        "the error shows as text: {shown}"
    );
    // The override is shown as a visible mark inside an isolated span,
    // never obeyed.
    assert!(
        shown.as_str().unwrap_or("").contains("/adv/<U+202E>evil")
            && !shown.as_str().unwrap_or("").contains('\u{202E}'),
        "a bidirectional control shows as a mark: {shown}"
    );
    assert_eq!(
        eval(
            client,
            "return [...document.querySelectorAll('#review-list bdi')].some((b) => b.textContent.includes('<U+202E>'))"
        )
        .await,
        json!(true),
        "the text holding it is isolated in a <bdi>"
    );
    click(client, "#review-list button[data-action=retry]").await;
    until(
        client,
        "the entry to leave the queue",
        "document.querySelector('#review-list tr[data-entry]') === null",
    )
    .await;
    assert_eq!(
        eval(client, "return document.getElementById('error').hidden").await,
        Value::Bool(true)
    );

    // No payload ran, and the policy had nothing to block.
    assert_eq!(eval(client, "return typeof window.__pwned").await, json!("undefined"));
    assert_eq!(
        eval(client, "return window.__violations").await,
        json!(0),
        "nothing was blocked either"
    );
    // Control: the hook does count what the policy blocks.
    eval(
        client,
        "document.body.insertAdjacentHTML('beforeend', '<img src=x onerror=\"window.__pwned=1\">'); return true;",
    )
    .await;
    until(client, "the control's violation", "window.__violations >= 1").await;
    assert_eq!(eval(client, "return typeof window.__pwned").await, json!("undefined"));
}
