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

use crate::pool::panic_message;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use thiserror::Error;

type Work = Box<dyn FnOnce() + Send + 'static>;

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
        let threads = threads.max(1);
        let (queue, receiver) = mpsc::channel::<Work>();
        let receiver = Arc::new(Mutex::new(receiver));
        for index in 0..threads {
            let receiver = receiver.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || loop {
                    // The lock is held only while waiting for the next
                    // closure, never while running one.
                    let next = match receiver.lock() {
                        Ok(receiver) => receiver.recv(),
                        Err(_) => return,
                    };
                    match next {
                        Ok(work) => work(),
                        Err(_) => return,
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
        let job: Work = Box::new(move || {
            let result =
                catch_unwind(AssertUnwindSafe(work)).map_err(|panic| ComputeError::Panicked(panic_message(&*panic)));
            let _ = answer.send(result);
        });
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

    #[tokio::test]
    async fn a_panicking_closure_is_an_error_and_the_thread_goes_on() {
        let threads = ComputeThreads::new(1, "test-compute").unwrap();
        let panicked = threads.run(|| -> u32 { panic!("decoder exploded") }).await;
        assert_eq!(panicked, Err(ComputeError::Panicked("decoder exploded".into())));
        assert_eq!(threads.run(|| 7).await, Ok(7));
    }
}
