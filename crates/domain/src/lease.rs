//! Leases: how long a claim may hold its work before recovery may take it
//! back, and when a held lease ends.
//!
//! A lease length is checked once, where it is made ([`LeaseMs::new`]):
//! every command and runtime that takes a lease holds a [`LeaseMs`], so the
//! bounds are one rule, not a check repeated at each door.

use crate::error::DomainError;
use crate::time::Timestamp;
use std::fmt;
use std::time::Duration;

/// The longest lease a claim may take, in milliseconds. A worker that needs
/// longer heartbeats; a lease of years would hide a dead worker for years.
pub const MAX_LEASE_MS: i64 = 7 * 86_400_000;

/// A lease length within the bounds: 1 ms up to [`MAX_LEASE_MS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseMs(i64);

impl LeaseMs {
    /// The longest lease.
    pub const MAX: LeaseMs = LeaseMs(MAX_LEASE_MS);

    /// A lease of `millis`; invalid input outside 1 ms ..= 7 days.
    pub fn new(millis: i64) -> Result<Self, DomainError> {
        if (1..=MAX_LEASE_MS).contains(&millis) {
            Ok(LeaseMs(millis))
        } else {
            Err(out_of_bounds(format_args!("{millis} ms")))
        }
    }

    /// A lease of `duration`, rounded down to whole milliseconds.
    pub fn from_duration(duration: Duration) -> Result<Self, DomainError> {
        i64::try_from(duration.as_millis())
            .ok()
            .and_then(|millis| LeaseMs::new(millis).ok())
            .ok_or_else(|| out_of_bounds(format_args!("{duration:?}")))
    }

    pub fn millis(self) -> i64 {
        self.0
    }

    /// When a lease of this length taken at `start` ends.
    pub fn ends_at(self, start: Timestamp) -> Timestamp {
        start.plus_millis(self.0)
    }
}

fn out_of_bounds(given: fmt::Arguments<'_>) -> DomainError {
    DomainError::InvalidInput(format!(
        "a lease must be between 1 ms and {} days, not {given}",
        MAX_LEASE_MS / 86_400_000
    ))
}

/// When a held claim's lease ends: the later of the lease the claim was
/// granted (on its processing state) and the one heartbeats extended it to
/// (its liveness row). `None` when neither is known.
pub fn lease_end(granted: Option<Timestamp>, extended: Option<Timestamp>) -> Option<Timestamp> {
    // `None` orders before every instant: the known one wins.
    granted.max(extended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_refused_outside_one_millisecond_to_seven_days() {
        for millis in [0, -5, MAX_LEASE_MS + 1, i64::MAX / 1000, i64::MAX, i64::MIN] {
            assert!(
                matches!(LeaseMs::new(millis), Err(DomainError::InvalidInput(_))),
                "{millis} ms"
            );
        }
        assert_eq!(LeaseMs::new(1).unwrap().millis(), 1);
        assert_eq!(LeaseMs::new(MAX_LEASE_MS).unwrap(), LeaseMs::MAX);
    }

    #[test]
    fn a_lease_from_a_duration_keeps_whole_milliseconds_within_the_bounds() {
        assert_eq!(
            LeaseMs::from_duration(Duration::from_secs(60)).unwrap().millis(),
            60_000
        );
        assert_eq!(
            LeaseMs::from_duration(Duration::from_micros(1_999)).unwrap().millis(),
            1
        );
        for duration in [
            Duration::ZERO,
            Duration::from_micros(999),
            Duration::from_millis(MAX_LEASE_MS as u64 + 1),
            Duration::MAX,
        ] {
            let error = LeaseMs::from_duration(duration).unwrap_err().to_string();
            assert!(error.contains(&format!("{duration:?}")), "{error}");
        }
    }

    #[test]
    fn a_lease_ends_at_the_later_of_its_grant_and_its_extension() {
        let at = Timestamp::from_micros;
        assert_eq!(lease_end(Some(at(5)), Some(at(9))), Some(at(9)));
        assert_eq!(lease_end(Some(at(9)), Some(at(5))), Some(at(9)));
        assert_eq!(lease_end(None, Some(at(5))), Some(at(5)));
        assert_eq!(lease_end(Some(at(5)), None), Some(at(5)));
        assert_eq!(lease_end(None, None), None);
        assert_eq!(LeaseMs::new(2).unwrap().ends_at(at(1_000)), at(3_000));
    }
}
