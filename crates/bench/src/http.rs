//! `http`: the task lifecycle over HTTP. An in-process `opledger serve`
//! (the real service: router, tokens, long-polls) on a throwaway
//! database; a requester sending batched task requests and N concurrent
//! worker clients (keep-alive connections) doing claim (long-poll, a batch
//! of `claim_batch`) → one batched report of the claims' completions. It
//! prints tasks/s, p50/p99 latency of each call kind, and — measured in the
//! same run, at the same workers and claim batch, on a database of its own —
//! the in-process `lifecycle` figure, with the ratio.
//!
//! It reaches the service only over HTTP, as a worker on another host
//! would: what it measures is what the JSON API adds to the engine.

use crate::backend::BenchBackend;
use crate::lifecycle::{register_lifecycle_media, run_task_lifecycle};
use crate::stats::{per_second, quantile, round3};
use crate::{BenchError, Options};
use opledger_domain::MediaId;
use opledger_engine::Engine;
use opledger_http::{App, Role, ServiceConfig, Tokens};
use opledger_store::Store;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Requests per `/task-requests` call, as the in-process lifecycle batches them.
const REQUEST_BATCH: usize = 64;

/// How long a claim waits for work (the service caps it at 30 s).
const CLAIM_WAIT_MS: u64 = 1_000;

/// What one HTTP run measured.
struct HttpRun {
    tasks: u64,
    elapsed: Duration,
    /// Per call kind, every call's latency in µs, sorted.
    latencies: Vec<(&'static str, Vec<u64>)>,
    /// Claim calls that came back empty (waited out, or lost the race).
    empty_claims: u64,
}

fn failed(what: &str) -> impl FnOnce(reqwest::Error) -> BenchError + '_ {
    move |error| BenchError::Task(format!("{what}: {error}"))
}

/// One token of each role the run needs, and the tokens the service holds.
fn tokens() -> Result<(Tokens, String), BenchError> {
    let (token, entry) = opledger_http::new_token("bench", Role::Admin, Vec::new())
        .map_err(|error| BenchError::Invalid(error.to_string()))?;
    let tokens =
        Tokens::parse(&opledger_http::entry_toml(&entry)).map_err(|error| BenchError::Invalid(error.to_string()))?;
    Ok((tokens, token))
}

/// A POST answered 2xx with JSON, and its latency in µs.
async fn post(client: &reqwest::Client, url: &str, token: &str, body: &Value) -> Result<(Value, u64), BenchError> {
    let asked = Instant::now();
    let response = client
        .post(url)
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .map_err(failed(url))?;
    let status = response.status();
    let answer: Value = response.json().await.map_err(failed(url))?;
    let latency = asked.elapsed().as_micros() as u64;
    if !status.is_success() {
        return Err(BenchError::Task(format!("{url} answered {status}: {answer}")));
    }
    Ok((answer, latency))
}

