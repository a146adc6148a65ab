//! `opledger bench http` runs end to end at a tiny size: the lifecycle
//! over the real service's HTTP API and in process, one run per worker
//! count, with per-call latencies, and leaves nothing behind. Figures are
//! not asserted (people read them: docs/benchmarks.md); their presence is.

use crate::common;

use std::process::Command;

#[test]
fn a_tiny_http_bench_reports_tasks_per_second_latencies_and_the_in_process_ratio_per_worker_count() {
    let dir = tempfile::tempdir().unwrap();
    let output = common::run(Command::new(common::BIN).current_dir(dir.path()).args([
        "bench",
        "http",
        "--workers",
        "1,3",
        "--tasks",
        "40",
        "--claim-batch",
        "4",
        "--json",
    ]));
    common::assert_exit(&output, 0);
    let report = common::json(&output);
    assert_eq!(report["workload"], "http");
    assert_eq!(report["backend"], "sqlite");
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{report}");
    for (run, workers) in runs.iter().zip([1, 3]) {
        assert_eq!(run["workers"], workers, "{run}");
        assert_eq!(run["tasks"], 40, "{run}");
        assert_eq!(run["claim_batch"], 4, "{run}");
        assert!(run["http_tasks_per_sec"].as_f64().unwrap() > 0.0, "{run}");
        assert!(run["in_process_tasks_per_sec"].as_f64().unwrap() > 0.0, "{run}");
        assert!(run["ratio_to_in_process"].as_f64().unwrap() > 0.0, "{run}");
        for call in ["request", "claim", "report"] {
            let latency = &run["latency"][call];
            assert!(latency["calls"].as_u64().unwrap() > 0, "{call}: {run}");
            assert!(
                latency["p99_ms"].as_f64().unwrap() >= latency["p50_ms"].as_f64().unwrap(),
                "{run}"
            );
        }
        // 40 tasks in batches of 4 need at least 10 claims and 10 reports.
        assert!(run["latency"]["claim"]["calls"].as_u64().unwrap() >= 10, "{run}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "the benchmark's databases are removed: {left:?}");
}
