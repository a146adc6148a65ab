//! The generated event log that `append`, `replay`, `status` and `timeline`
//! measure: realistic event streams built from a counter, so two runs (and
//! two backends) append identical events.

use opledger_domain::events::{
    Event, MediaRegistered, OperationClaimed, OperationCreated, OperationFailed, OperationProgressed, OperationStarted,
    OperationSucceeded, OperationTarget,
};
use opledger_domain::{MediaId, NewEvent, OperationId, OperationStatus, StreamId, Timestamp};
use opledger_store::{ExpectedVersion, StreamAppend};
use serde_json::json;
use uuid::Uuid;

/// Operations per media item in the generated workload.
const OPERATIONS_PER_MEDIA: u64 = 4;
/// Events of one operation's life: created, claimed, started, progress, succeeded.
pub const EVENTS_PER_OPERATION: u64 = 5;

/// A deterministic stream of realistic events: media registrations, each
/// followed by a few export operations living their whole lifecycle.
/// Ids are derived from a counter, so two runs produce identical logs.
pub struct GeneratedEvents {
    next_item: u64,
    start: Timestamp,
    /// Whether operations are the media tasks that keep capability states
    /// (metadata, thumbnail, perceptual_hash beside an export), with one in
    /// [`FAILING_ONE_IN`] failing terminally into the review queue.
    media_tasks: bool,
}

/// Task kinds of a media item's operations in the media-task workload.
const MEDIA_TASK_KINDS: [&str; OPERATIONS_PER_MEDIA as usize] = ["metadata", "thumbnail", "perceptual_hash", "export"];
/// In the media-task workload, one operation in this many (a thumbnail:
/// item 2 of every 50, never a media registration) fails terminally.
pub const FAILING_ONE_IN: u64 = 50;

/// One unit of the workload: the events of one stream, in order.
pub struct StreamEvents {
    pub stream_id: StreamId,
    pub events: Vec<NewEvent>,
}

impl GeneratedEvents {
    /// Export operations only: the workload `append` and `replay` measure.
    pub fn new(start: Timestamp) -> Self {
        GeneratedEvents {
            next_item: 0,
            start,
            media_tasks: false,
        }
    }

    /// Media tasks with capability states and some terminal failures (so
    /// review entries): the library a dashboard summarises (`status`,
    /// `timeline`). Same number of events per operation as [`Self::new`].
    pub fn with_media_tasks(start: Timestamp) -> Self {
        GeneratedEvents {
            next_item: 0,
            start,
            media_tasks: true,
        }
    }

    fn stamp(&self, offset_ms: u64, event: Event, actor: &str, correlation: &str) -> NewEvent {
        NewEvent {
            event,
            recorded_at: self.start.plus_millis(offset_ms as i64),
            actor: actor.to_string(),
            correlation_id: correlation.to_string(),
            causation_id: Some(format!("bench-command-{offset_ms}")),
        }
    }

