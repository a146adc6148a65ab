//! The admin routes' contracts (and the reading routes of the same parts),
//! on both backends: batches, the review queue, task kinds, media
//! registration and replay verification — shapes, pages, 404/400 on
//! unknown or malformed ids, 409 on illegal transitions, 422 on invalid
//! input, and the wake-up of waiters when a handler commits.

use crate::fixtures;
use crate::support;

use opledger_testkit::Backend;
use serde_json::{json, Value};
use std::time::Duration;
use support::{assert_error, start, start_with, As};

const UNKNOWN: &str = "01890000-0000-7000-8000-000000000000";

async fn batches_are_created_listed_shown_by_pages_cancelled_and_resumed_as_their_rules_allow<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let engine = service.app.engine();
    fixtures::declare_kinds(engine).await;
    let first = fixtures::register(engine, "/photos/a.jpg").await;
    let second = fixtures::register(engine, "/photos/b.jpg").await;

    let created = service
        .post(
            "/api/v1/batches",
            As::Admin,
            json!({"name": "thumbs", "media": [first, second], "kinds": ["thumbnail"], "inputs": {"thumbnail": {"max_side": 64}}}),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.body["name"], "thumbs");
    assert_eq!(created.body["total"], 2);
    assert_eq!(created.body["active"], true);
    assert_eq!(created.body["items"].as_array().unwrap().len(), 2);
    let batch = created.body["batch_id"].as_str().unwrap().to_string();

    let shown = service
        .get(&format!("/api/v1/batches/{batch}?limit=1"), As::Reader)
        .await;
    assert_eq!(shown.status, 200, "{shown:?}");
    assert_eq!(shown.body["items"].as_array().unwrap().len(), 1);
    assert_eq!(shown.body["items"][0]["path"], "/photos/a.jpg");
    let next = shown.body["next"].as_str().unwrap();
    let rest = service
        .get(&format!("/api/v1/batches/{batch}?limit=1&after={next}"), As::Reader)
        .await;
    assert_eq!(rest.body["items"][0]["path"], "/photos/b.jpg");
    assert!(rest.body["next"].is_null());

    let cancelled = service
        .post(
            &format!("/api/v1/batches/{batch}/cancel"),
            As::Admin,
            json!({"reason": "wrong size"}),
        )
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    assert_eq!(cancelled.body["cancelled"], 2);
    assert_error(
        &service
            .post(&format!("/api/v1/batches/{batch}/cancel"), As::Admin, json!({}))
            .await,
        409,
        "conflict",
    );
    let resumed = service
        .call(
            reqwest::Method::POST,
            &format!("/api/v1/batches/{batch}/resume"),
            As::Admin,
            None,
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    assert_eq!(resumed.body["resumes"], 1);

    // A batch whose one item succeeded has nothing failed or cancelled:
    // resuming it is refused. (Its priority puts it before the resumed
    // batch's items in the claim order.)
    let dir = tempfile::tempdir().unwrap();
    let third = fixtures::register(engine, "/photos/c.jpg").await;
    let done = service
        .post(
            "/api/v1/batches",
            As::Admin,
            json!({"name": "again", "media": [third], "kinds": ["thumbnail"], "priority": 10}),
        )
        .await;
    assert_eq!(done.status, 201, "{done:?}");
    let claim = fixtures::claim_one(engine, "thumbnail").await;
    assert_eq!(claim.media_id, Some(third));
    fixtures::complete_thumbnail(engine, &claim, &dir.path().join("c.png")).await;
    let finished = done.body["batch_id"].as_str().unwrap();
    let settled = service.get(&format!("/api/v1/batches/{finished}"), As::Reader).await;
    assert_eq!(settled.body["succeeded"], 1, "{settled:?}");
    assert_error(
        &service
            .post(&format!("/api/v1/batches/{finished}/resume"), As::Admin, json!({}))
            .await,
        409,
        "conflict",
    );

    let page = service.get("/api/v1/batches?limit=1", As::Reader).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.body["items"][0]["name"], "again");
    let next = page.body["next"].as_str().unwrap();
    let older = service
        .get(&format!("/api/v1/batches?limit=1&after={next}"), As::Reader)
        .await;
    assert_eq!(older.body["items"][0]["batch_id"], batch.as_str());
    let active = service.get("/api/v1/batches?active=true", As::Reader).await;
    assert_eq!(active.body["items"].as_array().unwrap().len(), 1, "{active:?}");

    assert_error(
        &service.get(&format!("/api/v1/batches/{UNKNOWN}"), As::Reader).await,
        404,
        "not_found",
    );
    assert_error(&service.get("/api/v1/batches/nope", As::Reader).await, 400, "malformed");
    assert_error(
        &service.get("/api/v1/batches?after=nope", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service.get("/api/v1/batches?active=maybe", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service
            .post(&format!("/api/v1/batches/{UNKNOWN}/cancel"), As::Admin, json!({}))
            .await,
        404,
        "not_found",
    );
    assert_error(
        &service
            .post(
                "/api/v1/batches",
                As::Admin,
                json!({"name": "x", "media": [first], "kinds": []}),
            )
            .await,
        422,
        "invalid",
    );
    assert_error(
        &service
            .post(
                "/api/v1/batches",
                As::Admin,
                json!({"name": "x", "media": ["nope"], "kinds": ["thumbnail"]}),
            )
            .await,
        400,
        "malformed",
    );
    service.shutdown().await;
}

async fn the_review_queue_pages_and_resolves_one_entry_or_many_with_a_dry_run_first<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let engine = service.app.engine();
    fixtures::declare_kinds(engine).await;
    for name in ["a", "b", "c"] {
        let media = fixtures::register(engine, &format!("/photos/{name}.jpg")).await;
        fixtures::metadata_failed(engine, media).await;
    }

    let page = service.get("/api/v1/review?limit=2", As::Reader).await;
    assert_eq!(page.status, 200, "{page:?}");
    let items = page.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["reason_code"], "failed_terminal");
    assert_eq!(items[0]["path"], "/photos/a.jpg");
    assert_eq!(items[0]["state"], "open");
    let next = page.body["next"].as_str().unwrap();
    let rest = service
        .get(&format!("/api/v1/review?limit=2&after={next}"), As::Reader)
        .await;
    assert_eq!(rest.body["items"].as_array().unwrap().len(), 1);
    let first = items[0]["entry_id"].as_i64().unwrap();

    let resolved = service
        .post(
            &format!("/api/v1/review/{first}/resolve"),
            As::Admin,
            json!({"action": "dismiss", "reason": "not a photo"}),
        )
        .await;
    assert_eq!(resolved.status, 200, "{resolved:?}");
    assert_eq!(resolved.body["state"], "resolved");
    assert_eq!(resolved.body["resolution"], "dismiss");
    assert_eq!(resolved.body["resolved_by"], "admin");
    assert_error(
        &service
            .post(
                &format!("/api/v1/review/{first}/resolve"),
                As::Admin,
                json!({"action": "dismiss"}),
            )
            .await,
        409,
        "conflict",
    );
    assert_error(
        &service
            .post("/api/v1/review/999999/resolve", As::Admin, json!({"action": "dismiss"}))
            .await,
        404,
        "not_found",
    );
    assert_error(
        &service
            .post("/api/v1/review/first/resolve", As::Admin, json!({"action": "dismiss"}))
            .await,
        400,
        "malformed",
    );
    assert_error(
        &service
            .post(
                &format!("/api/v1/review/{first}/resolve"),
                As::Admin,
                json!({"action": "shrug"}),
            )
            .await,
        400,
        "malformed",
    );

    let dry = service
        .post(
            "/api/v1/review/resolve",
            As::Admin,
            json!({"action": "retry", "kind": "metadata", "dry_run": true}),
        )
        .await;
    assert_eq!(dry.status, 200, "{dry:?}");
    assert_eq!(dry.body["matched"], 2);
    assert_eq!(dry.body["resolved"], 0);
    assert_eq!(dry.body["dry_run"], true);
    assert_eq!(dry.body["entries"].as_array().unwrap().len(), 2);
    let still = service.get("/api/v1/review", As::Reader).await;
    assert_eq!(
        still.body["items"].as_array().unwrap().len(),
        2,
        "a dry run records nothing"
    );

    let bulk = service
        .post(
            "/api/v1/review/resolve",
            As::Admin,
            json!({"action": "acknowledge", "limit": 1}),
        )
        .await;
    assert_eq!(bulk.body["resolved"], 1, "{bulk:?}");
    assert_eq!(bulk.body["remaining"], 1);
    assert_eq!(bulk.body["action"], "acknowledge");
    assert_error(
        &service
            .post(
                "/api/v1/review/resolve",
                As::Admin,
                json!({"action": "retry", "reason_code": "bored"}),
            )
            .await,
        422,
        "invalid",
    );
    assert_error(
        &service
            .post(
                "/api/v1/review/resolve",
                As::Admin,
                json!({"action": "retry", "batch": UNKNOWN}),
            )
            .await,
        404,
        "not_found",
    );
    assert_error(
        &service.get("/api/v1/review?after=x", As::Reader).await,
        400,
        "malformed",
    );
    service.shutdown().await;
}

