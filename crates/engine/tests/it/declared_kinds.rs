//! Pipelines as data on a real database of each backend: task kinds are
//! declared by the application, recorded in the log, and every command
//! reads them from there — requests check inputs against their
//! constraints, `applies_to` makes work not applicable, a new version
//! makes older results stale and `reprocess_stale` runs them again, and a
//! change that alters results without a new version is refused with
//! nothing appended.

use opledger_domain::kinds::legacy;
use opledger_domain::{CapabilityStatus, DomainError, MediaId, OperationStatus, Timestamp};
use opledger_engine::{
    parse_kinds, ClaimRequest, Completion, Engine, EngineError, FixedClock, KindStatus, KindsReport, SequentialIds,
    TaskClaim, TaskRequest, TaskTarget,
};
use opledger_store::Store;
use opledger_testkit::{backend_tests, Backend};
use serde_json::{json, Value};
use std::sync::Arc;

/// The application's pipeline: a kind of its own beside the reference
/// pipeline's metadata.
const PIPELINE: &str = r#"
[[kind]]
name = "metadata"
target = "media"
version = "1"
capability = "metadata"
required = true
purpose = "format, dimensions and byte size of a media item"
inputs.extractor = { type = "string" }

[[kind]]
name = "transcribe"
target = "media"
version = "1"
capability = "transcript"
required = false
applies_to = ["audio", "video"]
inputs.model = { type = "string", required = true }
inputs.max_words = { type = "integer", min = 1, max = 200, default = 30 }
inputs.language = { type = "string", enum = ["en", "ja", "de"], default = "en" }
retry = { max_attempts = 2, exhausted = "dead_lettered" }
"#;

use crate::support::{context, engine};

async fn apply<S: Store>(engine: &Engine<S>, text: &str) -> KindsReport {
    engine
        .apply_kinds(&context(), &parse_kinds(text).unwrap(), false)
        .await
        .unwrap()
}

fn statuses(report: &KindsReport) -> Vec<(&str, KindStatus)> {
    report
        .kinds
        .iter()
        .map(|kind| (kind.name.as_str(), kind.status))
        .collect()
}

async fn item<S: Store>(engine: &Engine<S>, path: &str, media_kind: &str) -> MediaId {
    let digest = format!("sha256:{:064x}", path.len());
    engine
        .register_media(&context(), path, media_kind, Some(digest), Some(10))
        .await
        .unwrap()
}

fn transcribe(media: MediaId, inputs: Value) -> TaskRequest {
    TaskRequest {
        target: TaskTarget::Media(media),
        kind: "transcribe".into(),
        inputs,
        priority: 0,
    }
}