/// The lifecycle through a service on `engine`'s store.
async fn run_over_http<S: Store>(
    engine: Engine<S>,
    media: &[MediaId],
    workers: usize,
    claim_batch: usize,
) -> Result<HttpRun, BenchError> {
    use futures::StreamExt;
    let (tokens, token) = tokens()?;
    let config = ServiceConfig {
        tokens,
        ..ServiceConfig::default()
    };
    let app = App::new(engine, config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(BenchError::io("binding a loopback port"))?;
    let base = format!(
        "http://{}",
        listener
            .local_addr()
            .map_err(BenchError::io("reading the bound port"))?
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let service = tokio::spawn(opledger_http::serve(app.clone(), listener, async move {
        let _ = stopped.await;
    }));
    while !app.is_ready() {
        if service.is_finished() {
            return Err(BenchError::Task("the service stopped before it was ready".to_string()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(workers + 8)
        .tcp_nodelay(true)
        .build()
        .map_err(failed("building the HTTP client"))?;

    let tasks = media.len() as u64 * 2;
    let completed = Arc::new(AtomicU64::new(0));
    let finished_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let started = Instant::now();

    let requester = {
        let (client, token) = (client.clone(), token.clone());
        let url = format!("{base}/api/v1/task-requests");
        let requests: Vec<Value> = media
            .iter()
            .flat_map(|media_id| {
                [
                    json!({"media_id": media_id.to_string(), "kind": "metadata", "inputs": {}}),
                    json!({"media_id": media_id.to_string(), "kind": "thumbnail", "inputs": {"max_side": 256, "format": "webp"}}),
                ]
            })
            .collect();
        tokio::spawn(async move {
            let batches: Vec<Value> = requests
                .chunks(REQUEST_BATCH)
                .map(|batch| json!({ "requests": batch }))
                .collect();
            let answers: Vec<Result<(Value, u64), BenchError>> = futures::stream::iter(batches)
                .map(|batch| {
                    let (client, token, url) = (client.clone(), token.clone(), url.clone());
                    async move { post(&client, &url, &token, &batch).await }
                })
                .buffer_unordered(4)
                .collect()
                .await;
            let mut latencies = Vec::with_capacity(answers.len());
            for answer in answers {
                let (answer, latency) = answer?;
                if let Some(refused) = answer["items"]
                    .as_array()
                    .and_then(|items| items.iter().find(|item| item.get("error").is_some()))
                {
                    return Err(BenchError::Task(format!("a request was refused: {refused}")));
                }
                latencies.push(latency);
            }
            Ok::<_, BenchError>(latencies)
        })
    };

    let mut handles = Vec::new();
    for worker in 0..workers {
        let (client, token, completed, finished_at) =
            (client.clone(), token.clone(), completed.clone(), finished_at.clone());
        let (claim_url, report_url) = (format!("{base}/api/v1/claims"), format!("{base}/api/v1/reports"));
        handles.push(tokio::spawn(async move {
            let name = format!("bench-http-worker-{worker}");
            let (mut claims_us, mut reports_us, mut empty) = (Vec::new(), Vec::new(), 0u64);
            while completed.load(Ordering::SeqCst) < tasks {
                let ask = json!({"worker": name, "lease_ms": 60_000, "limit": claim_batch, "wait_ms": CLAIM_WAIT_MS});
                let (answer, latency) = post(&client, &claim_url, &token, &ask).await?;
                let claims = answer["claims"].as_array().cloned().unwrap_or_default();
                if claims.is_empty() {
                    // A waited-out or raced claim is not a claim's cost.
                    empty += 1;
                    continue;
                }
                claims_us.push(latency);
                let reports: Vec<Value> = claims
                    .iter()
                    .map(|claim| {
                        json!({
                            "claim_token": claim["claim_token"],
                            "revision": claim["revision"],
                            "outcome": "complete",
                            "output": {"bytes": 1024, "attempt": claim["attempt"]},
                        })
                    })
                    .collect();
                let (answer, latency) = post(&client, &report_url, &token, &json!({ "reports": reports })).await?;
                reports_us.push(latency);
                for item in answer["items"].as_array().cloned().unwrap_or_default() {
                    if item.get("error").is_some() {
                        return Err(BenchError::Task(format!("a completion was refused: {item}")));
                    }
                    if completed.fetch_add(1, Ordering::SeqCst) + 1 == tasks {
                        *finished_at.lock().expect("the finish time's lock") = Some(Instant::now());
                    }
                }
            }
            Ok::<_, BenchError>((claims_us, reports_us, empty))
        }));
    }
    let request_us = requester.await.map_err(BenchError::task("requester task"))??;
    // Workers still long-polling when the last task completed are answered
    // at once by the stopping service; the run ended at the last completion.
    let mut last_completion = None;
    while last_completion.is_none() {
        last_completion = *finished_at.lock().expect("the finish time's lock");
        if last_completion.is_none() {
            if handles.iter().any(|handle| handle.is_finished()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let _ = stop.send(());
    let (mut claim_us, mut report_us, mut empty_claims) = (Vec::new(), Vec::new(), 0);
    for handle in handles {
        let (claims, reports, empty) = handle.await.map_err(BenchError::task("worker task"))??;
        claim_us.extend(claims);
        report_us.extend(reports);
        empty_claims += empty;
    }
    let elapsed = last_completion.unwrap_or_else(Instant::now).duration_since(started);
    match service.await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => return Err(BenchError::Task(format!("the service failed: {error}"))),
        Err(error) => return Err(BenchError::Task(format!("the service task: {error}"))),
    }
    let mut latencies = vec![("request", request_us), ("claim", claim_us), ("report", report_us)];
    for (_, samples) in &mut latencies {
        samples.sort_unstable();
    }
    Ok(HttpRun {
        tasks,
        elapsed,
        latencies,
        empty_claims,
    })
}

/// Reads `tasks`, `workers` and `claim_batch`: per worker count, the
/// lifecycle over HTTP and in process, each on a fresh database.
pub(crate) async fn http<B: BenchBackend>(backend: &B, options: &Options) -> Result<Value, BenchError> {
    let media_count = (options.tasks / 2).max(1);
    let mut runs = Vec::new();
    for &workers in &options.workers {
        let workers = workers.max(1);
        let store = backend.fresh_store(&format!("http_{workers}")).await?;
        let (engine, _) = Engine::open(store).await?;
        let media = register_lifecycle_media(&engine, media_count).await?;
        let over_http = run_over_http(engine, &media, workers, options.claim_batch).await?;

        let store = backend.fresh_store(&format!("http_inprocess_{workers}")).await?;
        let (engine, _) = Engine::open(store).await?;
        let media = register_lifecycle_media(&engine, media_count).await?;
        let in_process = run_task_lifecycle(&engine, &media, workers, options.claim_batch).await?;
        drop(engine);

        let http_per_sec = per_second(over_http.tasks, over_http.elapsed);
        let in_process_per_sec = per_second(in_process.tasks, in_process.elapsed);
        let calls: serde_json::Map<String, Value> = over_http
            .latencies
            .iter()
            .map(|(kind, samples)| {
                (
                    kind.to_string(),
                    json!({
                        "calls": samples.len(),
                        "p50_ms": round3(quantile(samples, 0.5) as f64 / 1_000.0),
                        "p99_ms": round3(quantile(samples, 0.99) as f64 / 1_000.0),
                    }),
                )
            })
            .collect();
        runs.push(json!({
            "workers": workers,
            "tasks": over_http.tasks,
            "claim_batch": options.claim_batch,
            "http_seconds": round3(over_http.elapsed.as_secs_f64()),
            "http_tasks_per_sec": http_per_sec.round(),
            "in_process_tasks_per_sec": in_process_per_sec.round(),
            "ratio_to_in_process": round3(http_per_sec / in_process_per_sec),
            "latency": calls,
            "empty_claims": over_http.empty_claims,
            "in_process_claim_p50_ms": round3(in_process.claim_latency_us(0.5) as f64 / 1_000.0),
            "in_process_claim_p99_ms": round3(in_process.claim_latency_us(0.99) as f64 / 1_000.0),
        }));
    }
    let (durability, setting) = backend.durability();
    Ok(json!({
        "workload": "http",
        "backend": backend.name(),
        (durability): setting,
        "runs": runs,
        "workload_tasks": "the lifecycle workload's tasks (a metadata and a thumbnail task per media item) through an in-process `opledger serve` over loopback HTTP: batched requests (64 a call), long-poll claims of claim_batch tasks, one batched report per claim; latency is per call, claims that came back empty excluded (counted in empty_claims)",
        "compared_with": "the in-process lifecycle workload at the same workers and claim batch, on a fresh database, in the same run",
    }))
}
