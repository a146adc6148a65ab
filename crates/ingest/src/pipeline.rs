//! One ingest run, step by step (see the crate documentation): discover
//! the folder's files and classify them against the ledger, begin their
//! ingestions and the batch, start the image workers, drive every file
//! through its stages until its tasks settle, and collect what needs a
//! person. Each step is a module of its own.

use crate::begin::begin;
use crate::discover::{classify, walk};
use crate::drive::{drive, FileReading};
use crate::finish::finish_settled;
use crate::lock::{flight_record_path, is_run_worker, left_flight_records};
use crate::review::review_entries;
use crate::run::{Run, CHUNK};
use crate::tools::{retry_what_now_runs, wait_for, Tools};
use crate::workers::ImageWorkers;
use crate::{IngestError, IngestOptions, IngestProgress, IngestSummary, Interrupted};
use opledger_domain::DomainError;
use opledger_engine::{CommandContext, Engine, EngineError, IngestionClaim};
use opledger_media::Settler;
use opledger_store::{ErrorKind, Store, StoreError};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Applies the declarations of the image tasks (`opledger_media::KINDS_TOML`).
/// A ledger whose recorded declarations of these kinds differ in what
/// determines results, at the same version, refuses the ingest.
pub async fn declare_kinds<S: Store>(engine: &Engine<S>, context: &CommandContext) -> Result<(), IngestError> {
    let document = opledger_engine::parse_kinds(opledger_media::KINDS_TOML)?;
    let report = engine.apply_kinds(context, &document, false).await?;
    if let Some(refused) = report.refused().next() {
        return Err(IngestError::Engine(opledger_engine::EngineError::invalid(format!(
            "the ingest's task kind {} cannot be declared: {}",
            refused.name,
            refused.error.as_deref().unwrap_or("refused")
        ))));
    }
    Ok(())
}