async fn claim<S: Store>(engine: &Engine<S>, kind: &str) -> Vec<TaskClaim> {
    engine
        .claim_tasks(
            &context(),
            ClaimRequest {
                kinds: vec![kind.into()],
                worker: "py-1".into(),
                lease_ms: 30_000,
                limit: 100,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap()
}

async fn complete_all<S: Store>(engine: &Engine<S>, claims: &[TaskClaim]) {
    for claim in claims {
        engine
            .complete_task(&context(), &claim.fence(), Completion::Output(json!({"words": 3})))
            .await
            .unwrap();
    }
}

async fn capability<S: Store>(engine: &Engine<S>, media: MediaId, name: &str) -> CapabilityStatus {
    engine
        .capabilities(media)
        .await
        .unwrap()
        .into_iter()
        .find(|row| row.capability == name)
        .unwrap_or_else(|| panic!("no {name} capability"))
        .status
}

fn invalid_message(result: Result<impl std::fmt::Debug, EngineError>) -> String {
    match result {
        Err(EngineError::Domain(DomainError::InvalidInput(message))) => message,
        other => panic!("expected an invalid-input refusal, got {other:?}"),
    }
}

async fn a_declared_kind_runs_end_to_end_and_an_undeclared_one_is_refused_naming_the_declared<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let report = apply(&engine, PIPELINE).await;
    assert_eq!(
        statuses(&report),
        [("metadata", KindStatus::Declared), ("transcribe", KindStatus::Declared)]
    );
    let song = item(&engine, "/music/song.flac", "audio").await;
    let requested = engine
        .request_task(&context(), transcribe(song, json!({"model": "whisper"})))
        .await
        .unwrap();
    assert_eq!(requested.status, OperationStatus::Queued);
    let claims = claim(&engine, "transcribe").await;
    assert_eq!(claims.len(), 1);
    let claim = &claims[0];
    // A worker in any language can open the file from the claim alone.
    assert_eq!(claim.path.as_deref(), Some("/music/song.flac"));
    assert_eq!(claim.media_kind.as_deref(), Some("audio"));
    assert_eq!(claim.content_digest.as_deref(), claim.inputs["content_digest"].as_str());
    // Defaults filled in are part of the inputs (and the revision).
    assert_eq!(claim.inputs["max_words"], 30);
    assert_eq!(claim.inputs["language"], "en");
    complete_all(&engine, &claims).await;
    assert_eq!(
        capability(&engine, song, "transcript").await,
        CapabilityStatus::Succeeded
    );

    let head = engine.store().head().await.unwrap();
    let refused = engine
        .request_task(
            &context(),
            TaskRequest {
                kind: "lyrics".into(),
                ..transcribe(song, json!({}))
            },
        )
        .await;
    let message = invalid_message(refused);
    assert!(
        message.contains("\"lyrics\" is not declared; declared kinds: metadata, transcribe"),
        "{message}"
    );
    assert_eq!(engine.store().head().await.unwrap(), head, "a refusal appends nothing");
    assert!(engine.verify().await.unwrap().is_identical());
}

async fn a_new_version_makes_results_stale_and_reprocessing_runs_exactly_those_again<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    apply(&engine, PIPELINE).await;
    let items = [
        item(&engine, "/a.mp3", "audio").await,
        item(&engine, "/b.mp3", "audio").await,
        item(&engine, "/c.mp3", "audio").await,
    ];
    for media in items {
        engine
            .request_task(
                &context(),
                transcribe(media, json!({"model": "whisper", "language": "ja"})),
            )
            .await
            .unwrap();
    }
    let claims = claim(&engine, "transcribe").await;
    assert_eq!(claims.len(), 3);
    // Two finish; the third is still running when the new version lands.
    complete_all(&engine, &claims[..2]).await;

    // The same file again: nothing appended.
    let head = engine.store().head().await.unwrap();
    let again = apply(&engine, PIPELINE).await;
    assert!(again.kinds.iter().all(|kind| kind.status == KindStatus::Unchanged));
    assert_eq!(engine.store().head().await.unwrap(), head);

    let bumped = apply(
        &engine,
        &PIPELINE.replace(
            "version = \"1\"\ncapability = \"transcript\"",
            "version = \"2\"\ncapability = \"transcript\"",
        ),
    )
    .await;
    let transcribe_report = bumped.kinds.iter().find(|kind| kind.name == "transcribe").unwrap();
    assert_eq!(
        (transcribe_report.status, transcribe_report.stale_items),
        (KindStatus::Changed, 2)
    );
    let done: Vec<MediaId> = claims[..2].iter().map(|claim| claim.media_id.unwrap()).collect();
    for media in &done {
        assert_eq!(capability(&engine, *media, "transcript").await, CapabilityStatus::Stale);
    }
    complete_all(&engine, &claims[2..]).await;

    let reprocessed = engine
        .reprocess_stale(&context(), Some("transcribe"), Some("new whisper".into()))
        .await
        .unwrap();
    // The third item's result came from version 1 too: it is stale now.
    assert_eq!(reprocessed.requested, 3);
    assert!(reprocessed.batch_id.is_some());
    let rerun = claim(&engine, "transcribe").await;
    assert_eq!(rerun.len(), 3);
    for claim in &rerun {
        assert_eq!(claim.inputs["language"], "ja", "the inputs it was requested with");
    }
    complete_all(&engine, &rerun).await;
    for media in items {
        assert_eq!(
            capability(&engine, media, "transcript").await,
            CapabilityStatus::Succeeded
        );
        let state = engine
            .task_state(TaskTarget::Media(media), "transcribe")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            state.state.completed_revision.as_ref(),
            Some(&state.state.requested_revision)
        );
    }
    let nothing = engine.reprocess_stale(&context(), None, None).await.unwrap();
    assert_eq!((nothing.batch_id, nothing.requested), (None, 0));
    assert!(engine.verify().await.unwrap().is_identical());
}

