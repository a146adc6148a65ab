//! Live updates: the log as server-sent events, from a position, with
//! optional filters by operation, batch or media.
//!
//! A stream reads the log from the last seq it sent, a page at a time
//! (never from the start), and between reads waits on the service's wake
//! (bumped by this process's commits and by the head poll for other
//! processes'). The log's seq is gap-free and increases in commit order,
//! so a client that resumes after the last id it received (`after` or
//! `Last-Event-ID`) misses nothing and sees nothing twice. It must not
//! know a backend: it reads through the `Store` trait's `read_all`.

use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{parse_uuid, Caller, Params};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use opledger_domain::{quoted, BatchId, Event, EventEnvelope, OperationId};
use opledger_store::Store;
use serde::Deserialize;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use tokio::sync::watch;
use utoipa::IntoParams;

/// Events read from the log per page.
const PAGE: usize = 500;

/// Where a stream starts and what it keeps.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Send events after this seq (`Last-Event-ID` wins when both are
    /// given, so a reconnect resumes where it stopped). Default: the head
    /// of the log now (only new events).
    pub after: Option<i64>,
    /// Only events of this operation (its stream, or a payload naming it).
    pub operation: Option<String>,
    /// Only events of this batch: its stream, a payload naming it, and
    /// every event of one of its items' operations from the batch's
    /// creation on (claims, progress, outcome).
    pub batch: Option<String>,
    /// Only events of this media item: its stream, a payload naming it,
    /// and every event of an operation on it (claims, progress, outcome).
    pub media: Option<String>,
}

/// What an event must name to be sent: each given filter must match.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// `(what, id)`: `what` is `operation`, `batch` or `media`.
    wanted: Vec<(&'static str, String)>,
}

impl Filter {
    fn from_query(query: &EventsQuery) -> ApiResult<Self> {
        let mut wanted = Vec::new();
        for (what, given) in [
            ("operation", &query.operation),
            ("batch", &query.batch),
            ("media", &query.media),
        ] {
            if let Some(text) = given {
                wanted.push((what, parse_uuid(what, text)?.hyphenated().to_string()));
            }
        }
        Ok(Filter { wanted })
    }

    /// The id of this kind asked for, if any.
    fn wanted(&self, kind: &str) -> Option<&str> {
        self.wanted
            .iter()
            .find(|(what, _)| *what == kind)
            .map(|(_, id)| id.as_str())
    }

    /// The event belongs to every wanted id: its stream is that id's
    /// stream, or its payload names the id (`media_id`, `batch_id`,
    /// `operation_id`, `operation_ids`, at any depth: a task's target
    /// names its media item), or the event is on the stream of an
    /// operation whose target is the wanted media item or that is an item
    /// of the wanted batch (`owner`).
    pub fn keeps(&self, envelope: &EventEnvelope, json: &Value, owner: &Owner) -> bool {
        self.wanted.iter().all(|(what, id)| {
            envelope.stream_id.as_str() == format!("{what}-{id}")
                || names(json, what, id)
                || (*what == "media" && owner.media.as_deref() == Some(id.as_str()))
                || (*what == "batch" && owner.in_batch)
        })
    }
}

/// What an event on an operation's stream belongs to beyond its payload:
/// the media item the operation targets, and whether the operation is an
/// item of the wanted batch (read only for the filters given).
#[derive(Debug, Clone, Default)]
pub struct Owner {
    pub media: Option<String>,
    pub in_batch: bool,
}

/// Operations a stream has looked up at most; past it the cache starts
/// over (a lookup is one indexed read).
const OWNERS_KEPT: usize = 10_000;

fn names(value: &Value, what: &str, id: &str) -> bool {
    match value {
        Value::Object(fields) => fields.iter().any(|(key, field)| {
            let is_key = key
                .strip_prefix(what)
                .is_some_and(|rest| rest == "_id" || rest == "_ids");
            (is_key && mentions(field, id)) || names(field, what, id)
        }),
        Value::Array(items) => items.iter().any(|item| names(item, what, id)),
        _ => false,
    }
}

fn mentions(value: &Value, id: &str) -> bool {
    match value {
        Value::String(text) => text == id,
        Value::Array(items) => items.iter().any(|item| mentions(item, id)),
        _ => false,
    }
}

