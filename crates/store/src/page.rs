//! Paged walks of one projection table in index order: what a listing
//! (`ops list`, `media list`, a batch's items) reads, page by page.
//!
//! A [`PageQuery`] names a table, equalities on the leading columns of one
//! of its indexes, an order (the index's next columns, which together
//! identify a row among those the equalities select), optional bounds on
//! the first order column, a keyset position to start strictly after, and
//! filters on other columns (`any_of`) that are checked on every row the
//! walk passes. A backend answers with one [`Page`]: the matching rows in
//! order, at most `limit`, and where the walk stopped when rows past it
//! remain.
//!
//! The walk is bounded: it passes at most `walk` rows in the order
//! (matching or not), so a filter that matches nothing costs the same as
//! one that matches everything. A page may therefore hold fewer than
//! `limit` rows, none even, and still have a `resume` position. Pages are
//! keyset positions, never offsets: rows added or changed elsewhere in the
//! order cannot shift a later page.
//!
//! The decision of what a page is, from the rows a backend read, is made
//! once, here ([`finish`]); backends only run the two reads it needs.

use opledger_domain::projections::{Cell, Row, TableSpec};

/// Which way a walk goes along its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Ascending,
    Descending,
}

/// One page of a walk of `table` in index order.
///
/// Text order columns compare bytewise (as their UTF-8 bytes; the same
/// order as code points) on every backend, whatever a database's default
/// collation, so a page holds the same rows everywhere.
#[derive(Debug, Clone, PartialEq)]
pub struct PageQuery {
    pub table: &'static TableSpec,
    /// Columns that must equal these values: the index's leading columns.
    pub equal: Vec<(&'static str, Cell)>,
    /// The order: the index's next columns. Among the rows the equalities
    /// select, their values identify one row (end with a unique column).
    pub order: Vec<&'static str>,
    pub direction: Direction,
    /// Only rows whose first order column is at least this (inclusive).
    pub from: Option<Cell>,
    /// Only rows whose first order column is below this (exclusive).
    pub to: Option<Cell>,
    /// Only rows strictly past this position (one value per order column)
    /// in the walk's direction.
    pub after: Option<Vec<Cell>>,
    /// Each column must be one of its values; checked on every row walked
    /// (no index is needed for them).
    pub any_of: Vec<(&'static str, Vec<Cell>)>,
    /// The most rows the page holds (at least 1).
    pub limit: usize,
    /// The most rows the walk passes, matching or not (at least 1). Only
    /// `any_of` makes it differ from `limit`.
    pub walk: usize,
}

impl PageQuery {
    /// A walk of `table` in `order` with no filter: `limit` rows a page.
    pub fn new(table: &'static TableSpec, order: &[&'static str], direction: Direction, limit: usize) -> Self {
        PageQuery {
            table,
            equal: Vec::new(),
            order: order.to_vec(),
            direction,
            from: None,
            to: None,
            after: None,
            any_of: Vec::new(),
            limit,
            walk: limit,
        }
    }

    /// Whether rows the walk passes may be left out (an `any_of` filter):
    /// then the walk's end needs a read of its own.
    pub fn filters(&self) -> bool {
        !self.any_of.is_empty()
    }

    /// The limit a backend reads matching rows with: one more than the
    /// page holds, which tells whether any remain.
    pub fn read_limit(&self) -> usize {
        self.limit.max(1).saturating_add(1)
    }

    /// Where the walk's window ends: a backend reads the order values of
    /// the rows at this offset and the next one (0-based, in the walk's
    /// order past `after`), and keeps only matching rows up to the first.
    pub fn window_end_offset(&self) -> usize {
        self.walk.max(1) - 1
    }

    /// A query a backend can run: columns exist, one value per order
    /// column in `after`, positive bounds. Refusals are Constraint (the
    /// caller asked for something the table does not have).
    pub fn check(&self) -> Result<(), crate::StoreError> {
        let column = |name: &str| {
            if self.table.column_names().any(|known| known == name) {
                Ok(())
            } else {
                Err(crate::StoreError::constraint(format!(
                    "{} has no column {name}",
                    self.table.name
                )))
            }
        };
        if self.order.is_empty() {
            return Err(crate::StoreError::constraint(format!(
                "a walk of {} needs an order",
                self.table.name
            )));
        }
        for name in self
            .equal
            .iter()
            .map(|(name, _)| *name)
            .chain(self.order.iter().copied())
            .chain(self.any_of.iter().map(|(name, _)| *name))
        {
            column(name)?;
        }
        if let Some(after) = &self.after {
            if after.len() != self.order.len() {
                return Err(crate::StoreError::constraint(format!(
                    "a position in {} needs {} values, not {}",
                    self.table.name,
                    self.order.len(),
                    after.len()
                )));
            }
        }
        if self.limit == 0 || self.walk == 0 {
            return Err(crate::StoreError::constraint("a page holds at least one row"));
        }
        Ok(())
    }
}

/// One page: matching rows in the walk's order, and where to go on.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub rows: Vec<Row>,
    /// The order values of the last row the walk passed, when rows past it
    /// remain; None when the walk reached the end of the order.
    pub resume: Option<Vec<Cell>>,
}

