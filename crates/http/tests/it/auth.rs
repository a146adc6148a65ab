//! The auth matrix: every route of the OpenAPI document, called as
//! anonymous, reader, worker, a worker limited to the `thumbnail` kind, and
//! admin, against the table below (the route table). Below a
//! route's role the answer is 401 (no token) or 403; at or above it,
//! anything but those. A route of the document missing from the table
//! fails the test, so a new route cannot go without its role.

use crate::support;

use opledger_testkit::Backend;
use reqwest::Method;
use serde_json::{json, Value};
use support::{start, As, EVERYONE};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Needs {
    Anyone,
    Reader,
    Worker,
    Admin,
}

/// One row: method, path (as the document writes it), the least role,
/// whether a worker token limited to other kinds is refused (the body
/// names the `metadata` kind), and a body the route parses.
struct Row {
    method: &'static str,
    path: &'static str,
    needs: Needs,
    kind_limited: bool,
    body: fn() -> Option<Value>,
}

const fn row(method: &'static str, path: &'static str, needs: Needs) -> Row {
    Row {
        method,
        path,
        needs,
        kind_limited: false,
        body: || None,
    }
}

const fn with_body(method: &'static str, path: &'static str, needs: Needs, body: fn() -> Option<Value>) -> Row {
    Row {
        method,
        path,
        needs,
        kind_limited: false,
        body,
    }
}

const UNKNOWN: &str = "01890000-0000-7000-8000-000000000000";

/// The route table, every route once.
const TABLE: &[Row] = &[
    row("get", "/", Needs::Anyone),
    row("get", "/assets/{file}", Needs::Anyone),
    row("get", "/assets/{*path}", Needs::Anyone),
    row("get", "/healthz", Needs::Anyone),
    row("get", "/readyz", Needs::Anyone),
    row("get", "/metrics", Needs::Anyone),
    row("get", "/openapi.json", Needs::Anyone),
    row("get", "/api/v1/status", Needs::Reader),
    row("get", "/api/v1/operations", Needs::Reader),
    row("get", "/api/v1/operations/{id}", Needs::Reader),
    row("get", "/api/v1/operations/{id}/timeline", Needs::Reader),
    with_body("post", "/api/v1/operations/{id}/cancel", Needs::Admin, || {
        Some(json!({}))
    }),
    row("get", "/api/v1/media", Needs::Reader),
    with_body("post", "/api/v1/media", Needs::Admin, || {
        Some(json!({"path": "/auth/matrix.jpg", "allow_duplicate_path": true}))
    }),
    row("get", "/api/v1/media/by-path", Needs::Reader),
    row("get", "/api/v1/media/{id}", Needs::Reader),
    row("get", "/api/v1/media/{id}/capabilities", Needs::Reader),
    row("get", "/api/v1/media/{id}/thumbnail", Needs::Reader),
    row("get", "/api/v1/batches", Needs::Reader),
    with_body("post", "/api/v1/batches", Needs::Admin, || {
        Some(json!({"name": "m", "media": [UNKNOWN], "kinds": ["metadata"]}))
    }),
    row("get", "/api/v1/batches/{id}", Needs::Reader),
    with_body("post", "/api/v1/batches/{id}/cancel", Needs::Admin, || Some(json!({}))),
    with_body("post", "/api/v1/batches/{id}/resume", Needs::Admin, || Some(json!({}))),
    row("get", "/api/v1/review", Needs::Reader),
    with_body("post", "/api/v1/review/resolve", Needs::Admin, || {
        Some(json!({"action": "retry", "dry_run": true}))
    }),
    with_body("post", "/api/v1/review/{entry}/resolve", Needs::Admin, || {
        Some(json!({"action": "dismiss"}))
    }),
    row("get", "/api/v1/kinds", Needs::Reader),
    with_body("post", "/api/v1/kinds", Needs::Admin, || {
        Some(json!({"document": "", "dry_run": true}))
    }),
    row("get", "/api/v1/kinds/{name}", Needs::Reader),
    row("post", "/api/v1/verify", Needs::Admin),
    row("get", "/api/v1/events", Needs::Reader),
    // Any named token may export; a job is then its creator's alone.
    with_body("post", "/api/v1/exports", Needs::Reader, || {
        Some(json!({"what": "operations", "format": "csv"}))
    }),
    row("get", "/api/v1/exports/{token}", Needs::Reader),
    row("delete", "/api/v1/exports/{token}", Needs::Reader),
    row("post", "/api/v1/exports/{token}/downloads", Needs::Reader),
    row("get", "/api/v1/exports/{token}/file", Needs::Reader),
    Row {
        method: "post",
        path: "/api/v1/tasks",
        needs: Needs::Worker,
        kind_limited: true,
        body: || Some(json!({"media_id": UNKNOWN, "kind": "metadata", "inputs": {}, "priority": 0})),
    },
    Row {
        method: "post",
        path: "/api/v1/task-requests",
        needs: Needs::Worker,
        kind_limited: true,
        body: || Some(json!({"requests": [{"media_id": UNKNOWN, "kind": "metadata", "inputs": {}}]})),
    },
    Row {
        method: "post",
        path: "/api/v1/claims",
        needs: Needs::Worker,
        kind_limited: true,
        body: || Some(json!({"worker": "matrix", "kinds": ["metadata"], "lease_ms": 30000, "limit": 1, "wait_ms": 0})),
    },
    with_body("post", "/api/v1/claims/{token}/heartbeat", Needs::Worker, || {
        Some(json!({}))
    }),
    with_body("post", "/api/v1/claims/{token}/progress", Needs::Worker, || {
        Some(json!({"phase": "p", "processed": 1, "total": 2}))
    }),
    with_body("post", "/api/v1/claims/{token}/complete", Needs::Worker, || {
        Some(json!({"output": {}}))
    }),
    with_body("post", "/api/v1/claims/{token}/fail", Needs::Worker, || {
        Some(json!({"error": "e", "terminal": false}))
    }),
    with_body("post", "/api/v1/claims/{token}/release", Needs::Worker, || {
        Some(json!({}))
    }),
    with_body("post", "/api/v1/claims/{token}/ack-cancel", Needs::Worker, || {
        Some(json!({}))
    }),
    with_body("post", "/api/v1/reports", Needs::Worker, || {
        Some(json!({"reports": []}))
    }),
];

