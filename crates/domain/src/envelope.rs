//! The event envelope (seq, stream and version, type and schema version,
//! payload, time, actor, correlation and causation) and stream naming.

use crate::events::Event;
use crate::ids::{BatchId, MediaId, OperationId};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Names one event stream. Each media item and each operation has its own
/// stream; the stream's events, in `stream_version` order, are its history.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StreamId(String);

impl StreamId {
    pub fn media(media_id: MediaId) -> Self {
        StreamId(format!("media-{media_id}"))
    }

    pub fn operation(operation_id: OperationId) -> Self {
        StreamId(format!("operation-{operation_id}"))
    }

    pub fn batch(batch_id: BatchId) -> Self {
        StreamId(format!("batch-{batch_id}"))
    }

    /// Wraps a stored stream name as is.
    /// The stream of task kind declarations.
    pub fn task_kinds() -> Self {
        StreamId(crate::kinds::TASK_KINDS_STREAM.to_string())
    }

    pub fn from_stored(text: String) -> Self {
        StreamId(text)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An event as a command builds it: everything but its position in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    pub event: Event,
    pub recorded_at: Timestamp,
    /// Who did it: a worker id, a user, or `system`.
    pub actor: String,
    /// Ties together every event of one flow (an ingest run, a batch, a request).
    pub correlation_id: String,
    /// What directly caused this event: the command id, or `seq:N` of an event.
    pub causation_id: Option<String>,
}

/// An event as the log holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventEnvelope {
    /// Global position: strictly increasing in commit order, gap-free.
    pub seq: i64,
    pub stream_id: StreamId,
    /// Position within the stream: contiguous from 1.
    pub stream_version: i64,
    /// The schema version the event was written at (before upcasting).
    pub schema_version: u32,
    pub recorded_at: Timestamp,
    pub actor: String,
    pub correlation_id: String,
    pub causation_id: Option<String>,
    #[serde(flatten)]
    pub event: Event,
}

impl EventEnvelope {
    pub fn event_type(&self) -> &'static str {
        self.event.event_type()
    }
}
