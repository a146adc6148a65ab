//! The log's hash chain: each event's `chain_hash` is SHA-256 over the hash
//! of the event before it (by seq) and a digest of the event as stored — its
//! envelope (seq, stream and version, type and schema version, time, actor,
//! correlation, causation) and its payload text. Changing any stored byte of
//! an event, or removing or reordering one, breaks the chain at that seq,
//! even when the projection rows were changed to match.
//!
//! *Why the stored text and not the typed event:* the payload is hashed as
//! it was written, before any upcasting, so the hash of an event never
//! changes when a later build reads it at a newer schema version, and a
//! payload that no longer decodes can still be checked.
//!
//! *Why two steps* (a digest of the event, then the link): a reader of the
//! log can compute every event's digest on its own, in any order, and the
//! check that each link follows from the one before is a cheap walk in seq
//! order (`first_break`).
//!
//! The encoding is fixed forever for `v1`: a change would make every
//! stored hash wrong. Each field is written with its length, so no two
//! different events share an encoding.

use crate::time::Timestamp;
use sha2::{Digest, Sha256};
use std::fmt;

/// The hash a chain starts from: the predecessor of seq 1.
pub const GENESIS: ChainHash = ChainHash([0; 32]);

const EVENT_DOMAIN: &[u8] = b"opledger.event.v1\0";
const LINK_DOMAIN: &[u8] = b"opledger.chain.v1\0";

/// A link of the chain (or an event's digest): 32 bytes, stored and shown
/// as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChainHash(pub [u8; 32]);

impl ChainHash {
    pub fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = String::with_capacity(64);
        for byte in self.0 {
            text.push(DIGITS[usize::from(byte >> 4)] as char);
            text.push(DIGITS[usize::from(byte & 0xf)] as char);
        }
        text
    }

    /// Reads 64 lowercase hex digits; anything else is refused with a short
    /// quote.
    pub fn from_hex(text: &str) -> Result<Self, String> {
        let digit = |byte: u8| match byte {
            b'0'..=b'9' => Some(byte - b'0'),
            b'a'..=b'f' => Some(byte - b'a' + 10),
            _ => None,
        };
        let bytes = text.as_bytes();
        let refused = || format!("a chain hash is 64 lowercase hex digits, not {}", crate::quote(text));
        if bytes.len() != 64 {
            return Err(refused());
        }
        let mut hash = [0u8; 32];
        for (index, pair) in bytes.chunks(2).enumerate() {
            let (Some(high), Some(low)) = (digit(pair[0]), digit(pair[1])) else {
                return Err(refused());
            };
            hash[index] = (high << 4) | low;
        }
        Ok(ChainHash(hash))
    }
}

impl fmt::Display for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChainHash({})", self.to_hex())
    }
}

/// An event as the log stores it, borrowed: what its digest covers.
#[derive(Debug, Clone, Copy)]
pub struct StoredFacts<'a> {
    pub seq: i64,
    pub stream_id: &'a str,
    pub stream_version: i64,
    pub event_type: &'a str,
    pub schema_version: i64,
    /// The payload text exactly as stored.
    pub payload: &'a str,
    pub recorded_at: Timestamp,
    pub actor: &'a str,
    pub correlation_id: &'a str,
    pub causation_id: Option<&'a str>,
}

fn text(hasher: &mut Sha256, value: &str) {
    hasher.update((value.len() as u64).to_be_bytes());
    hasher.update(value.as_bytes());
}

/// The digest of one stored event (envelope and payload).
pub fn event_digest(facts: &StoredFacts<'_>) -> ChainHash {
    let mut hasher = Sha256::new();
    hasher.update(EVENT_DOMAIN);
    hasher.update(facts.seq.to_be_bytes());
    text(&mut hasher, facts.stream_id);
    hasher.update(facts.stream_version.to_be_bytes());
    text(&mut hasher, facts.event_type);
    hasher.update(facts.schema_version.to_be_bytes());
    text(&mut hasher, facts.payload);
    hasher.update(facts.recorded_at.as_micros().to_be_bytes());
    text(&mut hasher, facts.actor);
    text(&mut hasher, facts.correlation_id);
    match facts.causation_id {
        None => hasher.update([0u8]),
        Some(causation) => {
            hasher.update([1u8]);
            text(&mut hasher, causation);
        }
    }
    ChainHash(hasher.finalize().into())
}

