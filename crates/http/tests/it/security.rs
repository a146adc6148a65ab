//! The service's locks, each defect of an adversarial trial with the
//! regression test named after it, on both backends: a worker-reported
//! output path is served only from the ledger's output directories, as a
//! regular raster image of a bounded size, with headers that forbid
//! sniffing, scripting and embedding; a claim token appears only in the
//! answer to the claim that took it and only its principal may report on
//! it; a client without credentials is refused before its request is read;
//! every refusal leaves in the one error shape. `replay --verify` holds
//! after every scenario.

use crate::fixtures;
use crate::support;

use opledger_domain::claims::fingerprint;
use opledger_domain::MediaId;
use opledger_http::{Outputs, ServiceConfig, DEFAULT_MAX_FILE_BYTES};
use opledger_store::Store;
use opledger_testkit::Backend;
use reqwest::header;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{assert_error, start_with, As, Service, EVERYONE};

/// The bound on anything that must not hang: a failure, never a wait.
const HANG: Duration = Duration::from_secs(20);

async fn verified<S: Store>(service: &Service<S>) {
    let report = service.app.engine().verify().await.unwrap();
    assert!(report.is_identical(), "{}", report.render());
}

async fn head<S: Store>(service: &Service<S>) -> i64 {
    service.app.engine().store().head().await.unwrap()
}

/// A service whose output directories are `roots`.
async fn serving<B: Backend>(backend: &B, roots: Vec<PathBuf>) -> Service<B::Store> {
    start_with(backend, |config: &mut ServiceConfig| {
        config.outputs = Outputs::new(roots, DEFAULT_MAX_FILE_BYTES);
    })
    .await
}

/// A media item whose thumbnail task succeeded with `path` as its output.
async fn thumbnail_at<S: Store>(service: &Service<S>, name: &str, path: &Path) -> MediaId {
    let engine = service.app.engine();
    let media = fixtures::register(engine, &format!("/photos/{name}.jpg")).await;
    fixtures::thumbnail_done(engine, media, path).await;
    media
}

async fn thumbnail<S: Store>(service: &Service<S>, media: MediaId) -> support::Answer {
    tokio::time::timeout(
        HANG,
        service.get(&format!("/api/v1/media/{media}/thumbnail"), As::Reader),
    )
    .await
    .expect("the thumbnail route answers without hanging")
}

async fn a_worker_reported_path_outside_the_outputs_directories_is_never_served<B: Backend>(backend: &B) {
    let dir = tempfile::tempdir().unwrap();
    let outputs = dir.path().join("thumbnails");
    std::fs::create_dir(&outputs).unwrap();
    let secret = dir.path().join("tokens.toml");
    std::fs::write(&secret, b"\x89PNG\r\n\x1a\n the tokens file").unwrap();
    let service = serving(backend, vec![outputs.clone()]).await;
    fixtures::declare_kinds(service.app.engine()).await;

    // Recorded as given, served never: an absolute path elsewhere, a link in
    // the outputs pointing out of them, a path that climbs out with `..`, a
    // relative path.
    let link = outputs.join("innocent.png");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let cases = [
        ("passwd", PathBuf::from("/etc/passwd")),
        ("secret", secret.clone()),
        ("link", link),
        ("climb", outputs.join("..").join("tokens.toml")),
        ("relative", PathBuf::from("thumbnails/../tokens.toml")),
    ];
    for (name, path) in cases {
        let media = thumbnail_at(&service, name, &path).await;
        let detail = service.get(&format!("/api/v1/media/{media}"), As::Reader).await;
        assert_eq!(
            detail.body["thumbnail"],
            json!(path.to_string_lossy()),
            "recorded as given"
        );
        let served = thumbnail(&service, media).await;
        assert_error(&served, 404, "not_found");
        assert!(
            !String::from_utf8_lossy(&served.bytes).contains("tokens file")
                && !String::from_utf8_lossy(&served.bytes).contains("root:"),
            "{name}: nothing of the file leaks: {served:?}"
        );
    }
    // A file inside the outputs is served.
    let inside = outputs.join("a.png");
    std::fs::write(&inside, fixtures::PNG).unwrap();
    let media = thumbnail_at(&service, "inside", &inside).await;
    let served = thumbnail(&service, media).await;
    assert_eq!(served.status, 200, "{served:?}");
    assert_eq!(served.bytes, fixtures::PNG);
    verified(&service).await;
    service.shutdown().await;
}

