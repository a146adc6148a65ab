//! The second step of a run: start the ingestions of new and changed files
//! and take over those a dead run left, record the files that are gone,
//! and create the batch over every file of the folder.

use crate::discover::Classified;
use crate::pipeline::{Run, CHUNK};
use crate::IngestError;
use opledger_domain::events::BatchItemSpec;
use opledger_domain::BatchId;
use opledger_engine::{Engine, IngestionClaim};
use opledger_store::Store;

/// How long the run's ingestions are recorded as held. The run holds them
/// for as long as it holds the ingest lock; the lease only records that
/// (the lock, not the lease, proves the run alive).
const HELD_MS: i64 = 86_400_000;

/// What starting the run's ingestions did.
pub(crate) struct Begun {
    /// The ingestions this run holds: new ones, then those taken over.
    pub claims: Vec<IngestionClaim>,
    pub batch_id: Option<BatchId>,
    /// Operations created: new ingestions, and the records of gone files.
    pub operations_created: usize,
    /// Files recorded as gone.
    pub missing: usize,
}

/// Starts the run's ingestions, records the gone files, and creates the
/// batch over the folder (its unchanged files settled at once as skipped).
pub(crate) async fn begin<S: Store>(
    engine: &Engine<S>,
    run: &Run,
    batch_name: Option<&str>,
    classified: Classified,
) -> Result<Begun, IngestError> {
    let Classified {
        fresh,
        resume,
        unchanged,
        gone,
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
    let missing_count = missing.len();
    let mut items: Vec<BatchItemSpec> = claims
        .iter()
        .map(|claim| BatchItemSpec {
            operation_id: claim.operation_id,
            label: claim.path.clone(),
        })
        .collect();
    items.extend(unchanged);
    items.extend(missing);
    let mut batch_id = None;
    if !items.is_empty() {
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
        operations_created: created + missing_count,
        missing: missing_count,
    })
}
