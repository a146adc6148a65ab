//! The query layer on real databases: a media item's detail by id and by
//! path; operation, media, review, batch and batch-item listings paged to
//! their end with every filter, each compared with the same question
//! answered from whole tables; refusals of bad pages. Every scenario ends
//! with `verify`. `backend_tests!` runs each on SQLite and PostgreSQL.

use opledger_domain::kinds::legacy;
use opledger_domain::projections::{OperationRow, Row, BATCH_ITEMS_TABLE, CAPABILITY_STATES_TABLE, MEDIA_TABLE};
use opledger_domain::projections::{BATCHES_TABLE, OPERATIONS_TABLE, REVIEW_TABLE};
use opledger_domain::review::EntryState;
use opledger_domain::{BatchId, CapabilityStatus, DomainError, MediaId, OperationId, OperationStatus, Timestamp};
use opledger_engine::{
    encode_cursor, BatchRequest, ClaimRequest, CommandContext, Completion, Engine, EngineError, FixedClock,
    FixedJitter, Listing, MediaFilter, MediaRef, OpsFilter, PageRequest, SequentialIds, TaskClaim, TaskRequest,
    TaskTarget,
};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const T0: i64 = 1_700_000_000_000_000;

struct Lab<S: Store> {
    engine: Engine<S>,
    clock: Arc<FixedClock>,
    context: CommandContext,
}

async fn lab<B: Backend>(backend: &B) -> Lab<B::Store> {
    let store = backend.open().await;
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(T0)));
    let engine = Engine::with_clock(store, clock.clone(), Arc::new(SequentialIds::starting_at(1)))
        .with_jitter(Arc::new(FixedJitter(0)));
    engine.startup().await.unwrap();
    engine
        .declare(&CommandContext::actor("deploy"), legacy::declarations())
        .await
        .unwrap();
    Lab {
        engine,
        clock,
        context: CommandContext::actor("test"),
    }
}

impl<S: Store> Lab<S> {
    async fn request(&self, media: MediaId, kind: &str) -> OperationId {
        self.engine
            .request_task(
                &self.context,
                TaskRequest {
                    target: TaskTarget::Media(media),
                    kind: kind.into(),
                    inputs: json!({}),
                    priority: 0,
                },
            )
            .await
            .unwrap()
            .operation_id
    }

    async fn claim(&self, kinds: &[&str], worker: &str, limit: usize) -> Vec<TaskClaim> {
        self.engine
            .claim_tasks(
                &self.context,
                ClaimRequest {
                    kinds: kinds.iter().map(|kind| kind.to_string()).collect(),
                    worker: worker.into(),
                    lease_ms: 600_000,
                    limit,
                    principal: None,
                    versions: Default::default(),
                },
            )
            .await
            .unwrap()
    }

    async fn verify(&self) {
        let report = self.engine.verify().await.unwrap();
        assert!(report.is_identical(), "{}", report.render());
    }

    async fn operations(&self) -> Vec<OperationRow> {
        self.engine
            .store()
            .scan_table(&OPERATIONS_TABLE)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|row| match row {
                Row::Operation(operation) => Some(operation),
                _ => None,
            })
            .collect()
    }
}

/// Paths where byte order and language order differ (case, accents,
/// punctuation), under two folders and one lookalike.
const PATHS: [&str; 12] = [
    "/lib/a/one.png",
    "/lib/a/Two.png",
    "/lib/a/two.png",
    "/lib/a/été.png",
    "/lib/a-b/x.png",
    "/lib/a/sub/deep.png",
    "/lib/b/one.png",
    "/lib/b/Z.png",
    "/lib/ab.png",
    "/lib/a/ß.png",
    "/lib/A/upper.png",
    "/lib/b/two.png",
];

/// A library: items at [`PATHS`] (every third a video), each with a
/// metadata task, every other one a thumbnail too, at moving times (some
/// sharing one); a batch of perceptual hashes over six items, requested
/// at one instant; claims held by `worker-1`, and work by `worker-2`
/// completed, thumbnails with a file, two metadata tasks failed for good.
struct Library {
    media: Vec<MediaId>,
    batch: BatchId,
}

