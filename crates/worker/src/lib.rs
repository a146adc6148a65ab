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
//! A task kind is a type implementing [`Task`]; a [`WorkerPool`] built
//! with it over an engine runs what is requested of that kind. The
//! example `the_crate_documentation_example_drains_what_was_requested`
//! (`tests/it/runtime.rs`) is the whole of it, run.

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
