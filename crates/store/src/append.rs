//! The append plan: what [`WriteTx::append`](crate::WriteTx::append) checks
//! and numbers before a backend writes anything, as one pure function that
//! every backend calls with what it read from its log.
//!
//! *Why here:* the expectation check and the numbering are the log's own
//! rules (append-only, next seq, next stream version, expected version).
//! Written once, they cannot differ between backends; each backend only
//! reads the head and the streams' versions, and writes the envelopes.
//!
//! The plan also links each event into the log's hash chain
//! ([`opledger_domain::chain`]): its `chain_hash` follows from the hash of
//! the event before it by seq — the head the backend read under its write
//! lock, or the event planned just before it — so events appended by
//! several pieces of one group commit, or by writers taking turns on the
//! lock, chain in exactly the order of their seqs.
//!
//! And it keeps `recorded_at` non-decreasing along seq: an event whose
//! time is earlier than the event before it is recorded at that event's
//! time ([`LogHead::recorded_at`]). *Why:* commands from hosts whose
//! clocks disagree append to one log; readers and folds take the log's
//! order as the order of time, and a replay reads the clamped time back
//! from the event, so it stays exact. [`command_time`] is the same rule
//! for the time a command decides at.

use crate::{ExpectedVersion, StoreError, StreamAppend};
use opledger_domain::chain::{self, ChainHash, ChainPoint, StoredFacts};
use opledger_domain::envelope::{EventEnvelope, StreamId};
use opledger_domain::time::Timestamp;
use std::collections::BTreeMap;

/// The log's last event as an append goes on from it: its seq and chain
/// link, and its time (None on an empty log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogHead {
    pub point: ChainPoint,
    pub recorded_at: Option<Timestamp>,
}

impl LogHead {
    /// The head of an empty log.
    pub const START: LogHead = LogHead {
        point: ChainPoint::START,
        recorded_at: None,
    };

    pub fn seq(&self) -> i64 {
        self.point.seq
    }
}

/// The time a command decides and records at, given the time its clock
/// says (`proposed`): never earlier than the last event's, so a command
/// from a host whose clock is behind neither records time going backwards
/// nor decides (a lease's end, a retry's due time) before the log's
/// present.
pub fn command_time(head: &LogHead, proposed: Timestamp) -> Timestamp {
    head.recorded_at.map_or(proposed, |last| proposed.max(last))
}

/// The events of one append call, numbered, ready to be written.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// In `seq` order: head + 1, head + 2, …
    pub envelopes: Vec<EventEnvelope>,
    /// Each envelope's payload column, as hashed: backends write this text.
    pub payloads: Vec<String>,
    /// Each envelope's `chain_hash` column.
    pub hashes: Vec<ChainHash>,
    /// The log head once they are written, with its chain hash and time
    /// (the old head if there were none).
    pub head: LogHead,
}

/// The digest of an envelope about to be stored with this payload text.
pub fn digest_of(envelope: &EventEnvelope, payload: &str) -> ChainHash {
    chain::event_digest(&StoredFacts {
        seq: envelope.seq,
        stream_id: envelope.stream_id.as_str(),
        stream_version: envelope.stream_version,
        event_type: envelope.event.event_type(),
        schema_version: i64::from(envelope.schema_version),
        payload,
        recorded_at: envelope.recorded_at,
        actor: &envelope.actor,
        correlation_id: &envelope.correlation_id,
        causation_id: envelope.causation_id.as_deref(),
    })
}

/// A stream that is not where its append expected it: nothing of the call
/// may be appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub stream_id: StreamId,
    /// The stream's version before the call (0: it does not exist).
    pub current: i64,
    pub expected: ExpectedVersion,
}

impl From<Conflict> for StoreError {
    fn from(conflict: Conflict) -> Self {
        StoreError::conflict(format!(
            "stream {} is at version {}, the append expected {:?}",
            conflict.stream_id, conflict.current, conflict.expected
        ))
    }
}

/// Whether a stream at version `current` (0: absent) meets `expected`.
fn meets(expected: ExpectedVersion, current: i64) -> bool {
    match expected {
        ExpectedVersion::Any => true,
        ExpectedVersion::NoStream => current == 0,
        ExpectedVersion::Exactly(version) => current == version,
    }
}