/// The document's routes as (method, path).
fn documented() -> Vec<(String, String)> {
    let document = opledger_http::openapi();
    let mut routes = Vec::new();
    for (path, item) in &document.paths.paths {
        let methods = [
            ("get", item.get.is_some()),
            ("post", item.post.is_some()),
            ("put", item.put.is_some()),
            ("delete", item.delete.is_some()),
            ("patch", item.patch.is_some()),
        ];
        for (method, present) in methods {
            if present {
                routes.push((method.to_string(), path.clone()));
            }
        }
    }
    routes
}

#[test]
fn every_documented_route_has_a_row_in_the_auth_table() {
    let missing: Vec<String> = documented()
        .into_iter()
        .filter(|(method, path)| !TABLE.iter().any(|row| row.method == method && row.path == path))
        .map(|(method, path)| format!("{method} {path}"))
        .collect();
    assert!(
        missing.is_empty(),
        "routes without a row in the auth table: {missing:?}"
    );
}

/// A concrete path for a documented one: ids that name nothing.
fn concrete(path: &str) -> String {
    path.replace("{id}", UNKNOWN)
        .replace("{entry}", "999999")
        .replace("{name}", "thumbnail")
        .replace("{token}", "opl-claim-none")
        .replace("{file}", "app.js")
        .replace("{*path}", "app.js")
        .replace("by-path", "by-path?path=/nowhere")
}

fn role_of(who: As) -> Option<Needs> {
    match who {
        As::Anonymous => None,
        As::Reader => Some(Needs::Reader),
        As::Worker | As::ThumbnailWorker => Some(Needs::Worker),
        As::Admin => Some(Needs::Admin),
    }
}

async fn every_route_refuses_callers_below_its_role_and_serves_those_at_or_above<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let documented = documented();
    let mut failures = Vec::new();
    let mut checked = 0;
    for row in TABLE {
        if !documented
            .iter()
            .any(|(method, path)| method == row.method && path == row.path)
        {
            continue;
        }
        checked += 1;
        let method = Method::from_bytes(row.method.to_uppercase().as_bytes()).unwrap();
        for who in EVERYONE {
            let mut request = service.http.request(method.clone(), service.url(&concrete(row.path)));
            if let Some(token) = service.token(who) {
                request = request.bearer_auth(token);
            }
            if let Some(body) = (row.body)() {
                request = request.json(&body);
            }
            // Only the status is read: an event stream's body never ends.
            let status = request.send().await.expect("the service answers").status().as_u16();
            let allowed = row.needs == Needs::Anyone
                || role_of(who).is_some_and(|held| held >= row.needs)
                    && !(row.kind_limited && who == As::ThumbnailWorker);
            let expected_refusal = if who == As::Anonymous { 401 } else { 403 };
            let good = if allowed {
                status != 401 && status != 403
            } else {
                status == expected_refusal
            };
            if !good {
                failures.push(format!("{} {} as {who:?}: {status}", row.method, row.path));
            }
        }
    }
    assert!(checked >= 20, "only {checked} routes were checked");
    assert!(failures.is_empty(), "{failures:#?}");
    service.shutdown().await;
}

opledger_testkit::backend_tests!(every_route_refuses_callers_below_its_role_and_serves_those_at_or_above);
