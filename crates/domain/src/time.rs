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
        // Every stored time and every replayed event goes through here, so
        // the fixed layout is written by arithmetic rather than chrono's
        // general formatter. Instants before 1970 or after 9999 take chrono's
        // path; both produce the same text (tested).
        if (0..=Self::MAX.0).contains(&self.0) {
            return format_fixed(self.0);
        }
        self.to_datetime().to_rfc3339_opts(SecondsFormat::Micros, true)
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(micros) = parse_fixed(text.as_bytes()) {
            return Ok(Timestamp(micros));
        }
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

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date of a day count since 1970-01-01 (`civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` for a non-negative microsecond count.
fn format_fixed(micros: i64) -> String {
    let seconds = micros.div_euclid(1_000_000);
    let fraction = micros.rem_euclid(1_000_000);
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    let second_of_day = seconds.rem_euclid(86_400);
    // Digits written in place: `format!` with padded fields cost a few
    // percent of the SQLite writer, which binds every stored time as text.
    let mut text = *b"0000-00-00T00:00:00.000000Z";
    let mut put = |at: usize, width: usize, mut value: i64| {
        for index in (at..at + width).rev() {
            text[index] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, second_of_day / 3600);
    put(14, 2, second_of_day / 60 % 60);
    put(17, 2, second_of_day % 60);
    put(20, 6, fraction);
    text.iter().map(|&byte| char::from(byte)).collect()
}

/// Parses exactly `YYYY-MM-DDTHH:MM:SS.ffffffZ`, the form this crate writes;
/// anything else returns None for chrono's general parser to judge.
fn parse_fixed(text: &[u8]) -> Option<i64> {
    if text.len() != 27 {
        return None;
    }
    let separators = [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
        (26, b'Z'),
    ];
    if separators.iter().any(|(index, byte)| text[*index] != *byte) {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        text[range].iter().try_fold(0i64, |value, byte| {
            byte.is_ascii_digit().then(|| value * 10 + i64::from(byte - b'0'))
        })
    };
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let fraction = number(20..26)?;
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => return None,
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 59 || year < 1970 {
        return None;
    }
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Some(seconds * 1_000_000 + fraction)
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
    fn fixed_layout_agrees_with_chrono_everywhere() {
        // Leap days, month ends, century rules, the epoch and the last
        // instant, plus a walk through the whole range.
        let mut samples = vec![
            0,
            1,
            951_782_400_000_000,   // 2000-02-29
            4_107_542_399_999_999, // 2100-02-28T23:59:59.999999
            4_107_542_400_000_000, // 2100-03-01
            Timestamp::MAX.as_micros(),
        ];
        let mut micros = 0i64;
        while micros < Timestamp::MAX.as_micros() {
            samples.push(micros);
            micros += 86_400_000_000 * 13 + 3_599_999_999;
        }
        for micros in samples {
            let at = Timestamp::from_micros(micros);
            let chrono_text = at.to_datetime().to_rfc3339_opts(SecondsFormat::Micros, true);
            assert_eq!(at.to_rfc3339(), chrono_text, "{micros}");
            assert_eq!(Timestamp::parse(&chrono_text).unwrap(), at, "{chrono_text}");
        }
    }

    #[test]
    fn fixed_layout_refuses_impossible_dates_and_defers_other_forms_to_chrono() {
        assert!(Timestamp::parse("2026-02-30T00:00:00.000000Z").is_err());
        assert!(Timestamp::parse("2026-13-01T00:00:00.000000Z").is_err());
        assert!(Timestamp::parse("2026-01-01T24:00:00.000000Z").is_err());
        assert_eq!(
            Timestamp::parse("2026-01-01T01:00:00+01:00").unwrap(),
            Timestamp::parse("2026-01-01T00:00:00.000000Z").unwrap()
        );
        assert_eq!(Timestamp::from_micros(-1).to_rfc3339(), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn parse_refuses_garbage() {
        assert!(Timestamp::parse("yesterday").is_err());
    }
}
