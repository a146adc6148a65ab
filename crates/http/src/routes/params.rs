//! Query strings read as the CLI reads its flags: repeatable filters
//! (`status=a&status=b`), single values, page limits and cursors, ids and
//! times, each refusal a 400 naming the parameter and quoting at most a
//! little of what was given. Parameters a route does not know are refused
//! too, so a misspelt filter never silently selects everything.
//!
//! It knows no engine rules beyond the shapes of values: which filters
//! combine is the engine's to say.

use crate::error::{ApiError, ApiResult};
use crate::extract::Params;
use opledger_domain::{quoted, Timestamp};
use opledger_engine::{decode_cursor, Listing, PageRequest, DEFAULT_PAGE_LIMIT};
use std::str::FromStr;
use utoipa::IntoParams;

/// A query string as its pairs, in order.
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// The pairs of `params`, refused when a key is not one of `known`.
    pub fn of(Params(pairs): Params<Vec<(String, String)>>, known: &[&str]) -> ApiResult<Self> {
        if let Some((key, _)) = pairs.iter().find(|(key, _)| !known.contains(&key.as_str())) {
            return Err(ApiError::malformed(format!(
                "unknown query parameter {} (this route takes: {})",
                quoted(key),
                known.join(", ")
            )));
        }
        if pairs.iter().any(|(_, value)| value.contains('\0')) {
            return Err(ApiError::malformed("a query parameter holds a NUL character"));
        }
        Ok(Query { pairs })
    }

    /// Every value given for `key` (a repeatable filter).
    pub fn all(&self, key: &str) -> Vec<String> {
        self.pairs
            .iter()
            .filter(|(held, _)| held == key)
            .map(|(_, value)| value.clone())
            .collect()
    }

    /// The one value of `key`, if given; 400 when given twice.
    pub fn one(&self, key: &str) -> ApiResult<Option<String>> {
        let mut values = self.all(key).into_iter();
        let first = values.next();
        if values.next().is_some() {
            return Err(ApiError::malformed(format!("{key} is given more than once")));
        }
        Ok(first)
    }

    /// The one value of `key` parsed as `T` (`what` says what it must be).
    pub fn parsed<T: FromStr>(&self, key: &str, what: &str) -> ApiResult<Option<T>> {
        self.one(key)?
            .map(|text| {
                text.trim()
                    .parse()
                    .map_err(|_| ApiError::malformed(format!("{key}: {} is not {what}", quoted(&text))))
            })
            .transpose()
    }

    /// Every value of a repeatable `key`, each parsed as `T`, one of `all`.
    pub fn vocabulary<T: FromStr>(&self, key: &str, all: &[&str]) -> ApiResult<Vec<T>> {
        self.all(key)
            .iter()
            .map(|text| {
                text.parse().map_err(|_| {
                    ApiError::malformed(format!("{key}: {} is not one of {}", quoted(text), all.join(", ")))
                })
            })
            .collect()
    }

    /// An RFC 3339 time.
    pub fn time(&self, key: &str) -> ApiResult<Option<Timestamp>> {
        self.one(key)?
            .map(|text| {
                Timestamp::parse(text.trim()).map_err(|_| {
                    ApiError::malformed(format!(
                        "{key}: {} is not an RFC 3339 time (e.g. 2026-12-01T09:30:00Z)",
                        quoted(&text)
                    ))
                })
            })
            .transpose()
    }

    /// The page `limit` and `after` ask for; a cursor that is not one of
    /// `listing`'s is malformed (400), a limit outside 1 to 1000 invalid
    /// (422, the engine's refusal).
    pub fn page(&self, listing: Listing) -> ApiResult<PageRequest> {
        let limit = self
            .parsed::<usize>("limit", "a number of rows")?
            .unwrap_or(DEFAULT_PAGE_LIMIT);
        let after = self.one("after")?;
        if let Some(after) = &after {
            decode_cursor(listing, after).map_err(|error| ApiError::malformed(format!("after: {error}")))?;
        }
        Ok(PageRequest { limit, after })
    }
}

/// The paging parameters every listing takes (documentation only: the
/// handler reads them through [`Query::page`]).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Rows on the page, 1 to 1000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` cursor of the page before.
    pub after: Option<String>,
}

/// Parameters of a listing's paging, as names.
pub const PAGE_KEYS: [&str; 2] = ["limit", "after"];

/// Refuses text a store cannot hold (a NUL character: PostgreSQL's text
/// has none) with 422, before it reaches the engine.
pub fn plain_text(what: &str, text: &str) -> ApiResult<()> {
    if text.contains('\0') {
        return Err(ApiError::invalid(format!("{what} cannot contain a NUL character")));
    }
    Ok(())
}