const NEW_KIND: &str = r#"
[[kind]]
name = "caption"
target = "media"
version = "1"
inputs.language = { type = "string", default = "en" }
"#;

async fn kinds_are_listed_shown_and_applied_and_a_refused_document_records_nothing<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let engine = service.app.engine();
    fixtures::declare_kinds(engine).await;

    let listed = service.get("/api/v1/kinds", As::Reader).await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let names: Vec<&str> = listed.body["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kind| kind["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"thumbnail") && names.contains(&"metadata"), "{names:?}");
    let shown = service.get("/api/v1/kinds/thumbnail", As::Reader).await;
    assert_eq!(shown.body["name"], "thumbnail");
    assert_eq!(shown.body["declared"], true);
    assert_error(
        &service.get("/api/v1/kinds/nothing", As::Reader).await,
        404,
        "not_found",
    );

    let dry = service
        .post(
            "/api/v1/kinds",
            As::Admin,
            json!({"document": NEW_KIND, "dry_run": true}),
        )
        .await;
    assert_eq!(dry.status, 200, "{dry:?}");
    assert_eq!(
        dry.body["kinds"][0],
        json!({"name": "caption", "status": "declared", "version": "1", "stale_items": 0, "retargeted": 0})
    );
    assert_error(
        &service.get("/api/v1/kinds/caption", As::Reader).await,
        404,
        "not_found",
    );
    let applied = service
        .post("/api/v1/kinds", As::Admin, json!({"document": NEW_KIND}))
        .await;
    assert_eq!(applied.body["kinds"][0]["status"], "declared", "{applied:?}");
    assert_eq!(service.get("/api/v1/kinds/caption", As::Reader).await.status, 200);

    // Changing what a kind takes without a new version is refused, and the
    // whole document with it: the new kind beside it is not declared.
    let changed =
        NEW_KIND.replace("\"en\"", "\"fr\"") + "\n[[kind]]\nname = \"tagging\"\ntarget = \"media\"\nversion = \"1\"\n";
    let refused = service
        .post("/api/v1/kinds", As::Admin, json!({"document": changed}))
        .await;
    assert_error(&refused, 422, "invalid");
    let report = &refused.body["error"]["details"]["kinds"];
    let caption = report
        .as_array()
        .unwrap()
        .iter()
        .find(|kind| kind["name"] == "caption")
        .unwrap();
    assert_eq!(caption["status"], "refused", "{refused:?}");
    assert!(caption["error"].is_string());
    assert_error(
        &service.get("/api/v1/kinds/tagging", As::Reader).await,
        404,
        "not_found",
    );

    assert_error(
        &service
            .post("/api/v1/kinds", As::Admin, json!({"document": "[[kind]\nname ="}))
            .await,
        422,
        "invalid",
    );
    assert_error(
        &service
            .post("/api/v1/kinds", As::Admin, json!({"text": NEW_KIND}))
            .await,
        400,
        "malformed",
    );
    service.shutdown().await;
}

