//! Versions in the work protocol, on a real database of each backend: a
//! worker states the versions its code implements and is offered only
//! those; a new version re-targets every task nobody holds in the apply's
//! own transaction; a claimed task finishes at its claimed version and its
//! result reads stale; a claim of the old version that comes back to the
//! queue is moved to the new version then. Replay agrees after each step.

use crate::support::{self, context};
use opledger_domain::status::CapabilityStatus;
use opledger_domain::versions::VERSION_CHANGED;
use opledger_domain::{MediaId, OperationStatus};
use opledger_engine::{parse_kinds, ClaimRequest, Completion, Engine, TaskClaim, TaskRequest, TaskTarget};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use proptest::prelude::*;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};

fn embedding(version: &str) -> String {
    format!(
        r#"
[[kind]]
name = "embedding"
target = "media"
version = "{version}"
capability = "embedding"
required = false
inputs.model = {{ type = "string", default = "clip" }}
"#
    )
}

/// A claim of `embedding` by a worker stating `versions` (none: any).
fn claim_request(worker: &str, versions: &[&str], limit: usize) -> ClaimRequest {
    let mut stated = BTreeMap::new();
    if !versions.is_empty() {
        stated.insert(
            "embedding".to_string(),
            versions.iter().map(ToString::to_string).collect::<BTreeSet<_>>(),
        );
    }
    ClaimRequest {
        kinds: vec!["embedding".into()],
        worker: worker.into(),
        lease_ms: 60_000,
        limit,
        principal: None,
        versions: stated,
    }
}

async fn claim<S: Store>(engine: &Engine<S>, versions: &[&str], limit: usize) -> Vec<TaskClaim> {
    engine
        .claim_tasks(&context(), claim_request("w", versions, limit))
        .await
        .unwrap()
}

async fn apply<S: Store>(engine: &Engine<S>, version: &str) -> usize {
    let report = engine
        .apply_kinds(&context(), &parse_kinds(&embedding(version)).unwrap(), false)
        .await
        .unwrap();
    assert!(report.refused().next().is_none(), "{report:?}");
    report.kinds[0].retargeted
}

/// `count` photos with `embedding` requested on each; their ids.
async fn photos_with_embedding<S: Store>(engine: &Engine<S>, count: usize) -> Vec<MediaId> {
    let mut photos = Vec::new();
    for n in 0..count {
        let digest = format!("sha256:{}", format!("{:02x}", n + 1).repeat(32));
        let photo = engine
            .register_media(&context(), &format!("/p{n}.jpg"), "image", Some(digest), Some(1))
            .await
            .unwrap();
        engine
            .request_task(
                &context(),
                TaskRequest {
                    target: TaskTarget::Media(photo),
                    kind: "embedding".into(),
                    inputs: json!({"model": "siglip"}),
                    priority: 0,
                },
            )
            .await
            .unwrap();
        photos.push(photo);
    }
    photos
}

async fn embedding_capability<S: Store>(
    engine: &Engine<S>,
    photo: MediaId,
) -> opledger_domain::projections::CapabilityRow {
    engine
        .capabilities(photo)
        .await
        .unwrap()
        .into_iter()
        .find(|row| row.capability == "embedding")
        .expect("the embedding capability")
}

async fn assert_replay_agrees<S: Store>(engine: &Engine<S>) {
    let report = engine.verify().await.unwrap();
    assert!(report.is_identical(), "{}", report.render());
}

