//! The query layer's latencies, measured by `bench status` in the same
//! generated log: a page of `ops list` (the first, one filtered by status,
//! one by kind, one deep in the listing through its cursor), the first page
//! of `media list`, and `media show --path` of items spread over the
//! registry. Floor: the first page of operations as one plain `SELECT …
//! ORDER BY created_at DESC, id DESC LIMIT 51` on a raw connection, its
//! rows fetched but not decoded into typed rows.

use crate::error::BenchError;
use crate::stats::{millis, quantile, round3};
use opledger_domain::OperationStatus;
use opledger_engine::{Engine, MediaFilter, MediaRef, OpsFilter, PageRequest, DEFAULT_PAGE_LIMIT};
use opledger_store_sqlite::SqliteStore;
use serde_json::{json, Map, Value};
use std::cell::Cell;
use std::future::Future;
use std::time::{Duration, Instant};

/// p50 and p99 (ms) of `samples` calls of `query`, the call's index given.
async fn latency<F, Fut>(samples: usize, mut query: F) -> Result<Value, BenchError>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<(), BenchError>>,
{
    let mut timings: Vec<Duration> = Vec::with_capacity(samples);
    for index in 0..samples {
        let started = Instant::now();
        query(index).await?;
        timings.push(started.elapsed());
    }
    timings.sort_unstable();
    Ok(json!({
        "p50_ms": round3(millis(quantile(&timings, 0.5))),
        "p99_ms": round3(millis(quantile(&timings, 0.99))),
    }))
}

/// Picks sample `index` of `values` spread over them (xorshift from the index).
fn spread<T>(values: &[T], index: usize) -> &T {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ (index as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    &values[(state % values.len() as u64) as usize]
}

/// The listing figures of the log `engine` holds, as a JSON object.
pub async fn listings(engine: &Engine<SqliteStore>, samples: usize) -> Result<Value, BenchError> {
    let page = PageRequest::first(DEFAULT_PAGE_LIMIT);
    // Cursors deep in the listing (past 80% of its pages) and paths across
    // the registry, collected by paging through both once.
    let every = OpsFilter::default();
    let mut cursors = Vec::new();
    let mut walked = 0usize;
    let mut request = PageRequest::first(DEFAULT_PAGE_LIMIT);
    while let Some(next) = engine.list_operations(&every, &request).await?.next {
        walked += 1;
        cursors.push(next.clone());
        request.after = Some(next);
    }
    // A log of one page has no cursor: its deep page is the first.
    let mut deep: Vec<Option<String>> = cursors.split_off(cursors.len() * 4 / 5).into_iter().map(Some).collect();
    if deep.is_empty() {
        deep.push(None);
    }
    let mut paths = Vec::new();
    let mut request = PageRequest::first(1_000);
    loop {
        let media = engine.list_media(&MediaFilter::default(), &request).await?;
        paths.extend(media.items.iter().step_by(97).map(|item| item.path.clone()));
        match media.next {
            Some(next) => request.after = Some(next),
            None => break,
        }
    }
    if paths.is_empty() {
        return Err(BenchError::Invalid(
            "the built log is too small for the listing figures".into(),
        ));
    }

    let mut figures = Map::new();
    figures.insert(
        "ops_first_page".into(),
        latency(samples, |_| async {
            engine.list_operations(&every, &page).await?;
            Ok(())
        })
        .await?,
    );
    let failed = OpsFilter {
        statuses: vec![OperationStatus::FailedTerminal],
        ..OpsFilter::default()
    };
    let failed_rows = Cell::new(0usize);
    let filtered = latency(samples, |_| async {
        let listed = engine.list_operations(&failed, &page).await?.items.len();
        failed_rows.set(failed_rows.get() + listed);
        Ok(())
    })
    .await?;
    figures.insert("ops_status_failed_terminal_page".into(), filtered);
    let thumbnails = OpsFilter {
        kinds: vec!["thumbnail".into()],
        ..OpsFilter::default()
    };
    figures.insert(
        "ops_kind_page".into(),
        latency(samples, |_| async {
            engine.list_operations(&thumbnails, &page).await?;
            Ok(())
        })
        .await?,
    );
    figures.insert(
        "ops_deep_page".into(),
        latency(samples, |index| {
            let request = PageRequest {
                limit: DEFAULT_PAGE_LIMIT,
                after: spread(&deep, index).clone(),
            };
            let every = &every;
            async move {
                engine.list_operations(every, &request).await?;
                Ok(())
            }
        })
        .await?,
    );
    figures.insert(
        "media_list_first_page".into(),
        latency(samples, |_| async {
            engine.list_media(&MediaFilter::default(), &page).await?;
            Ok(())
        })
        .await?,
    );
    figures.insert(
        "media_show_by_path".into(),
        latency(samples, |index| {
            let media = MediaRef::Path(spread(&paths, index).clone());
            async move {
                engine.media_detail(&media).await?;
                Ok(())
            }
        })
        .await?,
    );
    let mut connection = engine.store().raw_connection().await?;
    let mut floor: Vec<Duration> = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        crate::floor::sqlite::first_operations_page(&mut connection, DEFAULT_PAGE_LIMIT + 1).await?;
        floor.push(started.elapsed());
    }
    floor.sort_unstable();
    figures.insert(
        "ops_first_page_floor".into(),
        json!({
            "p50_ms": round3(millis(quantile(&floor, 0.5))),
            "p99_ms": round3(millis(quantile(&floor, 0.99))),
        }),
    );
    figures.insert(
        "failed_terminal_rows_per_page".into(),
        json!(round3(failed_rows.get() as f64 / samples as f64)),
    );
    figures.insert("pages_of_operations".into(), json!(walked + 1));
    figures.insert("page_limit".into(), json!(DEFAULT_PAGE_LIMIT));
    figures.insert(
        "floor".into(),
        json!("ops_first_page_floor: one plain SELECT of the first page's columns ORDER BY created_at DESC, id DESC LIMIT 51, rows fetched, not decoded"),
    );
    Ok(Value::Object(figures))
}