async fn the_file_route_refuses_a_fifo_a_device_a_100_mib_file_and_an_svg_without_blocking<B: Backend>(backend: &B) {
    let dir = tempfile::tempdir().unwrap();
    let outputs = dir.path().join("thumbnails");
    std::fs::create_dir(&outputs).unwrap();
    // `/dev` is an output root here, so that the device is refused for
    // what it is, not for where it is.
    let service = serving(backend, vec![outputs.clone(), PathBuf::from("/dev")]).await;
    fixtures::declare_kinds(service.app.engine()).await;

    let fifo = outputs.join("fifo.png");
    let name = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
    let big = outputs.join("big.png");
    let file = std::fs::File::create(&big).unwrap();
    std::io::Write::write_all(&mut &file, fixtures::PNG).unwrap();
    file.set_len(100 << 20).unwrap();
    let svg = outputs.join("vector.png");
    std::fs::write(
        &svg,
        br#"<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>"#,
    )
    .unwrap();
    let html = outputs.join("page.jpg");
    std::fs::write(&html, b"<!DOCTYPE html><script>alert(1)</script>").unwrap();
    let directory = outputs.join("folder.png");
    std::fs::create_dir(&directory).unwrap();

    for (name, path, status, code) in [
        ("fifo", fifo.clone(), 404, "not_found"),
        ("device", PathBuf::from("/dev/zero"), 404, "not_found"),
        ("directory", directory, 404, "not_found"),
        ("big", big, 404, "not_found"),
        ("svg", svg, 415, "unsupported_media"),
        ("html", html, 415, "unsupported_media"),
    ] {
        let media = thumbnail_at(&service, name, &path).await;
        assert_error(&thumbnail(&service, media).await, status, code);
    }
    // Nothing was left waiting on the FIFO: the service still answers and
    // stops within its bound.
    assert_eq!(service.get("/healthz", As::Anonymous).await.status, 200);
    verified(&service).await;
    tokio::time::timeout(HANG, service.shutdown())
        .await
        .expect("the service stops with no request stuck on a FIFO");
}

async fn a_served_image_has_its_type_from_its_bytes_and_headers_that_forbid_sniffing_scripting_and_embedding<
    B: Backend,