/// One server-sent event as the stream carries it: `id` is the event's
/// seq (what `Last-Event-ID` resumes after), `event` its type, `data` its
/// envelope as JSON text.
#[derive(Debug, utoipa::ToSchema)]
pub struct StreamedEvent {
    pub id: String,
    pub event: String,
    pub data: String,
}

/// The log as server-sent events: each `id: SEQ`, `event: EVENT_TYPE`,
/// `data: ENVELOPE_JSON`; a heartbeat comment every `sse_heartbeat` when
/// quiet. Ends when the service shuts down.
#[utoipa::path(get, path = "/api/v1/events", tag = "live", params(EventsQuery,
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this seq (wins over `after`).")),
    responses(
        (status = 200, description = "An event stream (`text/event-stream`): one SSE event per log event.",
            content_type = "text/event-stream", body = StreamedEvent),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn events<S: Store>(
    State(app): State<App<S>>,
    caller: Caller,
    headers: HeaderMap,
    Params(query): Params<EventsQuery>,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    caller.require(Role::Reader)?;
    let filter = Filter::from_query(&query)?;
    let resume = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|text| text.trim().parse::<i64>().ok())
                .ok_or_else(|| ApiError::malformed("Last-Event-ID is not a seq (a whole number)"))?,
        ),
    };
    let head = app
        .engine()
        .store()
        .head()
        .await
        .map_err(opledger_engine::EngineError::from)?;
    let after = match resume.or(query.after) {
        Some(after) if after < 0 => {
            return Err(ApiError::malformed(format!(
                "after {} is not a seq (0 or more)",
                quoted(&after.to_string())
            )))
        }
        // A position the log has not reached would be silent until it
        // does, and then skip every event up to it: refused, as `as_of_seq`.
        Some(after) if after > head => {
            return Err(ApiError::invalid(format!(
                "after {after} is past the log's head ({head}): resume from a seq this ledger has given"
            )))
        }
        Some(after) => after,
        None => head,
    };
    let heartbeat = app.config().sse_heartbeat;
    let wake = app.wake().subscribe();
    let stream = Tail {
        app,
        filter,
        after,
        ready: VecDeque::new(),
        owners: HashMap::new(),
        batch_from: None,
        wake,
    }
    .into_stream();
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(heartbeat).text("heartbeat")))
}

/// One client's place in the log.
struct Tail<S: Store> {
    app: App<S>,
    filter: Filter,
    /// The last seq read (sent or filtered out).
    after: i64,
    /// Read and kept, not yet sent.
    ready: VecDeque<SseEvent>,
    /// For a media or batch filter, per operation seen: its target and
    /// whether it is an item of the batch (an operation's later events
    /// name only the operation).
    owners: HashMap<String, Owner>,
    /// For a batch filter: the seq of the batch's creation, once known.
    /// An item's events before it are not the batch's (an operation a
    /// batch follows may be older than the batch).
    batch_from: Option<i64>,
    wake: watch::Receiver<u64>,
}

impl<S: Store> Tail<S> {
    fn into_stream(self) -> impl Stream<Item = Result<SseEvent, Infallible>> {
        futures::stream::unfold(self, |mut tail| async move {
            let next = tail.next().await?;
            Some((Ok(next), tail))
        })
    }

