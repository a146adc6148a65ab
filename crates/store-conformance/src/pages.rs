//! Paged walks (`Store::page_rows`): every row once and in order, text
//! compared bytewise on every backend, a prefix as a range, filters checked
//! on a bounded walk that resumes where it stopped, bad queries refused.

use crate::fixtures::{media, media_row, upsert, write_rows};
use crate::Harness;
use opledger_domain::ids::MediaId;
use opledger_domain::projections::{Cell, Row, MEDIA_TABLE};
use opledger_store::page::prefix_successor;
use opledger_store::{Direction, ErrorKind, PageQuery, Store};

/// Paths chosen where collations disagree: case, accents, punctuation
/// around the separator, a path that is a prefix of others, one past the
/// prefix range.
const PATHS: [&str; 12] = [
    "/a/b", "/a/B", "/a/c", "/a/é", "/a/e", "/a-b", "/a0", "/a/", "/A/a", "/a/b/c", "/a/ß", "/b",
];

/// Items at [`PATHS`] (the third of them video, the rest image), two at
/// "/a/b", ids ascending in insertion order.
async fn library<S: Store>(store: &S) -> Vec<(String, MediaId, String)> {
    let mut items = Vec::new();
    for (index, path) in PATHS.iter().chain(["/a/b"].iter()).enumerate() {
        let kind = if index % 3 == 0 { "video" } else { "image" };
        items.push((path.to_string(), media(100 + index as u128), kind.to_string()));
    }
    let rows = items
        .iter()
        .map(|(path, id, kind)| {
            let mut row = media_row(*id);
            row.path = path.clone();
            row.media_kind = kind.clone();
            upsert(Row::Media(row))
        })
        .collect();
    write_rows(store, rows).await.unwrap();
    // Bytewise order (Rust's string order), then id.
    items.sort_by(|a, b| (a.0.as_bytes(), a.1).cmp(&(b.0.as_bytes(), b.1)));
    items
}

fn ids(rows: &[Row]) -> Vec<MediaId> {
    rows.iter()
        .map(|row| match row {
            Row::Media(media) => media.media_id,
            other => panic!("not a media row: {other:?}"),
        })
        .collect()
}

/// Every page of `query` from the start, and the pages' sizes.
async fn walk_all<S: Store>(store: &S, mut query: PageQuery) -> (Vec<MediaId>, Vec<usize>) {
    let mut found = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let page = store.page_rows(&query).await.unwrap();
        assert!(page.rows.len() <= query.limit, "a page holds at most its limit");
        sizes.push(page.rows.len());
        found.extend(ids(&page.rows));
        match page.resume {
            Some(position) => query.after = Some(position),
            None => return (found, sizes),
        }
        assert!(sizes.len() < 100, "the walk ends");
    }
}

pub async fn pages_walk_every_row_once_in_bytewise_order_both_ways<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let items = library(&store).await;
    let expected: Vec<MediaId> = items.iter().map(|(_, id, _)| *id).collect();
    for limit in [1, 4, 13, 50] {
        let query = PageQuery::new(&MEDIA_TABLE, &["path", "id"], Direction::Ascending, limit);
        let (found, sizes) = walk_all(&store, query).await;
        assert_eq!(found, expected, "ascending pages of {limit}");
        assert!(
            sizes[..sizes.len() - 1].iter().all(|size| *size == limit),
            "unfiltered pages are full until the last: {sizes:?}"
        );
        let query = PageQuery::new(&MEDIA_TABLE, &["path", "id"], Direction::Descending, limit);
        let (found, _) = walk_all(&store, query).await;
        let mut reversed = expected.clone();
        reversed.reverse();
        assert_eq!(found, reversed, "descending pages of {limit}");
    }
    // The last page of an exact multiple says there is no more.
    let query = PageQuery::new(&MEDIA_TABLE, &["path", "id"], Direction::Ascending, expected.len());
    let page = store.page_rows(&query).await.unwrap();
    assert_eq!(page.rows.len(), expected.len());
    assert_eq!(page.resume, None, "nothing remains after the last row");
}

