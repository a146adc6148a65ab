//! Scratch copies: a copy that writes behind still answers loads with
//! every write before them, and reports a refused write.

use crate::fixtures::{media, media_row, state, upsert};
use crate::Harness;
use opledger_domain::ids::MediaId;
use opledger_domain::projections::{Row, RowChange, MEDIA_TABLE};
use opledger_domain::status::OperationStatus;
use opledger_domain::tasks::TargetType;
use opledger_store::{ErrorKind, RowTarget, ScratchTarget, Store};

/// A scratch copy may write behind (`ScratchTarget::commit_chunk`), but a
/// load must still see every row written before it, deletions too, with
/// commits in between or not: replay reloads rows it dropped from its cache.
pub async fn scratch_loads_see_every_row_written_before_them<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let mut scratch = store.open_scratch().await.expect("open scratch");
    let items: Vec<MediaId> = (1..=50).map(media).collect();
    let key = |item: &MediaId| Row::Media(media_row(*item)).key().key.to_string();
    for round in 0..20 {
        // Each round rewrites every row with a new path, then deletes one.
        let changes: Vec<RowChange> = items
            .iter()
            .map(|item| {
                let mut row = media_row(*item);
                row.path = format!("/round-{round}/{}", item.0);
                upsert(Row::Media(row))
            })
            .collect();
        scratch.write_rows(&changes).await.expect("write");
        let gone = items[round];
        scratch
            .write_rows(&[RowChange::delete(Row::Media(media_row(gone)).key())])
            .await
            .expect("delete");
        if round % 2 == 0 {
            scratch.commit_chunk().await.expect("commit");
        }
        let keys: Vec<String> = items.iter().map(key).collect();
        let loaded = scratch.load_rows(&MEDIA_TABLE, &keys).await.expect("load");
        assert_eq!(loaded.len(), items.len() - 1, "round {round}");
        for row in loaded {
            let Row::Media(row) = row else {
                panic!("not a media row: {row:?}")
            };
            assert_ne!(row.media_id, gone, "round {round}: a deleted row came back");
            assert!(
                row.path.starts_with(&format!("/round-{round}/")),
                "round {round}: {}",
                row.path
            );
        }
    }
    scratch.flush().await.expect("flush");
    scratch.discard().await.expect("discard");
}

/// A write the scratch copy's database refuses fails the replay: if
/// `write_rows` returned before writing, the failure is the answer of the
/// next call, and `flush` never reports success after it.
pub async fn a_scratch_write_the_database_refuses_is_reported_by_a_later_call_at_the_latest<H: Harness>(harness: &H) {
    let store = harness.open().await;
    let mut scratch = store.open_scratch().await.expect("open scratch");
    let item = media(1);
    scratch
        .write_rows(&[upsert(Row::Media(media_row(item)))])
        .await
        .expect("write the media item");
    // A claimed status without a claim: the CHECK constraint refuses it.
    let mut refused = state(1, TargetType::Media, item.0, "metadata", OperationStatus::Queued, 0, 0);
    refused.status = OperationStatus::Leased;
    let written = scratch.write_rows(&[upsert(Row::ProcessingState(refused))]).await;
    let error = match written {
        Err(error) => error,
        Ok(()) => {
            // Written behind: the next call answers with the failure.
            let next = scratch.commit_chunk().await;
            let then = scratch.flush().await;
            match (next, then) {
                (Err(error), _) | (Ok(()), Err(error)) => error,
                (Ok(()), Ok(())) => panic!("a refused scratch write was never reported"),
            }
        }
    };
    assert_eq!(error.kind, ErrorKind::Constraint, "{error}");
    let _ = scratch.discard().await;
}
