//! What readers see of a claim token. A token is a capability: whoever
//! holds it may report on the claim, so it appears only in the answer to
//! the claim that took it. Everywhere else — timelines, event streams,
//! task views — it is shown as its fingerprint: the first 8 hex digits of
//! its SHA-256, enough to tell claims apart and to match a worker's own
//! token against the history, useless for reporting.

use crate::envelope::EventEnvelope;
use crate::events::Event;
use sha2::{Digest, Sha256};

/// Hex digits a fingerprint keeps.
pub const FINGERPRINT_DIGITS: usize = 8;

/// The fingerprint of `token` (`sha256(token)`, its first 8 hex digits).
pub fn fingerprint(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let mut hex = String::with_capacity(FINGERPRINT_DIGITS);
    for byte in digest.iter().take(FINGERPRINT_DIGITS / 2) {
        hex.push_str(&format!("{byte:02x}"));
    }
    hex
}

impl EventEnvelope {
    /// The envelope as a reader may see it: every claim token in its
    /// payload replaced by its fingerprint.
    pub fn for_readers(mut self) -> EventEnvelope {
        self.event = self.event.for_readers();
        self
    }
}

impl Event {
    /// The event with every claim token replaced by its fingerprint.
    pub fn for_readers(mut self) -> Event {
        let hide = |token: &mut String| *token = fingerprint(token);
        match &mut self {
            Event::OperationClaimed(claimed) => hide(&mut claimed.claim_token),
            Event::OperationStarted(started) => hide(&mut started.claim_token),
            Event::OperationSucceeded(succeeded) => succeeded.claim_token.iter_mut().for_each(hide),
            Event::OperationFailed(failed) => failed.claim_token.iter_mut().for_each(hide),
            Event::OperationReleased(released) => hide(&mut released.claim_token),
            Event::OperationInterrupted(interrupted) => interrupted.claim_token.iter_mut().for_each(hide),
            Event::OperationSuperseded(superseded) => hide(&mut superseded.claim_token),
            _ => {}
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::OperationClaimed;
    use crate::{OperationId, Timestamp};

    #[test]
    fn a_fingerprint_is_the_first_eight_hex_digits_of_the_tokens_sha256() {
        // sha256("abc") = ba7816bf 8f01cfea ...
        assert_eq!(fingerprint("abc"), "ba7816bf");
    }

    #[test]
    fn an_event_for_readers_carries_no_claim_token_only_its_fingerprint() {
        let token = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b".to_string();
        let event = Event::OperationClaimed(OperationClaimed {
            operation_id: OperationId(uuid::Uuid::nil()),
            claim_token: token.clone(),
            worker: "w1".into(),
            revision: None,
            lease_expires_at: Timestamp::from_micros(0),
        });
        let shown = event.for_readers().payload_json();
        assert!(!shown.contains(&token), "{shown}");
        assert!(shown.contains(&fingerprint(&token)), "{shown}");
    }
}
