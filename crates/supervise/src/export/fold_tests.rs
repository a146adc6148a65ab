//! An export's fold is the projection. Folding the whole log with one
//! event per chunk and no rows cached (so every row is written back and
//! read again between events), and with the export's own limits, gives
//! table by table exactly the rows the live projection holds — on every
//! backend, over the golden logs' scenario: every event type this build
//! writes, a removed media item's cascade and a redeclared kind among them.

#[path = "../../../engine/tests/it/golden_logs/scenario.rs"]
#[allow(dead_code)]
mod scenario;

use crate::export::fold::{fold_until, FoldLimits};
use opledger_domain::projections::{all_specs, Row};
use opledger_store::Store;
use opledger_testkit::Harness;

async fn an_exports_fold_writing_every_row_back_between_events_equals_every_live_projection<H: Harness>(harness: &H) {
    let engine = scenario::run(harness).await;
    let store = engine.store();
    let head = store.head().await.unwrap();
    let mut compared = 0;
    for spec in all_specs() {
        for limits in [
            FoldLimits {
                chunk: 1,
                cache_rows: 0,
            },
            FoldLimits::default(),
        ] {
            let mut checkpoints = 0;
            let folded = fold_until(store, head, spec.name, limits, |_| {
                checkpoints += 1;
                Ok(())
            })
            .await
            .unwrap();
            assert!(checkpoints > 0, "{}: no checkpoint", spec.name);
            for table in spec.tables {
                let mut live = store.scan_table(table).await.unwrap();
                live.sort_by_key(Row::key);
                let ours: Vec<Row> = folded.rows(table).collect::<Result<_, _>>().unwrap();
                assert_eq!(ours, live, "{} with {limits:?}", table.name);
                assert_eq!(folded.count(table), live.len(), "{}", table.name);
                compared += live.len();
            }
        }
    }
    assert!(
        compared > 50,
        "the scenario's projections hold rows to compare ({compared})"
    );
}

async fn an_exports_fold_stops_at_its_checkpoints_word<H: Harness>(harness: &H) {
    let engine = scenario::run(harness).await;
    let store = engine.store();
    let head = store.head().await.unwrap();
    let limits = FoldLimits {
        chunk: 1,
        cache_rows: 0,
    };
    let mut seen = Vec::new();
    let stopped = fold_until(store, head, "media_operations", limits, |seq| {
        seen.push(seq);
        if seen.len() == 3 {
            Err(())
        } else {
            Ok(())
        }
    })
    .await;
    assert!(matches!(stopped, Err(crate::export::fold::FoldStop::Stopped)));
    assert_eq!(seen, [1, 2, 3]);
}

opledger_testkit::backend_tests!(
    an_exports_fold_writing_every_row_back_between_events_equals_every_live_projection,
    an_exports_fold_stops_at_its_checkpoints_word
);
