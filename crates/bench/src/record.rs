//! Raw results: a recorded run's report appended as one JSON line to
//! `<dir>/<workload>.jsonl` (`opledger bench … --record`, by default into
//! `benches/results/`), with when and where it was measured (commit, cores,
//! load) and the command that measures it again. Recording is asked for,
//! never implied: smoke runs and tests with small sizes would otherwise
//! fill the history with figures nobody meant to keep.

use crate::{BenchError, Options, Workload};
use opledger_store_postgres::PostgresConfig;
use opledger_store_sqlite::{SqliteConfig, Synchronous};
use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::process::Command;

/// Appends `report` to `<dir>/<workload>.jsonl`, creating both if needed.
pub fn append(dir: &Path, database_url: &str, options: &Options, report: &Value) -> Result<(), BenchError> {
    let path = dir.join(format!("{}.jsonl", options.workload.name()));
    let (commit, dirty) = match commit() {
        Some((commit, dirty)) => (Value::from(commit), Value::from(dirty)),
        None => (Value::Null, Value::Null),
    };
    let line = json!({
        "recorded_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "commit": commit,
        "dirty": dirty,
        "cores": std::thread::available_parallelism().map_or(1, usize::from),
        "load_average": load_average(),
        "command": command_line(database_url, options),
        "report": report,
    });
    std::fs::create_dir_all(dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(BenchError::io(format!("opening {}", path.display())))?;
    writeln!(file, "{line}").map_err(BenchError::io(format!("writing {}", path.display())))
}

/// The 1-, 5- and 15-minute load averages when the run ended (Linux), since
/// figures on a shared machine move with what else it runs.
fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(str::parse::<f64>);
    Some([fields.next()?.ok()?, fields.next()?.ok()?, fields.next()?.ok()?])
}

/// The checked-out commit and whether tracked files differ from it, when
/// `git` answers in the current directory (one process each; nothing when
/// it is not a repository or git is missing).
fn commit() -> Option<(String, bool)> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|status| !status.is_empty());
    Some((commit, dirty))
}

/// The `opledger bench` command that runs the same measurement: the
/// workload's own flags, and the backend's setting that the figures
/// depend on (a PostgreSQL server without its user or password; SQLite's
/// `synchronous` when it is not the default).
pub fn command_line(database_url: &str, options: &Options) -> String {
    let mut words = vec!["opledger".to_string()];
    if let Ok(server) = PostgresConfig::server_from_url(database_url) {
        words.push(format!("--database-url postgres://{}", server.describe()));
    } else if SqliteConfig::from_url(database_url).is_ok_and(|config| config.synchronous == Synchronous::Normal) {
        words.push("--database-url bench.db?synchronous=normal".to_string());
    }
    words.push(format!("bench {}", options.workload.name()));
    let workers = options
        .workers
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let flags = match options.workload {
        Workload::Append => format!(
            "--events {} --batch {} --unbatched-events {} --rounds {}",
            options.events, options.batch, options.unbatched_events, options.rounds
        ),
        Workload::Replay | Workload::Export => format!("--events {}", options.events),
        Workload::Lifecycle | Workload::Http => format!(
            "--tasks {} --workers {workers} --claim-batch {}",
            options.tasks, options.claim_batch
        ),
        Workload::Ingest => match options.photos {
            Some(photos) => format!(
                "--photos {photos} --megapixels {} --rounds {}",
                options.megapixels, options.rounds
            ),
            None => format!(
                "--files {} --workers {workers} --rounds {}",
                options.files, options.rounds
            ),
        },
        Workload::Status | Workload::Timeline => format!("--events {} --samples {}", options.events, options.samples),
    };
    words.push(flags);
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(workload: Workload) -> Options {
        Options {
            workload,
            events: 100_000,
            batch: 100,
            unbatched_events: 2_000,
            rounds: 3,
            tasks: 10_000,
            workers: vec![1, 4, 16],
            claim_batch: 32,
            dir: None,
            files: 1_000,
            photos: None,
            megapixels: 12.0,
            samples: 1_000,
            record: None,
        }
    }

    #[test]
    fn the_recorded_command_names_the_workloads_flags_and_never_a_password() {
        assert_eq!(
            command_line("opledger.db", &options(Workload::Lifecycle)),
            "opledger bench lifecycle --tasks 10000 --workers 1,4,16 --claim-batch 32"
        );
        assert_eq!(
            command_line("sqlite:x.db?synchronous=normal", &options(Workload::Replay)),
            "opledger --database-url bench.db?synchronous=normal bench replay --events 100000"
        );
        let on_postgres = command_line("postgres://root:secret@127.0.0.1:5432/test", &options(Workload::Append));
        assert_eq!(
            on_postgres,
            "opledger --database-url postgres://127.0.0.1:5432/test bench append --events 100000 --batch 100 \
             --unbatched-events 2000 --rounds 3"
        );
    }

    #[test]
    fn each_recorded_run_is_one_more_line_of_its_workloads_file() {
        let dir = tempfile::tempdir().unwrap();
        let results = dir.path().join("results");
        let options = options(Workload::Status);
        for p99 in [1.5, 2.5] {
            append(
                &results,
                "opledger.db",
                &options,
                &json!({"workload": "status", "p99_ms": p99}),
            )
            .unwrap();
        }
        let text = std::fs::read_to_string(results.join("status.jsonl")).unwrap();
        let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[1]["report"]["p99_ms"], json!(2.5));
        assert_eq!(lines[0]["command"], json!(command_line("opledger.db", &options)));
        assert!(lines[0]["cores"].as_u64().is_some_and(|cores| cores >= 1), "{text}");
        let recorded_at = lines[0]["recorded_at"].as_str().unwrap();
        assert!(
            chrono::DateTime::parse_from_rfc3339(recorded_at).is_ok(),
            "{recorded_at}"
        );
    }
}
