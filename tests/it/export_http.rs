//! Exports over HTTP with real processes: `opledger supervise` runs the
//! jobs, and the routes are served either by a real `opledger serve` (the
//! file it streams equals what `opledger export download` writes, byte for
//! byte; no supervisor is 503; another principal's token and a token after
//! the policy changed are 403; two concurrent GETs of one attempt stream
//! once; HEAD leaves the attempt pending; DELETE cancels at once) or by an
//! in-process service whose engine runs on a clock the test moves (an
//! unstarted attempt expires at 45 s; an expired artifact is 410; a
//! streamed attempt is recorded `started`; a download that breaks off —
//! the artifact expiring mid-stream, the client going away — is recorded
//! `failed`).

use crate::common;
use crate::supervise_support;

use common::{assert_exit, run, stdout};
use opledger_domain::Timestamp;
use opledger_engine::{Clock, Engine, UuidV7Ids};
use opledger_http::{App, ServiceConfig, Tokens};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use opledger_supervise::attempts::AttemptState;
use opledger_supervise::ArtifactDir;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use supervise_support::{runtime, Ledger};

/// A running `opledger serve`, killed when dropped.
struct Served {
    child: Child,
    base: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `opledger token new --role reader --name NAME` into `file`: the token.
fn reader_token(file: &Path, name: &str) -> String {
    let output = run(common::binary()
        .args(["token", "new", "--role", "reader", "--name", name, "--tokens-file"])
        .arg(file));
    assert_exit(&output, 0);
    stdout(&output).trim().to_string()
}

/// `opledger serve` over the ledger and its artifact directory (from the
/// environment, as `export` takes it), ready.
fn serve(ledger: &Ledger, tokens: &Path) -> Served {
    let mut child = ledger
        .command()
        .args(["serve", "--bind", "127.0.0.1:0", "--tokens"])
        .arg(tokens)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("opledger serve starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    let base = first
        .strip_prefix("opledger serving on ")
        .unwrap_or_else(|| panic!("serve's first line names its address, not {first:?}"))
        .to_string();
    std::thread::spawn(move || lines.for_each(drop));
    let served = Served { child, base };
    let http = Http::new(&served.base);
    supervise_support::wait_for("serve to be ready", Duration::from_secs(30), || {
        http.call(Method::GET, "/readyz", None, None).status == StatusCode::OK
    });
    served
}

/// An answer: status, headers, body.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    bytes: Vec<u8>,
    body: Value,
}

/// A blocking client of one service.
struct Http {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
}

impl Http {
    fn new(base: &str) -> Http {
        Http {
            runtime: runtime(),
            client: reqwest::Client::new(),
            base: base.to_string(),
        }
    }

    fn request(&self, method: Method, path: &str, token: Option<&str>, body: Option<Value>) -> reqwest::RequestBuilder {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        request
    }

    fn call(&self, method: Method, path: &str, token: Option<&str>, body: Option<Value>) -> Answer {
        self.runtime.block_on(answer(self.request(method, path, token, body)))
    }

    fn create(&self, token: &str, body: Value) -> Value {
        let created = self.call(Method::POST, "/api/v1/exports", Some(token), Some(body));
        assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
        created.body
    }

    fn status(&self, token: &str, job: &str) -> Answer {
        self.call(Method::GET, &format!("/api/v1/exports/{job}"), Some(token), None)
    }