async fn library<S: Store>(lab: &Lab<S>) -> Library {
    let mut media = Vec::new();
    for (index, path) in PATHS.iter().enumerate() {
        let kind = if index % 3 == 2 { "video" } else { "image" };
        let id = lab
            .engine
            .register_media(
                &lab.context,
                path,
                kind,
                Some(format!("sha256:{index:064x}")),
                Some(100 + index as i64),
            )
            .await
            .unwrap();
        media.push(id);
        lab.request(id, "metadata").await;
        if index % 2 == 0 {
            lab.request(id, "thumbnail").await;
        }
        if index % 4 != 3 {
            lab.clock.advance_millis(1_000);
        }
    }
    let batch = lab
        .engine
        .create_batch(
            &lab.context,
            BatchRequest {
                name: "hashes".into(),
                media: media[2..8].to_vec(),
                kinds: vec!["perceptual_hash".into()],
                inputs: BTreeMap::new(),
                priority: 0,
            },
        )
        .await
        .unwrap()
        .batch
        .batch_id;
    lab.clock.advance_millis(1_000);
    lab.claim(&["perceptual_hash"], "worker-1", 3).await;
    for claim in lab.claim(&["thumbnail"], "worker-2", 4).await {
        let output = json!({"path": format!("thumbs/{}.png", claim.operation_id)});
        lab.engine
            .complete_task(&lab.context, &claim.fence(), Completion::Output(output))
            .await
            .unwrap();
    }
    for (index, claim) in lab.claim(&["metadata"], "worker-2", 5).await.iter().enumerate() {
        if index < 2 {
            lab.engine
                .fail_task(&lab.context, &claim.fence(), "decoder crashed", true)
                .await
                .unwrap();
        } else {
            lab.engine
                .complete_task(&lab.context, &claim.fence(), Completion::Output(json!({"ok": true})))
                .await
                .unwrap();
        }
    }
    Library { media, batch }
}

/// Every page of operations from the first, with `limit` rows a page.
async fn all_operations<S: Store>(engine: &Engine<S>, filter: &OpsFilter, limit: usize) -> Vec<OperationId> {
    let mut page = PageRequest::first(limit);
    let mut found = Vec::new();
    for _ in 0..1_000 {
        let answer = engine.list_operations(filter, &page).await.unwrap();
        assert!(answer.items.len() <= limit);
        found.extend(answer.items.iter().map(|item| item.operation_id));
        match answer.next {
            Some(next) => page.after = Some(next),
            None => return found,
        }
    }
    panic!("the listing never ended");
}

async fn all_media<S: Store>(engine: &Engine<S>, filter: &MediaFilter, limit: usize) -> Vec<MediaId> {
    let mut page = PageRequest::first(limit);
    let mut found = Vec::new();
    for _ in 0..1_000 {
        let answer = engine.list_media(filter, &page).await.unwrap();
        assert!(answer.items.len() <= limit);
        found.extend(answer.items.iter().map(|item| item.media_id));
        match answer.next {
            Some(next) => page.after = Some(next),
            None => return found,
        }
    }
    panic!("the listing never ended");
}