    /// The next event to send; None once the service stops or the log
    /// cannot be read (the client reconnects from its last id).
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if self.app.is_stopping() {
                return None;
            }
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            // Seen before reading: a commit after this read wakes the wait below.
            self.wake.borrow_and_update();
            let read = self.read_page().await?;
            if read > 0 {
                continue;
            }
            let stopped = self.app.clone();
            tokio::select! {
                changed = self.wake.changed() => changed.ok()?,
                _ = stopped.stopped() => return None,
            }
        }
    }

    /// Reads up to a page after `after`; returns how many events it read.
    async fn read_page(&mut self) -> Option<usize> {
        let mut page = self.app.engine().store().read_all(self.after, PAGE).take(PAGE);
        let mut read = 0;
        while let Some(envelope) = page.next().await {
            let envelope = match envelope {
                Ok(envelope) => envelope,
                Err(error) => {
                    tracing::warn!(%error, after = self.after, "an event stream cannot read the log");
                    return if read > 0 { Some(read) } else { None };
                }
            };
            read += 1;
            self.after = envelope.seq;
            let envelope = envelope.for_readers();
            let json = match serde_json::to_value(&envelope) {
                Ok(json) => json,
                Err(error) => {
                    tracing::error!(%error, seq = envelope.seq, "an event does not serialize");
                    continue;
                }
            };
            let owner = self.owner_of(&envelope).await;
            self.learn_members(&envelope);
            if self.filter.keeps(&envelope, &json, &owner) {
                self.ready.push_back(
                    SseEvent::default()
                        .id(envelope.seq.to_string())
                        .event(envelope.event_type())
                        .data(json.to_string()),
                );
            }
        }
        Some(read)
    }

    /// For a media or batch filter and an event on an operation's stream:
    /// what the operation belongs to, read once per operation from the
    /// operations and batch-items projections (whose rows exist from the
    /// operation's first event and the batch's creation on). Nothing for
    /// other events, or when a row cannot be read (the event is then
    /// judged by its payload alone).
    async fn owner_of(&mut self, envelope: &EventEnvelope) -> Owner {
        let (media, batch) = (self.filter.wanted("media"), self.filter.wanted("batch"));
        if media.is_none() && batch.is_none() {
            return Owner::default();
        }
        let Some(operation) = envelope.stream_id.as_str().strip_prefix("operation-") else {
            return Owner::default();
        };
        let mut owner = match self.owners.get(operation) {
            Some(owner) => owner.clone(),
            None => {
                let Ok(id) = uuid::Uuid::parse_str(operation).map(OperationId) else {
                    return Owner::default();
                };
                let owner = self.look_up(id, media.is_some(), batch.map(str::to_string)).await;
                if self.owners.len() >= OWNERS_KEPT {
                    self.owners.clear();
                }
                self.owners.insert(operation.to_string(), owner.clone());
                owner
            }
        };
        if owner.in_batch {
            owner.in_batch = self.batch_from.is_some_and(|from| envelope.seq >= from);
        }
        owner
    }

    async fn look_up(&mut self, operation: OperationId, media: bool, batch: Option<String>) -> Owner {
        let engine = self.app.engine();
        let mut owner = Owner::default();
        if media {
            match engine.operation(operation).await {
                Ok(row) => owner.media = row.media_id.map(|media| media.0.hyphenated().to_string()),
                Err(error) => tracing::debug!(%error, %operation, "an event stream cannot read an operation's target"),
            }
        }
        let Some(batch) = batch.and_then(|text| uuid::Uuid::parse_str(&text).ok()).map(BatchId) else {
            return owner;
        };
        if self.batch_from.is_none() {
            match engine.batch_created_at_seq(batch).await {
                Ok(from) => self.batch_from = from,
                Err(error) => tracing::debug!(%error, %batch, "an event stream cannot read a batch's creation"),
            }
        }
        match engine.batch_item(batch, operation).await {
            Ok(item) => owner.in_batch = item.is_some(),
            Err(error) => tracing::debug!(%error, %operation, "an event stream cannot read a batch's items"),
        }
        owner
    }

    /// An event that creates the wanted batch or adds items to it: its
    /// items are the batch's from here on, whatever an earlier look-up
    /// found (it ran before the batch was created).
    fn learn_members(&mut self, envelope: &EventEnvelope) {
        let Some(wanted) = self.filter.wanted("batch") else {
            return;
        };
        match &envelope.event {
            Event::BatchCreated(created) if created.batch_id.0.hyphenated().to_string() == wanted => {
                self.batch_from.get_or_insert(envelope.seq);
            }
            Event::BatchItemsAdded(added) if added.batch_id.0.hyphenated().to_string() == wanted => {
                self.batch_from.get_or_insert(envelope.seq);
                for item in &added.items {
                    if let Some(owner) = self.owners.get_mut(&item.operation_id.0.hyphenated().to_string()) {
                        owner.in_batch = true;
                    }
                }
            }
            _ => {}
        }
    }
}
