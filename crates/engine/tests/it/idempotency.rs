//! Idempotent retries under injected storage faults, on real databases of
//! each backend (`backend_tests!`): the store is wrapped in
//! `opledger_testkit::faults::FaultyStore`, which makes a chosen write
//! transaction commit and then report a failure ("applied but reported
//! failed"). Every writing command retried with its request id answers
//! its first result and appends nothing more; the same id for another
//! command is refused; records are forgotten after their retention.
//! Every scenario ends with `verify`: replay equals live.

use opledger_domain::kinds::legacy;
use opledger_domain::review::ReviewAction;
use opledger_domain::{DomainError, EventEnvelope, MediaId, OperationId, OperationStatus, Timestamp};
use opledger_engine::{
    BatchRequest, ClaimRequest, CommandContext, Completion, Engine, EngineError, FixedClock, FixedJitter, Progress,
    RequestId, SequentialIds, TaskClaim, TaskRequest, TaskTarget, REQUEST_RETENTION_MS,
};
use opledger_store::{ErrorKind, Store};
use opledger_testkit::faults::{Fault, FaultyStore};
use opledger_testkit::{backend_tests, Backend};
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

const T0: i64 = 1_700_000_000_000_000;

/// The logical commands of the thousand-failure run: 200 tasks, five
/// commands each, every one of them through an ambiguous failure.
const TASKS: usize = 200;

/// An engine over a backend's database behind the fault injector.
struct Lab<S: Store> {
    engine: Engine<FaultyStore<S>>,
    store: FaultyStore<S>,
    clock: Arc<FixedClock>,
}

async fn lab<B: Backend>(backend: &B) -> Lab<B::Store> {
    let store = FaultyStore::new(backend.open().await);
    let clock = Arc::new(FixedClock::at(Timestamp::from_micros(T0)));
    let engine = Engine::with_clock(store.clone(), clock.clone(), Arc::new(SequentialIds::default()))
        .with_jitter(Arc::new(FixedJitter(0)));
    engine.startup().await.unwrap();
    engine
        .declare(&CommandContext::actor("deploy"), legacy::declarations())
        .await
        .unwrap();
    Lab { engine, store, clock }
}

fn with_id(actor: &str, id: &str) -> CommandContext {
    CommandContext::actor(actor).with_request_id(RequestId::new(id).unwrap())
}

fn thumbnail(media: MediaId, max_side: i64) -> TaskRequest {
    TaskRequest {
        target: TaskTarget::Media(media),
        kind: "thumbnail".into(),
        inputs: json!({"max_side": max_side, "format": "png"}),
        priority: 0,
    }
}

fn claim_one(worker: &str) -> ClaimRequest {
    ClaimRequest {
        kinds: vec!["thumbnail".into()],
        worker: worker.into(),
        lease_ms: 60_000,
        limit: 1,
        principal: None,
        versions: Default::default(),
    }
}

fn is_unavailable(error: &EngineError) -> bool {
    error.is_store(ErrorKind::Unavailable)
}

impl<S: Store> Lab<S> {
    async fn media(&self, path: &str) -> MediaId {
        self.engine
            .register_media(
                &CommandContext::actor("test"),
                path,
                "image",
                Some(format!("sha256:{path}")),
                Some(10),
            )
            .await
            .unwrap()
    }

    async fn head(&self) -> i64 {
        self.store.head().await.unwrap()
    }

    /// Runs `command` once with its write applied and reported failed,
    /// then retries it: the retry answers, appends nothing, and a second
    /// retry answers the same. Answers the retry's answer and how many
    /// events the first attempt appended.
    async fn through_ambiguous_failure<T, F, Fut>(&self, command: F) -> (T, i64)
    where
        T: PartialEq + Debug,
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, EngineError>>,
    {
        let before = self.head().await;
        self.store.fail_write(1, Fault::AppliedButReported);
        let injected = self.store.injected();
        let first = command().await;
        assert_eq!(self.store.injected(), injected + 1, "the fault was not injected");
        assert!(
            matches!(&first, Err(error) if is_unavailable(error)),
            "the first attempt should have been reported failed: {first:?}"
        );
        let applied = self.head().await;
        let answer = command().await.expect("the retry answers");
        assert_eq!(self.head().await, applied, "the retry appended events");
        let again = command().await.expect("a second retry answers");
        assert_eq!(again, answer, "a second retry answered differently");
        assert_eq!(self.head().await, applied, "the second retry appended events");
        (answer, applied - before)
    }

    async fn timeline_types(&self, operation_id: OperationId) -> Vec<String> {
        self.engine
            .timeline(operation_id)
            .await
            .unwrap()
            .iter()
            .map(|envelope: &EventEnvelope| envelope.event.event_type().to_string())
            .collect()
    }

