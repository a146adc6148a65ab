//! The total-queue check under faults, on SQLite and on PostgreSQL: one
//! requester process requests tasks while worker processes claim and
//! complete them, each recording every invoke and answer of request,
//! claim and complete in a history file of its own
//! (`tests/it/history_support`). Meanwhile the test SIGKILLs workers at random
//! (starting a fresh one in each's place) and pauses others (SIGSTOP) for
//! longer than their lease, so their claims expire, are recovered and are
//! taken by another worker before the paused one wakes and tries to
//! complete them. After a final drain the checker reads every history and
//! the log: nothing lost, nothing duplicated, nothing unexpected, and every
//! task a killed worker held ends succeeded through another worker (or
//! through its own completion, when that had landed before the kill).
//!
//! Size: 8 workers and 1,000 tasks per backend, so CI's share stays well
//! under five minutes; `OPLEDGER_SOAK=1` runs 32 workers and 10,000 tasks.
//! The run prints its counts (one JSON line per backend on stderr).
//!
//! **The child processes** are this test binary run again
//! (`tests/it/history_support/processes.rs`), selecting [`history_child`],
//! which returns at once in a normal run. A child opens its own store on
//! the URL it is given and uses the engine directly, so that every call is
//! one recorded operation of the history.

use crate::history_support;

use history_support::processes::{
    count, declare, drain, open_engine, replay_verify, seed, signal, spawn_child, whole_log, with_engine, Dice,
    EngineAt, Spawned, LEASE_MS,
};
use history_support::{check, read_histories};
use opledger_domain::OperationStatus;
use opledger_engine::{OpsFilter, PageRequest};
use opledger_testkit::Backend;
use serde_json::json;
use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

const CHILD_TEST: &str = "history_checker::history_child";
/// Longer than the lease.
const PAUSE: Duration = Duration::from_millis(4_500);

struct Size {
    workers: usize,
    tasks: usize,
    deadline: Duration,
}

fn size() -> Size {
    if std::env::var("OPLEDGER_SOAK").as_deref() == Ok("1") {
        Size {
            workers: 32,
            tasks: 10_000,
            deadline: Duration::from_secs(40 * 60),
        }
    } else {
        Size {
            workers: 8,
            tasks: 1_000,
            deadline: Duration::from_secs(150),
        }
    }
}

/// Not a test on its own: the body of the processes the tests below start.
/// Without `OPLEDGER_HISTORY_CHILD` it returns at once.
#[test]
fn history_child() {
    history_support::processes::child_main();
}

fn spawn(role: &str, url: &str, dir: &std::path::Path) -> Spawned {
    spawn_child(CHILD_TEST, role, url, dir, &[])
}