/// What a backend read for one page: the matching rows (read with
/// [`PageQuery::read_limit`], within the window when the query filters),
/// each with its order values, and for a filtering query the order values
/// of the window's last row and of the row after it (absent when the order
/// ends first).
pub struct Read {
    pub rows: Vec<(Row, Vec<Cell>)>,
    pub window_end: Option<Vec<Cell>>,
    pub past_window_end: bool,
}

/// The page a backend's reads make. Matching rows beyond `limit` only say
/// that more remain: the page resumes after its last row. Otherwise, a
/// filtering walk that stopped at its window's end resumes there when rows
/// remain past it; any other walk reached the end.
pub fn finish(query: &PageQuery, read: Read) -> Page {
    let Read {
        mut rows,
        window_end,
        past_window_end,
    } = read;
    let limit = query.limit.max(1);
    if rows.len() > limit {
        rows.truncate(limit);
        let resume = rows.last().map(|(_, position)| position.clone());
        return Page {
            rows: rows.into_iter().map(|(row, _)| row).collect(),
            resume,
        };
    }
    let resume = if query.filters() && past_window_end {
        window_end
    } else {
        None
    };
    Page {
        rows: rows.into_iter().map(|(row, _)| row).collect(),
        resume,
    }
}

/// The position of `row` in `order`: its values of those columns.
pub fn position_of(row: &Row, order: &[&'static str]) -> Vec<Cell> {
    let table = row.table();
    let cells = row.to_cells();
    order
        .iter()
        .map(|name| {
            table
                .column_names()
                .position(|known| known == *name)
                .and_then(|index| cells.get(index).cloned())
                .unwrap_or(Cell::Null)
        })
        .collect()
}

/// The smallest text above every text that starts with `prefix`, in
/// bytewise (code point) order: the exclusive upper bound of a prefix
/// range `[prefix, successor)`. None when no text is above them all (an
/// empty prefix, or one of only `char::MAX`).
pub fn prefix_successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            // The surrogates are not characters: the next one is U+E000.
            '\u{D7FF}' => Some('\u{E000}'),
            char::MAX => None,
            other => char::from_u32(other as u32 + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_prefix_successor_bounds_exactly_the_texts_with_that_prefix() {
        assert_eq!(prefix_successor("/photos/"), Some("/photos0".to_string()));
        assert_eq!(prefix_successor("a\u{10FFFF}"), Some("b".to_string()));
        assert_eq!(prefix_successor("\u{D7FF}"), Some("\u{E000}".to_string()));
        assert_eq!(prefix_successor(""), None);
        assert_eq!(prefix_successor("\u{10FFFF}\u{10FFFF}"), None);
    }

    proptest! {
        #[test]
        fn a_text_is_in_the_prefix_range_exactly_when_it_starts_with_the_prefix(
            prefix in "[a-c\u{D7FF}\u{E000}\u{10FFFF}/]{0,4}",
            text in "[a-d\u{D7FF}\u{E000}\u{10FFFF}/]{0,6}",
        ) {
            // Rust's string order is bytewise, the order both backends compare in.
            let in_range = text.as_str() >= prefix.as_str()
                && prefix_successor(&prefix).is_none_or(|upper| text < upper);
            prop_assert_eq!(in_range, text.starts_with(&prefix));
        }
    }
}
