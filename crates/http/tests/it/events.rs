//! `GET /api/v1/events`: the log as server-sent events. Every event once,
//! in order, across reconnects; filters by operation, batch and media;
//! resuming from `Last-Event-ID`; heartbeats; the stream ends on shutdown.

use crate::support;

use futures::StreamExt;
use opledger_domain::events::{Event, MediaRegistered};
use opledger_domain::{MediaId, NewEvent, StreamId};
use opledger_engine::{BatchRequest, ClaimRequest, CommandContext, Completion, Engine, TaskRequest, TaskTarget};
use opledger_store::{ExpectedVersion, Store, StreamAppend};
use opledger_testkit::Backend;
use serde_json::{json, Value};
use std::time::Duration;
use support::{assert_error, start, start_with, As, Service};

/// One event as a client parsed it from the stream.
#[derive(Debug, Clone)]
struct Received {
    id: i64,
    event: String,
    data: Value,
}

/// A minimal SSE client: reads `id:`/`event:`/`data:` fields up to each
/// blank line, and counts comment lines (heartbeats).
struct Client {
    body: futures::stream::BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    buffer: String,
    comments: usize,
}

impl Client {
    async fn connect<S: opledger_store::Store>(
        service: &Service<S>,
        query: &str,
        last_event_id: Option<i64>,
    ) -> Client {
        let mut request = service
            .http
            .get(service.url(&format!("/api/v1/events{query}")))
            .bearer_auth(service.token(As::Reader).unwrap());
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = request.send().await.expect("the service answers");
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Client {
            body: response.bytes_stream().boxed(),
            buffer: String::new(),
            comments: 0,
        }
    }

    /// The next event, or None when the stream ended or sent no event
    /// (heartbeats aside) for `quiet`.
    async fn next(&mut self, quiet: Duration) -> Option<Received> {
        let deadline = tokio::time::Instant::now() + quiet;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, String::new(), String::new());
                for line in block.lines() {
                    if line.starts_with(':') {
                        self.comments += 1;
                    } else if let Some(value) = line.strip_prefix("id: ") {
                        id = Some(value.parse::<i64>().expect("ids are seqs"));
                    } else if let Some(value) = line.strip_prefix("event: ") {
                        event = value.to_string();
                    } else if let Some(value) = line.strip_prefix("data: ") {
                        data.push_str(value);
                    }
                }
                if let Some(id) = id {
                    let data = serde_json::from_str(&data).expect("data is the envelope's JSON");
                    return Some(Received { id, event, data });
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.body.next()).await.ok()??;
            self.buffer
                .push_str(std::str::from_utf8(&chunk.expect("the stream reads")).expect("utf-8"));
        }
    }
}

/// Appends `count` media registrations in atomic appends of `per_append`.
async fn register_many<S: opledger_store::Store>(engine: &Engine<S>, count: usize, per_append: usize) {
    for chunk in 0..count.div_ceil(per_append) {
        let appends = (0..per_append.min(count - chunk * per_append))
            .map(|item| {
                let media_id = MediaId(uuid::Uuid::now_v7());
                StreamAppend {
                    stream_id: StreamId::media(media_id),
                    expected: ExpectedVersion::NoStream,
                    events: vec![NewEvent {
                        event: Event::MediaRegistered(MediaRegistered {
                            media_id,
                            path: format!("/live/{chunk}/{item}.jpg"),
                            media_kind: "image".into(),
                            content_digest: None,
                            byte_size: Some(1),
                        }),
                        recorded_at: engine.now(),
                        actor: "test".into(),
                        correlation_id: format!("chunk-{chunk}"),
                        causation_id: None,
                    }],
                }
            })
            .collect();
        engine.append(appends).await.expect("the append commits");
    }
}

async fn a_client_reconnecting_three_times_during_ten_thousand_events_sees_each_once_in_order<B: Backend>(backend: &B) {
    const EVENTS: usize = 10_000;
    let service = start(backend).await;
    let head = service.app.engine().store().head().await.unwrap();
    // Appended straight through the engine: the head poll wakes the stream.
    let engine = service.app.engine().clone();
    let appending = tokio::spawn(async move { register_many(&engine, EVENTS, 50).await });
    let mut seen: Vec<i64> = Vec::with_capacity(EVENTS);
    let mut client = Client::connect(&service, &format!("?after={head}"), None).await;
    let mut reconnects = 0;
    while seen.len() < EVENTS {
        let event = client
            .next(Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("the stream stalled after {} events", seen.len()));
        assert_eq!(event.event, "media_registered");
        assert_eq!(event.data["seq"], event.id);
        seen.push(event.id);
        // Reconnect three times, part way through, from the last id received.
        if reconnects < 3 && seen.len() == (reconnects + 1) * EVENTS / 4 {
            reconnects += 1;
            drop(client);
            client = Client::connect(&service, &format!("?after={head}"), seen.last().copied()).await;
        }
    }
    appending.await.unwrap();
    assert_eq!(reconnects, 3);
    let expected: Vec<i64> = (head + 1..=head + EVENTS as i64).collect();
    assert!(seen == expected, "events were missed, repeated or out of order");
    assert!(
        client.next(Duration::from_millis(300)).await.is_none(),
        "nothing more was appended"
    );
    service.shutdown().await;
}

