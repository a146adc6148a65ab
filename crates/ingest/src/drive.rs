//! The fourth step of a run: move every held file through its stages
//! (settling, hashing, parsing, registered), request its image tasks, and
//! finish each file once its tasks have settled; or, once a stop is asked
//! for, read no more and hand back what is left.

use crate::discover::observe;
use crate::finish::{finish_settled, SETTLE_WINDOW};
use crate::patience::patiently;
use crate::run::{chunks, InFlight, CHUNK};
use crate::tools::Tools;
use crate::workers::KnownPaths;
use crate::{task_kinds_for, IngestError, IngestProgress, StopSignal};
use futures::StreamExt;
use opledger_domain::{IngestionStage, OperationId};
use opledger_engine::{CommandContext, Engine, FileObservation, IngestionClaim, Registration};
use opledger_media::{
    classify_file, hash_file, read_classified_metadata, text_path, MediaError, MediaKind, Settler, IMAGE_KINDS,
    NO_FFMPEG, NO_HEIF_SUPPORT, VIDEO_KINDS,
};
use opledger_store::Store;
use opledger_worker::ComputeThreads;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use tokio::sync::watch;

/// Files registered before the first tasks are requested: few, so the image
/// threads start on tasks while the next, larger chunks are read.
const FIRST_CHUNK: usize = 32;

/// How a run reads files: waiting for those still being written, then
/// hashing and parsing on the image threads.
pub(crate) struct FileReading {
    pub settler: Settler,
    pub compute: ComputeThreads,
    /// How long a write may fail on storage trouble (see `patience`).
    pub give_up_after: Duration,
    pub tools: Tools,
}

/// What the run's files have come to so far.
pub(crate) struct Tally {
    /// Files settled: unchanged, finished, or failed.
    pub settled: usize,
    /// Of those, files that cannot be read or whose tasks failed for good.
    pub failed: usize,
    /// Task operations created by registration.
    pub tasks_created: usize,
}

/// Where driving the files ended.
pub(crate) struct Driven {
    pub tally: Tally,
    /// Registered files whose tasks had not all settled when a stop was
    /// asked for (empty when the run went to its end).
    pub in_flight: Vec<InFlight>,
    /// Held files not read when a stop was asked for.
    pub unread: Vec<IngestionClaim>,
}

/// Whether a file is known to be complete on disk when it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Readiness {
    /// Settled at a glance (or registered by an earlier run): read at once.
    Settled,
    /// Still being written: waited for until it stops changing.
    BeingWritten,
}

/// Moves every claimed file through its stages, runs until every file's
/// tasks have settled, and finishes each ingestion. `settled` counts the
/// files settled before (the unchanged ones). A stop ends it early, with
/// the files not finished in the answer.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn drive<S: Store>(
    engine: &Engine<S>,
    context: &CommandContext,
    reading: &FileReading,
    claims: Vec<IngestionClaim>,
    settled: usize,
    progress: &dyn IngestProgress,
    known_paths: &KnownPaths,
    stop: &StopSignal,
    mut workers_ended: watch::Receiver<bool>,
) -> Result<Driven, IngestError> {
    let sorted = sort_claims(claims, &reading.settler).await;
    let mut files = Files {
        engine,
        context,
        reading,
        known_paths,
        stop,
        in_flight: Vec::new(),
        unread: Vec::new(),
        tally: Tally {
            settled,
            failed: 0,
            tasks_created: 0,
        },
    };
    // Files settled at a glance go first, a chunk at a time; files still
    // being written are watched until they settle, after the others.
    for chunk in growing_chunks(sorted.ready, FIRST_CHUNK, CHUNK) {
        files.register(chunk, Readiness::Settled).await?;
        files.finish_settled().await?;
        progress.settled(files.tally.settled, files.tally.failed);
    }
    tracing::info!(
        in_flight = files.in_flight.len(),
        slow = sorted.slow.len(),
        "files settled at a glance registered"
    );
    files.register(sorted.slow, Readiness::BeingWritten).await?;
    // Resumed files registered by a run that died: find their tasks.
    files.register(sorted.registered, Readiness::Settled).await?;
    while !files.in_flight.is_empty() && !stop.is_requested() {
        if *workers_ended.borrow() {
            // The workers gave up (storage trouble): no task will settle.
            // The files in flight are left to the next run; the workers'
            // error is the run's answer.
            break;
        }
        files.finish_settled().await?;
        progress.settled(files.tally.settled, files.tally.failed);
        if !files.in_flight.is_empty() {
            // The last files are polled more often: the run ends when they
            // settle, and nothing else is left to do meanwhile.
            let poll = if files.in_flight.len() <= SETTLE_WINDOW {
                20
            } else {
                100
            };
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(poll)) => {}
                () = stop.requested() => {}
                _ = workers_ended.changed() => {}
            }
        }
    }
    Ok(Driven {
        tally: files.tally,
        in_flight: files.in_flight,
        unread: files.unread,
    })
}