    /// The next stream's events: a media registration or an operation's life.
    pub fn next_stream(&mut self) -> StreamEvents {
        let item = self.next_item;
        self.next_item += 1;
        let media_index = item / (OPERATIONS_PER_MEDIA + 1);
        let media_id = MediaId(Uuid::from_u128(
            0x6d65_6469_6100_0000_0000_0000_0000_0000 | u128::from(media_index),
        ));
        let correlation = format!("bench-batch-{media_index}");
        if item.is_multiple_of(OPERATIONS_PER_MEDIA + 1) {
            let event = Event::MediaRegistered(MediaRegistered {
                media_id,
                path: format!("/library/photos/{media_index:08}.jpg"),
                media_kind: "image".into(),
                content_digest: Some(format!("sha256:{:064x}", u128::from(media_index) * 7919)),
                byte_size: Some(250_000 + (media_index as i64 % 1000)),
            });
            return StreamEvents {
                stream_id: StreamId::media(media_id),
                events: vec![self.stamp(item, event, "ingest", &correlation)],
            };
        }
        let operation_id = OperationId(Uuid::from_u128(
            0x6f70_0000_0000_0000_0000_0000_0000_0000 | u128::from(item),
        ));
        let revision = format!("{:064x}", u128::from(item) * 104_729);
        let claim_token = Uuid::from_u128(0x746f_6b00_0000_0000_0000_0000_0000_0000 | u128::from(item)).to_string();
        let worker = format!("bench-worker-{}", item % 16);
        let (kind, task_version) = if self.media_tasks {
            let kind = MEDIA_TASK_KINDS[(item % (OPERATIONS_PER_MEDIA + 1)) as usize - 1];
            (kind, Some("1".to_string()))
        } else {
            ("export", None)
        };
        let outcome = if self.media_tasks && item % FAILING_ONE_IN == 2 {
            Event::OperationFailed(OperationFailed {
                operation_id,
                claim_token: Some(claim_token.clone()),
                error: "decoding failed: truncated file".into(),
                retryable: false,
            })
        } else {
            Event::OperationSucceeded(OperationSucceeded {
                operation_id,
                claim_token: Some(claim_token.clone()),
                output: json!({"thumbnail": format!("thumbnails/{item:08}.webp"), "width": 256, "height": 171}),
            })
        };
        let events = vec![
            Event::OperationCreated(OperationCreated {
                operation_id,
                kind: kind.into(),
                target: OperationTarget {
                    media_id: Some(media_id),
                    region_id: None,
                    path: None,
                },
                revision: Some(revision.clone()),
                inputs: json!({"longest_side": 256, "format": "webp"}),
                status: OperationStatus::Queued,
                priority: 0,
                task: task_version
                    .as_ref()
                    .and_then(|_| opledger_domain::kinds::legacy::facts(kind)),
                task_version,
            }),
            Event::OperationClaimed(OperationClaimed {
                operation_id,
                claim_token: claim_token.clone(),
                worker: worker.clone(),
                revision: Some(revision),
                lease_expires_at: self.start.plus_millis(item as i64 + 30_000),
            }),
            Event::OperationStarted(OperationStarted {
                operation_id,
                claim_token: claim_token.clone(),
            }),
            Event::OperationProgressed(OperationProgressed {
                operation_id,
                phase: "writing".into(),
                processed: 1,
                total: Some(1),
            }),
            outcome,
        ];
        let actors = ["scheduler", &worker, &worker, &worker, &worker];
        StreamEvents {
            stream_id: StreamId::operation(operation_id),
            events: events
                .into_iter()
                .zip(actors)
                .enumerate()
                .map(|(step, (event, actor))| self.stamp(item * 10 + step as u64, event, actor, &correlation))
                .collect(),
        }
    }

    /// At least `events` events, as whole streams, each stream appended as
    /// one `StreamAppend` expecting a new stream.
    pub fn appends(&mut self, events: u64) -> Vec<StreamAppend> {
        let mut appends = Vec::new();
        let mut produced = 0u64;
        while produced < events {
            let stream = self.next_stream();
            produced += stream.events.len() as u64;
            appends.push(StreamAppend {
                stream_id: stream.stream_id,
                expected: ExpectedVersion::NoStream,
                events: stream.events,
            });
        }
        appends
    }

    /// Groups whole streams into transactions of about `batch` events.
    pub fn batches(appends: Vec<StreamAppend>, batch: usize) -> Vec<Vec<StreamAppend>> {
        let mut batches = Vec::new();
        let mut current = Vec::new();
        let mut size = 0;
        for append in appends {
            size += append.events.len();
            current.push(append);
            if size >= batch {
                batches.push(std::mem::take(&mut current));
                size = 0;
            }
        }
        if !current.is_empty() {
            batches.push(current);
        }
        batches
    }

    /// Splits streams into one event per transaction, each expecting the
    /// stream version the previous one left.
    pub fn one_event_each(appends: Vec<StreamAppend>) -> Vec<StreamAppend> {
        let mut singles = Vec::new();
        for append in appends {
            for (index, event) in append.events.into_iter().enumerate() {
                singles.push(StreamAppend {
                    stream_id: append.stream_id.clone(),
                    expected: ExpectedVersion::Exactly(index as i64),
                    events: vec![event],
                });
            }
        }
        singles
    }
}