async fn a_new_version_re_targets_queued_tasks_at_once_and_old_workers_are_offered_none<B: Backend>(backend: &B) {
    let engine = support::engine(backend).await;
    support::declare(&engine, &embedding("1")).await;
    let photos = photos_with_embedding(&engine, 3).await;
    let held = claim(&engine, &["1"], 1).await;
    assert_eq!(held.len(), 1);
    assert_eq!(
        held[0].kind_version.as_deref(),
        Some("1"),
        "a claim says the version it runs"
    );

    assert_eq!(apply(&engine, "2").await, 2, "the two queued tasks moved to version 2");
    assert_replay_agrees(&engine).await;
    assert!(
        claim(&engine, &["1"], 10).await.is_empty(),
        "a worker of version 1 is offered no task requested at version 2"
    );
    for photo in &photos {
        let state = engine
            .task_state(TaskTarget::Media(*photo), "embedding")
            .await
            .unwrap()
            .expect("the task")
            .state;
        if state.operation_id == held[0].operation_id {
            assert_eq!(
                state.task_version.as_deref(),
                Some("1"),
                "a held task keeps its claimed version"
            );
            continue;
        }
        assert_eq!(state.task_version.as_deref(), Some("2"));
        assert_eq!(state.status, OperationStatus::Queued, "it keeps its place");
        assert!(
            state
                .status_reason
                .as_deref()
                .unwrap_or_default()
                .starts_with(VERSION_CHANGED),
            "{:?}",
            state.status_reason
        );
        let inputs: serde_json::Value = serde_json::from_str(&state.inputs).unwrap();
        assert_eq!(inputs["model"], json!("siglip"), "what it was requested with is kept");
    }

    let taken = claim(&engine, &["2"], 10).await;
    assert_eq!(taken.len(), 2);
    assert!(taken.iter().all(|claim| claim.kind_version.as_deref() == Some("2")));
    for claim in taken.iter().chain(&held) {
        engine
            .complete_task(&context(), &claim.fence(), Completion::Output(json!({"vector": [1]})))
            .await
            .unwrap();
    }
    for photo in &photos {
        let capability = embedding_capability(&engine, *photo).await;
        let held_here = engine
            .task_state(TaskTarget::Media(*photo), "embedding")
            .await
            .unwrap()
            .unwrap()
            .state
            .operation_id
            == held[0].operation_id;
        if held_here {
            assert_eq!(
                capability.produced_version.as_deref(),
                Some("1"),
                "recorded at the claimed version"
            );
            assert_eq!(capability.status, CapabilityStatus::Stale, "and read stale");
        } else {
            assert_eq!(capability.produced_version.as_deref(), Some("2"));
            assert_eq!(capability.status, CapabilityStatus::Succeeded);
        }
    }
    assert_replay_agrees(&engine).await;
}

async fn a_claim_of_the_old_version_that_fails_and_will_retry_is_moved_to_the_new_version<B: Backend>(backend: &B) {
    let engine = support::engine(backend).await;
    support::declare(&engine, &embedding("1")).await;
    let photos = photos_with_embedding(&engine, 1).await;
    let held = claim(&engine, &["1"], 1).await;
    assert_eq!(apply(&engine, "2").await, 0, "nothing waited");
    let outcome = engine
        .fail_task(&context(), &held[0].fence(), "GPU busy", false)
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::RetryWaiting);
    let state = engine
        .task_state(TaskTarget::Media(photos[0]), "embedding")
        .await
        .unwrap()
        .unwrap()
        .state;
    assert_eq!(
        state.task_version.as_deref(),
        Some("2"),
        "its retry runs at the current version"
    );
    assert_replay_agrees(&engine).await;
}

async fn a_worker_that_states_no_version_is_offered_any<B: Backend>(backend: &B) {
    let engine = support::engine(backend).await;
    support::declare(&engine, &embedding("1")).await;
    photos_with_embedding(&engine, 2).await;
    let first = claim(&engine, &["1"], 1).await;
    apply(&engine, "2").await;
    engine
        .release_task(&context(), &first[0].fence(), "shutting down")
        .await
        .unwrap();
    let any = claim(&engine, &[], 10).await;
    assert_eq!(any.len(), 2, "both, whatever their version");
    assert!(
        any.iter().all(|claim| claim.kind_version.as_deref() == Some("2")),
        "the released task was moved to version 2 as it came back"
    );
}

async fn versions_stated_for_a_kind_the_claim_does_not_name_are_refused_and_nothing_is_appended<B: Backend>(
    backend: &B,
) {
    let engine = support::engine(backend).await;
    support::declare(&engine, &embedding("1")).await;
    photos_with_embedding(&engine, 1).await;
    let head = engine.store().head().await.unwrap();
    let mut request = claim_request("w", &["1"], 1);
    request.kinds.clear();
    let refused = engine.claim_tasks(&context(), request).await.unwrap_err();
    assert!(refused.to_string().contains("does not name"), "{refused}");
    let mut request = claim_request("w", &[], 1);
    request
        .versions
        .insert("embedding".into(), ["bad\u{7}".to_string()].into());
    assert!(engine.claim_tasks(&context(), request).await.is_err());
    assert_eq!(engine.store().head().await.unwrap(), head, "nothing appended");
}

backend_tests!(
    a_new_version_re_targets_queued_tasks_at_once_and_old_workers_are_offered_none,
    a_claim_of_the_old_version_that_fails_and_will_retry_is_moved_to_the_new_version,
    a_worker_that_states_no_version_is_offered_any,
    versions_stated_for_a_kind_the_claim_does_not_name_are_refused_and_nothing_is_appended,
);

