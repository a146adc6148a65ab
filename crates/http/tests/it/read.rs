//! The reading routes' contracts, on both backends: shapes, pagination
//! with `next`, 404 on unknown ids, 400 on malformed ids, cursors and
//! query strings, and thumbnails with their `ETag`.

use crate::fixtures;
use crate::support;

use opledger_testkit::Backend;
use reqwest::header;
use serde_json::Value;
use support::{assert_error, start, start_with, As};

const NOT_A_UUID: &str = "not-a-uuid";
const UNKNOWN: &str = "01890000-0000-7000-8000-000000000000";

async fn operations_list_pages_newest_first_with_filters_and_refuses_bad_queries<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let engine = service.app.engine();
    fixtures::declare_kinds(engine).await;
    let first = fixtures::register(engine, "/photos/a.jpg").await;
    let second = fixtures::register(engine, "/photos/b.jpg").await;
    let dir = tempfile::tempdir().unwrap();
    fixtures::thumbnail_done(engine, first, &dir.path().join("a.png")).await;
    let failed = fixtures::metadata_failed(engine, second).await;

    let page = service.get("/api/v1/operations?limit=1", As::Reader).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert_eq!(page.body["items"].as_array().unwrap().len(), 1);
    let newest = &page.body["items"][0];
    assert_eq!(newest["operation_id"], failed.to_string());
    assert_eq!(newest["status"], "failed_terminal");
    assert!(newest["created_at"].is_string());
    let next = page.body["next"].as_str().expect("a next cursor");
    let rest = service
        .get(&format!("/api/v1/operations?limit=1&after={next}"), As::Reader)
        .await;
    assert_eq!(rest.status, 200);
    assert_eq!(rest.body["items"][0]["kind"], "thumbnail");
    assert!(rest.body["next"].is_null(), "{rest:?}");

    let filtered = service
        .get(
            "/api/v1/operations?status=succeeded&status=queued&kind=thumbnail",
            As::Reader,
        )
        .await;
    assert_eq!(filtered.body["items"].as_array().unwrap().len(), 1, "{filtered:?}");
    let by_media = service
        .get(&format!("/api/v1/operations?media={second}"), As::Reader)
        .await;
    assert_eq!(by_media.body["items"][0]["operation_id"], failed.to_string());

    assert_error(
        &service.get("/api/v1/operations?status=finished", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service.get("/api/v1/operations?after=garbage", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service.get("/api/v1/operations?media=nope", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service.get("/api/v1/operations?since=yesterday", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service.get("/api/v1/operations?limit=many", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service.get("/api/v1/operations?colour=red", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service.get("/api/v1/operations?limit=0", As::Reader).await,
        422,
        "invalid",
    );
    // A cursor of another listing is not a cursor of this one.
    let media_page = service.get("/api/v1/media?limit=1", As::Reader).await;
    let media_cursor = media_page.body["next"].as_str().unwrap().to_string();
    assert_error(
        &service
            .get(&format!("/api/v1/operations?after={media_cursor}"), As::Reader)
            .await,
        400,
        "malformed",
    );
    service.shutdown().await;
}

async fn describe_explains_an_operation_with_its_why_and_history_and_timeline_lists_its_events<B: Backend>(
    backend: &B,
) {
    let service = start(backend).await;
    let engine = service.app.engine();
    fixtures::declare_kinds(engine).await;
    let media = fixtures::register(engine, "/photos/a.jpg").await;
    let failed = fixtures::metadata_failed(engine, media).await;

    let described = service.get(&format!("/api/v1/operations/{failed}"), As::Reader).await;
    assert_eq!(described.status, 200, "{described:?}");
    let body = &described.body;
    assert_eq!(body["operation_id"], failed.to_string());
    assert_eq!(body["kind"], "metadata");
    assert_eq!(body["path"], "/photos/a.jpg");
    assert_eq!(body["status"], "failed_terminal");
    assert_eq!(body["attempts"]["claims"], 1);
    assert_eq!(body["last_error"], "the file is not an image");
    assert!(body["why"]["standing"].is_string(), "{body}");
    assert!(body["sentence"].as_str().is_some_and(|sentence| !sentence.is_empty()));
    let history = body["timeline"].as_array().unwrap();
    assert!(history.len() >= 3, "{body}");

    let timeline = service
        .get(&format!("/api/v1/operations/{failed}/timeline"), As::Reader)
        .await;
    assert_eq!(timeline.status, 200);
    let events = timeline.body.as_array().unwrap();
    assert_eq!(events.len(), history.len());
    assert_eq!(events[0]["stream_version"], 1);
    assert!(events[0]["event_type"].is_string() && events[0]["payload"].is_object());
    let seqs: Vec<i64> = events.iter().map(|event| event["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "{seqs:?}");

    for path in ["/api/v1/operations/{}", "/api/v1/operations/{}/timeline"] {
        assert_error(
            &service.get(&path.replace("{}", UNKNOWN), As::Reader).await,
            404,
            "not_found",
        );
        assert_error(
            &service.get(&path.replace("{}", NOT_A_UUID), As::Reader).await,
            400,
            "malformed",
        );
    }
    service.shutdown().await;
}

async fn media_list_show_by_path_and_capabilities_answer_what_the_cli_prints<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let engine = service.app.engine();
    fixtures::declare_kinds(engine).await;
    let dir = tempfile::tempdir().unwrap();
    let first = fixtures::register(engine, "/photos/a.jpg").await;
    let second = fixtures::register(engine, "/photos/b.jpg").await;
    fixtures::register(engine, "/videos/c.mp4").await;
    let file = dir.path().join("a.png");
    fixtures::thumbnail_done(engine, first, &file).await;

    let page = service
        .get("/api/v1/media?path_prefix=/photos/&limit=1", As::Reader)
        .await;
    assert_eq!(page.status, 200, "{page:?}");
    assert_eq!(page.body["items"][0]["path"], "/photos/a.jpg");
    assert_eq!(page.body["items"][0]["media_kind"], "image");
    let next = page.body["next"].as_str().unwrap();
    let rest = service
        .get(
            &format!("/api/v1/media?path_prefix=/photos/&limit=1&after={next}"),
            As::Reader,
        )
        .await;
    assert_eq!(rest.body["items"][0]["media_id"], second.to_string());
    let succeeded = service
        .get(
            "/api/v1/media?capability=thumbnail&capability_status=succeeded",
            As::Reader,
        )
        .await;
    let ids: Vec<&Value> = succeeded.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| &item["media_id"])
        .collect();
    assert_eq!(ids, vec![&Value::String(first.to_string())], "{succeeded:?}");
    assert_error(
        &service.get("/api/v1/media?capability_status=bogus", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service
            .get("/api/v1/media?capability_status=succeeded", As::Reader)
            .await,
        422,
        "invalid",
    );

    let shown = service.get(&format!("/api/v1/media/{first}"), As::Reader).await;
    assert_eq!(shown.status, 200, "{shown:?}");
    assert_eq!(shown.body["media"]["path"], "/photos/a.jpg");
    assert_eq!(shown.body["thumbnail"], file.to_string_lossy().as_ref());
    assert_eq!(shown.body["capabilities"][0]["capability"], "thumbnail");
    assert_eq!(shown.body["capabilities"][0]["status"], "succeeded");
    assert_eq!(shown.body["operations"].as_array().unwrap().len(), 1);
    assert!(shown.body["review"].as_array().unwrap().is_empty());

    let found = service
        .get("/api/v1/media/by-path?path=/photos/b.jpg", As::Reader)
        .await;
    assert_eq!(found.body["media"]["media_id"], second.to_string(), "{found:?}");
    assert_error(
        &service.get("/api/v1/media/by-path?path=/nowhere", As::Reader).await,
        404,
        "not_found",
    );
    assert_error(
        &service.get("/api/v1/media/by-path", As::Reader).await,
        400,
        "malformed",
    );

    let capabilities = service
        .get(&format!("/api/v1/media/{first}/capabilities"), As::Reader)
        .await;
    assert_eq!(capabilities.body["media_id"], first.to_string());
    let thumbnail = &capabilities.body["capabilities"][0];
    assert_eq!(thumbnail["task_kind"], "thumbnail");
    assert!(thumbnail["produced_revision"].is_string(), "{thumbnail}");

    for path in [
        "/api/v1/media/{}",
        "/api/v1/media/{}/capabilities",
        "/api/v1/media/{}/thumbnail",
    ] {
        assert_error(
            &service.get(&path.replace("{}", UNKNOWN), As::Reader).await,
            404,
            "not_found",
        );
        assert_error(
            &service.get(&path.replace("{}", NOT_A_UUID), As::Reader).await,
            400,
            "malformed",
        );
    }
    service.shutdown().await;
}

async fn a_thumbnail_is_served_as_png_with_its_revision_as_etag_and_304_when_unchanged<B: Backend>(backend: &B) {
    let dir = tempfile::tempdir().unwrap();
    let outputs = dir.path().to_path_buf();
    let service = start_with(backend, |config| {
        config.outputs = opledger_http::Outputs::new([outputs], opledger_http::DEFAULT_MAX_FILE_BYTES)
    })
    .await;
    let engine = service.app.engine();
    fixtures::declare_kinds(engine).await;
    // No extension: the type comes from the file's first bytes.
    let file = dir.path().join("thumb-of-a");
    std::fs::write(&file, fixtures::PNG).unwrap();
    let media = fixtures::register(engine, "/photos/a.jpg").await;
    let bare = fixtures::register(engine, "/photos/bare.jpg").await;
    let (_, revision) = fixtures::thumbnail_done(engine, media, &file).await;
    let path = format!("/api/v1/media/{media}/thumbnail");

    let served = service.get(&path, As::Reader).await;
    assert_eq!(served.status, 200, "{served:?}");
    assert_eq!(served.headers[header::CONTENT_TYPE], "image/png");
    let etag = served.headers[header::ETAG].to_str().unwrap().to_string();
    assert_eq!(etag, format!("\"{revision}\""));
    assert_eq!(served.bytes, fixtures::PNG);

    let token = service.token(As::Reader).unwrap().to_string();
    let cached = service
        .http
        .get(service.url(&path))
        .bearer_auth(&token)
        .header(header::IF_NONE_MATCH, &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(cached.status(), 304);
    assert_eq!(cached.headers()[header::ETAG].to_str().unwrap(), etag);
    let other = service
        .http
        .get(service.url(&path))
        .bearer_auth(&token)
        .header(header::IF_NONE_MATCH, "\"another-revision\"")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);

    assert_error(
        &service
            .get(&format!("/api/v1/media/{bare}/thumbnail"), As::Reader)
            .await,
        404,
        "not_found",
    );
    std::fs::remove_file(&file).unwrap();
    assert_error(&service.get(&path, As::Reader).await, 404, "not_found");
    service.shutdown().await;
}

async fn an_operation_read_carries_its_current_output_and_the_revision_it_belongs_to<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let engine = service.app.engine();
    fixtures::declare_kinds(engine).await;
    let media = fixtures::register(engine, "/photos/a.jpg").await;
    engine
        .request_task(
            &opledger_engine::CommandContext::actor("test"),
            opledger_engine::TaskRequest {
                target: opledger_engine::TaskTarget::Media(media),
                kind: "thumbnail".into(),
                inputs: serde_json::json!({}),
                priority: 0,
            },
        )
        .await
        .unwrap();
    let claim = fixtures::claim_one(engine, "thumbnail").await;
    let path = format!("/api/v1/operations/{}", claim.operation_id);

    // Claimed, no result yet: no output, and the token only as a fingerprint.
    let running = service.get(&path, As::Reader).await;
    assert_eq!(running.status, 200, "{running:?}");
    assert!(running.body["output"].is_null(), "{}", running.body);
    assert!(running.body["completed_revision"].is_null());
    assert!(!running.body.to_string().contains(&claim.claim_token));

    // The worker's output is data: markup in it comes back as a JSON string.
    let output = serde_json::json!({"path": "/out/a.png", "caption": "<script>alert(1)</script>"});
    engine
        .complete_task(
            &opledger_engine::CommandContext::actor("test"),
            &claim.fence(),
            opledger_engine::Completion::Output(output.clone()),
        )
        .await
        .unwrap();
    let done = service.get(&path, As::Reader).await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(done.body["output"], output);
    assert_eq!(done.body["completed_revision"], claim.revision.as_str());
    assert_eq!(done.body["requested_revision"], claim.revision.as_str());
    assert!(!done.body.to_string().contains(&claim.claim_token));
    service.shutdown().await;
}

opledger_testkit::backend_tests!(
    operations_list_pages_newest_first_with_filters_and_refuses_bad_queries,
    describe_explains_an_operation_with_its_why_and_history_and_timeline_lists_its_events,
    media_list_show_by_path_and_capabilities_answer_what_the_cli_prints,
    a_thumbnail_is_served_as_png_with_its_revision_as_etag_and_304_when_unchanged,
    an_operation_read_carries_its_current_output_and_the_revision_it_belongs_to,
);