/// Plans one append call on a log whose last event is `head`, where
/// `stream_versions` holds the current version of every stream of the call
/// that exists (an absent stream is at 0).
///
/// Every expectation is checked against the versions before the call, and
/// before anything is numbered, so a refusal leaves the log untouched.
/// Then the events are numbered in the order given: `seq` from head + 1,
/// each stream's versions on from its current one (a stream named twice
/// goes on where its first part ended). Each event's `recorded_at` is at
/// least the one of the event before it.
pub fn plan(
    head: LogHead,
    mut stream_versions: BTreeMap<String, i64>,
    appends: Vec<StreamAppend>,
) -> Result<Planned, Conflict> {
    for append in &appends {
        let current = stream_versions.get(append.stream_id.as_str()).copied().unwrap_or(0);
        if !meets(append.expected, current) {
            return Err(Conflict {
                stream_id: append.stream_id.clone(),
                current,
                expected: append.expected,
            });
        }
    }
    let count = appends.iter().map(|append| append.events.len()).sum();
    let mut envelopes = Vec::with_capacity(count);
    let mut payloads = Vec::with_capacity(count);
    let mut hashes = Vec::with_capacity(count);
    let mut seq = head.point.seq;
    let mut previous = head.point.hash;
    let mut last_time = head.recorded_at;
    for append in appends {
        let version = stream_versions
            .entry(append.stream_id.as_str().to_string())
            .or_insert(0);
        for new_event in append.events {
            seq += 1;
            *version += 1;
            let recorded_at = last_time.map_or(new_event.recorded_at, |last| new_event.recorded_at.max(last));
            last_time = Some(recorded_at);
            let envelope = EventEnvelope {
                seq,
                stream_id: append.stream_id.clone(),
                stream_version: *version,
                schema_version: new_event.event.schema_version(),
                recorded_at,
                actor: new_event.actor,
                correlation_id: new_event.correlation_id,
                causation_id: new_event.causation_id,
                event: new_event.event,
            };
            let payload = envelope.event.payload_json();
            previous = chain::link(&previous, &digest_of(&envelope, &payload));
            envelopes.push(envelope);
            payloads.push(payload);
            hashes.push(previous);
        }
    }
    Ok(Planned {
        envelopes,
        payloads,
        hashes,
        head: LogHead {
            point: ChainPoint { seq, hash: previous },
            recorded_at: last_time,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use opledger_domain::envelope::NewEvent;
    use opledger_domain::events::{Event, MediaRemoved};
    use opledger_domain::ids::MediaId;
    use opledger_domain::time::Timestamp;
    use proptest::prelude::*;
    use uuid::Uuid;

    fn event(n: u128) -> NewEvent {
        NewEvent {
            event: Event::MediaRemoved(MediaRemoved {
                media_id: MediaId(Uuid::from_u128(n)),
                reason: "gone".into(),
            }),
            recorded_at: Timestamp::from_micros(1_780_000_000_000_000 + n as i64),
            actor: format!("actor-{n}"),
            correlation_id: format!("correlation-{n}"),
            causation_id: n.is_multiple_of(2).then(|| format!("command-{n}")),
        }
    }

    fn stream(name: &str) -> StreamId {
        StreamId::from_stored(name.to_string())
    }

    fn append(name: &str, expected: ExpectedVersion, events: usize) -> StreamAppend {
        StreamAppend {
            stream_id: stream(name),
            expected,
            events: (0..events as u128).map(event).collect(),
        }
    }

    /// A head at `seq` with an arbitrary hash, its time unknown.
    fn at(seq: i64) -> LogHead {
        LogHead {
            point: ChainPoint {
                seq,
                hash: ChainHash([seq as u8; 32]),
            },
            recorded_at: None,
        }
    }

    fn versions(entries: &[(&str, i64)]) -> BTreeMap<String, i64> {
        entries
            .iter()
            .map(|(name, version)| (name.to_string(), *version))
            .collect()
    }

    #[test]
    fn events_are_numbered_from_the_head_and_from_each_streams_version() {
        let planned = plan(
            at(10),
            versions(&[("a", 3)]),
            vec![
                append("a", ExpectedVersion::Exactly(3), 2),
                append("b", ExpectedVersion::NoStream, 1),
                append("a", ExpectedVersion::Any, 1),
            ],
        )
        .unwrap();
        let numbered: Vec<(i64, &str, i64)> = planned
            .envelopes
            .iter()
            .map(|envelope| (envelope.seq, envelope.stream_id.as_str(), envelope.stream_version))
            .collect();
        assert_eq!(numbered, vec![(11, "a", 4), (12, "a", 5), (13, "b", 1), (14, "a", 6)]);
        assert_eq!(planned.head.point.seq, 14);
    }

    #[test]
    fn envelopes_carry_each_events_facts_and_its_schema_version() {
        let sent = event(4);
        let planned = plan(
            LogHead::START,
            BTreeMap::new(),
            vec![StreamAppend {
                stream_id: stream("a"),
                expected: ExpectedVersion::NoStream,
                events: vec![sent.clone()],
            }],
        )
        .unwrap();
        let envelope = &planned.envelopes[0];
        assert_eq!(envelope.event, sent.event);
        assert_eq!(envelope.schema_version, sent.event.schema_version());
        assert_eq!(envelope.recorded_at, sent.recorded_at);
        assert_eq!(envelope.actor, sent.actor);
        assert_eq!(envelope.correlation_id, sent.correlation_id);
        assert_eq!(envelope.causation_id, sent.causation_id);
    }

    #[test]
    fn two_calls_chain_as_one_when_the_second_starts_at_the_first_ones_head() {
        // A group commit plans each piece from the head the piece before it
        // left: the chain is the same as one call's.
        let parts = || {
            vec![
                append("a", ExpectedVersion::Any, 2),
                append("b", ExpectedVersion::Any, 3),
            ]
        };
        let whole = plan(LogHead::START, BTreeMap::new(), parts()).unwrap();
        let [first, second]: [StreamAppend; 2] = parts().try_into().unwrap();
        let one = plan(LogHead::START, BTreeMap::new(), vec![first]).unwrap();
        let two = plan(one.head, versions(&[("a", 2)]), vec![second]).unwrap();
        assert_eq!([one.hashes, two.hashes].concat(), whole.hashes);
        assert_eq!(two.head, whole.head);
        assert_eq!(whole.payloads[0], whole.envelopes[0].event.payload_json());
    }

    #[test]
    fn recorded_at_never_goes_backwards_along_seq() {
        // A host an hour behind appends after the head, then two events of
        // its own out of order: each is recorded no earlier than the one
        // before it, and the head keeps the last time.
        let hour = 3_600_000_000;
        let mut head = at(3);
        head.recorded_at = Some(Timestamp::from_micros(1_780_000_000_000_000 + hour));
        let mut late = event(1);
        late.recorded_at = Timestamp::from_micros(1_780_000_000_000_000);
        let mut later = event(2);
        later.recorded_at = Timestamp::from_micros(1_780_000_000_000_000 + 2 * hour);
        let mut earlier = event(3);
        earlier.recorded_at = Timestamp::from_micros(1_780_000_000_000_000 + hour / 2);
        let planned = plan(
            head,
            BTreeMap::new(),
            vec![StreamAppend {
                stream_id: stream("a"),
                expected: ExpectedVersion::Any,
                events: vec![late, later, earlier],
            }],
        )
        .unwrap();
        let times: Vec<i64> = planned
            .envelopes
            .iter()
            .map(|envelope| envelope.recorded_at.as_micros() - 1_780_000_000_000_000)
            .collect();
        assert_eq!(times, vec![hour, 2 * hour, 2 * hour]);
        assert_eq!(planned.head.recorded_at, Some(planned.envelopes[2].recorded_at));
        // The chain digests the time as recorded.
        assert_eq!(
            planned.hashes[0],
            chain::link(
                &head.point.hash,
                &digest_of(&planned.envelopes[0], &planned.payloads[0])
            )
        );
        // A command's time follows the same rule; on an empty log it is the clock's.
        let proposed = Timestamp::from_micros(1);
        assert_eq!(command_time(&planned.head, proposed), planned.envelopes[2].recorded_at);
        assert_eq!(command_time(&LogHead::START, proposed), proposed);
    }

    #[test]
    fn a_call_without_events_keeps_the_head() {
        let planned = plan(at(7), BTreeMap::new(), vec![append("a", ExpectedVersion::Any, 0)]).unwrap();
        assert_eq!(
            planned,
            Planned {
                envelopes: Vec::new(),
                payloads: Vec::new(),
                hashes: Vec::new(),
                head: at(7)
            }
        );
        assert_eq!(plan(at(7), BTreeMap::new(), Vec::new()).unwrap().head, at(7));
    }

    #[test]
    fn a_mismatch_in_any_stream_refuses_the_call_as_a_conflict_naming_it() {
        let refused = plan(
            at(5),
            versions(&[("a", 2), ("b", 1)]),
            vec![
                append("a", ExpectedVersion::Exactly(2), 1),
                append("b", ExpectedVersion::NoStream, 1),
            ],
        )
        .unwrap_err();
        assert_eq!(
            refused,
            Conflict {
                stream_id: stream("b"),
                current: 1,
                expected: ExpectedVersion::NoStream
            }
        );
        let error = StoreError::from(refused);
        assert_eq!(error.kind, ErrorKind::Conflict);
        assert_eq!(error.message, "stream b is at version 1, the append expected NoStream");
    }

    #[test]
    fn a_stream_named_twice_is_checked_against_its_version_before_the_call() {
        // The second part expects where the stream stood before the call,
        // not where the first part leaves it.
        let calls = |second: ExpectedVersion| {
            plan(
                LogHead::START,
                versions(&[("a", 1)]),
                vec![append("a", ExpectedVersion::Exactly(1), 1), append("a", second, 1)],
            )
        };
        assert!(calls(ExpectedVersion::Exactly(1)).is_ok());
        assert!(calls(ExpectedVersion::Exactly(2)).is_err());
    }

    /// An expectation drawn against a stream's real version: met, or not.
    fn expectation(current: i64) -> impl Strategy<Value = ExpectedVersion> {
        prop_oneof![
            Just(ExpectedVersion::Any),
            Just(ExpectedVersion::NoStream),
            Just(ExpectedVersion::Exactly(current)),
            (0..6i64).prop_map(ExpectedVersion::Exactly),
        ]
    }

    /// A head, the versions of streams s0..s3 (0: absent), and a call of up
    /// to five parts on those streams.
    fn call() -> impl Strategy<Value = (i64, Vec<i64>, Vec<(usize, ExpectedVersion, usize)>)> {
        (0..1_000i64, prop::collection::vec(0..4i64, 4)).prop_flat_map(|(head, current)| {
            let parts = prop::collection::vec(
                (0..4usize).prop_flat_map({
                    let current = current.clone();
                    move |index| (Just(index), expectation(current[index]), 0..4usize)
                }),
                0..5,
            );
            (Just(head), Just(current), parts)
        })
    }

    proptest! {
        #[test]
        fn plans_number_contiguously_or_refuse_the_whole_call((head, current, parts) in call()) {
            let known: BTreeMap<String, i64> = current
                .iter()
                .enumerate()
                .filter(|(_, version)| **version > 0)
                .map(|(index, version)| (format!("s{index}"), *version))
                .collect();
            let appends: Vec<StreamAppend> = parts
                .iter()
                .map(|(index, expected, events)| append(&format!("s{index}"), *expected, *events))
                .collect();
            let all_met = parts.iter().all(|(index, expected, _)| meets(*expected, current[*index]));
            match plan(at(head), known, appends) {
                Err(conflict) => {
                    prop_assert!(!all_met, "refused a call whose expectations all hold: {conflict:?}");
                    let index: usize = conflict.stream_id.as_str()[1..].parse().unwrap();
                    prop_assert_eq!(conflict.current, current[index]);
                    prop_assert!(!meets(conflict.expected, current[index]));
                }
                Ok(planned) => {
                    prop_assert!(all_met, "planned a call with an unmet expectation");
                    let total: usize = parts.iter().map(|(_, _, events)| events).sum();
                    let seqs: Vec<i64> = planned.envelopes.iter().map(|envelope| envelope.seq).collect();
                    prop_assert_eq!(seqs, (head + 1..=head + total as i64).collect::<Vec<_>>());
                    prop_assert_eq!(planned.head.point.seq, head + total as i64);
                    // Each event links to the one before it, the first to the head.
                    let entries = planned.envelopes.iter().zip(&planned.payloads).zip(&planned.hashes).map(
                        |((envelope, payload), hash)| chain::ChainEntry {
                            seq: envelope.seq,
                            digest: digest_of(envelope, payload),
                            stored: Some(*hash),
                        },
                    );
                    prop_assert_eq!(chain::check(at(head).point, entries), Ok(planned.head.point));
                    // Per stream: versions go on from the current one, one by one, in seq order.
                    for (index, version) in current.iter().enumerate() {
                        let name = format!("s{index}");
                        let versions: Vec<i64> = planned
                            .envelopes
                            .iter()
                            .filter(|envelope| envelope.stream_id.as_str() == name)
                            .map(|envelope| envelope.stream_version)
                            .collect();
                        let expected: Vec<i64> = (version + 1..=version + versions.len() as i64).collect();
                        prop_assert_eq!(versions, expected);
                    }
                    // And the streams come in the order of the call's parts.
                    let order: Vec<String> = parts
                        .iter()
                        .flat_map(|(index, _, events)| std::iter::repeat_n(format!("s{index}"), *events))
                        .collect();
                    let streams: Vec<String> = planned
                        .envelopes
                        .iter()
                        .map(|envelope| envelope.stream_id.as_str().to_string())
                        .collect();
                    prop_assert_eq!(streams, order);
                }
            }
        }
    }
}