async fn operations_are_listed_newest_first_with_every_filter_exactly_as_whole_tables_answer<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    let library = library(&lab).await;
    let operations = lab.operations().await;
    let items: Vec<(BatchId, OperationId, i64)> = lab
        .engine
        .store()
        .scan_table(&BATCH_ITEMS_TABLE)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|row| match row {
            Row::BatchItem(item) => Some((item.batch_id, item.operation_id, item.position)),
            _ => None,
        })
        .collect();
    let in_batch: BTreeMap<OperationId, i64> = items
        .iter()
        .filter(|(batch, _, _)| *batch == library.batch)
        .map(|(_, operation, position)| (*operation, *position))
        .collect();
    let middle = Timestamp::from_micros(T0 + 3_000_000);
    let late = Timestamp::from_micros(T0 + 7_000_000);
    let filters = vec![
        OpsFilter::default(),
        OpsFilter {
            statuses: vec![OperationStatus::Queued],
            ..OpsFilter::default()
        },
        OpsFilter {
            statuses: vec![OperationStatus::FailedTerminal, OperationStatus::Succeeded],
            ..OpsFilter::default()
        },
        OpsFilter {
            kinds: vec!["thumbnail".into()],
            ..OpsFilter::default()
        },
        OpsFilter {
            kinds: vec!["metadata".into(), "perceptual_hash".into()],
            ..OpsFilter::default()
        },
        OpsFilter {
            kinds: vec!["metadata".into()],
            statuses: vec![OperationStatus::Queued],
            ..OpsFilter::default()
        },
        OpsFilter {
            media: Some(library.media[4]),
            ..OpsFilter::default()
        },
        OpsFilter {
            media: Some(library.media[4]),
            kinds: vec!["perceptual_hash".into()],
            ..OpsFilter::default()
        },
        OpsFilter {
            media: Some(library.media[4]),
            batch: Some(library.batch),
            ..OpsFilter::default()
        },
        OpsFilter {
            batch: Some(library.batch),
            ..OpsFilter::default()
        },
        OpsFilter {
            batch: Some(library.batch),
            statuses: vec![OperationStatus::Leased],
            ..OpsFilter::default()
        },
        OpsFilter {
            since: Some(middle),
            until: Some(late),
            ..OpsFilter::default()
        },
        OpsFilter {
            since: Some(middle),
            kinds: vec!["thumbnail".into()],
            ..OpsFilter::default()
        },
        OpsFilter {
            until: Some(middle),
            statuses: vec![OperationStatus::Succeeded],
            ..OpsFilter::default()
        },
        OpsFilter {
            worker: Some("worker-1".into()),
            ..OpsFilter::default()
        },
    ];
    for filter in &filters {
        let mut expected: Vec<&OperationRow> = operations
            .iter()
            .filter(|operation| {
                (filter.statuses.is_empty() || filter.statuses.contains(&operation.status))
                    && (filter.kinds.is_empty() || filter.kinds.contains(&operation.kind))
                    && filter.media.is_none_or(|media| operation.media_id == Some(media))
                    && filter
                        .batch
                        .is_none_or(|_| in_batch.contains_key(&operation.operation_id))
                    && filter.since.is_none_or(|since| operation.created_at >= since)
                    && filter.until.is_none_or(|until| operation.created_at < until)
                    && filter
                        .worker
                        .as_ref()
                        .is_none_or(|worker| operation.worker.as_ref() == Some(worker))
            })
            .collect();
        if filter.batch.is_some() && filter.media.is_none() {
            // A batch's operations: last item first.
            expected.sort_by_key(|operation| std::cmp::Reverse(in_batch[&operation.operation_id]));
        } else {
            expected.sort_by_key(|row| std::cmp::Reverse((row.created_at, row.operation_id)));
        }
        let expected: Vec<OperationId> = expected.iter().map(|operation| operation.operation_id).collect();
        assert!(
            !expected.is_empty() || filter.statuses == [OperationStatus::Leased],
            "every filter selects something: {filter:?}"
        );
        for limit in [1, 2, 5, 1_000] {
            assert_eq!(
                all_operations(&lab.engine, filter, limit).await,
                expected,
                "{filter:?}, pages of {limit}"
            );
        }
    }
    // Ties of creation time are broken by id, newest first.
    let all = all_operations(&lab.engine, &OpsFilter::default(), 3).await;
    assert_eq!(all.len(), operations.len());
    lab.verify().await;
}