/// The held files by what is left to do for each.
struct Sorted {
    /// Settled at a glance: read now.
    ready: Vec<InFlight>,
    /// Still being written (or not readable yet): watched.
    slow: Vec<InFlight>,
    /// Registered by a run that died: only their tasks are left.
    registered: Vec<InFlight>,
}

async fn sort_claims(claims: Vec<IngestionClaim>, settler: &Settler) -> Sorted {
    let mut sorted = Sorted {
        ready: Vec::new(),
        slow: Vec::new(),
        registered: Vec::new(),
    };
    for claim in claims {
        let path = text_path(&claim.path);
        let file = InFlight {
            claim,
            path,
            media_id: None,
            tasks: Vec::new(),
        };
        if file.claim.stage.rank() >= IngestionStage::Registered.rank() {
            sorted.registered.push(file);
            continue;
        }
        match settler.check(&file.path).await {
            Ok(Some(_)) => sorted.ready.push(file),
            _ => sorted.slow.push(file),
        }
    }
    sorted
}

/// The files of a run between registration and their end, and the tally.
struct Files<'a, S: Store> {
    engine: &'a Engine<S>,
    context: &'a CommandContext,
    reading: &'a FileReading,
    known_paths: &'a KnownPaths,
    stop: &'a StopSignal,
    /// Registered files whose tasks have not all settled, oldest first.
    in_flight: Vec<InFlight>,
    /// Held files left unread because a stop was asked for.
    unread: Vec<IngestionClaim>,
    tally: Tally,
}

impl<S: Store> Files<'_, S> {
    /// Hashing, parsing and registration of a group of files, counted:
    /// stage `hashing` in one transaction, the reads on the compute
    /// threads, then `parsing`, `registered`, the media items and their
    /// task requests in another. Files that cannot be read end their
    /// ingestion `failed_terminal` with the reason (settled, failed); the
    /// others are in flight until their tasks settle. Once a stop is asked
    /// for, files not read yet are left unread.
    async fn register(&mut self, files: Vec<InFlight>, readiness: Readiness) -> Result<(), IngestError> {
        if files.is_empty() {
            return Ok(());
        }
        if self.stop.is_requested() {
            self.unread.extend(files.into_iter().map(|file| file.claim));
            return Ok(());
        }
        let (engine, context) = (self.engine, self.context);
        if readiness == Readiness::BeingWritten {
            // The stage a file waits in while it is still being written.
            let claims: Vec<IngestionClaim> = files.iter().map(|file| file.claim.clone()).collect();
            patiently(self.reading.give_up_after, "record files settling", || {
                engine.ingestion_stage(context, &claims, IngestionStage::Settling)
            })
            .await?;
        }
        let read = read_files(files, self.reading, readiness, self.stop).await;
        let mut registrations = Vec::new();
        let mut unreadable = Vec::new();
        let mut hashed = Vec::new();
        let mut by_operation: BTreeMap<OperationId, InFlight> = BTreeMap::new();
        for ReadFile { file, result } in read {
            match result {
                Reading::Read(found) => {
                    hashed.push(file.claim.clone());
                    registrations.push(Registration {
                        claim: file.claim.clone(),
                        content_digest: found.digest,
                        byte_size: found.byte_size,
                        media_kind: found.media_kind,
                        parsed: found.parsed,
                        observed: Some(found.observed),
                        blocked: found.blocked,
                    });
                    by_operation.insert(file.claim.operation_id, file);
                }
                Reading::Unreadable(reason) => {
                    hashed.push(file.claim.clone());
                    unreadable.push((file.claim.clone(), Err(reason)));
                }
                Reading::Stopped => self.unread.push(file.claim),
            }
        }
        let patience = self.reading.give_up_after;
        if !hashed.is_empty() {
            patiently(patience, "record files hashing", || {
                engine.ingestion_stage(context, &hashed, IngestionStage::Hashing)
            })
            .await?;
        }
        self.tally.settled += unreadable.len();
        self.tally.failed += unreadable.len();
        if !unreadable.is_empty() {
            patiently(patience, "finish unreadable files", || {
                engine.finish_ingestions(context, unreadable.clone())
            })
            .await?;
        }
        // Files of one media kind get the same kinds: one command per kind
        // of file in a chunk (a photo library's chunks hold one).
        let mut by_kinds: BTreeMap<&'static [&'static str], Vec<Registration>> = BTreeMap::new();
        for registration in registrations {
            by_kinds
                .entry(task_kinds_for(&registration.media_kind))
                .or_default()
                .push(registration);
        }
        for (kinds, chunk) in by_kinds
            .into_iter()
            .flat_map(|(kinds, group)| chunks(group, CHUNK).into_iter().map(move |chunk| (kinds, chunk)))
        {
            let registered = patiently(patience, "register files", || {
                engine.register_ingestions(context, chunk.clone(), kinds)
            })
            .await?;
            for outcome in registered {
                self.tally.tasks_created += outcome.tasks_created;
                if let Some(mut file) = by_operation.remove(&outcome.operation_id) {
                    file.media_id = Some(outcome.media_id);
                    if let Ok(mut paths) = self.known_paths.write() {
                        paths.insert(outcome.media_id, file.path.clone());
                    }
                    file.tasks = outcome.task_operations;
                    self.in_flight.push(file);
                }
            }
        }
        Ok(())
    }

    /// Finishes the files in flight whose tasks have all settled, counted.
    async fn finish_settled(&mut self) -> Result<(), IngestError> {
        let finished = finish_settled(
            self.engine,
            self.context,
            &mut self.in_flight,
            self.reading.give_up_after,
        )
        .await?;
        self.tally.settled += finished.done;
        self.tally.failed += finished.failed;
        Ok(())
    }
}