async fn run_history(backend: &str, url: &str) {
    let size = size();
    let folder = tempfile::tempdir().expect("a history folder");
    let dir = folder.path();
    let engine = open_engine(url).await;
    declare(&engine).await;

    let mut dice = Dice::new(seed());
    let mut requester = spawn(&format!("requester:{}", size.tasks), url, dir);
    let mut workers: Vec<Spawned> = (0..size.workers)
        .map(|index| spawn(&format!("worker:w{index}"), url, dir))
        .collect();
    let mut next_name = size.workers;
    let mut killed: BTreeSet<String> = BTreeSet::new();
    let (mut kills, mut pauses) = (0usize, 0usize);
    let started = Instant::now();
    let mut requested = false;

    loop {
        tokio::time::sleep(Duration::from_millis(200 + dice.below(200))).await;
        requested |= requester.lines.try_iter().any(|line| line == "requested");
        if let Ok(Some(status)) = requester.child.try_wait() {
            assert!(
                requested,
                "{backend}: the requester ended with {status} before it was done"
            );
        }
        let now = Instant::now();
        for worker in &mut workers {
            if worker.paused_until.is_some_and(|until| until <= now) {
                signal(&worker.child, "-CONT");
                worker.paused_until = None;
            }
        }
        if requested && count(&engine, "succeeded").await == size.tasks as i64 {
            break;
        }
        if started.elapsed() >= size.deadline {
            let report = with_engine!(&engine, engine => engine.status().await.expect("status"));
            panic!(
                "{backend}: the run did not finish within {:?} (requested: {requested}); operations by status: {:?}; \
                 workers' errors are in {}",
                size.deadline,
                report.operations_by_status,
                dir.display()
            );
        }
        // One fault a round: kill a worker (a fresh one takes its place),
        // or pause one for longer than its lease; the victim is one that
        // holds a claim now. *Why:* workers wait on the requester for much
        // of a run, and faults dealt to idle workers once hit nothing.
        let holders = holders(&engine).await;
        let candidates: Vec<usize> = (0..workers.len())
            .filter(|&index| workers[index].paused_until.is_none() && holders.contains(&workers[index].name))
            .collect();
        if candidates.is_empty() {
            continue;
        }
        let victim = candidates[dice.below(candidates.len() as u64) as usize];
        // The first fault is a pause and the second a kill, so that a run
        // short enough for a handful of faults still has both; then three
        // kills in five.
        let kill = match (pauses, kills) {
            (0, _) => false,
            (_, 0) => true,
            _ => dice.below(5) < 3,
        };
        if kill {
            let mut dead = workers.swap_remove(victim);
            dead.child.kill().expect("SIGKILL a worker");
            let _ = dead.child.wait();
            killed.insert(dead.name.clone());
            kills += 1;
            workers.push(spawn(&format!("worker:w{next_name}"), url, dir));
            next_name += 1;
        } else {
            signal(&workers[victim].child, "-STOP");
            workers[victim].paused_until = Some(Instant::now() + PAUSE);
            pauses += 1;
        }
    }
    let _ = requester.child.wait();
    // Everything is done: stop every worker the hard way, so their last
    // claims (if any) are a killed worker's, then drain what is left.
    for worker in &mut workers {
        if worker.paused_until.is_some() {
            signal(&worker.child, "-CONT");
        }
        worker.child.kill().expect("SIGKILL a worker");
        let _ = worker.child.wait();
        killed.insert(worker.name.clone());
    }
    tokio::time::sleep(Duration::from_millis(LEASE_MS as u64 + 500)).await;
    drain(&engine, dir).await;

    let log = whole_log(&engine).await;
    let interruptions = log
        .iter()
        .filter(|envelope| matches!(envelope.event, opledger_domain::events::Event::OperationInterrupted(_)))
        .count();
    let verdict = check(&read_histories(dir), &log, &killed);
    let mut summary = verdict.summary();
    summary["backend"] = json!(backend);
    summary["workers"] = json!(size.workers);
    summary["kills"] = json!(kills);
    summary["pauses"] = json!(pauses);
    summary["interruptions"] = json!(interruptions);
    summary["seconds"] = json!(started.elapsed().as_secs());
    // Straight to stderr: libtest captures eprintln! of passing tests.
    let _ = writeln!(std::io::stderr(), "history check: {summary}");

    assert!(verdict.is_clean(), "{backend}: the history check failed: {verdict:#?}");
    assert_eq!(
        verdict.requested, size.tasks,
        "{backend}: every request was acknowledged"
    );
    assert_eq!(verdict.succeeded_in_log, size.tasks, "{backend}: one success per task");
    assert!(kills > 0 && pauses > 0, "{backend}: the run injected no faults");
    assert!(
        interruptions > 0,
        "{backend}: no claim was ever interrupted: the faults hit nothing"
    );
    replay_verify(url, backend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_paused_workers_lose_duplicate_and_invent_no_task_on_sqlite() {
    let backend = opledger_testkit::sqlite::backend().await;
    run_history("sqlite", &backend.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_paused_workers_lose_duplicate_and_invent_no_task_on_postgres() {
    let Some(backend) = opledger_testkit::postgres::backend().await else {
        return;
    };
    // A worker paused inside a write transaction holds the append lock;
    // the server ends its session after a second (the default is 10 s, so
    // that a loaded host's slow client is not cut off), and the others go on.
    let base = backend.url();
    let joint = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{joint}options=-c%20idle_in_transaction_session_timeout%3D1000");
    run_history("postgres", &url).await;
}

/// The workers that hold a claim now (their leased or running tasks).
async fn holders(engine: &EngineAt) -> BTreeSet<String> {
    let filter = OpsFilter {
        statuses: vec![OperationStatus::Leased, OperationStatus::Running],
        ..OpsFilter::default()
    };
    let page = with_engine!(engine, engine => engine.list_operations(&filter, &PageRequest::default()).await);
    page.map(|page| page.items.into_iter().filter_map(|item| item.worker).collect())
        .unwrap_or_default()
}
