//! The export child: what `opledger __run-supervised export` runs. It knows
//! its arguments (the job, its spec, the temporary file to write), writes
//! one JSON [`ChildReport`] a line on its standard output, and stops on
//! its own at its next checkpoint (about every 250 ms) after a SIGTERM. It
//! knows nothing of slots, limits, leases or the supervisor.
//!
//! Test knobs (environment variables read only here, so tests can make a
//! long or stubborn child in seconds): `OPLEDGER_EXPORT_TEST_ROW_DELAY_MS`
//! sleeps after every record written; `OPLEDGER_EXPORT_TEST_BLOCK_MS`
//! blocks before the fold without any checkpoint, as a long query would;
//! `OPLEDGER_EXPORT_TEST_IGNORE_TERM` makes the child ignore SIGTERM;
//! `OPLEDGER_EXPORT_TEST_RUN_LOG` names a file the child appends `start`
//! and `end` lines to (its pid and the time), so a test counts runs and
//! overlapping children from the children themselves. A release build
//! reads none of them ([`test_var`]): no environment can slow, block or
//! harden a production child.

use super::fold::{fold_until, FoldLimits, FoldStop};
use super::records::{Records, RecordsError};
use super::write::{write_records, WriteStop};
use super::{ChildReport, ExportSpec};
use crate::SuperviseError;
use opledger_engine::{Clock, EngineError, SystemClock};
use opledger_store::Store;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the child reports progress and looks for a stop.
pub const CHECKPOINT: Duration = Duration::from_millis(250);

/// What the child was asked to do.
#[derive(Debug, Clone)]
pub struct ChildArgs {
    pub spec: ExportSpec,
    /// The temporary file to write (created; must not exist).
    pub out: PathBuf,
}

/// How the child ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEnd {
    Done,
    /// Stopped after SIGTERM; its temporary file is removed.
    Stopped,
}

/// A test knob's value; always None in a release build.
fn test_var(name: &str) -> Option<std::ffi::OsString> {
    if cfg!(debug_assertions) {
        std::env::var_os(name)
    } else {
        None
    }
}

fn knob(name: &str) -> Option<u64> {
    test_var(name)?.to_str()?.parse().ok()
}

fn run_log(event: &str) {
    if let Some(path) = test_var("OPLEDGER_EXPORT_TEST_RUN_LOG") {
        let line = format!("{event} {} {}\n", std::process::id(), SystemClock.now().as_micros());
        if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = file.write_all(line.as_bytes());
        }
    }
}

fn report(out: &mut dyn Write, report: &ChildReport) -> Result<(), SuperviseError> {
    let mut line = serde_json::to_vec(report).expect("a report serializes");
    line.push(b'\n');
    out.write_all(&line)
        .and_then(|()| out.flush())
        .map_err(SuperviseError::io("reporting to the supervisor"))
}

/// Runs an export into `args.out`. Must run on a multi-threaded runtime:
/// the SIGTERM listener sets the stop flag while the export computes.
pub async fn run_child<S: Store>(
    store: &S,
    args: &ChildArgs,
    reports: &mut dyn Write,
) -> Result<ChildEnd, SuperviseError> {
    run_log("start");
    let ended = run(store, args, reports).await;
    if !matches!(ended, Ok(ChildEnd::Done)) {
        let _ = std::fs::remove_file(&args.out);
    }
    run_log("end");
    ended
}

async fn run<S: Store>(store: &S, args: &ChildArgs, reports: &mut dyn Write) -> Result<ChildEnd, SuperviseError> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(SuperviseError::io("listening for SIGTERM"))?;
    // Registered either way: a registered SIGTERM no longer kills the
    // process, so the knob's child ignores it until SIGKILL.
    if test_var("OPLEDGER_EXPORT_TEST_IGNORE_TERM").is_none() {
        let stop = stop.clone();
        tokio::spawn(async move {
            if terminate.recv().await.is_some() {
                stop.store(true, Ordering::SeqCst);
            }
        });
    } else {
        std::mem::forget(terminate);
    }
    let stopped = || stop.load(Ordering::SeqCst);
    report(
        reports,
        &ChildReport::Progress {
            phase: "aggregating".to_string(),
            processed: 0,
            total: None,
            regular_rows: None,
        },
    )?;
    if let Some(block) = knob("OPLEDGER_EXPORT_TEST_BLOCK_MS") {
        std::thread::sleep(Duration::from_millis(block));
    }
    let mut last = Instant::now();
    let limits = FoldLimits::default();
    let folded = fold_until(store, args.spec.as_of_seq, args.spec.what.projection(), limits, |_| {
        if last.elapsed() >= CHECKPOINT {
            last = Instant::now();
            if stopped() {
                return Err(());
            }
        }
        Ok(())
    })
    .await;
    let rows = match folded {
        Ok(rows) => rows,
        Err(FoldStop::Stopped) => return Ok(ChildEnd::Stopped),
        Err(FoldStop::Failed(error)) => return Err(error.into()),
    };
    if stopped() {
        return Ok(ChildEnd::Stopped);
    }
    let records = Records::of(args.spec.what, args.spec.batch, rows).map_err(|error| match error {
        RecordsError::Missing(why) => SuperviseError::Gone(why),
        RecordsError::Store(error) => SuperviseError::Engine(EngineError::Store(error)),
    })?;
    let total = records.total();
    let regular_rows = records.regular_rows();
    report(
        reports,
        &ChildReport::Progress {
            phase: "writing".to_string(),
            processed: 0,
            total: Some(total),
            regular_rows: Some(regular_rows),
        },
    )?;
    let file = create_new(&args.out)?;
    let delay = knob("OPLEDGER_EXPORT_TEST_ROW_DELAY_MS").map(Duration::from_millis);
    let mut last = Instant::now();
    let mut failed_report = None;
    let written = write_records(&args.spec, &records, file, |processed| {
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        if last.elapsed() >= CHECKPOINT {
            last = Instant::now();
            if stopped() {
                return Err(());
            }
            let progress = ChildReport::Progress {
                phase: "writing".to_string(),
                processed,
                total: Some(total),
                regular_rows: Some(regular_rows),
            };
            if let Err(error) = report(reports, &progress) {
                failed_report = Some(error);
                return Err(());
            }
        }
        Ok(())
    });
    if let Some(error) = failed_report {
        return Err(error);
    }
    let written = match written {
        Ok(written) => written,
        Err(WriteStop::Stopped) => return Ok(ChildEnd::Stopped),
        Err(WriteStop::Store(error)) => return Err(EngineError::Store(error).into()),
        Err(WriteStop::Io(source)) => {
            return Err(SuperviseError::Io {
                context: format!("writing {}", args.out.display()),
                source,
            })
        }
    };
    // The last record's counts, then the file itself.
    report(
        reports,
        &ChildReport::Progress {
            phase: "writing".to_string(),
            processed: written.processed,
            total: Some(total),
            regular_rows: Some(regular_rows),
        },
    )?;
    report(
        reports,
        &ChildReport::Done {
            size: written.size,
            sha256: written.sha256,
            processed: written.processed,
            total,
            regular_rows,
        },
    )?;
    Ok(ChildEnd::Done)
}

fn create_new(path: &Path) -> Result<std::fs::File, SuperviseError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(SuperviseError::io(format!("creating {}", path.display())))
}