    async fn assert_replay_agrees(&self) {
        let report = self.engine.verify().await.unwrap();
        assert!(report.is_identical(), "{}", report.render());
    }
}

/// One task's life, each command with its own request id and through
/// one ambiguous failure: request, claim, heartbeat, progress, complete.
async fn one_task_through_ambiguous_failures<S: Store>(lab: &Lab<S>, n: usize) -> OperationId {
    let media = lab.media(&format!("/photos/{n}.png")).await;
    let worker = format!("w{n}");
    let request = with_id("scheduler", &format!("request-{n}"));
    let (requested, appended) = lab
        .through_ambiguous_failure(|| lab.engine.request_task(&request, thumbnail(media, 256)))
        .await;
    assert!(requested.created && appended > 0);

    let claim = with_id(&worker, &format!("claim-{n}"));
    let (claims, appended): (Vec<TaskClaim>, _) = lab
        .through_ambiguous_failure(|| lab.engine.claim_tasks(&claim, claim_one(&worker)))
        .await;
    assert_eq!(claims.len(), 1, "the retried claim answers the task the first one took");
    assert_eq!(claims[0].operation_id, requested.operation_id);
    assert_eq!(appended, 1);
    let fence = claims[0].fence();

    let heartbeat = RequestId::new(format!("heartbeat-{n}")).unwrap();
    let (beat, appended) = lab
        .through_ambiguous_failure(|| lab.engine.heartbeat_once(Some(&heartbeat), &fence, Some(120_000)))
        .await;
    assert!(!beat.cancel_requested);
    assert_eq!(appended, 0);

    let progress = with_id(&worker, &format!("progress-{n}"));
    let phase = || Progress {
        phase: "writing".into(),
        processed: 1,
        total: Some(1),
    };
    let ((), appended) = lab
        .through_ambiguous_failure(|| lab.engine.report_progress(&progress, &fence, phase()))
        .await;
    assert_eq!(appended, 1);

    let complete = with_id(&worker, &format!("complete-{n}"));
    let output = || Completion::Output(json!({"path": format!("/thumbs/{n}.png")}));
    let (outcome, _) = lab
        .through_ambiguous_failure(|| lab.engine.complete_task(&complete, &fence, output()))
        .await;
    assert_eq!(outcome.status, OperationStatus::Succeeded);
    requested.operation_id
}

async fn a_thousand_ambiguous_failures_leave_exactly_one_event_per_logical_command<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    // The same life without a fault: what each task's timeline must hold.
    let control = {
        let media = lab.media("/photos/control.png").await;
        let context = CommandContext::actor("control");
        let requested = lab.engine.request_task(&context, thumbnail(media, 256)).await.unwrap();
        let claim = lab.engine.claim_tasks(&context, claim_one("control")).await.unwrap();
        let fence = claim[0].fence();
        lab.engine.heartbeat(&fence, Some(120_000)).await.unwrap();
        let phase = Progress {
            phase: "writing".into(),
            processed: 1,
            total: Some(1),
        };
        lab.engine.report_progress(&context, &fence, phase).await.unwrap();
        lab.engine
            .complete_task(
                &context,
                &fence,
                Completion::Output(json!({"path": "/thumbs/control.png"})),
            )
            .await
            .unwrap();
        lab.timeline_types(requested.operation_id).await
    };
    assert_eq!(
        control,
        [
            "operation_created",
            "operation_claimed",
            "operation_progressed",
            "operation_succeeded"
        ]
    );

    let injected = lab.store.injected();
    let mut operations = Vec::with_capacity(TASKS);
    for n in 0..TASKS {
        operations.push(one_task_through_ambiguous_failures(&lab, n).await);
    }
    assert_eq!(lab.store.injected() - injected, 5 * TASKS as u64);
    for operation_id in operations {
        assert_eq!(lab.timeline_types(operation_id).await, control, "task {operation_id}");
    }
    lab.assert_replay_agrees().await;
}

