//! The service's metrics in Prometheus text format.
//!
//! Each [`crate::App`] keeps its own recorder (tests run many services in
//! one process, so nothing is process-global) and records into it through
//! `metrics::with_local_recorder`. What is measured where:
//!
//! - gauges are refreshed at scrape time from the engine's reads: the
//!   status report (operations and capabilities by status, projection
//!   lag, the open review queue) and the claim queues (depth, and the age
//!   of the oldest claimable task, per kind);
//! - the work counters (claims, completions, failures, retries,
//!   interruptions) are counted from the log itself: each scrape reads the
//!   events appended since the last one (from the head at startup, never
//!   from the start), so they count every process's work on the database,
//!   the CLI's and other `serve` processes' included;
//! - conflicts are this service's `409` answers, and request latency is
//!   measured by the request log ([`crate::observe`]) around every
//!   request, by matched route (never the raw path: ids would make a
//!   series each), method and status;
//! - append and commit latency come from the engine's write observer
//!   ([`WriteHistograms`]): every write command this service's engine runs
//!   (requests, periodic recovery) reports how long it waited for the
//!   store's writer, how long its commit took, and its whole latency.
//!
//! It must not know a backend: it reads through the engine and the
//! `Store` trait's read methods.

use futures::StreamExt;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use opledger_domain::tasks::CLAIMABLE_STATUSES;
use opledger_engine::{Engine, EngineError, WriteObserver, WriteTimings};
use opledger_store::Store;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// Latency buckets, in seconds: from a cached read to a long-poll's end.
const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];

/// Events one scrape counts at most; a scrape after a long pause catches
/// up over the next ones instead of taking long.
const COUNTED_PER_SCRAPE: usize = 200_000;

/// Events read per page while counting.
const COUNT_PAGE: usize = 1_000;

/// The work counters: which event type counts in which counter.
const WORK_COUNTERS: [(&str, &str); 7] = [
    ("operation_claimed", "opledger_claims_total"),
    ("operation_succeeded", "opledger_completions_total"),
    ("operation_found_nothing", "opledger_completions_total"),
    ("operation_failed", "opledger_failures_total"),
    ("operation_retry_scheduled", "opledger_retries_total"),
    ("operation_dead_lettered", "opledger_dead_letters_total"),
    ("operation_interrupted", "opledger_interruptions_total"),
];

/// One service's recorder and what scrapes remember.
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    scrape: tokio::sync::Mutex<Scraped>,
}

#[derive(Default)]
struct Scraped {
    /// The last seq the work counters counted; None until startup set it.
    counted_to: Option<i64>,
    /// Kinds a queue gauge was set for: reset to 0 when their queue empties.
    kinds: BTreeSet<String>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new() -> Self {
        let builder = PrometheusBuilder::new();
        // The buckets are constant and valid; a refusal would leave summaries.
        let builder = match builder.set_buckets(&LATENCY_BUCKETS) {
            Ok(builder) => builder,
            Err(_) => PrometheusBuilder::new(),
        };
        let recorder = Arc::new(builder.build_recorder());
        let handle = recorder.handle();
        let metrics = Metrics {
            recorder,
            handle,
            scrape: tokio::sync::Mutex::new(Scraped::default()),
        };
        metrics.record(|| {
            metrics::describe_histogram!(
                "opledger_http_request_duration_seconds",
                metrics::Unit::Seconds,
                "HTTP request latency until the answer's head, by matched route, method and status"
            );
            metrics::describe_histogram!(
                "opledger_append_duration_seconds",
                metrics::Unit::Seconds,
                "Write commands from the call until the store acknowledged their commit, by kind (log, liveness)"
            );
            metrics::describe_histogram!(
                "opledger_commit_duration_seconds",
                metrics::Unit::Seconds,
                "The commit step of write commands: from the end of their work in the transaction until acknowledged"
            );
            metrics::describe_histogram!(
                "opledger_write_queue_duration_seconds",
                metrics::Unit::Seconds,
                "Write commands' wait for the store's writer before their transaction ran"
            );
            metrics::describe_counter!(
                "opledger_write_failures_total",
                "Write commands that failed or were refused: nothing of them was written"
            );
            metrics::describe_counter!(
                "opledger_http_conflicts_total",
                "409 answers: stale claims, illegal transitions, version conflicts"
            );
            metrics::describe_counter!(
                "opledger_claims_total",
                "Claims recorded in the log since this service started"
            );
            metrics::describe_counter!(
                "opledger_completions_total",
                "Completions (a result or no result) recorded in the log"
            );
            metrics::describe_counter!("opledger_failures_total", "Failures recorded in the log");
            metrics::describe_counter!("opledger_retries_total", "Retries scheduled in the log");
            metrics::describe_counter!("opledger_dead_letters_total", "Tasks that ran out of attempts");
            metrics::describe_counter!(
                "opledger_interruptions_total",
                "Claims interrupted (expired lease, shutdown)"
            );
            metrics::describe_gauge!("opledger_operations", "Operations by status");
            metrics::describe_gauge!("opledger_capabilities", "Capabilities by status");
            metrics::describe_gauge!(
                "opledger_projection_lag_events",
                "Events the projection has not folded yet"
            );
            metrics::describe_gauge!("opledger_review_queue_open", "Open review entries");
            metrics::describe_gauge!("opledger_log_head", "The highest seq in the log");
            metrics::describe_gauge!("opledger_claim_queue_depth", "Claimable tasks now, per kind");
            metrics::describe_gauge!(
                "opledger_claim_queue_age_seconds",
                metrics::Unit::Seconds,
                "How long the oldest claimable task of the kind has been claimable"
            );
        });
        metrics
    }

