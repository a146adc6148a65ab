//! Reading the log as every backend does it, above the statements: a
//! stored row decoded into its envelope (the typed event, upcast; anything
//! that does not decode is Corrupt, naming its seq), and `read_all`'s
//! keyset paging over a backend's read of one page.

use crate::StoreError;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use opledger_domain::chain::{self, ChainEntry, ChainHash, StoredFacts};
use opledger_domain::envelope::{EventEnvelope, StreamId};
use opledger_domain::events::Event;
use opledger_domain::time::Timestamp;
use std::future::Future;

/// One log row's columns as a backend read them, borrowed where its
/// driver allows.
pub struct StoredEvent<'row> {
    pub seq: i64,
    pub stream_id: String,
    pub stream_version: i64,
    pub event_type: &'row str,
    pub schema_version: i64,
    pub payload: &'row str,
    pub recorded_at: RecordedAt<'row>,
    pub actor: String,
    pub correlation_id: String,
    pub causation_id: Option<String>,
}

/// The time of a stored event, in the form the backend stores it.
pub enum RecordedAt<'row> {
    /// RFC 3339 text with microseconds.
    Text(&'row str),
    /// A time the driver decoded already.
    Time(Timestamp),
}

/// Decodes a stored log row into its envelope: the typed event, upcast to
/// its current schema. Anything that does not decode is Corrupt at its seq.
pub fn decode(stored: StoredEvent<'_>) -> Result<EventEnvelope, StoreError> {
    let seq = stored.seq;
    let corrupt = |what: String| StoreError::corrupt_at(seq, what);
    let schema_version = u32::try_from(stored.schema_version).map_err(|error| corrupt(error.to_string()))?;
    let event =
        Event::decode(stored.event_type, schema_version, stored.payload).map_err(|error| corrupt(error.to_string()))?;
    let recorded_at = match stored.recorded_at {
        RecordedAt::Text(text) => Timestamp::parse(text).map_err(corrupt)?,
        RecordedAt::Time(time) => time,
    };
    Ok(EventEnvelope {
        seq,
        stream_id: StreamId::from_stored(stored.stream_id),
        stream_version: stored.stream_version,
        schema_version,
        recorded_at,
        actor: stored.actor,
        correlation_id: stored.correlation_id,
        causation_id: stored.causation_id,
        event,
    })
}

/// A stored row as the chain check reads it: the digest of its columns as
/// stored (the payload text as it is, not re-encoded) and its stored
/// `chain_hash` (None when missing or not a hash). A time that does not
/// parse is Corrupt at its seq, as for [`decode`].
pub fn chain_entry(stored: &StoredEvent<'_>, chain_hash: Option<&str>) -> Result<ChainEntry, StoreError> {
    let recorded_at = match stored.recorded_at {
        RecordedAt::Text(text) => Timestamp::parse(text).map_err(|error| StoreError::corrupt_at(stored.seq, error))?,
        RecordedAt::Time(time) => time,
    };
    let digest = chain::event_digest(&StoredFacts {
        seq: stored.seq,
        stream_id: &stored.stream_id,
        stream_version: stored.stream_version,
        event_type: stored.event_type,
        schema_version: stored.schema_version,
        payload: stored.payload,
        recorded_at,
        actor: &stored.actor,
        correlation_id: &stored.correlation_id,
        causation_id: stored.causation_id.as_deref(),
    });
    Ok(ChainEntry {
        seq: stored.seq,
        digest,
        stored: chain_hash.and_then(|text| ChainHash::from_hex(text).ok()),
    })
}