pub async fn a_prefix_range_holds_exactly_the_paths_with_that_prefix<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let items = library(&store).await;
    for prefix in ["/a/", "/a", "/a/b", "/A", "/a/é", "/z"] {
        let mut query = PageQuery::new(&MEDIA_TABLE, &["path", "id"], Direction::Ascending, 3);
        query.from = Some(Cell::Text(prefix.to_string()));
        query.to = prefix_successor(prefix).map(Cell::Text);
        let (found, _) = walk_all(&store, query).await;
        let expected: Vec<MediaId> = items
            .iter()
            .filter(|(path, _, _)| path.starts_with(prefix))
            .map(|(_, id, _)| *id)
            .collect();
        assert_eq!(found, expected, "prefix {prefix:?}");
    }
}

pub async fn equalities_select_and_filters_are_checked_on_a_bounded_walk<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let items = library(&store).await;
    let videos: Vec<MediaId> = items
        .iter()
        .filter(|(_, _, kind)| kind == "video")
        .map(|(_, id, _)| *id)
        .collect();
    // An equality on the index's leading column.
    let mut query = PageQuery::new(&MEDIA_TABLE, &["path", "id"], Direction::Ascending, 2);
    query.equal.push(("media_kind", Cell::Text("video".into())));
    let (found, _) = walk_all(&store, query).await;
    assert_eq!(found, videos);
    // The same as a filter, on a walk of at most 3 rows a page: pages may
    // be short, even empty, but every row is passed exactly once.
    let mut query = PageQuery::new(&MEDIA_TABLE, &["path", "id"], Direction::Ascending, 2);
    query.any_of.push(("media_kind", vec![Cell::Text("video".into())]));
    query.walk = 3;
    let (found, sizes) = walk_all(&store, query.clone()).await;
    assert_eq!(found, videos, "filtered pages: {sizes:?}");
    assert!(
        sizes.len() >= items.len().div_ceil(3),
        "a page passes at most 3 rows: {} rows in {} pages",
        items.len(),
        sizes.len()
    );
    // A filter that matches nothing still walks to the end, page by page.
    query.any_of = vec![("media_kind", vec![Cell::Text("audio".into())])];
    let first = store.page_rows(&query).await.unwrap();
    assert!(first.rows.is_empty());
    assert!(first.resume.is_some(), "an empty page whose walk stopped says where");
    let (found, sizes) = walk_all(&store, query.clone()).await;
    assert!(found.is_empty());
    assert_eq!(sizes.len(), items.len().div_ceil(3));
    // An empty set of values matches nothing; several match any.
    query.any_of = vec![("media_kind", Vec::new())];
    assert!(walk_all(&store, query.clone()).await.0.is_empty());
    query.any_of = vec![(
        "media_kind",
        vec![Cell::Text("video".into()), Cell::Text("image".into())],
    )];
    let all: Vec<MediaId> = items.iter().map(|(_, id, _)| *id).collect();
    assert_eq!(walk_all(&store, query).await.0, all);
}

pub async fn a_walk_query_the_table_cannot_answer_is_refused<H: Harness>(harness: &H) {
    let store = harness.open().await;
    library(&store).await;
    let base = PageQuery::new(&MEDIA_TABLE, &["path", "id"], Direction::Ascending, 5);
    let mut unknown = base.clone();
    unknown.order = vec!["no_such_column", "id"];
    let mut filter = base.clone();
    filter.any_of.push(("no_such_column", vec![Cell::Null]));
    let mut arity = base.clone();
    arity.after = Some(vec![Cell::Text("/a".into())]);
    let mut empty = base.clone();
    empty.limit = 0;
    for query in [unknown, filter, arity, empty] {
        let refused = store.page_rows(&query).await.unwrap_err();
        assert_eq!(refused.kind, ErrorKind::Constraint, "{query:?}: {refused}");
    }
}
