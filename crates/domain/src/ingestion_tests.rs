//! Given a file ingestion's row, when an ingest decides its next steps,
//! then the chain records each step as the transition table allows.

use super::*;
use crate::projections::MediaRow;
use uuid::Uuid;

fn at(text: &str) -> Timestamp {
    Timestamp::parse(text).unwrap()
}

fn file() -> FileObservation {
    FileObservation {
        path: "/library/a.jpg".into(),
        byte_size: 1_000,
        modified_ns: 1_700_000_000_000_000_000,
    }
}

fn types(chain: &Chain) -> Vec<&'static str> {
    chain.events.iter().map(Event::event_type).collect()
}

/// A file found, claimed by `ingest-1` with claim `c1`, at `settling`.
fn begun() -> Chain {
    decide_begin(
        OperationId(Uuid::from_u128(3)),
        &file(),
        "c1",
        "ingest-1",
        at("2026-05-01T15:00:00Z"),
        at("2026-05-01T16:00:00Z"),
    )
    .unwrap()
}

#[test]
fn a_new_file_is_created_claimed_started_and_settling_on_a_new_stream() {
    let chain = begun();
    assert!(chain.new_stream);
    assert_eq!(
        types(&chain),
        [
            "operation_created",
            "operation_claimed",
            "operation_started",
            "operation_stage_changed"
        ]
    );
    assert_eq!(chain.row.stage, Some(IngestionStage::Settling));
    assert_eq!(chain.row.claim_token.as_deref(), Some("c1"));
}

#[test]
fn registration_by_an_ingest_that_no_longer_holds_the_file_is_a_conflict() {
    let parsed = serde_json::json!({"format": "jpeg"});
    let found = Found {
        claim_token: "c0",
        observed: None,
        parsed: &parsed,
    };
    let refused = decide_registration(begun().row, found).unwrap_err();
    assert!(matches!(refused, DomainError::Conflict(_)), "{refused}");
}

#[test]
fn a_file_read_other_than_it_was_found_is_registered_with_what_was_read_as_its_inputs() {
    let parsed = serde_json::json!({"format": "jpeg"});
    let grown = FileObservation {
        byte_size: 2_000,
        ..file()
    };
    let found = Found {
        claim_token: "c1",
        observed: Some(&grown),
        parsed: &parsed,
    };
    let chain = decide_registration(begun().row, found).unwrap();
    assert_eq!(
        types(&chain),
        [
            "operation_stage_changed",
            "operation_progressed",
            "operation_stage_changed"
        ]
    );
    let Event::OperationStageChanged(parsing) = &chain.events[0] else {
        panic!("parsing first");
    };
    assert_eq!(parsing.inputs, Some(grown.inputs()));
    assert_eq!(chain.row.stage, Some(IngestionStage::Registered));
}

#[test]
fn a_known_item_with_the_same_content_gets_no_media_event_and_new_content_of_another_kind_says_so() {
    let known = MediaRow {
        media_id: MediaId(Uuid::from_u128(1)),
        path: "/library/a.jpg".into(),
        media_kind: "image".into(),
        content_digest: Some("sha256:aa".into()),
        byte_size: Some(1_000),
        registered_at: at("2026-05-01T15:00:00Z"),
        updated_at: at("2026-05-01T15:00:00Z"),
        version: 1,
    };
    let same = Content {
        path: "/library/a.jpg",
        media_kind: "image",
        content_digest: "sha256:aa",
        byte_size: 1_000,
    };
    assert_eq!(decide_media(known.media_id, Some(&known), same), None);
    let sound = Content {
        media_kind: "audio",
        content_digest: "sha256:bb",
        ..same
    };
    let Some(Event::MediaUpdated(updated)) = decide_media(known.media_id, Some(&known), sound) else {
        panic!("an update");
    };
    assert_eq!(updated.media_kind.as_deref(), Some("audio"));
    assert!(matches!(
        decide_media(known.media_id, None, same),
        Some(Event::MediaRegistered(_))
    ));
}

#[test]
fn a_release_by_a_claim_that_no_longer_holds_the_file_records_nothing() {
    assert_eq!(decide_release(begun().row, "c0", "stopped").unwrap(), None);
    let released = decide_release(begun().row, "c1", "the ingest was stopped")
        .unwrap()
        .unwrap();
    assert_eq!(types(&released), ["operation_interrupted", "operation_requeued"]);
}

#[test]
fn a_dead_ingest_s_file_is_interrupted_requeued_and_claimed_again_at_its_stage() {
    let resumed = decide_resume(begun().row, "c2", "ingest-2", at("2026-05-01T17:00:00Z")).unwrap();
    assert_eq!(
        types(&resumed),
        [
            "operation_interrupted",
            "operation_requeued",
            "operation_claimed",
            "operation_started"
        ]
    );
    assert_eq!(resumed.row.claim_token.as_deref(), Some("c2"));
    assert_eq!(resumed.row.stage, Some(IngestionStage::Settling));
}

#[test]
fn only_a_file_ingestion_can_be_resumed() {
    let mut row = begun().row;
    row.kind = "thumbnail".into();
    let refused = decide_resume(row, "c2", "ingest-2", at("2026-05-01T17:00:00Z")).unwrap_err();
    assert!(refused.to_string().contains("is not a file ingestion"), "{refused}");
}

#[test]
fn a_file_gone_from_disk_is_created_missing_confirmed() {
    let chain = decide_missing(OperationId(Uuid::from_u128(4)), &file(), at("2026-05-01T15:00:00Z")).unwrap();
    assert!(chain.new_stream);
    assert_eq!(types(&chain), ["operation_created", "operation_missing_confirmed"]);
}
