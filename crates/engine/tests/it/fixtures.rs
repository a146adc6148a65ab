//! Golden fixtures: every `projections/<name>/fixtures/*.jsonl` event log is
//! appended through the engine into a real SQLite database, and the
//! projection's tables are snapshotted with insta beside the fixture
//! (`projections/<name>/snapshots/`). The same log folded by the pure
//! in-memory reference and by a full replay must give the same rows.

use opledger_domain::envelope::NewEvent;
use opledger_domain::projections::{all_projectors, all_specs, fold_in_memory, Row, TableSpec};
use opledger_domain::StreamId;
use opledger_engine::Engine;
use opledger_store::{ExpectedVersion, Store, StreamAppend};
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One line of a fixture: an event and the stream it goes to.
#[derive(Debug, Deserialize)]
struct FixtureLine {
    stream_id: StreamId,
    #[serde(flatten)]
    event: NewEvent,
}

fn projections_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../projections")
}

fn read_fixture(path: &Path) -> Vec<FixtureLine> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(number, line)| {
            serde_json::from_str(line).unwrap_or_else(|error| panic!("{}:{}: {error}", path.display(), number + 1))
        })
        .collect()
}

/// A table as readable text rows: column name → value, in key order.
fn render_table(table: &TableSpec, rows: &[Row]) -> Vec<BTreeMap<String, serde_json::Value>> {
    rows.iter()
        .map(|row| {
            table
                .columns
                .iter()
                .zip(row.to_cells())
                .map(|(column, cell)| (column.name.to_string(), cell.to_json()))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_fixtures_fold_to_their_snapshots() {
    let mut checked = 0;
    for projector in all_projectors() {
        let spec = projector.spec();
        let dir = projections_dir().join(spec.name);
        let fixtures_dir = dir.join("fixtures");
        let mut fixtures: Vec<PathBuf> = std::fs::read_dir(&fixtures_dir)
            .unwrap_or_else(|error| panic!("{} needs fixtures: {error}", fixtures_dir.display()))
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|extension| extension == "jsonl"))
            .collect();
        fixtures.sort();
        assert!(!fixtures.is_empty(), "projection {} has no fixtures", spec.name);
        for fixture in fixtures {
            let lines = read_fixture(&fixture);
            let folder = tempfile::tempdir().unwrap();
            let store = SqliteStore::open(SqliteConfig::at(folder.path().join("fixture.db")))
                .await
                .unwrap();
            let (engine, _) = Engine::open(store).await.unwrap();
            for line in lines {
                engine
                    .append(vec![StreamAppend {
                        stream_id: line.stream_id,
                        expected: ExpectedVersion::Any,
                        events: vec![line.event],
                    }])
                    .await
                    .unwrap_or_else(|error| panic!("{}: {error}", fixture.display()));
            }

            let mut snapshot = BTreeMap::new();
            let events: Vec<_> = {
                use futures::TryStreamExt;
                engine.store().read_all(0, 100).try_collect().await.unwrap()
            };
            let reference = fold_in_memory(&events).unwrap();
            for table in spec.tables {
                let rows = engine.store().scan_table(table).await.unwrap();
                let mut expected: Vec<Row> = reference
                    .rows()
                    .filter(|row| row.table().name == table.name)
                    .cloned()
                    .collect();
                expected.sort_by_key(|row| row.key());
                assert_eq!(
                    rows,
                    expected,
                    "{}: {} differs from the in-memory fold",
                    fixture.display(),
                    table.name
                );
                snapshot.insert(table.name.to_string(), render_table(table, &rows));
            }
            let report = engine.verify().await.unwrap();
            assert!(report.is_identical(), "{}:\n{}", fixture.display(), report.render());

            let name = format!("{}__{}", spec.name, fixture.file_stem().unwrap().to_string_lossy());
            insta::with_settings!({
                snapshot_path => dir.join("snapshots"),
                prepend_module_to_snapshot => false,
                omit_expression => true,
                description => format!("{} folded from {}", spec.name, fixture.file_name().unwrap().to_string_lossy()),
            }, {
                insta::assert_yaml_snapshot!(name, snapshot);
            });
            checked += 1;
        }
    }
    assert!(checked >= all_specs().len());
}