async fn media_items_are_listed_by_path_bytes_with_kind_prefix_and_capability_filters<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    library(&lab).await;
    let store = lab.engine.store();
    let mut media: Vec<(String, MediaId, String)> = store
        .scan_table(&MEDIA_TABLE)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|row| match row {
            Row::Media(media) => Some((media.path, media.media_id, media.media_kind)),
            _ => None,
        })
        .collect();
    media.sort_by(|a, b| (a.0.as_bytes(), a.1).cmp(&(b.0.as_bytes(), b.1)));
    let capabilities: Vec<(MediaId, String, CapabilityStatus)> = store
        .scan_table(&CAPABILITY_STATES_TABLE)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|row| match row {
            Row::Capability(state) => Some((state.media_id, state.capability, state.status)),
            _ => None,
        })
        .collect();
    let has = |id: MediaId, capability: &str, statuses: &[CapabilityStatus]| {
        capabilities.iter().any(|(media, name, status)| {
            *media == id && name == capability && (statuses.is_empty() || statuses.contains(status))
        })
    };
    let filters = vec![
        MediaFilter::default(),
        MediaFilter {
            kind: Some("video".into()),
            ..MediaFilter::default()
        },
        MediaFilter {
            path_prefix: Some("/lib/a/".into()),
            ..MediaFilter::default()
        },
        MediaFilter {
            path_prefix: Some("/lib/a".into()),
            kind: Some("image".into()),
            ..MediaFilter::default()
        },
        MediaFilter {
            path_prefix: Some("/lib/".into()),
            ..MediaFilter::default()
        },
        MediaFilter {
            capability: Some("thumbnail".into()),
            ..MediaFilter::default()
        },
        MediaFilter {
            capability: Some("metadata".into()),
            capability_statuses: vec![CapabilityStatus::FailedTerminal],
            ..MediaFilter::default()
        },
        MediaFilter {
            capability: Some("metadata".into()),
            capability_statuses: vec![CapabilityStatus::Succeeded, CapabilityStatus::Queued],
            path_prefix: Some("/lib/a/".into()),
            kind: Some("image".into()),
        },
    ];
    for filter in &filters {
        let expected: Vec<MediaId> = media
            .iter()
            .filter(|(path, id, kind)| {
                filter.kind.as_ref().is_none_or(|wanted| wanted == kind)
                    && filter
                        .path_prefix
                        .as_ref()
                        .is_none_or(|prefix| path.starts_with(prefix.as_str()))
                    && filter
                        .capability
                        .as_ref()
                        .is_none_or(|capability| has(*id, capability, &filter.capability_statuses))
            })
            .map(|(_, id, _)| *id)
            .collect();
        assert!(!expected.is_empty(), "every filter selects something: {filter:?}");
        for limit in [1, 3, 1_000] {
            assert_eq!(
                all_media(&lab.engine, filter, limit).await,
                expected,
                "{filter:?}, pages of {limit}"
            );
        }
    }
    lab.verify().await;
}