async fn filters_keep_only_the_events_of_the_operation_batch_or_media_asked<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let engine = service.app.engine();
    let context = CommandContext::actor("test");
    engine
        .declare(&context, opledger_domain::kinds::legacy::declarations())
        .await
        .unwrap();
    let head = engine.store().head().await.unwrap();
    let kept = engine
        .register_media(&context, "/a.jpg", "image", Some("sha256:aa".into()), Some(1))
        .await
        .unwrap();
    let other = engine
        .register_media(&context, "/b.jpg", "image", Some("sha256:bb".into()), Some(1))
        .await
        .unwrap();
    // The operation exists before the batch: a claim given back unused.
    let early = engine
        .request_task(
            &context,
            TaskRequest {
                target: TaskTarget::Media(kept),
                kind: "metadata".into(),
                inputs: json!({}),
                priority: 0,
            },
        )
        .await
        .unwrap();
    let claim = |worker: &'static str| {
        engine.claim_tasks(
            &context,
            ClaimRequest {
                kinds: vec!["metadata".into()],
                worker: worker.into(),
                lease_ms: 30_000,
                limit: 1,
                principal: None,
                versions: Default::default(),
            },
        )
    };
    let given_back = claim("before-the-batch").await.unwrap();
    engine
        .release_task(&context, &given_back[0].fence(), "not now")
        .await
        .unwrap();
    let batch = engine
        .create_batch(
            &context,
            BatchRequest {
                name: "one".into(),
                media: vec![kept],
                kinds: vec!["metadata".into()],
                inputs: Default::default(),
                priority: 0,
            },
        )
        .await
        .unwrap();
    let operation = batch.items[0].operation_id;
    assert_eq!(operation, early.operation_id, "the batch follows the operation");
    let batch_id = batch.batch.batch_id;
    // The operation's later events name only the operation.
    let claims = claim("w").await.unwrap();
    engine
        .complete_task(&context, &claims[0].fence(), Completion::Output(json!({"width": 1})))
        .await
        .unwrap();

    let collect = |query: String| {
        let service = &service;
        async move {
            let mut client = Client::connect(service, &query, None).await;
            let mut events = Vec::new();
            while let Some(event) = client.next(Duration::from_millis(500)).await {
                events.push(event);
            }
            events
        }
    };
    let all = collect(format!("?after={head}")).await;
    let media = collect(format!("?after={head}&media={kept}")).await;
    assert!(media.iter().any(|event| event.event == "media_registered"));
    assert!(media.iter().any(|event| event.event == "operation_created"));
    for later in ["operation_claimed", "operation_succeeded"] {
        assert!(
            media.iter().any(|event| event.event == later),
            "an operation's {later} is an event of its media item: {media:?}"
        );
    }
    assert!(
        media
            .iter()
            .all(|event| !event.data.to_string().contains(&other.to_string())),
        "{media:?}"
    );
    assert!(media.len() < all.len());

    let of_batch = collect(format!("?after={head}&batch={batch_id}")).await;
    let types: Vec<&str> = of_batch.iter().map(|event| event.event.as_str()).collect();
    assert!(types.contains(&"batch_created"), "{types:?}");
    assert!(!types.contains(&"media_registered"), "{types:?}");
    let claimed: Vec<&str> = of_batch
        .iter()
        .filter(|event| event.event == "operation_claimed")
        .map(|event| event.data["worker"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        claimed,
        vec!["w"],
        "an item's claims from the batch's creation on are the batch's events, not those before it: {types:?}"
    );
    assert!(types.contains(&"operation_succeeded"), "{types:?}");
    // The same from a stream that starts after the batch's creation.
    let created = of_batch[0].id;
    let later = collect(format!("?after={created}&batch={batch_id}")).await;
    assert!(
        later.iter().any(|event| event.event == "operation_claimed"),
        "{later:?}"
    );

    let of_operation = collect(format!("?after={head}&operation={operation}")).await;
    assert!(of_operation.iter().any(|event| event.event == "operation_created"));
    assert!(of_operation
        .iter()
        .all(|event| event.data.to_string().contains(&operation.to_string())));
    assert!(!of_operation.iter().any(|event| event.event == "media_registered"));

    let both = collect(format!("?after={head}&batch={batch_id}&media={other}")).await;
    assert!(both.is_empty(), "{both:?}");
    service.shutdown().await;
}