async fn every_writing_command_retried_with_its_request_id_answers_its_first_result<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    let a = lab.media("/photos/a.png").await;
    let b = lab.media("/photos/b.png").await;

    // A failure, retried: the task fails terminally once, and its review
    // entry opens once.
    let context = CommandContext::actor("test");
    lab.engine.request_task(&context, thumbnail(a, 256)).await.unwrap();
    let claims = lab.engine.claim_tasks(&context, claim_one("w")).await.unwrap();
    let fail = with_id("w", "fail-a");
    let fence = claims[0].fence();
    let (failed, appended) = lab
        .through_ambiguous_failure(|| lab.engine.fail_task(&fail, &fence, "decoder crashed", true))
        .await;
    assert_eq!(failed.status, OperationStatus::FailedTerminal);
    assert!(appended >= 1);
    let entries = lab.engine.review_entries().await.unwrap();
    assert_eq!(entries.len(), 1);

    // The review entry resolved, retried: one resolution, and the retry
    // answers it instead of "not open".
    let resolve = with_id("support", "resolve-a");
    let (resolved, appended) = lab
        .through_ambiguous_failure(|| {
            lab.engine
                .resolve_review(&resolve, entries[0].entry_id, ReviewAction::Retry, None, "")
        })
        .await;
    assert_eq!(resolved.entry_id, entries[0].entry_id);
    assert!(appended >= 1);

    // A cancel, retried.
    let cancel = with_id("support", "cancel-a");
    let (cancelled, _) = lab
        .through_ambiguous_failure(|| lab.engine.cancel_task(&cancel, failed.operation_id, "not needed"))
        .await;
    assert_eq!(cancelled.status, OperationStatus::Cancelled);

    // A batch created, cancelled and resumed, each retried: one batch.
    let create = with_id("support", "batch-b");
    let batch_request = || BatchRequest {
        name: "thumbnails".into(),
        media: vec![b],
        kinds: vec!["thumbnail".into()],
        inputs: BTreeMap::new(),
        priority: 0,
    };
    let (created, _) = lab
        .through_ambiguous_failure(|| lab.engine.create_batch(&create, batch_request()))
        .await;
    assert_eq!(
        lab.engine.batches(false).await.unwrap().len(),
        1,
        "the retry made a second batch"
    );
    let batch_id = created.batch.batch_id;
    let cancel_batch = with_id("support", "batch-b-cancel");
    let (cancelled, _) = lab
        .through_ambiguous_failure(|| lab.engine.cancel_batch(&cancel_batch, batch_id, "wrong run"))
        .await;
    assert!(!cancelled.active);
    let resume_batch = with_id("support", "batch-b-resume");
    let (resumed, _) = lab
        .through_ambiguous_failure(|| lab.engine.resume_batch(&resume_batch, batch_id, "right run"))
        .await;
    assert!(resumed.active);

    // A request id names one command: the same id with other arguments,
    // or for another command, is a conflict naming it, and writes nothing.
    let head = lab.head().await;
    let reused = lab
        .engine
        .request_task(&with_id("scheduler", "fail-a"), thumbnail(b, 512))
        .await;
    assert!(
        matches!(&reused, Err(EngineError::Domain(DomainError::Conflict(message))) if message.contains("fail-a")),
        "{reused:?}"
    );
    let other_arguments = lab
        .engine
        .cancel_task(&with_id("support", "cancel-a"), failed.operation_id, "another reason")
        .await;
    assert!(
        matches!(&other_arguments, Err(EngineError::Domain(DomainError::Conflict(_)))),
        "{other_arguments:?}"
    );
    assert_eq!(lab.head().await, head);

    // Commands over many items refuse a request id instead of ignoring it.
    let many = lab
        .engine
        .request_tasks(&with_id("scheduler", "many"), vec![thumbnail(b, 512)])
        .await;
    assert!(
        matches!(many, Err(EngineError::Domain(DomainError::InvalidInput(_)))),
        "{many:?}"
    );
    lab.assert_replay_agrees().await;
}

async fn a_request_id_is_forgotten_after_its_retention<B: Backend>(backend: &B) {
    let lab = lab(backend).await;
    let a = lab.media("/photos/a.png").await;
    let request = with_id("scheduler", "reused-later");
    lab.engine.request_task(&request, thumbnail(a, 256)).await.unwrap();
    // Within the retention the id still names that request.
    lab.clock.advance_millis(REQUEST_RETENTION_MS - 1_000);
    let report = lab.engine.recover(&CommandContext::actor("system")).await.unwrap();
    assert_eq!(report.forgotten_requests, 0);
    let conflict = lab.engine.request_task(&request, thumbnail(a, 512)).await;
    assert!(matches!(conflict, Err(EngineError::Domain(DomainError::Conflict(_)))));
    // Past it, recovery forgets it, and the id is free.
    lab.clock.advance_millis(2_000);
    let report = lab.engine.recover(&CommandContext::actor("system")).await.unwrap();
    assert_eq!(report.forgotten_requests, 1);
    let outcome = lab.engine.request_task(&request, thumbnail(a, 512)).await.unwrap();
    assert!(outcome.created);
    lab.assert_replay_agrees().await;
}

backend_tests!(
    a_thousand_ambiguous_failures_leave_exactly_one_event_per_logical_command,
    every_writing_command_retried_with_its_request_id_answers_its_first_result,
    a_request_id_is_forgotten_after_its_retention,
);