/// One step of an interleaving.
#[derive(Debug, Clone)]
enum Step {
    /// A new version of the kind is declared.
    Bump,
    /// `embedding` is requested on photo N (with a model of its own, so a
    /// request may change the revision).
    Request(usize, u8),
    /// A worker claims, stating the current version or, when `legacy`,
    /// none.
    Claim { legacy: bool },
    /// The oldest held claim completes, fails (will retry) or is released.
    End(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => Just(Step::Bump),
        3 => (0..4usize, 0..3u8).prop_map(|(photo, model)| Step::Request(photo, model)),
        3 => any::<bool>().prop_map(|legacy| Step::Claim { legacy }),
        3 => (0..3u8).prop_map(Step::End),
    ]
}

/// After any interleaving of version bumps, requests, claims and their
/// ends, every result on hand was produced at the version its claim was
/// requested at, never at the declaration's current one, and no task
/// nobody holds waits at a version other than the current one.
#[test]
fn no_capability_records_a_version_other_than_the_one_its_task_was_claimed_at() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(steps in proptest::collection::vec(step(), 1..24))| {
        runtime.block_on(async {
            let backend = opledger_testkit::sqlite::backend().await;
            let engine = support::engine(&backend).await;
            support::declare(&engine, &embedding("1")).await;
            let mut current = 1u32;
            let mut photos = Vec::new();
            for n in 0..4 {
                let digest = format!("sha256:{}", format!("{:02x}", n + 1).repeat(32));
                photos.push(engine.register_media(&context(), &format!("/p{n}.jpg"), "image", Some(digest), Some(1)).await.unwrap());
            }
            let mut held: Vec<TaskClaim> = Vec::new();
            // The version each completed claim ran, by operation.
            let mut produced: BTreeMap<opledger_domain::OperationId, Option<String>> = BTreeMap::new();
            for step in steps {
                match step {
                    Step::Bump => {
                        current += 1;
                        apply(&engine, &current.to_string()).await;
                    }
                    Step::Request(photo, model) => {
                        engine.request_task(&context(), TaskRequest {
                            target: TaskTarget::Media(photos[photo]),
                            kind: "embedding".into(),
                            inputs: json!({"model": format!("m{model}")}),
                            priority: 0,
                        }).await.unwrap();
                    }
                    Step::Claim { legacy } => {
                        let version = current.to_string();
                        let stated: Vec<&str> = if legacy { Vec::new() } else { vec![version.as_str()] };
                        for claim in claim(&engine, &stated, 2).await {
                            if !legacy {
                                prop_assert_eq!(claim.kind_version.as_deref(), Some(version.as_str()));
                            }
                            held.push(claim);
                        }
                    }
                    Step::End(how) => {
                        if held.is_empty() { continue; }
                        let claim = held.remove(0);
                        let fence = claim.fence();
                        let ended = match how {
                            0 => engine.complete_task(&context(), &fence, Completion::Output(json!({"v": claim.kind_version}))).await,
                            1 => engine.fail_task(&context(), &fence, "busy", false).await,
                            _ => engine.release_task(&context(), &fence, "stop").await,
                        };
                        // A claim a newer request superseded still ends.
                        ended.unwrap();
                        if how == 0 {
                            produced.insert(claim.operation_id, claim.kind_version.clone());
                        }
                    }
                }
                for photo in &photos {
                    if let Some(task) = engine.task_state(TaskTarget::Media(*photo), "embedding").await.unwrap() {
                        let state = task.state;
                        if opledger_domain::versions::WAITING_STATUSES.contains(&state.status) {
                            prop_assert_eq!(state.task_version, Some(current.to_string()), "a waiting task is current");
                        }
                    }
                }
            }
            for photo in &photos {
                let Some(capability) = engine.capabilities(*photo).await.unwrap().into_iter().find(|row| row.capability == "embedding") else { continue };
                if capability.produced_version.is_some() {
                    prop_assert_eq!(
                        &capability.produced_version,
                        produced.get(&capability.operation_id).expect("a result comes from a completed claim"),
                        "the capability records the version its task was claimed at"
                    );
                }
            }
            let report = engine.verify().await.unwrap();
            prop_assert!(report.is_identical(), "{}", report.render());
            Ok::<(), TestCaseError>(())
        })?;
    });
}