>(
    backend: &B,
) {
    let dir = tempfile::tempdir().unwrap();
    let service = serving(backend, vec![dir.path().to_path_buf()]).await;
    fixtures::declare_kinds(service.app.engine()).await;
    // A PNG named as an SVG is a PNG.
    let misnamed = dir.path().join("thumb.svg");
    std::fs::write(&misnamed, fixtures::PNG).unwrap();
    let media = thumbnail_at(&service, "misnamed", &misnamed).await;
    let served = thumbnail(&service, media).await;
    assert_eq!(served.status, 200, "{served:?}");
    assert_eq!(served.headers[header::CONTENT_TYPE], "image/png");
    assert_eq!(
        served.headers[header::CONTENT_LENGTH],
        fixtures::PNG.len().to_string().as_str()
    );
    assert_eq!(served.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert_eq!(
        served.headers[header::CONTENT_SECURITY_POLICY],
        "default-src 'none'; sandbox"
    );
    assert_eq!(served.headers["cross-origin-resource-policy"], "same-origin");
    assert_eq!(served.bytes, fixtures::PNG);
    // Each raster type by its bytes, larger than one chunk, streamed whole.
    for (name, head, content_type) in [
        ("jpeg", &[0xFF, 0xD8, 0xFF, 0xE0][..], "image/jpeg"),
        ("gif", b"GIF89a", "image/gif"),
        ("webp", b"RIFF\0\0\0\0WEBPVP8 ", "image/webp"),
        ("avif", b"\0\0\0\x1cftypavif\0\0\0\0avifmif1miaf", "image/avif"),
    ] {
        let path = dir.path().join(format!("{name}.bin"));
        let mut bytes = head.to_vec();
        bytes.resize(200_000, 7);
        std::fs::write(&path, &bytes).unwrap();
        let media = thumbnail_at(&service, name, &path).await;
        let served = thumbnail(&service, media).await;
        assert_eq!(served.status, 200, "{name}: {served:?}");
        assert_eq!(served.headers[header::CONTENT_TYPE], content_type);
        assert_eq!(served.bytes, bytes, "{name}");
    }
    verified(&service).await;
    service.shutdown().await;
}

/// Takes one `metadata` task as `who` over HTTP: (the claim, its media).
async fn claimed_over_http<S: Store>(service: &Service<S>, who: As, kind: &str) -> (Value, MediaId) {
    let engine = service.app.engine();
    let media = fixtures::register(engine, &format!("/claims/{kind}-{}.jpg", uuid::Uuid::now_v7())).await;
    let requested = service
        .post(
            "/api/v1/tasks",
            As::Admin,
            json!({"media_id": media.to_string(), "kind": kind, "inputs": {}}),
        )
        .await;
    assert_eq!(requested.status, 200, "{requested:?}");
    let claims = service
        .post(
            "/api/v1/claims",
            who,
            json!({"worker": "w1", "kinds": [kind], "lease_ms": 60000}),
        )
        .await;
    assert_eq!(claims.status, 200, "{claims:?}");
    (claims.body["claims"][0].clone(), media)
}

/// Every documented reading route with the ids of `operation` and `media`.
fn reading_paths(operation: &str, media: MediaId) -> Vec<String> {
    let document = opledger_http::openapi();
    document
        .paths
        .paths
        .iter()
        .filter(|(path, item)| item.get.is_some() && !path.contains("/events") && !path.contains("/exports/"))
        .map(|(path, _)| {
            path.replace(
                "{id}",
                if path.starts_with("/api/v1/media") {
                    "MEDIA"
                } else {
                    operation
                },
            )
            .replace("MEDIA", &media.to_string())
            .replace("{name}", "metadata")
            .replace("{file}", "app.js")
            .replace("by-path", "by-path?path=/claims")
        })
        .collect()
}

async fn a_claim_token_appears_only_in_the_answer_to_the_claim_that_took_it<B: Backend>(backend: &B) {
    let service = start_with(backend, |config| config.allow_anonymous_read = true).await;
    fixtures::declare_kinds(service.app.engine()).await;
    let (claim, media) = claimed_over_http(&service, As::Worker, "metadata").await;
    let token = claim["claim_token"]
        .as_str()
        .expect("the claim answer holds the token")
        .to_string();
    let operation = claim["operation_id"].as_str().unwrap().to_string();

    // Every reading route, as every principal: the token never, its
    // fingerprint on the timeline.
    let mut read = 0;
    for path in reading_paths(&operation, media) {
        for who in EVERYONE {
            let answer = service.get(&path, who).await;
            read += 1;
            assert!(
                !String::from_utf8_lossy(&answer.bytes).contains(&token),
                "GET {path} as {who:?} shows the live claim token"
            );
        }
    }
    assert!(read >= 60, "only {read} reads");
    let timeline = service
        .get(&format!("/api/v1/operations/{operation}/timeline"), As::Admin)
        .await;
    let claimed = timeline
        .body
        .as_array()
        .unwrap()
        .iter()
        .find(|event| event["event_type"] == "operation_claimed");
    assert_eq!(
        claimed.expect("the claim is on the timeline")["payload"]["claim_token"],
        json!(fingerprint(&token)),
        "the timeline shows the token's fingerprint"
    );

    // The event stream from the start, read until the claim's event.
    let response = service
        .http
        .get(service.url("/api/v1/events?after=0"))
        .bearer_auth(service.token(As::Reader).unwrap())
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while !text.contains("event: operation_claimed") {
        let chunk = tokio::time::timeout(HANG, futures::StreamExt::next(&mut body))
            .await
            .expect("the claim's event arrives")
            .expect("the stream goes on")
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(!text.contains(&token), "the event stream shows the live claim token");
    assert!(
        text.contains(&fingerprint(&token)),
        "the event stream shows its fingerprint"
    );

    // The token still works for the worker that holds it.
    let done = service
        .post(
            &format!("/api/v1/claims/{token}/complete"),
            As::Worker,
            json!({"output": {"width": 1}}),
        )
        .await;
    assert_eq!(done.status, 200, "{done:?}");
    verified(&service).await;
    service.shutdown().await;
}

async fn a_report_with_another_principals_claim_token_is_403_and_appends_nothing<B: Backend>(backend: &B) {
    let service = start_with(backend, |_| {}).await;
    fixtures::declare_kinds(service.app.engine()).await;
    // `worker` takes a thumbnail task; `thumbnailer` may work on thumbnails
    // too, and `admin` may do anything else: neither may report on it.
    let (claim, _) = claimed_over_http(&service, As::Worker, "thumbnail").await;
    let token = claim["claim_token"].as_str().unwrap().to_string();
    let revision = claim["revision"].clone();
    let before = head(&service).await;
    for who in [As::ThumbnailWorker, As::Admin] {
        for (action, body) in [
            ("heartbeat", json!({})),
            ("progress", json!({"phase": "stolen", "processed": 1})),
            ("complete", json!({"output": {"path": "/etc/passwd"}})),
            ("fail", json!({"error": "stolen", "terminal": true})),
            ("release", json!({})),
            ("ack-cancel", json!({})),
        ] {
            let answer = service
                .post(&format!("/api/v1/claims/{token}/{action}"), who, body)
                .await;
            assert_error(&answer, 403, "forbidden");
        }
        let reports = service
            .post(
                "/api/v1/reports",
                who,
                json!({"reports": [{"claim_token": token, "outcome": "complete", "output": {"path": "/etc/passwd"}}]}),
            )
            .await;
        assert_eq!(reports.status, 200, "{reports:?}");
        assert_eq!(reports.body["items"][0]["error"]["code"], "forbidden", "{reports:?}");
    }
    assert_eq!(head(&service).await, before, "nothing was appended");

    // The principal that took it reports; the log says which token did.
    let done = service
        .post(
            &format!("/api/v1/claims/{token}/complete"),
            As::Worker,
            json!({"output": {"path": "/t.png"}, "revision": revision, "worker": "w1"}),
        )
        .await;
    assert_eq!(done.status, 200, "{done:?}");
    let operation = claim["operation_id"].as_str().unwrap();
    let timeline = service
        .get(&format!("/api/v1/operations/{operation}/timeline"), As::Reader)
        .await;
    let actors: Vec<&str> = timeline
        .body
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["event_type"] == "operation_claimed" || event["event_type"] == "operation_succeeded")
        .map(|event| event["actor"].as_str().unwrap())
        .collect();
    assert_eq!(actors, ["worker (worker w1)", "worker (worker w1)"]);
    verified(&service).await;
    service.shutdown().await;
}

/// The routes whose answer is a file or holds a live claim token, each
/// with the test that proves who may have it.
const GUARDED: &[(&str, &str, &str)] = &[
    (
        "get",
        "/api/v1/media/{id}/thumbnail",
        "a_worker_reported_path_outside_the_outputs_directories_is_never_served",
    ),
    (
        "get",
        "/api/v1/exports/{token}/file",
        "a_job_token_is_honoured_only_for_its_principal_and_policy_revision (exports.rs)",
    ),
    (
        "post",
        "/api/v1/claims",
        "a_report_with_another_principals_claim_token_is_403_and_appends_nothing",
    ),
];

#[test]
fn every_route_answering_a_file_or_a_claim_token_is_guarded_by_a_test_here() {
    let document = serde_json::to_value(opledger_http::openapi()).unwrap();
    let mut sensitive = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let Some(ok) = operation["responses"].get("200") else {
                continue;
            };
            let content = ok["content"].as_object().cloned().unwrap_or_default();
            let file = content
                .keys()
                .any(|kind| kind.starts_with("image/") || kind == "application/octet-stream");
            let token = content.values().any(|body| {
                let schema = body["schema"].to_string();
                schema.contains("ClaimsAnswer") || schema.contains("claim_token")
            });
            if file || token {
                sensitive.push((method.clone(), path.clone()));
            }
        }
    }
    for (method, path) in &sensitive {
        assert!(
            GUARDED.iter().any(|(m, p, _)| m == method && p == path),
            "{method} {path} answers a file or a claim token: add its guard test to GUARDED"
        );
    }
    assert_eq!(
        sensitive.len(),
        GUARDED.len(),
        "GUARDED names a route that is no longer sensitive: {sensitive:?}"
    );
}

