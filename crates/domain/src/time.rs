//! Timestamps with microsecond precision.
//!
//! Both backends store microseconds exactly, so a timestamp truncated to
//! microseconds round-trips through any store unchanged. That is what lets
//! `replay --verify` compare projected time columns for equality.

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A UTC instant truncated to whole microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// Microseconds since the Unix epoch.
    pub fn from_micros(micros: i64) -> Self {
        Timestamp(micros)
    }

    pub fn as_micros(self) -> i64 {
        self.0
    }

    /// Truncates a chrono instant to microseconds.
    pub fn from_datetime(at: DateTime<Utc>) -> Self {
        Timestamp(at.timestamp_micros())
    }

    pub fn to_datetime(self) -> DateTime<Utc> {
        Utc.timestamp_micros(self.0)
            .single()
            .expect("every i64 microsecond count within chrono's range maps to one instant")
    }

    /// RFC 3339 with exactly six fractional digits and `Z`, e.g.
    /// `2026-11-30T09:47:24.000000Z`. Fixed width, so text order is time order.
    pub fn to_rfc3339(self) -> String {
        self.to_datetime().to_rfc3339_opts(SecondsFormat::Micros, true)
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        DateTime::parse_from_rfc3339(text)
            .map(|at| Timestamp::from_datetime(at.with_timezone(&Utc)))
            .map_err(|error| format!("invalid RFC 3339 timestamp {text:?}: {error}"))
    }

    /// The latest instant every backend can store and print:
    /// 9999-12-31T23:59:59.999999Z.
    pub const MAX: Timestamp = Timestamp(253_402_300_799_999_999);

    /// This instant plus a number of milliseconds, saturating at
    /// [`Timestamp::MAX`] so a huge duration can never make an instant that
    /// cannot be printed or stored.
    pub fn plus_millis(self, millis: i64) -> Self {
        Timestamp(self.0.saturating_add(millis.saturating_mul(1000)).min(Self::MAX.0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Timestamp::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_is_fixed_width_and_round_trips() {
        let at = Timestamp::from_micros(1_764_496_044_000_001);
        let text = at.to_rfc3339();
        assert_eq!(text, "2025-11-30T09:47:24.000001Z");
        assert_eq!(Timestamp::parse(&text).unwrap(), at);
        assert_eq!(Timestamp::from_micros(0).to_rfc3339(), "1970-01-01T00:00:00.000000Z");
    }

    #[test]
    fn adding_a_huge_duration_saturates_at_the_largest_printable_instant() {
        let far = Timestamp::from_micros(0).plus_millis(i64::MAX);
        assert_eq!(far, Timestamp::MAX);
        assert_eq!(far.to_rfc3339(), "9999-12-31T23:59:59.999999Z");
    }

    #[test]
    fn parse_refuses_garbage() {
        assert!(Timestamp::parse("yesterday").is_err());
    }
}