async fn a_media_item_shows_its_capabilities_operations_batches_review_and_thumbnail_by_id_and_by_path<B: Backend>(
    backend: &B,
) {
    let lab = lab(backend).await;
    let library = library(&lab).await;
    let operations = lab.operations().await;
    // An item with a thumbnail written, in the batch, with work held.
    let thumbnailed = operations
        .iter()
        .find(|operation| {
            operation.kind == "thumbnail"
                && operation.status == OperationStatus::Succeeded
                && library.media[2..8].contains(&operation.media_id.unwrap())
        })
        .expect("a thumbnail in the batch succeeded");
    let media_id = thumbnailed.media_id.unwrap();
    let path = PATHS[library.media.iter().position(|id| *id == media_id).unwrap()];
    let by_id = lab.engine.media_detail(&MediaRef::Id(media_id)).await.unwrap();
    let by_path = lab.engine.media_detail(&MediaRef::Path(path.into())).await.unwrap();
    assert_eq!(by_id, by_path);
    assert_eq!(by_id.media.path, path);
    assert_eq!(by_id.media.media_id, media_id);
    assert_eq!(
        by_id.thumbnail,
        Some(format!("thumbs/{}.png", thumbnailed.operation_id)),
        "the thumbnail task's output"
    );
    let kinds: BTreeSet<&str> = by_id
        .capabilities
        .iter()
        .map(|capability| capability.capability.as_str())
        .collect();
    assert_eq!(kinds, BTreeSet::from(["metadata", "perceptual_hash", "thumbnail"]));
    let expected: Vec<OperationId> = {
        let mut own: Vec<&OperationRow> = operations
            .iter()
            .filter(|operation| operation.media_id == Some(media_id))
            .collect();
        own.sort_by_key(|row| std::cmp::Reverse((row.created_at, row.operation_id)));
        own.iter().map(|operation| operation.operation_id).collect()
    };
    assert_eq!(
        by_id
            .operations
            .iter()
            .map(|operation| operation.operation_id)
            .collect::<Vec<_>>(),
        expected
    );
    assert_eq!(by_id.batches.len(), 1);
    assert_eq!(by_id.batches[0].batch_id, library.batch);
    assert_eq!(by_id.batches[0].operation_ids.len(), 1);

    // An item whose metadata failed for good: its open review entry.
    let failed = operations
        .iter()
        .find(|operation| operation.status == OperationStatus::FailedTerminal)
        .unwrap();
    let detail = lab
        .engine
        .media_detail(&MediaRef::Id(failed.media_id.unwrap()))
        .await
        .unwrap();
    assert_eq!(detail.review.len(), 1);
    assert_eq!(detail.review[0].operation_id, failed.operation_id);
    assert_eq!(detail.review[0].state, EntryState::Open);
    let metadata = detail
        .capabilities
        .iter()
        .find(|capability| capability.capability == "metadata")
        .unwrap();
    assert_eq!(metadata.status, CapabilityStatus::FailedTerminal);
    assert_eq!(metadata.reason.as_deref(), Some("decoder crashed"));

    // Two items at one path: the latest registered, naming the other.
    lab.clock.advance_millis(5_000);
    let again = lab
        .engine
        .register_media(&lab.context, path, "image", None, None)
        .await
        .unwrap();
    let latest = lab.engine.media_detail(&MediaRef::Path(path.into())).await.unwrap();
    assert_eq!(latest.media.media_id, again);
    assert_eq!(latest.others_at_path, vec![media_id]);

    // Unknown items are not found, by id and by path.
    for unknown in [
        MediaRef::Id(MediaId(uuid::Uuid::from_u128(u128::MAX))),
        MediaRef::Path("/nowhere".into()),
    ] {
        let error = lab.engine.media_detail(&unknown).await.unwrap_err();
        assert!(
            matches!(error, EngineError::Domain(DomainError::NotFound { .. })),
            "{error}"
        );
    }
    lab.verify().await;
}

async fn review_entries_batches_and_batch_items_page_through_every_row_once<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    let library = library(&lab).await;
    // More batches, so their listing has pages.
    for name in ["b1", "b2", "b3"] {
        lab.clock.advance_millis(10);
        lab.engine
            .create_batch(
                &lab.context,
                BatchRequest {
                    name: name.into(),
                    media: library.media[..2].to_vec(),
                    kinds: vec!["metadata".into()],
                    inputs: BTreeMap::new(),
                    priority: 0,
                },
            )
            .await
            .unwrap();
    }
    let store = lab.engine.store();

    let mut open: Vec<i64> = store
        .scan_table(&REVIEW_TABLE)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|row| match row {
            Row::Review(entry) if entry.state == EntryState::Open => Some(entry.entry_id),
            _ => None,
        })
        .collect();
    open.sort_unstable();
    assert_eq!(open.len(), 2);
    let mut page = PageRequest::first(1);
    let mut listed = Vec::new();
    loop {
        let answer = lab.engine.review_page(&page).await.unwrap();
        for view in &answer.items {
            listed.push(view.entry.entry_id);
            assert!(
                view.path.as_deref().is_some_and(|path| PATHS.contains(&path)),
                "{view:?}"
            );
        }
        match answer.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    assert_eq!(listed, open);

    let mut batches: Vec<(Timestamp, BatchId, bool)> = store
        .scan_table(&BATCHES_TABLE)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|row| match row {
            Row::Batch(batch) => Some((
                batch.created_at,
                batch.batch_id,
                opledger_domain::batches::is_active(&batch.progress),
            )),
            _ => None,
        })
        .collect();
    batches.sort_by_key(|row| std::cmp::Reverse((row.0, row.1)));
    for active in [false, true] {
        let expected: Vec<BatchId> = batches
            .iter()
            .filter(|(_, _, is_active)| !active || *is_active)
            .map(|(_, id, _)| *id)
            .collect();
        let mut page = PageRequest::first(2);
        let mut listed = Vec::new();
        loop {
            let answer = lab.engine.batch_list(active, &page).await.unwrap();
            listed.extend(answer.items.iter().map(|batch| batch.batch_id));
            match answer.next {
                Some(next) => page.after = Some(next),
                None => break,
            }
        }
        assert_eq!(listed, expected, "active only: {active}");
    }

    let mut page = PageRequest::first(4);
    let mut positions = Vec::new();
    loop {
        let answer = lab.engine.batch_page(library.batch, &page).await.unwrap();
        assert_eq!(answer.batch.batch_id, library.batch);
        for view in &answer.items.items {
            positions.push(view.item.position);
            let item_media = library.media[2 + view.item.position as usize];
            let expected_path = PATHS[library.media.iter().position(|id| *id == item_media).unwrap()];
            assert_eq!(view.path.as_deref(), Some(expected_path), "the item's media path");
        }
        match answer.items.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    assert_eq!(positions, (0..6).collect::<Vec<i64>>());
    lab.verify().await;
}