    /// Runs `record` with this service's recorder as the current one.
    pub fn record<T>(&self, record: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(self.recorder.as_ref(), record)
    }

    /// The observer the service's engine reports its writes to.
    pub fn write_observer(&self) -> Arc<dyn WriteObserver> {
        Arc::new(WriteHistograms {
            recorder: Arc::clone(&self.recorder),
        })
    }

    /// The work counters count from `head` on (startup sets it).
    pub async fn count_from(&self, head: i64) {
        let mut scraped = self.scrape.lock().await;
        scraped.counted_to.get_or_insert(head);
    }

    /// Refreshes the gauges, counts the log since the last scrape, and
    /// renders every metric.
    pub async fn render<S: Store>(&self, engine: &Engine<S>) -> Result<String, EngineError> {
        let mut scraped = self.scrape.lock().await;
        let status = engine.status().await?;
        let now = engine.now();
        let queues = engine.store().claim_queues(CLAIMABLE_STATUSES, now).await?;
        let counted = match scraped.counted_to {
            Some(after) => Some(count_events(engine, after).await?),
            None => None,
        };
        let previous_kinds = std::mem::take(&mut scraped.kinds);
        self.record(|| {
            metrics::gauge!("opledger_log_head").set(status.head as f64);
            for (name, count) in &status.operations_by_status {
                metrics::gauge!("opledger_operations", "status" => name.clone()).set(*count as f64);
            }
            for (name, count) in &status.capabilities_by_status {
                metrics::gauge!("opledger_capabilities", "status" => name.clone()).set(*count as f64);
            }
            for projection in &status.projections {
                metrics::gauge!("opledger_projection_lag_events", "projection" => projection.name.clone())
                    .set(projection.lag as f64);
            }
            metrics::gauge!("opledger_review_queue_open").set(status.review_queue as f64);
            for queue in &queues {
                let age = now.to_datetime() - queue.oldest_available_at.to_datetime();
                let age = age.to_std().unwrap_or(Duration::ZERO).as_secs_f64();
                metrics::gauge!("opledger_claim_queue_depth", "kind" => queue.kind.clone()).set(queue.claimable as f64);
                metrics::gauge!("opledger_claim_queue_age_seconds", "kind" => queue.kind.clone()).set(age);
                scraped.kinds.insert(queue.kind.clone());
            }
            // Emptied queues read 0 (not their last value) from now on.
            for gone in previous_kinds {
                if !scraped.kinds.contains(&gone) {
                    metrics::gauge!("opledger_claim_queue_depth", "kind" => gone.clone()).set(0.0);
                    metrics::gauge!("opledger_claim_queue_age_seconds", "kind" => gone.clone()).set(0.0);
                    scraped.kinds.insert(gone);
                }
            }
            if let Some((_, counts)) = &counted {
                for (name, count) in counts {
                    metrics::counter!(*name).increment(*count);
                }
                // Present from the first scrape, so rates start at zero.
                for (_, name) in WORK_COUNTERS {
                    metrics::counter!(name).increment(0);
                }
                metrics::counter!("opledger_http_conflicts_total").increment(0);
            }
        });
        if let Some((to, _)) = counted {
            scraped.counted_to = Some(to);
        }
        self.handle.run_upkeep();
        Ok(self.handle.render())
    }

    /// Records one answered request.
    pub fn request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        self.record(|| {
            metrics::histogram!(
                "opledger_http_request_duration_seconds",
                "route" => route.to_string(),
                "method" => method.to_string(),
                "status" => status.to_string()
            )
            .record(elapsed.as_secs_f64());
            if status == 409 {
                metrics::counter!("opledger_http_conflicts_total").increment(1);
            }
        });
    }
}

/// Records the engine's write timings into one service's recorder.
pub struct WriteHistograms {
    recorder: Arc<PrometheusRecorder>,
}

impl WriteObserver for WriteHistograms {
    fn written(&self, timings: WriteTimings) {
        let kind = timings.kind.as_str();
        metrics::with_local_recorder(self.recorder.as_ref(), || {
            metrics::histogram!("opledger_write_queue_duration_seconds", "kind" => kind)
                .record(timings.queued.as_secs_f64());
            if timings.committed {
                metrics::histogram!("opledger_append_duration_seconds", "kind" => kind)
                    .record(timings.total.as_secs_f64());
                metrics::histogram!("opledger_commit_duration_seconds", "kind" => kind)
                    .record(timings.commit.as_secs_f64());
            } else {
                metrics::counter!("opledger_write_failures_total", "kind" => kind).increment(1);
            }
        });
    }
}

/// Counts the work events after `after` (at most [`COUNTED_PER_SCRAPE`]):
/// the last seq read, and the increment of each counter.
async fn count_events<S: Store>(
    engine: &Engine<S>,
    after: i64,
) -> Result<(i64, Vec<(&'static str, u64)>), EngineError> {
    let mut events = engine.store().read_all(after, COUNT_PAGE).take(COUNTED_PER_SCRAPE);
    let mut last = after;
    let mut counts: Vec<(&'static str, u64)> = Vec::new();
    while let Some(envelope) = events.next().await {
        let envelope = envelope?;
        last = envelope.seq;
        let event_type = envelope.event_type();
        if let Some((_, counter)) = WORK_COUNTERS.iter().find(|(counted, _)| *counted == event_type) {
            match counts.iter_mut().find(|(name, _)| name == counter) {
                Some((_, count)) => *count += 1,
                None => counts.push((*counter, 1)),
            }
        }
    }
    Ok((last, counts))
}