/// The link of an event whose digest is `digest` after the link `previous`.
pub fn link(previous: &ChainHash, digest: &ChainHash) -> ChainHash {
    let mut hasher = Sha256::new();
    hasher.update(LINK_DOMAIN);
    hasher.update(previous.0);
    hasher.update(digest.0);
    ChainHash(hasher.finalize().into())
}

/// One event as a chain check reads it: its seq, the digest of what is
/// stored, and the link stored beside it (None: missing or not a hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainEntry {
    pub seq: i64,
    pub digest: ChainHash,
    pub stored: Option<ChainHash>,
}

/// Where the chain stands after a checked run of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainPoint {
    /// The last seq checked (0: none).
    pub seq: i64,
    /// Its stored link (the genesis hash at 0).
    pub hash: ChainHash,
}

impl ChainPoint {
    pub const START: ChainPoint = ChainPoint { seq: 0, hash: GENESIS };
}

/// Why the chain breaks at an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BreakReason {
    /// The seq is not the one after the point before it.
    Gap { expected: i64 },
    /// The event has no stored link.
    Missing,
    /// The stored link is not the one its predecessor and its content give.
    Mismatch { stored: ChainHash, computed: ChainHash },
}

/// The first event at which the chain breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainBreak {
    pub seq: i64,
    pub reason: BreakReason,
}

impl fmt::Display for ChainBreak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            BreakReason::Gap { expected } => {
                write!(f, "the log's chain breaks at seq {}: seq {expected} is missing", self.seq)
            }
            BreakReason::Missing => write!(f, "the log's chain breaks at seq {}: no chain hash is stored", self.seq),
            BreakReason::Mismatch { stored, computed } => write!(
                f,
                "the log's chain breaks at seq {}: the stored hash {} is not {} (the event, or one before it, was changed)",
                self.seq,
                &stored.to_hex()[..12],
                &computed.to_hex()[..12]
            ),
        }
    }
}