async fn a_change_that_alters_results_without_a_new_version_is_refused_and_appends_nothing<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    apply(&engine, PIPELINE).await;
    let head = engine.store().head().await.unwrap();
    for (what, changed) in [
        ("inputs", PIPELINE.replace("max = 200", "max = 300")),
        ("applies_to", PIPELINE.replace("[\"audio\", \"video\"]", "[\"audio\"]")),
        (
            "needs",
            PIPELINE.replace(
                "applies_to = [\"audio\", \"video\"]",
                "needs = [\"metadata\"]\napplies_to = [\"audio\", \"video\"]",
            ),
        ),
    ] {
        let report = apply(&engine, &changed).await;
        let refused: Vec<&str> = report.refused().map(|kind| kind.name.as_str()).collect();
        assert_eq!(refused, ["transcribe"], "{what}");
        let error = report.refused().next().unwrap().error.clone().unwrap();
        assert!(error.contains("needs a new version"), "{what}: {error}");
        assert!(error.starts_with("line 11, column 1: "), "{what}: {error}");
        assert!(!report.applied);
        assert_eq!(engine.store().head().await.unwrap(), head, "{what}: nothing appended");
    }
    // Policy alone is recorded, and nothing becomes stale.
    let policy = apply(&engine, &PIPELINE.replace("max_attempts = 2", "max_attempts = 4")).await;
    let transcribe = policy.kinds.iter().find(|kind| kind.name == "transcribe").unwrap();
    assert_eq!((transcribe.status, transcribe.stale_items), (KindStatus::Changed, 0));
    assert_eq!(
        engine
            .task_kind("transcribe")
            .await
            .unwrap()
            .declaration
            .unwrap()
            .retry
            .max_attempts,
        4
    );
    // A dry run decides and records nothing.
    let head = engine.store().head().await.unwrap();
    let dry = engine
        .apply_kinds(
            &context(),
            &parse_kinds(&PIPELINE.replace("max_attempts = 2", "max_attempts = 9")).unwrap(),
            true,
        )
        .await
        .unwrap();
    assert_eq!(dry.kinds[1].status, KindStatus::Changed);
    assert_eq!(engine.store().head().await.unwrap(), head);
}

async fn needs_that_no_kind_produces_or_that_form_a_cycle_are_refused_where_they_are_written<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    let cycle = "[[kind]]\nname = \"a\"\ntarget = \"media\"\nversion = \"1\"\nneeds = [\"b\"]\n\n\
                 [[kind]]\nname = \"b\"\ntarget = \"media\"\nversion = \"1\"\nneeds = [\"a\"]\n";
    let report = apply(&engine, cycle).await;
    let error = report.refused().next().unwrap().error.clone().unwrap();
    assert_eq!(error, "line 1, column 1: the needs form a cycle: a → b → a");
    let unknown = "[[kind]]\nname = \"a\"\ntarget = \"media\"\nversion = \"1\"\nneeds = [\"lyrics\"]\n";
    let report = apply(&engine, unknown).await;
    let error = report.refused().next().unwrap().error.clone().unwrap();
    assert!(
        error.contains("needs capability \"lyrics\", which no kind produces"),
        "{error}"
    );
    assert_eq!(engine.store().head().await.unwrap(), 0, "nothing was ever appended");
    assert!(engine.task_kinds().await.unwrap().is_empty());
}

