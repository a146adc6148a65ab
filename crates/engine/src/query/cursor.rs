//! Page cursors: where the next page of a listing starts, opaque to users.
//!
//! A cursor is the position of the last row a page's walk passed — the
//! values of the listing's order columns (a creation time and an id, a
//! path and an id, a position) — with the listing's name, as a JSON array
//! (times in microseconds, ids as 32 hex digits) in URL-safe base64
//! without padding. It names no offset: rows added or
//! changed elsewhere in the order cannot shift the page it starts.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use opledger_domain::projections::Cell;
use opledger_domain::Timestamp;
use serde_json::Value;
use uuid::Uuid;

/// The longest cursor text read: a few order values need far less.
const MAX_CURSOR_CHARS: usize = 1_024;

/// Which listing a cursor continues; each has its own order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// Operations newest first: (created_at, id).
    Operations,
    /// A batch's operations, last item first: (position).
    BatchOperations,
    /// Media items by path: (path, id).
    Media,
    /// Open review entries, oldest first: (entry_id).
    Review,
    /// Batches newest first: (created_at, batch_id).
    Batches,
    /// A batch's items in order: (position).
    BatchItems,
}

/// The type of one order value in a cursor.
#[derive(Debug, Clone, Copy)]
enum OrderValue {
    Time,
    Id,
    Text,
    Integer,
}

impl Listing {
    fn tag(self) -> &'static str {
        match self {
            Listing::Operations => "operations",
            Listing::BatchOperations => "batch-operations",
            Listing::Media => "media",
            Listing::Review => "review",
            Listing::Batches => "batches",
            Listing::BatchItems => "batch-items",
        }
    }

    /// What the listing lists, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Listing::Operations => "operations",
            Listing::BatchOperations => "a batch's operations",
            Listing::Media => "media items",
            Listing::Review => "review entries",
            Listing::Batches => "batches",
            Listing::BatchItems => "a batch's items",
        }
    }

    fn values(self) -> &'static [OrderValue] {
        match self {
            Listing::Operations | Listing::Batches => &[OrderValue::Time, OrderValue::Id],
            Listing::Media => &[OrderValue::Text, OrderValue::Id],
            Listing::BatchOperations | Listing::Review | Listing::BatchItems => &[OrderValue::Integer],
        }
    }
}

/// The cursor text of a position in `listing`.
pub fn encode(listing: Listing, position: &[Cell]) -> String {
    let mut array = vec![Value::String(listing.tag().to_string())];
    for cell in position {
        array.push(match cell {
            Cell::Timestamp(at) => Value::from(at.as_micros()),
            Cell::Uuid(id) => Value::String(id.simple().to_string()),
            Cell::Integer(value) => Value::from(*value),
            Cell::Text(text) | Cell::Json(text) => Value::String(text.clone()),
            other => Value::String(other.to_string()),
        });
    }
    URL_SAFE_NO_PAD.encode(Value::Array(array).to_string())
}

/// The position a cursor text names in `listing`, or why it names none.
/// The message quotes at most the cursor's first few characters.
pub fn decode(listing: Listing, text: &str) -> Result<Vec<Cell>, String> {
    let quoted = quote(text);
    let not_a_cursor = || format!("{quoted} is not a page cursor (give the `next` value of an earlier page)");
    if text.len() > MAX_CURSOR_CHARS {
        return Err(not_a_cursor());
    }
    let bytes = URL_SAFE_NO_PAD.decode(text.trim()).map_err(|_| not_a_cursor())?;
    let Ok(Value::Array(array)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(not_a_cursor());
    };
    let Some((Value::String(tag), values)) = array.split_first() else {
        return Err(not_a_cursor());
    };
    if tag != listing.tag() {
        return Err(format!(
            "{quoted} is a cursor of another listing, not of {}",
            listing.describe()
        ));
    }
    let expected = listing.values();
    if values.len() != expected.len() {
        return Err(not_a_cursor());
    }
    values
        .iter()
        .zip(expected)
        .map(|(value, ty)| match (ty, value) {
            (OrderValue::Time, Value::Number(number)) => number
                .as_i64()
                .filter(|micros| (0..=Timestamp::MAX.as_micros()).contains(micros))
                .map(|micros| Cell::Timestamp(Timestamp::from_micros(micros))),
            (OrderValue::Id, Value::String(text)) => Uuid::parse_str(text).map(Cell::Uuid).ok(),
            (OrderValue::Text, Value::String(text)) => Some(Cell::Text(text.clone())),
            (OrderValue::Integer, Value::Number(number)) => number.as_i64().map(Cell::Integer),
            _ => None,
        })
        .collect::<Option<Vec<Cell>>>()
        .ok_or_else(not_a_cursor)
}

/// A short quote of untrusted text for a message.
fn quote(text: &str) -> String {
    const SHOWN: usize = 40;
    if text.chars().count() <= SHOWN {
        format!("{text:?}")
    } else {
        let head: String = text.chars().take(SHOWN).collect();
        format!("{head:?}… ({} characters)", text.chars().count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_its_position_and_belongs_to_its_listing() {
        let position = vec![
            Cell::Timestamp(Timestamp::from_micros(1_780_000_000_123_456)),
            Cell::Uuid(Uuid::from_u128(7)),
        ];
        let text = encode(Listing::Operations, &position);
        assert_eq!(decode(Listing::Operations, &text).unwrap(), position);
        let other = decode(Listing::Batches, &text).unwrap_err();
        assert!(other.contains("another listing"), "{other}");
        let media = vec![Cell::Text("/photos/é ü.jpg".into()), Cell::Uuid(Uuid::from_u128(9))];
        assert_eq!(decode(Listing::Media, &encode(Listing::Media, &media)).unwrap(), media);
    }

    #[test]
    fn a_malformed_cursor_is_refused_with_a_short_quote() {
        for text in ["", "not base64!", "bm90IGpzb24", &"x".repeat(5_000)] {
            let error = decode(Listing::Operations, text).unwrap_err();
            assert!(error.len() < 200, "{error}");
        }
        // Well-formed JSON with values of the wrong types.
        let wrong = URL_SAFE_NO_PAD.encode(r#"["operations", 1, 2]"#);
        assert!(decode(Listing::Operations, &wrong).is_err());
        let short = URL_SAFE_NO_PAD.encode(r#"["review"]"#);
        assert!(decode(Listing::Review, &short).is_err());
    }
}