/// Checks a run of entries, in seq order, following `from`: every seq the
/// next one, every stored link the link of its predecessor's stored link
/// and its own digest. The point reached, or the first break.
pub fn check<I>(from: ChainPoint, entries: I) -> Result<ChainPoint, ChainBreak>
where
    I: IntoIterator<Item = ChainEntry>,
{
    let mut point = from;
    for entry in entries {
        if entry.seq != point.seq + 1 {
            return Err(ChainBreak {
                seq: entry.seq,
                reason: BreakReason::Gap {
                    expected: point.seq + 1,
                },
            });
        }
        let computed = link(&point.hash, &entry.digest);
        match entry.stored {
            None => {
                return Err(ChainBreak {
                    seq: entry.seq,
                    reason: BreakReason::Missing,
                })
            }
            Some(stored) if stored != computed => {
                return Err(ChainBreak {
                    seq: entry.seq,
                    reason: BreakReason::Mismatch { stored, computed },
                })
            }
            Some(stored) => {
                point = ChainPoint {
                    seq: entry.seq,
                    hash: stored,
                }
            }
        }
    }
    Ok(point)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(seq: i64, payload: &str) -> StoredFacts<'_> {
        StoredFacts {
            seq,
            stream_id: "media-1",
            stream_version: seq,
            event_type: "media_removed",
            schema_version: 1,
            payload,
            recorded_at: Timestamp::from_micros(1_780_000_000_000_000),
            actor: "cli",
            correlation_id: "c",
            causation_id: None,
        }
    }

    /// A chain of `n` events as the store writes it.
    fn chain(n: i64) -> Vec<ChainEntry> {
        let mut previous = GENESIS;
        (1..=n)
            .map(|seq| {
                let digest = event_digest(&facts(seq, "{}"));
                previous = link(&previous, &digest);
                ChainEntry {
                    seq,
                    digest,
                    stored: Some(previous),
                }
            })
            .collect()
    }

    #[test]
    fn the_encoding_is_fixed_golden_vectors() {
        // These values are stored in every ledger: they must never change.
        // (Computed independently with Python's hashlib from the encoding above.)
        let digest = event_digest(&facts(1, r#"{"a":1}"#));
        assert_eq!(
            digest.to_hex(),
            "a5ec451fd0d9e327d8a5b1431b2f5eef1b2a792a6939ac49461acc9505a63213"
        );
        assert_eq!(
            link(&GENESIS, &digest).to_hex(),
            "667e5e4d21467c4d8eb533245e68617e858a267244d9a65952002acfc7492c1d"
        );
    }

    #[test]
    fn every_stored_field_changes_the_digest() {
        let base = facts(1, "{}");
        let digest = event_digest(&base);
        let changed = [
            StoredFacts { seq: 2, ..base },
            StoredFacts {
                stream_id: "media-2",
                ..base
            },
            StoredFacts {
                stream_version: 2,
                ..base
            },
            StoredFacts {
                event_type: "media_registered",
                ..base
            },
            StoredFacts {
                schema_version: 2,
                ..base
            },
            StoredFacts { payload: "{ }", ..base },
            StoredFacts {
                recorded_at: Timestamp::from_micros(1),
                ..base
            },
            StoredFacts {
                actor: "mallory",
                ..base
            },
            StoredFacts {
                correlation_id: "d",
                ..base
            },
            StoredFacts {
                causation_id: Some(""),
                ..base
            },
            // Lengths keep fields apart: moving a byte across a boundary changes the digest.
            StoredFacts {
                actor: "cl",
                correlation_id: "ic",
                ..base
            },
        ];
        for other in changed {
            assert_ne!(event_digest(&other), digest, "{other:?}");
        }
    }

    #[test]
    fn an_intact_chain_reaches_its_last_event() {
        let entries = chain(5);
        let last = entries[4].stored.unwrap();
        assert_eq!(
            check(ChainPoint::START, entries.clone()),
            Ok(ChainPoint { seq: 5, hash: last })
        );
        // And a check may start where an earlier one stopped.
        let middle = ChainPoint {
            seq: 2,
            hash: entries[1].stored.unwrap(),
        };
        assert_eq!(check(middle, entries[2..].to_vec()).unwrap().seq, 5);
    }

    #[test]
    fn a_changed_event_breaks_the_chain_at_its_seq() {
        let mut entries = chain(5);
        entries[2].digest = event_digest(&facts(3, r#"{"changed":true}"#));
        let broken = check(ChainPoint::START, entries).unwrap_err();
        assert_eq!(broken.seq, 3);
        assert!(matches!(broken.reason, BreakReason::Mismatch { .. }), "{broken:?}");
        assert!(broken.to_string().contains("breaks at seq 3"), "{broken}");
    }

    #[test]
    fn a_rewritten_link_breaks_the_chain_at_the_next_seq() {
        // Whoever changes an event and recomputes its link leaves the next
        // event's link pointing at the old one.
        let mut entries = chain(5);
        entries[2].digest = event_digest(&facts(3, r#"{"changed":true}"#));
        entries[2].stored = Some(link(&entries[1].stored.unwrap(), &entries[2].digest));
        assert_eq!(check(ChainPoint::START, entries).unwrap_err().seq, 4);
    }

    #[test]
    fn a_missing_link_or_event_breaks_the_chain() {
        let mut entries = chain(4);
        entries[1].stored = None;
        assert_eq!(
            check(ChainPoint::START, entries).unwrap_err(),
            ChainBreak {
                seq: 2,
                reason: BreakReason::Missing
            }
        );
        let mut entries = chain(4);
        entries.remove(2);
        assert_eq!(
            check(ChainPoint::START, entries).unwrap_err(),
            ChainBreak {
                seq: 4,
                reason: BreakReason::Gap { expected: 3 }
            }
        );
    }

    #[test]
    fn hashes_round_trip_through_hex_and_refuse_anything_else() {
        let hash = chain(1)[0].stored.unwrap();
        assert_eq!(ChainHash::from_hex(&hash.to_hex()), Ok(hash));
        for bad in [
            "",
            "00",
            &hash.to_hex().to_uppercase(),
            &format!("{}g", &hash.to_hex()[..63]),
        ] {
            assert!(ChainHash::from_hex(bad).is_err(), "{bad}");
        }
    }
}