async fn a_kind_that_does_not_apply_to_the_items_media_kind_is_not_applicable_and_never_claimable<B: Backend>(
    backend: &B,
) {
    let engine = engine(backend).await;
    apply(&engine, PIPELINE).await;
    let photo = item(&engine, "/photo.jpg", "image").await;
    let outcome = engine
        .request_task(&context(), transcribe(photo, json!({"model": "whisper"})))
        .await
        .unwrap();
    assert_eq!(outcome.status, OperationStatus::NotApplicable);
    assert!(outcome.created);
    assert_eq!(
        capability(&engine, photo, "transcript").await,
        CapabilityStatus::NotApplicable
    );
    assert!(claim(&engine, "transcribe").await.is_empty());
    // Asked again, it stays as it is.
    let again = engine
        .request_task(&context(), transcribe(photo, json!({"model": "whisper"})))
        .await
        .unwrap();
    assert_eq!((again.created, again.status), (false, OperationStatus::NotApplicable));
    assert!(engine.verify().await.unwrap().is_identical());
}

async fn every_input_constraint_is_refused_at_request_with_the_input_and_the_rule<B: Backend>(backend: &B) {
    let engine = engine(backend).await;
    apply(&engine, PIPELINE).await;
    let song = item(&engine, "/song.mp3", "audio").await;
    let head = engine.store().head().await.unwrap();
    for (inputs, expected) in [
        (json!({}), "transcribe needs input \"model\""),
        (json!({"model": 7}), "input \"model\" must be a string, not a number"),
        (
            json!({"model": "w", "max_words": 0}),
            "input \"max_words\" must be at least 1, not 0",
        ),
        (
            json!({"model": "w", "max_words": 500}),
            "input \"max_words\" must be at most 200, not 500",
        ),
        (
            json!({"model": "w", "max_words": "many"}),
            "input \"max_words\" must be an integer",
        ),
        (
            json!({"model": "w", "language": "fr"}),
            "input \"language\" must be one of en, ja, de, not \"fr\"",
        ),
        (
            json!({"model": "w", "speed": 2}),
            "transcribe does not take input(s) \"speed\"",
        ),
    ] {
        let message = invalid_message(engine.request_task(&context(), transcribe(song, inputs.clone())).await);
        assert!(message.contains(expected), "{inputs}: {message}");
    }
    // The reference pipeline's thumbnail refuses a negative side at once.
    engine.declare(&context(), legacy::declarations()).await.unwrap();
    let head_after_declaring = engine.store().head().await.unwrap();
    let message = invalid_message(
        engine
            .request_task(
                &context(),
                TaskRequest {
                    kind: "thumbnail".into(),
                    ..transcribe(song, json!({"max_side": -5}))
                },
            )
            .await,
    );
    assert!(message.contains("\"max_side\" must be at least 1, not -5"), "{message}");
    assert_eq!(engine.store().head().await.unwrap(), head_after_declaring);
    assert!(head_after_declaring > head);
}

