//! A fixed number of threads for the CPU-bound part of tasks.
//!
//! Tasks hand closures to [`ComputeThreads`]; its threads take them in the
//! order they came and run them one after another, so at most `threads`
//! closures run at once however many tasks a pool holds claims for.
//!
//! *Why not a permit per task and tokio's blocking pool:* a task that takes
//! a permit, sends its work to the blocking pool and waits for the answer
//! leaves the CPU idle for two wake-ups per trip (the pool thread's, then
//! the task's), and once more when the next task takes the permit. Here a
//! thread that finishes one closure starts the next one queued without
//! waiting for anybody, while the tasks whose closures are done report
//! their outcomes beside it.

use crate::flight::{current_claim, FlightRecord};
use crate::pool::panic_message;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// A queued closure, and the claim it runs for (when a job's task queued it).
struct Work {
    claim: Option<String>,
    run: Box<dyn FnOnce() + Send + 'static>,
}

/// Why a closure handed to [`ComputeThreads::run`] gave no answer.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ComputeError {
    #[error("the work panicked: {0}")]
    Panicked(String),
    #[error("the compute threads are gone")]
    Gone,
}

/// A fixed set of named OS threads running closures in arrival order.
/// Clones share the threads; they stop once every clone is dropped and
/// the queue is empty.
#[derive(Clone)]
pub struct ComputeThreads {
    queue: mpsc::Sender<Work>,
    threads: usize,
}

impl std::fmt::Debug for ComputeThreads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputeThreads")
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

impl ComputeThreads {
    /// Starts `threads` threads (at least one), named `<name>-<n>`.
    pub fn new(threads: usize, name: &str) -> std::io::Result<Self> {
        Self::recording(threads, name, None)
    }

    /// Like [`ComputeThreads::new`], each thread writing the claim of the
    /// closure it runs into its slot of `record` while it runs it (see
    /// [`FlightRecord`]).
    pub fn recording(threads: usize, name: &str, record: Option<Arc<FlightRecord>>) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let (queue, receiver) = mpsc::channel::<Work>();
        let receiver = Arc::new(Mutex::new(receiver));
        for index in 0..threads {
            let receiver = receiver.clone();
            let record = record.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || loop {
                    // The lock is held only while waiting for the next
                    // closure, never while running one.
                    let next = match receiver.lock() {
                        Ok(receiver) => receiver.recv(),
                        Err(_) => return,
                    };
                    let Ok(work) = next else { return };
                    match (&record, &work.claim) {
                        (Some(record), Some(claim)) => {
                            record.running(index, claim);
                            (work.run)();
                            record.idle(index);
                        }
                        _ => (work.run)(),
                    }
                })?;
        }
        Ok(ComputeThreads { queue, threads })
    }

    /// How many closures run at once at most.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Queues `work` and waits for its result. A panic in `work` is
    /// caught and returned as [`ComputeError::Panicked`]; the thread goes
    /// on with the next closure. Dropping the returned future does not
    /// take back work already queued: a closure that must not act for a
    /// caller who stopped waiting checks for that itself.
    pub async fn run<T, F>(&self, work: F) -> Result<T, ComputeError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job = Work {
            claim: current_claim(),
            run: Box::new(move || {
                let result = catch_unwind(AssertUnwindSafe(work))
                    .map_err(|panic| ComputeError::Panicked(panic_message(&*panic)));
                let _ = answer.send(result);
            }),
        };
        self.queue.send(job).map_err(|_| ComputeError::Gone)?;
        answered.await.map_err(|_| ComputeError::Gone)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn no_more_closures_run_at_once_than_there_are_threads() {
        let threads = ComputeThreads::new(2, "test-compute").unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut waiting = Vec::new();
        for index in 0..16 {
            let (threads, running, most) = (threads.clone(), running.clone(), most.clone());
            waiting.push(tokio::spawn(async move {
                threads
                    .run(move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(5));
                        running.fetch_sub(1, Ordering::SeqCst);
                        index * 10
                    })
                    .await
            }));
        }
        for (index, waited) in waiting.into_iter().enumerate() {
            assert_eq!(waited.await.unwrap(), Ok(index * 10));
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    /// A closure queued by a job's task is in the record while it runs,
    /// and only then; one queued outside any job is never recorded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_record_names_the_claims_whose_closures_run_and_only_while_they_run() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flight");
        let record = Arc::new(FlightRecord::create(&path).unwrap());
        let threads = ComputeThreads::recording(2, "test-compute", Some(record)).unwrap();
        let (started, running) = std::sync::mpsc::channel();
        let (finish, finishing) = std::sync::mpsc::channel::<()>();
        let waiting = {
            let threads = threads.clone();
            tokio::spawn(crate::flight::CLAIM.scope("claim-1".to_string(), async move {
                threads
                    .run(move || {
                        started.send(()).unwrap();
                        finishing.recv().unwrap();
                    })
                    .await
            }))
        };
        tokio::task::spawn_blocking(move || running.recv().unwrap())
            .await
            .unwrap();
        assert_eq!(
            FlightRecord::read(&path).unwrap(),
            std::collections::BTreeSet::from(["claim-1".to_string()])
        );
        assert_eq!(threads.run(|| 1).await, Ok(1), "a closure of no job");
        finish.send(()).unwrap();
        waiting.await.unwrap().unwrap();
        // The thread clears its slot right after the closure answered.
        let started = std::time::Instant::now();
        while !FlightRecord::read(&path).unwrap().is_empty() {
            assert!(started.elapsed() < Duration::from_secs(5), "the slot is cleared");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[tokio::test]
    async fn a_panicking_closure_is_an_error_and_the_thread_goes_on() {
        let threads = ComputeThreads::new(1, "test-compute").unwrap();
        let panicked = threads.run(|| -> u32 { panic!("decoder exploded") }).await;
        assert_eq!(panicked, Err(ComputeError::Panicked("decoder exploded".into())));
        assert_eq!(threads.run(|| 7).await, Ok(7));
    }
}