async fn a_request_without_credentials_is_refused_before_its_body_or_query_is_read<B: Backend>(backend: &B) {
    for anonymous_read in [false, true] {
        let service = start_with(backend, |config| config.allow_anonymous_read = anonymous_read).await;
        let broken = service
            .http
            .post(service.url("/api/v1/tasks"))
            .header(header::CONTENT_TYPE, "application/json")
            .body("{ this is not json")
            .send()
            .await
            .unwrap();
        assert_eq!(broken.status(), 401, "a writing route without a token");
        let query = service
            .get("/api/v1/operations?status=nonsense&unknown=1", As::Anonymous)
            .await;
        if anonymous_read {
            assert_error(&query, 400, "malformed");
        } else {
            assert_error(&query, 401, "unauthenticated");
        }
        service.shutdown().await;
    }
}

async fn framework_refusals_answer_in_the_one_error_shape<B: Backend>(backend: &B) {
    let service = start_with(backend, |_| {}).await;
    let put = service
        .call(reqwest::Method::PUT, "/api/v1/status", As::Reader, None)
        .await;
    assert_error(&put, 405, "method_not_allowed");
    let long = format!("/api/v1/operations?after={}", "a".repeat(9_000));
    assert_error(&service.get(&long, As::Reader).await, 414, "uri_too_long");
    // A path segment that is not UTF-8 once percent-decoded.
    let bad = service.get("/api/v1/media/%FF%FE", As::Reader).await;
    assert_error(&bad, 400, "malformed");
    assert!(!String::from_utf8_lossy(&bad.bytes).contains("%FF"), "{bad:?}");
    service.shutdown().await;
}