/// Runs one ingest of `options.root` to the end, or until a stop is asked
/// for (`options.stop`: then the summary says what was left).
pub async fn ingest<S: Store>(
    engine: Engine<S>,
    options: IngestOptions,
    progress: Arc<dyn IngestProgress>,
) -> Result<IngestSummary, IngestError> {
    let started = Instant::now();
    let stop = options.stop.clone();
    let run = Run::prepare(&engine, &options).await?;
    let watch = run.lock.watch(&stop);
    let ran = async {
        // 0. The kinds this pipeline runs, declared (an unchanged declaration
        // appends nothing).
        declare_kinds(&engine, &run.context).await?;

        // 1. Walk, and compare with what the ledger knows.
        let walked = walk(&run.root, &run.exclude)?;
        let classified = classify(&engine, &run.root, &walked).await?;
        let files = walked.files.len();
        let (new, changed, resumed, unchanged) = (
            classified.new,
            classified.changed,
            classified.resumed,
            classified.unchanged.len(),
        );
        tracing::info!(elapsed_ms = started.elapsed().as_millis() as u64, files, "walked");
        // The task claims of earlier runs that ended without releasing them
        // (killed) are dead: this run holds the ledger's ingest lock now, so
        // no other ingest run is alive. Released at once, so their tasks do
        // not wait for their leases to expire.
        // Their flight records say which claims they were running.
        let dead: BTreeSet<String> = classified.dead_workers.iter().cloned().collect();
        let me = run.worker.clone();
        let (running, records) = left_flight_records(&options.thumbnails_dir);
        let released = engine
            .release_claims_where(
                &run.context,
                move |worker| worker != me && (is_run_worker(worker) || dead.contains(worker)),
                "the ingest run holding it ended without releasing it",
                running,
            )
            .await?;
        if released.interrupted + released.released > 0 {
            tracing::info!(?released, "released the claims of ingest runs that died");
        }
        for record in records {
            let _ = std::fs::remove_file(record);
        }
        progress.started(files, unchanged);

        let summary = |batch_id, operations_created, failed, missing, unreadable_folders, tasks_run| IngestSummary {
            batch_id,
            files,
            new,
            unchanged,
            changed,
            resumed,
            failed,
            missing,
            unreadable_folders,
            skipped: walked.skipped.clone(),
            operations_created,
            review_entries: Vec::new(),
            tasks_run,
            wall_seconds: 0.0,
            interrupted: None,
        };
        if let Some(by) = stop.requested_by() {
            // Asked to stop before anything began: nothing is held.
            progress.finished();
            let mut summary = summary(None, 0, 0, 0, 0, 0);
            summary.interrupted = Some(Interrupted {
                by,
                files_left: files - unchanged,
                tasks_interrupted: 0,
            });
            summary.wall_seconds = started.elapsed().as_secs_f64();
            return Ok(summary);
        }

        // 2. Start ingestions, record the gone, and the batch over the folder.
        let begun = begin(&engine, &run, options.batch_name.as_deref(), classified).await?;
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "ingestions and batch started"
        );

        // Tasks blocked for what this run has (ffmpeg installed since, a
        // build that decodes HEIF) are retried; the run waits for them too.
        let tools = Tools {
            ffmpeg: options.ffmpeg.is_some(),
            heif: opledger_media::HEIF_SUPPORT,
        };
        let retried = retry_what_now_runs(&engine, &run.context, &run.root, tools).await?;
        if !retried.is_empty() {
            tracing::info!(retried = retried.len(), "retried tasks blocked for what this run has");
        }

        // 3. The workers, in the background until every file has settled.
        let workers = ImageWorkers::start(&engine, &run.worker, &options)?;

        // 4. Each file through its stages; then wait for its tasks.
        let reading = FileReading {
            settler: Settler::new(options.settle_quiet).with_poll(options.settle_quiet / 5),
            compute: workers.compute.clone(),
            give_up_after: options.give_up_after,
            tools,
        };
        let known_paths = workers.known_paths.clone();
        let workers_ended = workers.ended.clone();
        let mut retried_ended = workers.ended.clone();
        let driven = drive(
            &engine,
            &run.context,
            &reading,
            begun.claims,
            unchanged,
            progress.as_ref(),
            &known_paths,
            &stop,
            workers_ended,
        )
        .await;
        let mut stopping = driven
            .as_ref()
            .is_ok_and(|driven| !driven.in_flight.is_empty() || !driven.unread.is_empty());
        if driven.is_ok() && !stopping {
            stopping = !wait_for(&engine, &retried, &stop, &mut retried_ended).await?;
        }
        let stopped = if stopping {
            workers.stop_within(options.stop_grace, stop.requested_now()).await?
        } else {
            workers.stop().await?
        };
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            pool_report = ?stopped.report,
            "the image workers stopped"
        );
        let mut driven = driven?;

        // 5. Stopped early: finish the files whose tasks settled meanwhile, and
        // release the rest for the next run.
        let mut interrupted = None;
        if stopping {
            let finished = finish_settled(&engine, &run.context, &mut driven.in_flight, options.give_up_after).await?;
            driven.tally.settled += finished.done;
            driven.tally.failed += finished.failed;
            let by = stop.requested_by().unwrap_or_else(|| "a stop request".into());
            let cause = format!("the ingest was stopped ({by})");
            let left: Vec<IngestionClaim> = driven
                .in_flight
                .drain(..)
                .map(|file| file.claim)
                .chain(driven.unread.drain(..))
                .collect();
            for chunk in left.chunks(CHUNK) {
                engine.release_ingestions(&run.context, chunk.to_vec(), &cause).await?;
            }
            // Twice: a claim the pool sent before it was dropped commits before
            // the first pass's write, and is seen by the second pass's read.
            let mut tasks_interrupted = 0;
            for _ in 0..2 {
                let released = engine
                    .release_claims_of(&run.context, std::slice::from_ref(&run.worker), &cause)
                    .await?;
                tasks_interrupted += released.interrupted;
            }
            interrupted = Some(Interrupted {
                by,
                files_left: files.saturating_sub(driven.tally.settled),
                tasks_interrupted,
            });
        }
        // Everything this run held is finished or released: its flight record
        // has nothing more to tell.
        let _ = std::fs::remove_file(flight_record_path(&options.thumbnails_dir, &run.worker));

        // 6. What needs a person, among this folder's files.
        let review_entries = review_entries(&engine, &run.root).await?;
        progress.finished();
        let mut summary = summary(
            begun.batch_id,
            begun.operations_created + driven.tally.tasks_created,
            driven.tally.failed,
            begun.missing,
            begun.unreadable_folders,
            stopped.tasks_run,
        );
        summary.review_entries = review_entries;
        summary.interrupted = interrupted;
        summary.wall_seconds = started.elapsed().as_secs_f64();
        Ok::<IngestSummary, IngestError>(summary)
    }
    .await;
    // A lost lock explains whatever the run ran into after it (a claim
    // that another ingest took over answers Conflict), so the loss is
    // what the run reports: storage unavailable (exit 5), and how to
    // resume. The takeover can be met before the loss is heard of (the
    // lock's session is looked at every half second), so a run that ends
    // in a conflict gives the watch a moment first.
    let conflicted = matches!(&ran, Err(error) if error.engine_error().is_some_and(is_conflict));
    let lost = if conflicted {
        watch.lost_within(LOSS_HEARD_WITHIN).await
    } else {
        watch.lost()
    };
    if let Some(reason) = lost {
        return Err(IngestError::Engine(
            StoreError::unavailable(format!(
                "the ingest lock was lost ({reason}): another ingest may run now, so this one stopped, \
                 releasing what it held; run the same command again to resume"
            ))
            .into(),
        ));
    }
    ran
}

/// How long a run that ends in a conflict waits to hear whether its lock
/// was lost: a few looks at the lock's session.
const LOSS_HEARD_WITHIN: Duration = Duration::from_secs(2);

fn is_conflict(error: &EngineError) -> bool {
    matches!(error, EngineError::Domain(DomainError::Conflict(_))) || error.is_store(ErrorKind::Conflict)
}
