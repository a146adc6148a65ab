//! Repairing drifted projections (`Engine::rebuild_projections`, behind
//! `opledger replay --rebuild`) on every backend: a projection row changed
//! behind the engine's back is found by verify, the rebuild puts every
//! projection back as the log says, verify is identical afterwards, and
//! the engine goes on writing.

use opledger_domain::kinds::legacy;
use opledger_engine::{CommandContext, Engine, TaskRequest, TaskTarget};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;

async fn a_tampered_projection_row_is_found_by_verify_and_repaired_by_a_rebuild<B: Backend>(backend: &B) {
    let (engine, _) = Engine::open(backend.open().await).await.unwrap();
    let context = CommandContext::actor("test");
    engine.declare(&context, legacy::declarations()).await.unwrap();
    for index in 0..3 {
        let media = engine
            .register_media(
                &context,
                &format!("/photos/{index}.png"),
                "image",
                Some(format!("sha256:{index:064x}")),
                Some(10),
            )
            .await
            .unwrap();
        engine
            .request_task(
                &context,
                TaskRequest {
                    target: TaskTarget::Media(media),
                    kind: "metadata".into(),
                    inputs: json!({}),
                    priority: 0,
                },
            )
            .await
            .unwrap();
    }
    assert!(engine.verify().await.unwrap().is_identical());

    backend
        .execute_raw("UPDATE media_operations SET status_reason = 'tampered', priority = 99")
        .await
        .unwrap();
    backend
        .execute_raw("UPDATE media SET path = '/elsewhere.png' WHERE path = '/photos/1.png'")
        .await
        .unwrap();
    let drifted = engine.verify().await.unwrap();
    assert!(!drifted.is_identical());
    let tables: Vec<&str> = drifted.diffs.iter().map(|diff| diff.table.name).collect();
    assert!(tables.contains(&"media_operations"), "{tables:?}");
    assert!(tables.contains(&"media"), "{tables:?}");

    let rebuilt = engine.rebuild_projections().await.unwrap();
    let names: Vec<&str> = rebuilt.iter().map(|(name, _, _)| name.as_str()).collect();
    for projection in [
        "media_registry",
        "media_operations",
        "processing_states",
        "batches",
        "review_queue",
    ] {
        assert!(names.contains(&projection), "{projection} not rebuilt: {names:?}");
    }
    let head = engine.store().head().await.unwrap();
    assert!(
        rebuilt.iter().all(|(_, _, events)| *events == head as u64),
        "{rebuilt:?}"
    );
    let verified = engine.verify().await.unwrap();
    assert!(verified.is_identical(), "{}", verified.render());

    // The rebuilt tables take writes as before.
    engine
        .register_media(&context, "/photos/after.png", "image", None, None)
        .await
        .unwrap();
    assert!(engine.verify().await.unwrap().is_identical());
}

backend_tests!(a_tampered_projection_row_is_found_by_verify_and_repaired_by_a_rebuild);