async fn texts_over_the_limit_nul_characters_and_outputs_that_are_not_objects_are_refused<B: Backend>(backend: &B) {
    let service = start_with(backend, |_| {}).await;
    fixtures::declare_kinds(service.app.engine()).await;
    let (claim, _) = claimed_over_http(&service, As::Worker, "metadata").await;
    let token = claim["claim_token"].as_str().unwrap();
    let on = |action: &str| format!("/api/v1/claims/{token}/{action}");
    let before = head(&service).await;
    let many_small: serde_json::Map<String, Value> = (0..30_000)
        .map(|index| (format!("k{index}"), json!("0123456789abcdef")))
        .collect();
    for (path, body) in [
        (on("complete"), json!({"output": [1, 2, 3]})),
        (on("complete"), json!({"output": "a string"})),
        (on("complete"), json!({"output": 7})),
        (on("complete"), json!({"output": {"caption": "x".repeat(70_000)}})),
        (on("complete"), json!({"output": many_small})),
        (on("fail"), json!({"error": "e".repeat(70_000)})),
        (on("release"), json!({"reason": "nul \u{0} inside"})),
        (on("complete"), json!({"no_result": "nul \u{0}"})),
        (on("progress"), json!({"phase": "p\u{0}", "processed": 1})),
        (
            "/api/v1/claims".to_string(),
            json!({"worker": "w".repeat(300), "kinds": ["metadata"]}),
        ),
        (
            "/api/v1/claims".to_string(),
            json!({"worker": "tab\there", "kinds": ["metadata"]}),
        ),
    ] {
        let answer = service.post(&path, As::Worker, body).await;
        assert_error(&answer, 422, "invalid");
        assert!(
            answer.bytes.len() < 2_000,
            "the refusal quotes little of the input: {} bytes",
            answer.bytes.len()
        );
    }
    assert_eq!(head(&service).await, before, "nothing was appended");
    verified(&service).await;
    service.shutdown().await;
}

async fn an_integer_input_beyond_64_bits_and_an_unknown_media_kind_are_refused<B: Backend>(backend: &B) {
    let service = start_with(backend, |_| {}).await;
    fixtures::declare_kinds(service.app.engine()).await;
    let media = fixtures::register(service.app.engine(), "/inputs/a.jpg").await;
    let before = head(&service).await;
    // `max_side` declares a minimum and no maximum.
    for max_side in [json!(1e30), json!(18_446_744_073_709_551_615u64), json!(9.5)] {
        let answer = service
            .post(
                "/api/v1/tasks",
                As::Worker,
                json!({"media_id": media.to_string(), "kind": "thumbnail", "inputs": {"max_side": max_side}}),
            )
            .await;
        assert_error(&answer, 422, "invalid");
    }
    let hologram = service
        .post(
            "/api/v1/media",
            As::Admin,
            json!({"path": "/odd/h.bin", "kind": "hologram"}),
        )
        .await;
    assert_error(&hologram, 422, "invalid");
    assert_eq!(head(&service).await, before, "nothing was appended");
    for kind in ["image", "video", "audio", "other"] {
        let answer = service
            .post(
                "/api/v1/media",
                As::Admin,
                json!({"path": format!("/odd/{kind}"), "kind": kind}),
            )
            .await;
        assert_eq!(answer.status, 201, "{kind}: {answer:?}");
    }
    verified(&service).await;
    service.shutdown().await;
}