/// Every event after `after`, in seq order, read a page of `page_size` at
/// a time by `read_page(after, limit)` (up to `limit` events after `after`).
/// *Why pages:* each page is its own short read, so memory holds one page
/// whatever the log size and no read transaction stays open.
pub fn paged<P, F>(after: i64, page_size: usize, read_page: P) -> BoxStream<'static, Result<EventEnvelope, StoreError>>
where
    P: Fn(i64, usize) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Vec<EventEnvelope>, StoreError>> + Send + 'static,
{
    let page_size = page_size.max(1);
    stream::try_unfold(Some(after), move |position| {
        // None: the last page was short, so the log ended there.
        let page = position.map(|position| read_page(position, page_size));
        async move {
            let Some(page) = page else {
                return Ok(None);
            };
            let page = page.await?;
            let next = if page.len() < page_size {
                None
            } else {
                page.last().map(|event| event.seq)
            };
            Ok::<_, StoreError>(Some((stream::iter(page.into_iter().map(Ok)), next)))
        }
    })
    .try_flatten()
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use opledger_domain::events::MediaRemoved;
    use opledger_domain::ids::MediaId;

    fn stored<'row>(seq: i64, event_type: &'row str, payload: &'row str) -> StoredEvent<'row> {
        StoredEvent {
            seq,
            stream_id: "media-1".into(),
            stream_version: 1,
            event_type,
            schema_version: 1,
            payload,
            recorded_at: RecordedAt::Text("2026-01-01T00:00:00.000000Z"),
            actor: "a".into(),
            correlation_id: "c".into(),
            causation_id: None,
        }
    }

    const REMOVED: &str = r#"{"media_id":"00000000-0000-0000-0000-000000000001","reason":"gone"}"#;

    #[test]
    fn a_stored_row_decodes_into_its_typed_event() {
        let envelope = decode(stored(3, "media_removed", REMOVED)).unwrap();
        assert_eq!(envelope.seq, 3);
        assert_eq!(envelope.stream_id.as_str(), "media-1");
        assert_eq!(
            envelope.recorded_at,
            Timestamp::parse("2026-01-01T00:00:00.000000Z").unwrap()
        );
        assert_eq!(
            envelope.event,
            Event::MediaRemoved(MediaRemoved {
                media_id: MediaId(uuid::Uuid::from_u128(1)),
                reason: "gone".into()
            })
        );
        let mut at_time = stored(3, "media_removed", REMOVED);
        at_time.recorded_at = RecordedAt::Time(Timestamp::from_micros(7));
        assert_eq!(decode(at_time).unwrap().recorded_at, Timestamp::from_micros(7));
    }

    #[test]
    fn a_chain_entry_digests_the_stored_text_whatever_form_the_time_is_read_in() {
        let text = stored(3, "media_removed", REMOVED);
        let mut time = stored(3, "media_removed", REMOVED);
        time.recorded_at = RecordedAt::Time(Timestamp::parse("2026-01-01T00:00:00.000000Z").unwrap());
        let hash = "ab".repeat(32);
        let from_text = chain_entry(&text, Some(&hash)).unwrap();
        assert_eq!(from_text, chain_entry(&time, Some(&hash)).unwrap());
        assert_eq!(from_text.stored.map(|stored| stored.to_hex()), Some(hash));
        // The payload is hashed as stored: the same event written with other spacing differs.
        let respaced = REMOVED.replace(',', ", ");
        assert_ne!(
            chain_entry(&stored(3, "media_removed", &respaced), None)
                .unwrap()
                .digest,
            from_text.digest
        );
        assert_eq!(chain_entry(&text, Some("not a hash")).unwrap().stored, None);
        let mut bad_time = stored(4, "media_removed", REMOVED);
        bad_time.recorded_at = RecordedAt::Text("yesterday");
        assert_eq!(chain_entry(&bad_time, None).unwrap_err().seq, Some(4));
    }

    #[test]
    fn what_does_not_decode_is_corrupt_at_its_seq() {
        let mut bad_time = stored(5, "media_removed", REMOVED);
        bad_time.recorded_at = RecordedAt::Text("yesterday");
        let mut bad_version = stored(6, "media_removed", REMOVED);
        bad_version.schema_version = -1;
        for (row, seq) in [
            (stored(4, "no_such_event", "{}"), 4),
            (stored(4, "media_removed", "{\"media_id\": 7}"), 4),
            (bad_time, 5),
            (bad_version, 6),
        ] {
            let error = decode(row).unwrap_err();
            assert_eq!((error.kind, error.seq), (ErrorKind::Corrupt, Some(seq)), "{error}");
        }
    }

    /// A log of `events` events, read through `paged`, with the pages asked for.
    fn read_through_pages(events: i64, after: i64, page_size: usize) -> (Vec<i64>, Vec<(i64, usize)>) {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&asked);
        let stream = paged(after, page_size, move |position, limit| {
            log.lock().unwrap().push((position, limit));
            let page: Vec<EventEnvelope> = (position + 1..=events.min(position + limit as i64))
                .map(|seq| {
                    let mut envelope = decode(stored(seq, "media_removed", REMOVED)).unwrap();
                    envelope.seq = seq;
                    envelope
                })
                .collect();
            std::future::ready(Ok(page))
        });
        let seqs: Vec<i64> = futures::executor::block_on(stream.map_ok(|envelope| envelope.seq).try_collect()).unwrap();
        let asked = asked.lock().unwrap().clone();
        (seqs, asked)
    }

    #[test]
    fn pages_follow_the_last_seq_until_a_short_page() {
        let (seqs, asked) = read_through_pages(7, 0, 3);
        assert_eq!(seqs, (1..=7).collect::<Vec<_>>());
        assert_eq!(asked, vec![(0, 3), (3, 3), (6, 3)]);
        // A log ending on a page boundary costs one empty page more.
        let (seqs, asked) = read_through_pages(6, 2, 2);
        assert_eq!(seqs, (3..=6).collect::<Vec<_>>());
        assert_eq!(asked, vec![(2, 2), (4, 2), (6, 2)]);
        // A page size of 0 reads one event at a time.
        assert_eq!(read_through_pages(2, 0, 0).1, vec![(0, 1), (1, 1), (2, 1)]);
    }
}