async fn bad_pages_and_filters_are_refused_and_unknown_batches_and_items_not_found<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    library(&lab).await;
    let invalid = |error: EngineError| matches!(error, EngineError::Domain(DomainError::InvalidInput(_)));
    let filter = OpsFilter::default();
    for limit in [0, 1_001] {
        let error = lab
            .engine
            .list_operations(&filter, &PageRequest::first(limit))
            .await
            .unwrap_err();
        assert!(invalid(error.clone()), "{error}");
    }
    let media_cursor = encode_cursor(
        Listing::Media,
        &[
            opledger_domain::projections::Cell::Text("/x".into()),
            opledger_domain::projections::Cell::Uuid(uuid::Uuid::nil()),
        ],
    );
    for after in ["%%%".to_string(), "W10".to_string(), media_cursor, "x".repeat(10_000)] {
        let page = PageRequest {
            limit: 5,
            after: Some(after),
        };
        let error = lab.engine.list_operations(&filter, &page).await.unwrap_err();
        assert!(invalid(error.clone()), "{error}");
        assert!(error.to_string().len() < 300, "a short message: {error}");
        assert!(error.to_string().contains("after"), "names the cursor: {error}");
    }
    let backwards = OpsFilter {
        since: Some(Timestamp::from_micros(T0 + 10)),
        until: Some(Timestamp::from_micros(T0)),
        ..OpsFilter::default()
    };
    assert!(invalid(
        lab.engine
            .list_operations(&backwards, &PageRequest::default())
            .await
            .unwrap_err()
    ));
    let orphan = MediaFilter {
        capability_statuses: vec![CapabilityStatus::Stale],
        ..MediaFilter::default()
    };
    assert!(invalid(
        lab.engine
            .list_media(&orphan, &PageRequest::default())
            .await
            .unwrap_err()
    ));
    let not_found = |error: EngineError| matches!(error, EngineError::Domain(DomainError::NotFound { .. }));
    let nobody = uuid::Uuid::from_u128(u128::MAX);
    for filter in [
        OpsFilter {
            batch: Some(BatchId(nobody)),
            ..OpsFilter::default()
        },
        OpsFilter {
            media: Some(MediaId(nobody)),
            ..OpsFilter::default()
        },
    ] {
        let error = lab
            .engine
            .list_operations(&filter, &PageRequest::default())
            .await
            .unwrap_err();
        assert!(not_found(error.clone()), "{error}");
    }
    assert!(not_found(
        lab.engine
            .batch_page(BatchId(nobody), &PageRequest::default())
            .await
            .unwrap_err()
    ));
    lab.verify().await;
}

backend_tests!(
    operations_are_listed_newest_first_with_every_filter_exactly_as_whole_tables_answer,
    media_items_are_listed_by_path_bytes_with_kind_prefix_and_capability_filters,
    a_media_item_shows_its_capabilities_operations_batches_review_and_thumbnail_by_id_and_by_path,
    review_entries_batches_and_batch_items_page_through_every_row_once,
    bad_pages_and_filters_are_refused_and_unknown_batches_and_items_not_found
);