async fn last_event_id_resumes_after_that_seq_and_wins_over_after<B: Backend>(backend: &B) {
    let service = start(backend).await;
    let head = service.app.engine().store().head().await.unwrap();
    register_many(service.app.engine(), 5, 1).await;
    let mut client = Client::connect(&service, "?after=0", Some(head + 2)).await;
    let mut ids = Vec::new();
    while let Some(event) = client.next(Duration::from_millis(500)).await {
        ids.push(event.id);
    }
    assert_eq!(ids, vec![head + 3, head + 4, head + 5]);
    service.shutdown().await;
}

async fn without_a_position_the_stream_starts_at_the_head_and_wakes_on_new_commits<B: Backend>(backend: &B) {
    let service = start(backend).await;
    register_many(service.app.engine(), 3, 3).await;
    let head = service.app.engine().store().head().await.unwrap();
    let mut client = Client::connect(&service, "", None).await;
    register_many(service.app.engine(), 1, 1).await;
    service.app.wake().bump();
    let event = client
        .next(Duration::from_secs(2))
        .await
        .expect("the new event arrives");
    assert_eq!(event.id, head + 1);
    service.shutdown().await;
}

async fn a_quiet_stream_sends_heartbeat_comments_and_ends_on_shutdown<B: Backend>(backend: &B) {
    let service = start_with(backend, |config| config.sse_heartbeat = Duration::from_millis(100)).await;
    let mut client = Client::connect(&service, "", None).await;
    assert!(client.next(Duration::from_millis(450)).await.is_none());
    assert!(client.comments >= 2, "heartbeats: {}", client.comments);
    let ended = tokio::spawn(async move { while client.next(Duration::from_secs(20)).await.is_some() {} });
    tokio::time::timeout(Duration::from_secs(10), service.shutdown())
        .await
        .expect("shutdown completes with a stream open");
    tokio::time::timeout(Duration::from_secs(5), ended)
        .await
        .expect("the stream ended")
        .unwrap();
}

async fn bad_positions_and_filters_are_400_and_a_token_is_needed<B: Backend>(backend: &B) {
    let service = start(backend).await;
    assert_error(
        &service.get("/api/v1/events", As::Anonymous).await,
        401,
        "unauthenticated",
    );
    assert_error(
        &service.get("/api/v1/events?after=-1", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service.get("/api/v1/events?after=x", As::Reader).await,
        400,
        "malformed",
    );
    assert_error(
        &service.get("/api/v1/events?media=<script>", As::Reader).await,
        400,
        "malformed",
    );
    let answer = service
        .http
        .get(service.url("/api/v1/events"))
        .bearer_auth(service.token(As::Reader).unwrap())
        .header("Last-Event-ID", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 400);
    service.shutdown().await;
}

/// A position the log has not reached would leave the stream silent until
/// the log got there, then skip everything before it: refused, as an
/// export's `as_of_seq` is.
async fn a_position_past_the_head_is_refused_with_422_not_answered_with_silence<B: Backend>(backend: &B) {
    let service = start(backend).await;
    register_many(service.app.engine(), 3, 3).await;
    let head = service.app.engine().store().head().await.unwrap();
    assert_error(
        &service
            .get(&format!("/api/v1/events?after={}", head + 1), As::Reader)
            .await,
        422,
        "invalid",
    );
    let far = service
        .http
        .get(service.url("/api/v1/events"))
        .bearer_auth(service.token(As::Reader).unwrap())
        .header("Last-Event-ID", "9000000000000")
        .send()
        .await
        .unwrap();
    assert_eq!(far.status(), 422);
    // The head itself is a position: the stream starts there.
    let mut at_head = Client::connect(&service, &format!("?after={head}"), None).await;
    register_many(service.app.engine(), 1, 1).await;
    let next = at_head
        .next(Duration::from_secs(20))
        .await
        .expect("the next event arrives");
    assert_eq!(next.id, head + 1);
    service.shutdown().await;
}

opledger_testkit::backend_tests!(
    a_position_past_the_head_is_refused_with_422_not_answered_with_silence,
    a_client_reconnecting_three_times_during_ten_thousand_events_sees_each_once_in_order,
    filters_keep_only_the_events_of_the_operation_batch_or_media_asked,
    last_event_id_resumes_after_that_seq_and_wins_over_after,
    without_a_position_the_stream_starts_at_the_head_and_wakes_on_new_commits,
    a_quiet_stream_sends_heartbeat_comments_and_ends_on_shutdown,
    bad_positions_and_filters_are_400_and_a_token_is_needed,
);
