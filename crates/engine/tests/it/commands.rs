//! Command refusals that guard specific inputs.

use opledger_domain::events::OperationTarget;
use opledger_domain::{DomainError, OperationStatus};
use opledger_engine::{CommandContext, Engine, EngineError, NewOperation, MAX_LEASE_MS};
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_with_a_lease_out_of_range_is_invalid_input_and_appends_nothing() {
    let folder = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteConfig::at(folder.path().join("lease.db")))
        .await
        .unwrap();
    let (engine, _) = Engine::open(store).await.unwrap();
    let context = CommandContext::actor("test");
    let operation_id = engine
        .create_operation(
            &context,
            NewOperation {
                kind: "export".into(),
                target: OperationTarget::default(),
                revision: None,
                inputs: serde_json::json!({}),
                status: OperationStatus::Queued,
                priority: 0,
            },
        )
        .await
        .unwrap();
    let head = engine.store().head().await.unwrap();
    for lease_ms in [0, -5, MAX_LEASE_MS + 1, i64::MAX / 1000, i64::MAX] {
        let error = engine
            .claim_operation(&context, operation_id, "worker", lease_ms)
            .await
            .unwrap_err();
        assert!(
            matches!(error, EngineError::Domain(DomainError::InvalidInput(_))),
            "lease {lease_ms}: {error}"
        );
        assert_eq!(engine.store().head().await.unwrap(), head);
    }
    engine
        .claim_operation(&context, operation_id, "worker", MAX_LEASE_MS)
        .await
        .unwrap();
    assert!(engine.verify().await.unwrap().is_identical());
}
