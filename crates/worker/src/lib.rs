//! The opledger worker runtime: a pool of in-process workers that claim
//! tasks through the engine's work protocol, run each with the [`Task`]
//! registered for its kind, keep its lease alive with heartbeats, pass a
//! cancel request (or the loss of the claim) through to the running task,
//! and report how it ended (complete, fail, acknowledge the cancel), every
//! report fenced by the claim token and revision.
//!
//! It must not know SQL or which backend it runs on: it is generic over
//! [`opledger_store::Store`] only through [`opledger_engine::Engine`], and
//! everything it records goes through the engine's commands. It holds no
//! business rules either: retry policy, backoff, jitter and the transition
//! table are the domain's; the runtime only says whether an error was
//! retryable. Tasks see neither the engine nor the store: a [`Job`] is all
//! they get (the claim, throttled progress, the cancellation signal, and
//! fenced file outputs). Claims that fail on storage trouble back off, and
//! a pool may be told to give up after a bound; compute threads can keep a
//! [`FlightRecord`] of the claims they run, which outlives the process.
//!
//! ```no_run
//! use opledger_worker::{Job, Outcome, Task, TaskError, WorkerPool};
//! use serde_json::json;
//!
//! struct Metadata;
//!
//! impl Task for Metadata {
//!     fn kind(&self) -> &'static str {
//!         "metadata"
//!     }
//!
//!     async fn run(&self, job: &mut Job) -> Result<Outcome, TaskError> {
//!         job.progress("reading", 0, Some(1)).await?;
//!         Ok(Outcome::output(json!({"digest": job.inputs()["content_digest"]})))
//!     }
//! }
//!
//! # async fn example<S: opledger_store::Store>(engine: opledger_engine::Engine<S>) {
//! let pool = WorkerPool::builder(engine, "ingest")
//!     .task(Metadata)
//!     .workers(4)
//!     .build()
//!     .unwrap();
//! let report = pool.run_until_idle().await.unwrap();
//! println!("{} completed, {} failed", report.completed, report.failed);
//! # }
//! ```

mod compute;
mod files;
mod flight;
mod job;
mod link;
mod pool;
mod report;
mod task;

pub use compute::{ComputeError, ComputeThreads};
pub use files::remove_abandoned_outputs;
pub use flight::FlightRecord;
pub use job::{Job, JobError, StopReason, StopSignal, PROGRESS_INTERVAL};
pub use pool::{PoolError, PoolReport, WorkerPool, WorkerPoolBuilder};
pub use task::{Outcome, Task, TaskError};