/// A file and what reading it came to.
struct ReadFile {
    file: InFlight,
    result: Reading,
}

enum Reading {
    Read(FileRead),
    /// It could not be read: why, without its path (the ingestion names it).
    Unreadable(String),
    /// A stop was asked for before it was read.
    Stopped,
}

/// What reading a file found.
struct FileRead {
    /// `sha256:<hex>`.
    digest: String,
    byte_size: i64,
    /// What the content says it is: `image`, `video`, `audio`, `other`.
    media_kind: String,
    /// The kinds that cannot run on it here, with why.
    blocked: BTreeMap<String, String>,
    /// What the header says (format and dimensions, or the decoder's error).
    parsed: Value,
    /// The file's size and modification time as it was read.
    observed: FileObservation,
}

/// Reads every file on the compute threads, all queued at once, so the
/// threads go from one file to the next without waiting; a file still
/// being written is first waited for. Once a stop is asked for, files not
/// started are not read, and neither are files still being waited for; a
/// stop *at once* leaves the reads under way too.
async fn read_files(
    files: Vec<InFlight>,
    reading: &FileReading,
    readiness: Readiness,
    stop: &StopSignal,
) -> Vec<ReadFile> {
    let queued = files.len();
    futures::stream::iter(files)
        .map(|file| {
            let settler = reading.settler.clone();
            let compute = reading.compute.clone();
            async move {
                let path = file.path.clone();
                let result = async {
                    if stop.is_requested() {
                        return Reading::Stopped;
                    }
                    if readiness == Readiness::BeingWritten {
                        tokio::select! {
                            settled = settler.settle(&path) => {
                                if let Err(error) = settled {
                                    return Reading::Unreadable(format!("the file did not settle: {error}"));
                                }
                            }
                            () = stop.requested() => return Reading::Stopped,
                        }
                    }
                    let tools = reading.tools;
                    let read = compute.run(move || read_file(&path, tools));
                    tokio::select! {
                        read = read => match read {
                            Ok(Ok(found)) => Reading::Read(found),
                            Ok(Err(reason)) => Reading::Unreadable(reason),
                            Err(error) => Reading::Unreadable(format!("reading did not finish: {error}")),
                        },
                        () = stop.requested_now() => Reading::Stopped,
                    }
                }
                .await;
                ReadFile { file, result }
            }
        })
        .buffer_unordered(queued)
        .collect()
        .await
}

