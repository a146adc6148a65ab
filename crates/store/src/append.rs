//! The append plan: what [`WriteTx::append`](crate::WriteTx::append) checks
//! and numbers before a backend writes anything, as one pure function that
//! every backend calls with what it read from its log.
//!
//! *Why here:* the expectation check and the numbering are the log's own
//! rules (append-only, next seq, next stream version, expected version).
//! Written once, they cannot differ between backends; each backend only
//! reads the head and the streams' versions, and writes the envelopes.

use crate::{ExpectedVersion, StoreError, StreamAppend};
use opledger_domain::envelope::{EventEnvelope, StreamId};
use std::collections::BTreeMap;

/// The events of one append call, numbered, ready to be written.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// In `seq` order: head + 1, head + 2, …
    pub envelopes: Vec<EventEnvelope>,
    /// The log head once they are written (the old head if there were none).
    pub head: i64,
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

/// Plans one append call on a log whose highest `seq` is `head`, where
/// `stream_versions` holds the current version of every stream of the call
/// that exists (an absent stream is at 0).
///
/// Every expectation is checked against the versions before the call, and
/// before anything is numbered, so a refusal leaves the log untouched.
/// Then the events are numbered in the order given: `seq` from head + 1,
/// each stream's versions on from its current one (a stream named twice
/// goes on where its first part ended).
pub fn plan(
    head: i64,
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
    let mut envelopes = Vec::with_capacity(appends.iter().map(|append| append.events.len()).sum());
    let mut seq = head;
    for append in appends {
        let version = stream_versions
            .entry(append.stream_id.as_str().to_string())
            .or_insert(0);
        for new_event in append.events {
            seq += 1;
            *version += 1;
            envelopes.push(EventEnvelope {
                seq,
                stream_id: append.stream_id.clone(),
                stream_version: *version,
                schema_version: new_event.event.schema_version(),
                recorded_at: new_event.recorded_at,
                actor: new_event.actor,
                correlation_id: new_event.correlation_id,
                causation_id: new_event.causation_id,
                event: new_event.event,
            });
        }
    }
    Ok(Planned { envelopes, head: seq })
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

    fn versions(entries: &[(&str, i64)]) -> BTreeMap<String, i64> {
        entries
            .iter()
            .map(|(name, version)| (name.to_string(), *version))
            .collect()
    }

    #[test]
    fn events_are_numbered_from_the_head_and_from_each_streams_version() {
        let planned = plan(
            10,
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
        assert_eq!(planned.head, 14);
    }

    #[test]
    fn envelopes_carry_each_events_facts_and_its_schema_version() {
        let sent = event(4);
        let planned = plan(
            0,
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
    fn a_call_without_events_keeps_the_head() {
        let planned = plan(7, BTreeMap::new(), vec![append("a", ExpectedVersion::Any, 0)]).unwrap();
        assert_eq!(
            planned,
            Planned {
                envelopes: Vec::new(),
                head: 7
            }
        );
        assert_eq!(plan(7, BTreeMap::new(), Vec::new()).unwrap().head, 7);
    }

    #[test]
    fn a_mismatch_in_any_stream_refuses_the_call_as_a_conflict_naming_it() {
        let refused = plan(
            5,
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
                0,
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
            match plan(head, known, appends) {
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
                    prop_assert_eq!(planned.head, head + total as i64);
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