    fn wait_status(&self, token: &str, job: &str, wanted: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = self.status(token, job);
            assert_eq!(status.status, StatusCode::OK, "{status:?}");
            if status.body["status"] == wanted {
                return status.body;
            }
            assert!(Instant::now() < deadline, "never {wanted}: {:?}", status.body);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn register(&self, token: &str, job: &str) -> Answer {
        self.call(
            Method::POST,
            &format!("/api/v1/exports/{job}/downloads"),
            Some(token),
            None,
        )
    }
}

async fn answer(request: reqwest::RequestBuilder) -> Answer {
    let response = request.send().await.expect("the service answers");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.map(|bytes| bytes.to_vec()).unwrap_or_default();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        bytes,
        body,
    }
}

fn assert_error(answer: &Answer, status: u16, code: &str) {
    assert_eq!(answer.status.as_u16(), status, "{answer:?}");
    assert_eq!(answer.body["error"]["code"], code, "{answer:?}");
}

fn keys(value: &Value) -> Vec<String> {
    value.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn an_export_over_http_streams_the_file_the_cli_downloads_byte_for_byte() {
    let ledger = Ledger::new(30, 4);
    let tokens = ledger.artifacts.with_file_name("tokens.toml");
    let alice = reader_token(&tokens, "alice");
    let bob = reader_token(&tokens, "bob");
    let served = serve(&ledger, &tokens);
    let http = Http::new(&served.base);
    let csv = json!({"what": "operations", "format": "csv"});

    // Without a supervisor nothing would run it: 503, as the CLI's exit 5.
    let refused = http.call(Method::POST, "/api/v1/exports", Some(&alice), Some(csv.clone()));
    assert_error(&refused, 503, "unavailable");
    assert!(refused.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no supervisor is running"));

    let _supervisor = ledger.supervise(&[], &[]);
    let created = http.create(&alice, csv);
    let job = created["job_token"].as_str().unwrap();
    let as_of = created["as_of_seq"].as_i64().unwrap().to_string();
    // The same export from the command line, at the same position.
    let (cli_job, _, cli_as_of) = ledger.create(&["--what", "operations", "--format", "csv", "--as-of-seq", &as_of]);
    assert_eq!(cli_as_of.to_string(), as_of);
    let done = http.wait_status(&alice, job, "succeeded");
    let cli_done = ledger.wait_status(&cli_job, "succeeded", Duration::from_secs(30));
    assert_eq!(
        keys(&done),
        keys(&cli_done),
        "the route answers what `export status --json` prints"
    );
    for field in [
        "processed",
        "total",
        "regular_rows",
        "logical_count_unit",
        "as_of_seq",
        "what",
        "format",
    ] {
        assert_eq!(done[field], cli_done[field], "{field}");
    }
    assert_eq!(done["artifact"]["sha256"], cli_done["artifact"]["sha256"]);
    let size = done["artifact"]["size"].as_u64().unwrap();

    // Another principal's token is refused on every route, whatever it asks.
    let path = format!("/api/v1/exports/{job}");
    assert_error(&http.status(&bob, job), 403, "forbidden");
    assert_error(&http.register(&bob, job), 403, "forbidden");
    assert_error(&http.call(Method::DELETE, &path, Some(&bob), None), 403, "forbidden");
    assert_error(&http.call(Method::GET, &path, None, None), 401, "unauthenticated");

    // A second registration while one is pending is the same attempt.
    let attempt = http.register(&alice, job);
    assert_eq!(attempt.status, StatusCode::OK, "{attempt:?}");
    assert_eq!(attempt.body["state"], "pending");
    let id = attempt.body["attempt_id"].as_u64().unwrap();
    let file = attempt.body["file"].as_str().unwrap().to_string();
    assert_eq!(file, format!("{path}/file?attempt={id}"));
    assert_error(
        &http.call(Method::GET, &format!("{path}/file?attempt={id}"), Some(&bob), None),
        403,
        "forbidden",
    );
    assert_eq!(http.register(&alice, job).body["attempt_id"], id);

    // HEAD answers the headers and leaves the attempt pending.
    let head = http.call(Method::HEAD, &file, Some(&alice), None);
    assert_eq!(head.status, StatusCode::OK, "{head:?}");
    assert!(head.bytes.is_empty());
    assert_eq!(head.headers["content-length"], size.to_string().as_str());
    assert_eq!(head.headers["content-type"], "text/csv; charset=utf-8");
    assert_eq!(head.headers["x-accel-buffering"], "no");
    assert!(head.headers["last-modified"].to_str().unwrap().ends_with(" GMT"));
    assert_eq!(
        http.register(&alice, job).body["attempt_id"],
        id,
        "HEAD did not take it"
    );

    // Two GETs of one attempt at once: exactly one streams, the other is 409.
    let (first, second) = http.runtime.block_on(async {
        tokio::join!(
            answer(http.request(Method::GET, &file, Some(&alice), None)),
            answer(http.request(Method::GET, &file, Some(&alice), None)),
        )
    });
    let (streamed, refused) = if first.status == StatusCode::OK {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(streamed.status, StatusCode::OK, "{streamed:?}");
    assert_error(&refused, 409, "conflict");
    assert_eq!(streamed.headers["x-accel-buffering"], "no");
    assert!(streamed.headers.contains_key("last-modified"));
    assert_eq!(streamed.bytes.len() as u64, size);
    assert_eq!(
        streamed.bytes,
        ledger.download(&cli_job),
        "byte for byte the CLI's file"
    );
    // The attempt is used: a later GET of it is refused, a new one streams.
    assert_error(&http.call(Method::GET, &file, Some(&alice), None), 409, "conflict");
    let again = http.register(&alice, job);
    assert_ne!(again.body["attempt_id"], id);
    let again = http.call(Method::GET, again.body["file"].as_str().unwrap(), Some(&alice), None);
    assert_eq!(again.bytes, streamed.bytes);
    drop(served);

    // The policy changes: alice's token is rotated. Her job token, made
    // under the old revision, is refused with her new one.
    let rotated = ledger.artifacts.with_file_name("rotated.toml");
    let alice_now = reader_token(&rotated, "alice");
    let served = serve(&ledger, &rotated);
    let http = Http::new(&served.base);
    assert_error(&http.status(&alice_now, job), 403, "forbidden");
    assert_error(&http.register(&alice_now, job), 403, "forbidden");
    assert_error(&http.call(Method::GET, &file, Some(&alice_now), None), 403, "forbidden");
}

#[test]
fn delete_records_the_cancel_at_once_and_the_export_ends_cancelled() {
    let ledger = Ledger::new(5, 0);
    let tokens = ledger.artifacts.with_file_name("tokens.toml");
    let alice = reader_token(&tokens, "alice");
    let _supervisor = ledger.supervise(&[], &[("OPLEDGER_EXPORT_TEST_BLOCK_MS", "4000")]);
    let served = serve(&ledger, &tokens);
    let http = Http::new(&served.base);
    let created = http.create(&alice, json!({"what": "operations", "format": "json"}));
    let job = created["job_token"].as_str().unwrap();
    http.wait_status(&alice, job, "running");
    let path = format!("/api/v1/exports/{job}");
    let cancel = http.call(Method::DELETE, &path, Some(&alice), None);
    assert_eq!(cancel.status, StatusCode::OK, "{cancel:?}");
    // Durable at once: the next read says so, while the child still runs.
    let status = http.status(&alice, job).body;
    assert_eq!(status["cancel_requested"], true, "{status}");
    let ended = http.wait_status(&alice, job, "cancelled");
    assert_eq!(ended["artifact"], Value::Null);
    // Its file never came: no attempt can be registered.
    assert_eq!(http.register(&alice, job).status, StatusCode::CONFLICT);
    // A cancelled job cannot be cancelled again.
    assert_error(&http.call(Method::DELETE, &path, Some(&alice), None), 409, "conflict");
}

/// The machine's clock plus an offset the test moves.
struct MovedClock {
    offset_micros: AtomicI64,
}

impl MovedClock {
    fn advance(&self, by: Duration) {
        self.offset_micros.fetch_add(by.as_micros() as i64, Ordering::SeqCst);
    }
}

impl Clock for MovedClock {
    fn now(&self) -> Timestamp {
        let now = Timestamp::from_datetime(chrono::Utc::now());
        Timestamp::from_micros(now.as_micros() + self.offset_micros.load(Ordering::SeqCst))
    }
}

/// Serves `app` until the runtime ends. Generic: spawned with a concrete
/// store, the future's `Send` is asked of every lifetime, which rustc
/// cannot prove for the references the service holds across awaits.
fn spawn_service<S: opledger_store::Store>(app: App<S>, listener: tokio::net::TcpListener) {
    tokio::spawn(opledger_http::serve(app, listener, std::future::pending()));
}

/// An in-process service over the ledger, its engine on a clock the test
/// moves, ready; with one reader's token.
struct InProcess {
    /// Runs the service; dropped with it.
    _runtime: tokio::runtime::Runtime,
    app: App<SqliteStore>,
    clock: Arc<MovedClock>,
    http: Http,
    token: String,
}

impl InProcess {
    fn start(ledger: &Ledger) -> InProcess {
        let (token, entry) = opledger_http::new_token("alice", opledger_http::Role::Reader, vec![]).unwrap();
        let clock = Arc::new(MovedClock {
            offset_micros: AtomicI64::new(0),
        });
        let runtime = runtime();
        let (app, address) = runtime.block_on(async {
            let store = SqliteStore::open(SqliteConfig::from_url(ledger.db.to_str().unwrap()).unwrap())
                .await
                .unwrap();
            let config = ServiceConfig {
                tokens: Tokens::parse(&opledger_http::entry_toml(&entry)).unwrap(),
                artifact_dir: Some(ArtifactDir::open(&ledger.artifacts).unwrap()),
                ..ServiceConfig::default()
            };
            let engine = Engine::with_clock(store, clock.clone(), Arc::new(UuidV7Ids));
            let app = App::new(engine, config);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            spawn_service(app.clone(), listener);
            (app, address)
        });
        let http = Http::new(&format!("http://{address}"));
        supervise_support::wait_for("the service to be ready", Duration::from_secs(30), || app.is_ready());
        InProcess {
            _runtime: runtime,
            app,
            clock,
            http,
            token,
        }
    }

    /// A succeeded export's job token and a pending attempt's file path.
    fn exported(&self, body: Value) -> (String, u64, String) {
        let created = self.http.create(&self.token, body);
        let job = created["job_token"].as_str().unwrap().to_string();
        self.http.wait_status(&self.token, &job, "succeeded");
        let attempt = self.http.register(&self.token, &job).body;
        let file = attempt["file"].as_str().unwrap().to_string();
        (job, attempt["attempt_id"].as_u64().unwrap(), file)
    }

    fn attempt_state(&self, attempt: u64) -> AttemptState {
        self.app.attempts().get(attempt, self.app.engine().now()).unwrap().state
    }

    /// Waits until the attempt is `wanted`.
    fn wait_attempt(&self, attempt: u64, wanted: AttemptState) {
        supervise_support::wait_for(
            &format!("attempt {attempt} {wanted:?}"),
            Duration::from_secs(20),
            || self.attempt_state(attempt) == wanted,
        );
    }
}

/// Appends generated events (operations with media tasks) to the ledger:
/// an operations export of `events` events is about 30 bytes an event.
fn add_generated_events(ledger: &Ledger, events: u64) {
    runtime().block_on(async {
        let store = SqliteStore::open(SqliteConfig::from_url(ledger.db.to_str().unwrap()).unwrap())
            .await
            .unwrap();
        let (engine, _) = Engine::open(store).await.unwrap();
        let start = Timestamp::from_datetime(chrono::Utc::now()).as_micros() - 3_600_000_000;
        let mut generated = opledger_bench::events::GeneratedEvents::with_media_tasks(Timestamp::from_micros(start));
        for batch in opledger_bench::events::GeneratedEvents::batches(generated.appends(events), 1_000) {
            engine.append(batch).await.unwrap();
        }
    });
}

#[test]
fn a_download_that_breaks_off_mid_stream_is_recorded_failed_when_the_artifact_expires_or_the_client_goes() {
    let ledger = Ledger::new(0, 0);
    // About 4 MB of CSV: far more than the connection buffers while the
    // client reads nothing, so most of the file is still to be sent.
    add_generated_events(&ledger, 150_000);
    let _supervisor = ledger.supervise(&[], &[]);
    let service = InProcess::start(&ledger);
    let token = service.token.clone();
    let operations = json!({"what": "operations", "format": "csv"});

    // The client goes away after the first chunk: the rest is never sent,
    // and the attempt is `failed`, not `started`.
    let (_, attempt, file) = service.exported(operations.clone());
    service.http.runtime.block_on(async {
        let mut response = service
            .http
            .request(Method::GET, &file, Some(&token), None)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.chunk().await.unwrap().is_some());
        drop(response);
    });
    service.wait_attempt(attempt, AttemptState::Failed);

    // The artifact expires while it streams (last: the service's clock
    // then runs ahead of the supervisor's heartbeats): the next chunk's check stops
    // the body short, and the attempt is `failed`.
    let (_, attempt, file) = service.exported(operations);
    let (length, received) = service.http.runtime.block_on(async {
        let mut response = service
            .http
            .request(Method::GET, &file, Some(&token), None)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let length = response.content_length().unwrap();
        assert!(length > 2_000_000, "a large file: {length} bytes");
        let mut received = response.chunk().await.unwrap().map_or(0, |chunk| chunk.len() as u64);
        service.clock.advance(Duration::from_secs(11 * 60));
        while let Ok(Some(chunk)) = response.chunk().await {
            received += chunk.len() as u64;
        }
        (length, received)
    });
    assert!(
        received < length,
        "the body stopped short: {received} of {length} bytes"
    );
    service.wait_attempt(attempt, AttemptState::Failed);

    service.app.stop();
}

#[test]
fn an_unstarted_attempt_expires_at_45_seconds_and_an_expired_artifact_is_410_on_the_services_clock() {
    let ledger = Ledger::new(10, 0);
    let _supervisor = ledger.supervise(&[], &[]);
    let service = InProcess::start(&ledger);
    let InProcess {
        app,
        clock,
        http,
        token,
        ..
    } = &service;
    let token = token.as_str();
    let created = http.create(token, json!({"what": "capability_counts", "format": "json"}));
    let job = created["job_token"].as_str().unwrap();
    http.wait_status(token, job, "succeeded");
    let now = || app.engine().now();

    let attempt = http.register(token, job).body;
    let first = attempt["attempt_id"].as_u64().unwrap();
    clock.advance(Duration::from_secs(44));
    assert_eq!(
        http.register(token, job).body["attempt_id"],
        first,
        "still pending at 44 s"
    );
    let head = http.call(Method::HEAD, attempt["file"].as_str().unwrap(), Some(token), None);
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.headers["content-type"], "application/json");
    clock.advance(Duration::from_secs(2));
    let late = http.call(Method::GET, attempt["file"].as_str().unwrap(), Some(token), None);
    assert_error(&late, 410, "gone");
    assert_eq!(app.attempts().get(first, now()).unwrap().state, AttemptState::Expired);

    // A new attempt taken in time streams, and is recorded started.
    let fresh = http.register(token, job).body;
    let second = fresh["attempt_id"].as_u64().unwrap();
    assert_ne!(second, first);
    let file = http.call(Method::GET, fresh["file"].as_str().unwrap(), Some(token), None);
    assert_eq!(file.status, StatusCode::OK, "{file:?}");
    let pivot: Value = serde_json::from_slice(&file.bytes).unwrap();
    assert!(pivot["pivot"].is_object(), "{pivot}");
    assert_eq!(app.attempts().get(second, now()).unwrap().state, AttemptState::Started);

    // Past the artifact's expiry (10 minutes) on the service's clock.
    let pending = http.register(token, job).body;
    clock.advance(Duration::from_secs(11 * 60));
    let status = http.status(token, job).body;
    assert_eq!(status["expired"], true, "{status}");
    assert_eq!(status["artifact"], Value::Null);
    assert_error(&http.register(token, job), 410, "gone");
    assert_error(
        &http.call(Method::GET, pending["file"].as_str().unwrap(), Some(token), None),
        410,
        "gone",
    );
    app.stop();
}