async fn registering_media_refuses_a_duplicate_path_unless_allowed_and_wakes_waiters<B: Backend>(backend: &B) {
    // The head poll is off, so only the handler's commit can wake.
    let service = start_with(backend, |config| config.head_poll = Duration::from_secs(3600)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let woken = service.app.wake().subscribe();
    let digest = format!("sha256:{}", "ab".repeat(32));
    let registered = service
        .post(
            "/api/v1/media",
            As::Admin,
            json!({"path": "/photos/a.jpg", "digest": digest, "size": 10}),
        )
        .await;
    assert_eq!(registered.status, 201, "{registered:?}");
    assert!(woken.has_changed().unwrap(), "a commit wakes waiters at once");
    let id = registered.body["media_id"].as_str().unwrap().to_string();
    let shown = service.get(&format!("/api/v1/media/{id}"), As::Reader).await;
    assert_eq!(shown.body["media"]["content_digest"], Value::String(digest));
    assert_eq!(shown.body["media"]["media_kind"], "image");

    assert_error(
        &service
            .post("/api/v1/media", As::Admin, json!({"path": "/photos/a.jpg"}))
            .await,
        409,
        "conflict",
    );
    let again = service
        .post(
            "/api/v1/media",
            As::Admin,
            json!({"path": "/photos/a.jpg", "allow_duplicate_path": true}),
        )
        .await;
    assert_eq!(again.status, 201);
    assert_ne!(again.body["media_id"], registered.body["media_id"]);
    assert_error(
        &service
            .post("/api/v1/media", As::Admin, json!({"path": "/b.jpg", "digest": "md5:1"}))
            .await,
        422,
        "invalid",
    );
    assert_error(
        &service.post("/api/v1/media", As::Admin, json!({"path": " "})).await,
        422,
        "invalid",
    );
    assert_error(
        &service.post("/api/v1/media", As::Admin, json!({"kind": "image"})).await,
        400,
        "malformed",
    );
    assert_error(
        &service
            .post("/api/v1/media", As::Admin, json!({"path": "/c.jpg", "size": -1}))
            .await,
        422,
        "invalid",
    );
    service.shutdown().await;
}

async fn verify_replays_the_log_and_says_it_matches_the_live_projections<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let engine = service.app.engine();
    fixtures::declare_kinds(engine).await;
    let media = fixtures::register(engine, "/photos/a.jpg").await;
    fixtures::metadata_failed(engine, media).await;
    let verified = service
        .call(reqwest::Method::POST, "/api/v1/verify", As::Admin, None)
        .await;
    assert_eq!(verified.status, 200, "{verified:?}");
    assert_eq!(verified.body["identical"], true);
    assert!(verified.body["events"].as_u64().unwrap() > 0);
    assert_eq!(verified.body["differences"], json!([]));
    service.shutdown().await;
}

opledger_testkit::backend_tests!(
    batches_are_created_listed_shown_by_pages_cancelled_and_resumed_as_their_rules_allow,
    the_review_queue_pages_and_resolves_one_entry_or_many_with_a_dry_run_first,
    kinds_are_listed_shown_and_applied_and_a_refused_document_records_nothing,
    registering_media_refuses_a_duplicate_path_unless_allowed_and_wakes_waiters,
    verify_replays_the_log_and_says_it_matches_the_live_projections,
);
