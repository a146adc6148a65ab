//! The small words explanations are made of: clock times in a reader's
//! time zone, spans of time, short actor names, and one-line quotes of
//! texts and payloads. Pure: the zone and the present arrive as arguments.

use chrono::TimeZone;
use opledger_domain::time::Timestamp;
use serde_json::Value;
use std::fmt::Display;

/// The longest quote of a text (an error, a reason) in a sentence.
pub const QUOTE_CHARS: usize = 120;

/// `15:04:12` when `at` falls on the same day as `now` in `zone`, else
/// `2026-05-01 15:04:12`.
pub fn clock_time<Tz: TimeZone>(at: Timestamp, now: Timestamp, zone: &Tz) -> String
where
    Tz::Offset: Display,
{
    let local = at.to_datetime().with_timezone(zone);
    let today = now.to_datetime().with_timezone(zone).date_naive();
    if local.date_naive() == today {
        local.format("%H:%M:%S").to_string()
    } else {
        local.format("%Y-%m-%d %H:%M:%S").to_string()
    }
}

/// A span of time for people: `0.3 s`, `12 s`, `4 min 3 s`, `2 h 5 min`,
/// `3 d 4 h`. Negative spans are shown by their size.
pub fn span(millis: i64) -> String {
    let millis = millis.unsigned_abs();
    let seconds = millis / 1_000;
    let pair = |big: u64, big_unit: &str, small: u64, small_unit: &str| {
        if small == 0 {
            format!("{big} {big_unit}")
        } else {
            format!("{big} {big_unit} {small} {small_unit}")
        }
    };
    match seconds {
        0..=9 => {
            let tenths = (millis + 50) / 100;
            if tenths.is_multiple_of(10) {
                format!("{} s", tenths / 10)
            } else {
                format!("{}.{} s", tenths / 10, tenths % 10)
            }
        }
        10..=59 => format!("{seconds} s"),
        60..=3_599 => pair(seconds / 60, "min", seconds % 60, "s"),
        3_600..=86_399 => pair(seconds / 3_600, "h", seconds % 3_600 / 60, "min"),
        _ => pair(seconds / 86_400, "d", seconds % 86_400 / 3_600, "h"),
    }
}

/// Milliseconds from `from` to `to` (negative when `to` is earlier).
pub fn millis_between(from: Timestamp, to: Timestamp) -> i64 {
    (to.as_micros() - from.as_micros()) / 1_000
}

/// An actor as a column shows it: a UUID inside it (hyphenated, or 16
/// or more hex digits in a row, as a run id) cut to its first 8 digits, so
/// `ingest-0190ab12…` stays recognizable and short.
pub fn short_actor(actor: &str) -> String {
    let chars: Vec<char> = actor.chars().collect();
    let hex = |index: usize| chars.get(index).is_some_and(char::is_ascii_hexdigit);
    let hyphenated_uuid = |start: usize| {
        let groups = [8, 4, 4, 4, 12];
        let mut index = start;
        for (number, length) in groups.iter().enumerate() {
            if !(index..index + length).all(hex) {
                return None;
            }
            index += length;
            if number < groups.len() - 1 {
                if chars.get(index) != Some(&'-') {
                    return None;
                }
                index += 1;
            }
        }
        (!hex(index)).then_some(index)
    };
    let mut out = String::with_capacity(actor.len().min(24));
    let mut index = 0;
    while index < chars.len() {
        let starts_word = index == 0 || !hex(index - 1);
        if starts_word && hex(index) {
            let plain_end = (index..).find(|at| !hex(*at)).unwrap_or(chars.len());
            let end = hyphenated_uuid(index).or((plain_end - index >= 16).then_some(plain_end));
            if let Some(end) = end {
                out.extend(&chars[index..index + 8]);
                index = end;
                continue;
            }
        }
        out.push(chars[index]);
        index += 1;
    }
    out
}

/// A text on one line and at most `max` characters (whitespace runs,
/// newlines included, become one space; a cut ends in `…`).
pub fn quote(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        return flat;
    }
    let mut cut: String = flat.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A JSON value on one line, at most `max` characters: compact JSON, cut
/// with `…`. Strings are shown without quotes.
pub fn summarize(value: &Value, max: usize) -> String {
    match value {
        Value::String(text) => quote(text, max),
        other => quote(&other.to_string(), max),
    }
}

/// The first 8 characters of a revision or id, enough to tell them apart.
pub fn short_id(text: &str) -> String {
    let body = text.rsplit(':').next().unwrap_or(text);
    body.chars().take(8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{FixedOffset, Utc};

    fn at(text: &str) -> Timestamp {
        Timestamp::parse(text).unwrap()
    }

    #[test]
    fn spans_read_in_the_largest_two_units() {
        let table = [
            (0, "0 s"),
            (340, "0.3 s"),
            (1_000, "1 s"),
            (9_940, "9.9 s"),
            (12_400, "12 s"),
            (60_000, "1 min"),
            (243_000, "4 min 3 s"),
            (7_500_000, "2 h 5 min"),
            (273_600_000, "3 d 4 h"),
            (-12_000, "12 s"),
        ];
        for (millis, expected) in table {
            assert_eq!(span(millis), expected, "{millis} ms");
        }
    }

    #[test]
    fn clock_times_carry_the_date_only_on_another_day_of_the_readers_zone() {
        let now = at("2026-05-01T23:30:00Z");
        assert_eq!(clock_time(at("2026-05-01T15:04:12Z"), now, &Utc), "15:04:12");
        assert_eq!(clock_time(at("2026-04-30T15:04:12Z"), now, &Utc), "2026-04-30 15:04:12");
        // Two hours east, 23:30 UTC is already the next day.
        let east = FixedOffset::east_opt(2 * 3_600).unwrap();
        assert_eq!(
            clock_time(at("2026-05-01T15:04:12Z"), now, &east),
            "2026-05-01 17:04:12"
        );
        assert_eq!(clock_time(at("2026-05-01T23:00:00Z"), now, &east), "01:00:00");
    }

    #[test]
    fn actors_keep_their_words_and_cut_their_ids() {
        assert_eq!(short_actor("py-1"), "py-1");
        assert_eq!(short_actor("cli"), "cli");
        assert_eq!(
            short_actor("ingest-0190ab12cd34ef5601234567890abcde"),
            "ingest-0190ab12"
        );
        assert_eq!(
            short_actor("worker-01900000-0000-7000-8000-000000000001-2"),
            "worker-01900000-2"
        );
        assert_eq!(short_actor("deadbeef"), "deadbeef");
        assert_eq!(short_actor("team-a-"), "team-a-");
    }

    #[test]
    fn quotes_are_one_line_and_cut_with_an_ellipsis() {
        assert_eq!(quote("decoder\ncrashed   hard", 40), "decoder crashed hard");
        assert_eq!(quote("abcdefghij", 5), "abcd…");
        assert_eq!(
            summarize(&serde_json::json!({"path": "/t/a.png"}), 80),
            r#"{"path":"/t/a.png"}"#
        );
        assert_eq!(summarize(&serde_json::json!("plain"), 80), "plain");
    }

    #[test]
    fn short_ids_drop_a_scheme_and_keep_eight_characters() {
        assert_eq!(short_id("sha256:3f2a9c1d00ff"), "3f2a9c1d");
        assert_eq!(short_id("0190ab12-cd34"), "0190ab12");
    }
}