async fn connect<S: Store>(service: &Service<S>) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(service.address).await.unwrap()
}

/// What the service sends on `stream` until it closes it (bounded by HANG).
async fn until_closed(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut bytes = Vec::new();
    tokio::time::timeout(HANG, stream.read_to_end(&mut bytes))
        .await
        .expect("the service closes the connection")
        .ok();
    String::from_utf8_lossy(&bytes).into_owned()
}

async fn a_client_that_sends_no_headers_in_time_or_idles_is_disconnected<B: Backend>(backend: &B) {
    use tokio::io::AsyncWriteExt;
    let service = start_with(backend, |config| {
        config.connections.header_timeout = Duration::from_millis(500);
    })
    .await;
    // Half a request, never finished.
    let mut slow = connect(&service).await;
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
        .await
        .unwrap();
    let said = until_closed(&mut slow).await;
    assert!(!said.contains("200 OK"), "{said}");
    // A connection with nothing sent at all.
    let mut silent = connect(&service).await;
    until_closed(&mut silent).await;
    // An idle keep-alive connection after a whole request and its answer.
    let mut idle = connect(&service).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let said = until_closed(&mut idle).await;
    assert!(said.starts_with("HTTP/1.1 200"), "{said}");
    assert_eq!(service.get("/healthz", As::Anonymous).await.status, 200);
    service.shutdown().await;
}

async fn connections_past_the_cap_are_answered_503_in_the_error_shape_and_served_once_freed<B: Backend>(backend: &B) {
    let service = start_with(backend, |config| {
        config.connections.max_connections = 2;
        config.connections.header_timeout = Duration::from_secs(60);
    })
    .await;
    let held = [connect(&service).await, connect(&service).await];
    let mut third = connect(&service).await;
    let said = until_closed(&mut third).await;
    assert!(said.starts_with("HTTP/1.1 503"), "{said}");
    assert!(said.contains(r#""code":"unavailable""#), "{said}");
    drop(held);
    // Freed slots serve again, as soon as the service saw them close.
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let client = reqwest::Client::new();
        let answer = client
            .get(service.url("/healthz"))
            .send()
            .await
            .map(|answer| answer.status());
        if answer.as_ref().is_ok_and(|status| *status == 200) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no slot was freed: {answer:?}");
        tokio::task::yield_now().await;
    }
    service.shutdown().await;
}

async fn a_body_that_does_not_arrive_in_time_is_answered_408<B: Backend>(backend: &B) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let service = start_with(backend, |config| config.body_timeout = Duration::from_millis(500)).await;
    let mut stream = connect(&service).await;
    let head = format!(
        "POST /api/v1/tasks HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"media_id\"",
        service.token(As::Worker).unwrap()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // The rest never comes; the answer does, while the connection is open.
    let mut said = Vec::new();
    let mut buffer = [0u8; 4096];
    while !String::from_utf8_lossy(&said).contains(r#""code":"timeout""#) {
        let read = tokio::time::timeout(HANG, stream.read(&mut buffer))
            .await
            .expect("the service answers a body that does not come")
            .unwrap();
        assert!(read > 0, "closed without an answer: {}", String::from_utf8_lossy(&said));
        said.extend_from_slice(&buffer[..read]);
    }
    assert!(String::from_utf8_lossy(&said).starts_with("HTTP/1.1 408"));
    service.shutdown().await;
}

opledger_testkit::backend_tests!(
    a_client_that_sends_no_headers_in_time_or_idles_is_disconnected,
    connections_past_the_cap_are_answered_503_in_the_error_shape_and_served_once_freed,
    a_body_that_does_not_arrive_in_time_is_answered_408,
    a_worker_reported_path_outside_the_outputs_directories_is_never_served,
    the_file_route_refuses_a_fifo_a_device_a_100_mib_file_and_an_svg_without_blocking,
    a_served_image_has_its_type_from_its_bytes_and_headers_that_forbid_sniffing_scripting_and_embedding,
    a_claim_token_appears_only_in_the_answer_to_the_claim_that_took_it,
    a_report_with_another_principals_claim_token_is_403_and_appends_nothing,
    a_request_without_credentials_is_refused_before_its_body_or_query_is_read,
    framework_refusals_answer_in_the_one_error_shape,
    texts_over_the_limit_nul_characters_and_outputs_that_are_not_objects_are_refused,
    an_integer_input_beyond_64_bits_and_an_unknown_media_kind_are_refused,
);
