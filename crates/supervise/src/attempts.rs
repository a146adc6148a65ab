//! Download attempts: how a service hands one artifact out. An attempt is
//! registered (`pending`), taken by exactly one GET (`streaming`; a second
//! GET of it is refused), and `started` once its first chunk has been
//! handed to the connection; `failed` when streaming broke off. An attempt
//! not started within its time to live expires. A second registration for
//! the same job while one is pending returns that one.
//!
//! The time is an argument of every call, so tests drive the expiry with
//! their own clock.

use opledger_domain::{OperationId, Timestamp};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// How long a registered attempt waits for its GET: 45 s.
pub const ATTEMPT_TTL: Duration = Duration::from_secs(45);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    Pending,
    Streaming,
    Started,
    Failed,
    Expired,
}

/// One attempt as its caller sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    pub attempt_id: u64,
    pub job: OperationId,
    pub state: AttemptState,
    pub created_at: Timestamp,
    /// When a pending attempt expires.
    pub expires_at: Timestamp,
}

/// Why an attempt cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    Unknown,
    /// Another GET has it, or had it.
    Taken(AttemptState),
    Expired,
}

/// Every attempt of one service.
#[derive(Debug)]
pub struct Attempts {
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    by_id: BTreeMap<u64, Attempt>,
}

impl Default for Attempts {
    fn default() -> Self {
        Attempts::new(ATTEMPT_TTL)
    }
}

fn plus(at: Timestamp, ttl: Duration) -> Timestamp {
    Timestamp::from_micros(
        at.as_micros()
            .saturating_add(i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX)),
    )
}

impl Attempts {
    pub fn new(ttl: Duration) -> Attempts {
        Attempts {
            ttl,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Expires what waited too long.
    fn expire(inner: &mut Inner, now: Timestamp) {
        for attempt in inner.by_id.values_mut() {
            if attempt.state == AttemptState::Pending && attempt.expires_at <= now {
                attempt.state = AttemptState::Expired;
            }
        }
    }

    /// The job's pending attempt, or a new one.
    pub fn register(&self, job: OperationId, now: Timestamp) -> Attempt {
        let mut inner = self.lock();
        Self::expire(&mut inner, now);
        if let Some(pending) = inner
            .by_id
            .values()
            .find(|attempt| attempt.job == job && attempt.state == AttemptState::Pending)
        {
            return pending.clone();
        }
        inner.next += 1;
        let attempt = Attempt {
            attempt_id: inner.next,
            job,
            state: AttemptState::Pending,
            created_at: now,
            expires_at: plus(now, self.ttl),
        };
        inner.by_id.insert(attempt.attempt_id, attempt.clone());
        attempt
    }

    /// An attempt as it stands now.
    pub fn get(&self, attempt_id: u64, now: Timestamp) -> Option<Attempt> {
        let mut inner = self.lock();
        Self::expire(&mut inner, now);
        inner.by_id.get(&attempt_id).cloned()
    }

    /// Takes a pending attempt of `job` to `streaming`: exactly one caller
    /// gets it.
    pub fn take(&self, job: OperationId, attempt_id: u64, now: Timestamp) -> Result<Attempt, Refused> {
        let mut inner = self.lock();
        Self::expire(&mut inner, now);
        let attempt = inner
            .by_id
            .get_mut(&attempt_id)
            .filter(|attempt| attempt.job == job)
            .ok_or(Refused::Unknown)?;
        match attempt.state {
            AttemptState::Pending => {
                attempt.state = AttemptState::Streaming;
                Ok(attempt.clone())
            }
            AttemptState::Expired => Err(Refused::Expired),
            other => Err(Refused::Taken(other)),
        }
    }

    /// The first chunk reached the connection.
    pub fn started(&self, attempt_id: u64) {
        self.set(attempt_id, AttemptState::Started);
    }

    /// Streaming broke off.
    pub fn failed(&self, attempt_id: u64) {
        self.set(attempt_id, AttemptState::Failed);
    }

    fn set(&self, attempt_id: u64, state: AttemptState) {
        if let Some(attempt) = self.lock().by_id.get_mut(&attempt_id) {
            attempt.state = state;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_micros(1_800_000_000_000_000 + seconds * 1_000_000)
    }

    fn job() -> OperationId {
        "01900000-0000-7000-8000-000000000001".parse().unwrap()
    }

    #[test]
    fn a_second_registration_returns_the_pending_attempt_and_only_one_take_streams() {
        let attempts = Attempts::default();
        let first = attempts.register(job(), at(0));
        assert_eq!(attempts.register(job(), at(1)), first);
        assert_eq!(
            attempts.take(job(), first.attempt_id, at(2)).unwrap().state,
            AttemptState::Streaming
        );
        assert_eq!(
            attempts.take(job(), first.attempt_id, at(2)),
            Err(Refused::Taken(AttemptState::Streaming))
        );
        attempts.started(first.attempt_id);
        assert_eq!(
            attempts.get(first.attempt_id, at(3)).unwrap().state,
            AttemptState::Started
        );
        // Once it is taken, the next registration is a new attempt.
        assert_ne!(attempts.register(job(), at(4)).attempt_id, first.attempt_id);
    }

    #[test]
    fn an_attempt_not_taken_within_45_seconds_expires() {
        let attempts = Attempts::default();
        let attempt = attempts.register(job(), at(0));
        assert_eq!(
            attempts.get(attempt.attempt_id, at(44)).unwrap().state,
            AttemptState::Pending
        );
        assert_eq!(attempts.take(job(), attempt.attempt_id, at(45)), Err(Refused::Expired));
        let taken_in_time = attempts.register(job(), at(50));
        assert!(attempts.take(job(), taken_in_time.attempt_id, at(94)).is_ok());
        let other: OperationId = "01900000-0000-7000-8000-000000000002".parse().unwrap();
        assert_eq!(
            attempts.take(other, taken_in_time.attempt_id, at(94)),
            Err(Refused::Unknown)
        );
    }
}