/// Reads a file once: its size and modification time, its content digest,
/// what its content says it is, and for an image what its header says.
fn read_file(path: &Path, tools: Tools) -> Result<FileRead, String> {
    let unreadable = |error: MediaError| match error {
        MediaError::Io { action, source, .. } => format!("cannot read the file ({action} it): {source}"),
        other => format!("cannot read the file: {other}"),
    };
    let metadata = std::fs::metadata(path).map_err(|error| format!("cannot read the file: {error}"))?;
    let observed = observe(path, &metadata);
    let hash = hash_file(path).map_err(unreadable)?;
    let classified = classify_file(path).map_err(unreadable)?;
    let unavailable = |kinds: &[&str], reason: &str| -> BTreeMap<String, String> {
        kinds
            .iter()
            .map(|kind| (kind.to_string(), reason.to_string()))
            .collect()
    };
    let (parsed, blocked) = match classified.kind {
        MediaKind::Image if classified.needs_heif() && !tools.heif => (
            json!({"format": classified.format}),
            unavailable(IMAGE_KINDS, NO_HEIF_SUPPORT),
        ),
        MediaKind::Image => match read_classified_metadata(path, &classified) {
            Ok(metadata) => (
                json!({"format": metadata.format, "width": metadata.width, "height": metadata.height}),
                BTreeMap::new(),
            ),
            Err(error) => (json!({"error": error.to_string()}), BTreeMap::new()),
        },
        MediaKind::Video if !tools.ffmpeg => (
            json!({"format": classified.format}),
            unavailable(VIDEO_KINDS, NO_FFMPEG),
        ),
        _ => (json!({"format": classified.format}), BTreeMap::new()),
    };
    Ok(FileRead {
        digest: hash.digest(),
        byte_size: i64::try_from(hash.byte_size).unwrap_or(i64::MAX),
        media_kind: classified.kind.as_str().to_string(),
        blocked,
        parsed,
        observed,
    })
}

/// Chunks of `first` items, then twice as many each time up to `size`.
fn growing_chunks<T>(items: Vec<T>, first: usize, size: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut next = first.clamp(1, size.max(1));
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        out.push(items.by_ref().take(next).collect());
        next = (next * 2).min(size.max(1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_chunks_start_small_and_double_up_to_the_chunk_size() {
        let sizes: Vec<usize> = growing_chunks((0..1000).collect::<Vec<_>>(), 32, 250)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(sizes, vec![32, 64, 128, 250, 250, 250, 26]);
        let flattened: Vec<i32> = growing_chunks((0..1000).collect::<Vec<_>>(), 32, 250)
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(flattened, (0..1000).collect::<Vec<_>>(), "every file once, in order");
        assert!(growing_chunks(Vec::<i32>::new(), 32, 250).is_empty());
    }

    fn blocked_reading(name: &str, bytes: &[u8], tools: Tools) -> (String, BTreeMap<String, String>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let read = read_file(&path, tools).expect("the file reads");
        (read.media_kind, read.blocked)
    }

    /// CI builds with the `heif` feature, so the ingest tests see HEIF
    /// decoded; what a build without it does is decided here.
    #[test]
    fn a_heif_photo_in_a_build_without_heif_has_its_image_kinds_blocked_saying_why() {
        let heic = b"\0\0\0\x18ftypheic\0\0\0\0mif1heic";
        let without = Tools {
            ffmpeg: true,
            heif: false,
        };
        let (media_kind, blocked) = blocked_reading("IMG_0001.HEIC", heic, without);
        assert_eq!(media_kind, "image");
        let expected: BTreeMap<String, String> = IMAGE_KINDS
            .iter()
            .map(|kind| (kind.to_string(), NO_HEIF_SUPPORT.to_string()))
            .collect();
        assert_eq!(blocked, expected);
        let with = Tools { heif: true, ..without };
        assert!(
            blocked_reading("IMG_0001.HEIC", heic, with).1.is_empty(),
            "a build that decodes HEIF runs the kinds (and fails them if the file is no photo)"
        );
    }

    #[test]
    fn a_video_without_ffmpeg_has_its_video_kinds_blocked_saying_why() {
        let mp4 = b"\0\0\0\x18ftypisom\0\0\0\0isommp41";
        let without = Tools {
            ffmpeg: false,
            heif: true,
        };
        let (media_kind, blocked) = blocked_reading("clip.mp4", mp4, without);
        assert_eq!(media_kind, "video");
        let expected: BTreeMap<String, String> = VIDEO_KINDS
            .iter()
            .map(|kind| (kind.to_string(), NO_FFMPEG.to_string()))
            .collect();
        assert_eq!(blocked, expected);
        let with = Tools {
            ffmpeg: true,
            ..without
        };
        assert!(blocked_reading("clip.mp4", mp4, with).1.is_empty());
    }
}