/// `count` kinds named `k0000`…, each a media kind of its own.
fn kinds_document(from: usize, count: usize) -> String {
    (from..from + count)
        .map(|index| {
            format!(
                "[[kind]]\nname = \"k{index:04}\"\ntarget = \"media\"\nversion = \"1\"\ncapability = \"c{index:04}\"\n"
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn the_catalogue_holds_at_most_its_bound_and_a_declaration_past_it_appends_nothing<B: Backend>(backend: &B) {
    let engine = engine(backend).await.with_max_kinds(30);
    let report = apply(&engine, &kinds_document(0, 30)).await;
    assert!(report.applied);
    let head = engine.store().head().await.unwrap();
    let refused = engine
        .apply_kinds(&context(), &parse_kinds(&kinds_document(30, 1)).unwrap(), false)
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, EngineError::Domain(DomainError::InvalidInput(message))
            if message.contains("may hold 30 task kinds; it holds 30 and this declares 1 more")),
        "{refused}"
    );
    assert_eq!(engine.store().head().await.unwrap(), head, "nothing was appended");
    // A new version of a kind already there adds none.
    let bumped = kinds_document(0, 1).replace("version = \"1\"", "version = \"2\"");
    assert!(apply(&engine, &bumped).await.applied);
    // A claim of one kind, and the refusal of an undeclared one names a
    // bounded list of the declared.
    let claims = engine
        .claim_tasks(
            &context(),
            ClaimRequest {
                kinds: vec!["k0007".into()],
                worker: "w".into(),
                lease_ms: 1_000,
                limit: 1,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap();
    assert!(claims.is_empty());
    let undeclared = engine
        .claim_tasks(
            &context(),
            ClaimRequest {
                kinds: vec!["k0007".into(), "nope".into()],
                worker: "w".into(),
                lease_ms: 1_000,
                limit: 1,
                principal: None,
                versions: Default::default(),
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        undeclared.contains("\"nope\" is not declared") && undeclared.contains("and 10 more"),
        "{undeclared}"
    );
}

backend_tests!(
    the_catalogue_holds_at_most_its_bound_and_a_declaration_past_it_appends_nothing,
    a_declared_kind_runs_end_to_end_and_an_undeclared_one_is_refused_naming_the_declared,
    a_new_version_makes_results_stale_and_reprocessing_runs_exactly_those_again,
    a_change_that_alters_results_without_a_new_version_is_refused_and_appends_nothing,
    needs_that_no_kind_produces_or_that_form_a_cycle_are_refused_where_they_are_written,
    a_kind_that_does_not_apply_to_the_items_media_kind_is_not_applicable_and_never_claimable,
    every_input_constraint_is_refused_at_request_with_the_input_and_the_rule,
);

/// The reference pipeline's file and the example application's declare the
/// former built-in kinds exactly as a ledger upgraded from before
/// declarations records them, but for the media crate's image kinds, whose
/// outputs changed (one shared reduced-size decode, EXIF facts) and which
/// apply to images only: those are version 3 with `applies_to = ["image"]`,
/// keep every former input as it was, add only optional inputs, and keep
/// target, capability, needs and policy, so applying the file to such a
/// ledger records a new version that every former request on an image
/// still satisfies.
#[test]
fn the_shipped_declaration_files_match_what_an_upgrade_records_but_for_the_revised_image_kinds() {
    const REVISED: [&str; 3] = ["metadata", "thumbnail", "perceptual_hash"];
    let files = [
        opledger_media_kinds(),
        include_str!("../../../../examples/pipeline.toml").to_string(),
    ];
    let mut shipped = Vec::new();
    for text in files {
        for located in parse_kinds(&text).unwrap().kinds {
            shipped.push(located.declaration.normalized().unwrap());
        }
    }
    for former in legacy::declarations() {
        let declared = shipped
            .iter()
            .find(|kind| kind.name == former.name)
            .unwrap_or_else(|| panic!("{} is declared by no shipped file", former.name));
        let mut expected = former.clone();
        if REVISED.contains(&former.name.as_str()) {
            for (input, declaration) in &former.inputs {
                assert_eq!(declared.inputs.get(input), Some(declaration), "{}.{input}", former.name);
            }
            for (input, declaration) in &declared.inputs {
                assert!(
                    former.inputs.contains_key(input) || !declaration.required,
                    "{}.{input} is new and required",
                    former.name
                );
            }
            expected.version = "3".to_string();
            expected.applies_to = vec!["image".to_string()];
            expected.inputs = declared.inputs.clone();
            expected.purpose = declared.purpose.clone();
        }
        assert_eq!(declared, &expected, "{}", former.name);
    }
}

fn opledger_media_kinds() -> String {
    include_str!("../../../media/kinds.toml").to_string()
}

/// One step of a random history: declarations change between requests and
/// completions.
#[derive(Debug, Clone)]
enum Step {
    /// A new version of `transcribe` (results made stale).
    NewVersion,
    /// `transcribe`'s policy changes (`required` flips).
    Policy,
    /// `transcribe` requested on item `item` with `max_words`.
    Request { item: usize, max_words: i64 },
    /// Up to `count` claims, completed.
    Complete { count: usize },
    /// Up to `count` claims, failed (retryable).
    Fail { count: usize },
    /// Everything stale requested again.
    Reprocess,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        1 => Just(Step::NewVersion),
        1 => Just(Step::Policy),
        4 => (0..4usize, 0..=201i64).prop_map(|(item, max_words)| Step::Request { item, max_words }),
        3 => (1..4usize).prop_map(|count| Step::Complete { count }),
        1 => (1..3usize).prop_map(|count| Step::Fail { count }),
        1 => Just(Step::Reprocess),
    ]
}

async fn run_history(steps: Vec<Step>) {
    let folder = tempfile::tempdir().unwrap();
    let store = opledger_store_sqlite::SqliteStore::open(opledger_store_sqlite::SqliteConfig::at(
        folder.path().join("ledger.db"),
    ))
    .await
    .unwrap();
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(1_700_000_000_000_000)));
    let engine = Engine::with_clock(store, clock.clone(), Arc::new(SequentialIds::default()));
    engine.startup().await.unwrap();
    apply(&engine, PIPELINE).await;
    let mut items = Vec::new();
    for n in 0..4 {
        items.push(
            item(
                &engine,
                &format!("/song-{n}.mp3"),
                if n == 3 { "image" } else { "audio" },
            )
            .await,
        );
    }
    let (mut version, mut required) = (1, false);
    for step in steps {
        clock.advance_millis(1_000);
        let declared = |version: i64, required: bool| {
            PIPELINE.replace(
                "version = \"1\"\ncapability = \"transcript\"\nrequired = false",
                &format!("version = \"{version}\"\ncapability = \"transcript\"\nrequired = {required}"),
            )
        };
        match step {
            Step::NewVersion => {
                version += 1;
                let report = apply(&engine, &declared(version, required)).await;
                assert!(report.refused().next().is_none(), "{report:?}");
            }
            Step::Policy => {
                required = !required;
                let report = apply(&engine, &declared(version, required)).await;
                assert!(report.refused().next().is_none(), "{report:?}");
            }
            Step::Request { item, max_words } => {
                // Out-of-range inputs are refused, the rest accepted.
                let result = engine
                    .request_task(
                        &context(),
                        transcribe(items[item], json!({"model": "w", "max_words": max_words})),
                    )
                    .await;
                assert_eq!(result.is_ok(), (1..=200).contains(&max_words), "{result:?}");
            }
            Step::Complete { count } | Step::Fail { count } => {
                let claims = engine
                    .claim_tasks(
                        &context(),
                        ClaimRequest {
                            kinds: vec!["transcribe".into()],
                            worker: "w".into(),
                            lease_ms: 60_000,
                            limit: count,
                            principal: None,
                            versions: Default::default(),
                        },
                    )
                    .await
                    .unwrap();
                for claim in claims {
                    if matches!(step, Step::Complete { .. }) {
                        engine
                            .complete_task(&context(), &claim.fence(), Completion::Output(json!({})))
                            .await
                            .unwrap();
                    } else {
                        engine
                            .fail_task(&context(), &claim.fence(), "flaky", false)
                            .await
                            .unwrap();
                    }
                }
            }
            Step::Reprocess => {
                engine.reprocess_stale(&context(), None, None).await.unwrap();
            }
        }
    }
    let report = engine.verify().await.unwrap();
    assert!(report.is_identical(), "{report:?}");
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 12, ..proptest::test_runner::Config::default() })]

    /// Random declaration changes interleaved with requests, completions
    /// and failures: the inline projections always equal a full replay.
    #[test]
    fn declaration_changes_between_requests_and_completions_replay_to_the_inline_projections(
        steps in proptest::collection::vec(step(), 1..24)
    ) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(run_history(steps));
    }
}
