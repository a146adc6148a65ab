//! The second step of a run: start the ingestions of new and changed files
//! and take over those an earlier run left or that can be retried, record
//! the files that are gone and the folders that cannot be read, and create
//! the batch over every file of the folder (none when there is nothing to
//! do).

use crate::discover::Classified;
use crate::run::{Run, CHUNK};
use crate::IngestError;
use opledger_domain::events::BatchItemSpec;
use opledger_domain::BatchId;
use opledger_engine::{Engine, IngestionClaim};
use opledger_store::Store;
use serde_json::json;

/// How long the run's ingestions are recorded as held. The run holds them
/// for as long as it holds the ingest lock; the lease only records that
/// (the lock, not the lease, proves the run alive).
const HELD_MS: i64 = 86_400_000;

/// What starting the run's ingestions did.
pub(crate) struct Begun {
    /// The ingestions this run holds: new ones, then those taken over.
    pub claims: Vec<IngestionClaim>,
    pub batch_id: Option<BatchId>,
    /// Operations created: new ingestions, and the records of gone files
    /// and unreadable folders.
    pub operations_created: usize,
    /// Files recorded as gone.
    pub missing: usize,
    /// Folders recorded as unreadable.
    pub unreadable_folders: usize,
}

/// Starts the run's ingestions, records the gone files and unreadable
/// folders, and creates the batch over the folder (its unchanged files
/// settled at once as skipped) when the run has anything to do.
pub(crate) async fn begin<S: Store>(
    engine: &Engine<S>,
    run: &Run<S>,
    batch_name: Option<&str>,
    classified: Classified,
) -> Result<Begun, IngestError> {
    let Classified {
        fresh,
        resume,
        unchanged,
        gone,
        unreadable,
        readable_again,
        ..
    } = classified;
    let mut claims = Vec::new();
    for chunk in fresh.chunks(CHUNK) {
        claims.extend(
            engine
                .begin_ingestions(&run.context, &run.worker, HELD_MS, chunk.to_vec(), Vec::new())
                .await?,
        );
    }
    let created = claims.len();
    for chunk in resume.chunks(CHUNK) {
        claims.extend(
            engine
                .begin_ingestions(&run.context, &run.worker, HELD_MS, Vec::new(), chunk.to_vec())
                .await?,
        );
    }
    let mut missing = Vec::new();
    for chunk in gone.chunks(CHUNK) {
        let recorded = engine.confirm_missing_files(&run.context, chunk.to_vec()).await?;
        for (operation_id, file) in recorded.into_iter().zip(chunk) {
            missing.push(BatchItemSpec {
                operation_id,
                label: file.path.clone(),
            });
        }
    }
    // A folder that cannot be read is an ingestion of its path that fails
    // with the reason (a review entry, like a file that cannot be read).
    let mut folders = Vec::new();
    for chunk in unreadable.chunks(CHUNK) {
        let observations = chunk.iter().map(|(folder, _)| folder.clone()).collect();
        let held = engine
            .begin_ingestions(&run.context, &run.worker, HELD_MS, observations, Vec::new())
            .await?;
        let outcomes = held
            .into_iter()
            .zip(chunk)
            .map(|(claim, (_, reason))| (claim, Err(reason.clone())))
            .collect::<Vec<_>>();
        folders.extend(outcomes.iter().map(|(claim, _)| BatchItemSpec {
            operation_id: claim.operation_id,
            label: claim.path.clone(),
        }));
        engine.finish_ingestions(&run.context, outcomes).await?;
    }
    // A folder recorded as unreadable that can be read again: its failure
    // is closed (reopened, and finished), its files are ingested as files.
    for chunk in readable_again.chunks(CHUNK) {
        let held = engine
            .begin_ingestions(&run.context, &run.worker, HELD_MS, Vec::new(), chunk.to_vec())
            .await?;
        let outcomes = held
            .into_iter()
            .map(|claim| (claim, Ok(json!({"folder": "readable again"}))))
            .collect();
        engine.finish_ingestions(&run.context, outcomes).await?;
    }
    let (missing_count, folder_count) = (missing.len(), folders.len());
    let mut items: Vec<BatchItemSpec> = claims
        .iter()
        .map(|claim| BatchItemSpec {
            operation_id: claim.operation_id,
            label: claim.path.clone(),
        })
        .collect();
    // A run with nothing to do (every file unchanged) leaves no batch.
    let has_work = !items.is_empty() || missing_count > 0 || folder_count > 0;
    items.extend(unchanged);
    items.extend(missing);
    items.extend(folders);
    let mut batch_id = None;
    if has_work {
        let id = BatchId(engine.ids().next());
        let name = batch_name.map_or_else(|| format!("ingest {}", run.root.display()), str::to_string);
        engine
            .create_batch_over(&run.context, id, &name, "ingestion", items, true)
            .await?;
        batch_id = Some(id);
    }
    Ok(Begun {
        claims,
        batch_id,
        operations_created: created + missing_count + folder_count,
        missing: missing_count,
        unreadable_folders: folder_count,
    })
}
