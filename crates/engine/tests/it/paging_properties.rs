//! The paging guarantee of the query layer, as a property: paging through
//! `list_operations` while new operations are created and existing ones
//! change status between pages never skips nor repeats an operation that
//! existed when the first page was read.
//!
//! A case builds a ledger (operations of three kinds on their own media
//! items, at moving times, some claimed, completed or failed), picks a
//! listing (every operation, one kind, or one status) and page sizes, and
//! between every two pages runs a few commands: new operations, claims,
//! completions, failures. Properties:
//! 1. No operation appears twice across the pages.
//! 2. Without a status filter, the pages hold exactly the operations that
//!    existed (of that kind) when paging began: none skipped, and none of
//!    those created since (the clock only moves forward, so they sort
//!    before the first page's position, newest first).
//! 3. With a status filter, every operation on the pages had that status
//!    when paging began (nothing here moves work back to `queued`), and
//!    every one that had it and was not touched since is on them.
//! 4. At the end `verify()` finds the projections identical to a replay.
//!
//! The property runs on SQLite with shrinking; a few generated cases also
//! run on every backend (`backend_tests!`). Failure persistence is off.

use opledger_domain::kinds::legacy;
use opledger_domain::projections::{Row, OPERATIONS_TABLE};
use opledger_domain::{MediaId, OperationId, OperationStatus, Timestamp};
use opledger_engine::{
    ClaimRequest, CommandContext, Completion, Engine, FixedClock, FixedJitter, OpsFilter, PageRequest, SequentialIds,
    TaskClaim, TaskRequest, TaskTarget,
};
use opledger_store::Store;
use opledger_store_sqlite::{SqliteConfig, SqliteStore};
use opledger_testkit::{backend_tests, Backend};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const KINDS: [&str; 3] = ["metadata", "thumbnail", "perceptual_hash"];

#[derive(Debug, Clone)]
enum Step {
    /// A new media item with one task of `KINDS[kind]`, after the clock
    /// moved a second or not at all.
    Create { kind: usize, advance: bool },
    /// Claim up to `limit` tasks of a kind.
    Claim { kind: usize, limit: usize },
    /// Complete up to `count` held claims.
    Complete { count: usize },
    /// Fail up to `count` held claims, terminally or to be retried.
    Fail { count: usize, terminal: bool },
}

#[derive(Debug, Clone)]
enum Listing {
    Every,
    Kind(usize),
    Queued,
}

#[derive(Debug, Clone)]
struct Case {
    setup: Vec<Step>,
    listing: Listing,
    limits: Vec<usize>,
    between: Vec<Vec<Step>>,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..3usize, any::<bool>()).prop_map(|(kind, advance)| Step::Create { kind, advance }),
        2 => (0..3usize, 1..4usize).prop_map(|(kind, limit)| Step::Claim { kind, limit }),
        1 => (1..3usize).prop_map(|count| Step::Complete { count }),
        1 => (1..3usize, any::<bool>()).prop_map(|(count, terminal)| Step::Fail { count, terminal }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(step(), 5..40),
        prop_oneof![
            Just(Listing::Every),
            (0..3usize).prop_map(Listing::Kind),
            Just(Listing::Queued)
        ],
        prop::collection::vec(1..6usize, 1..4),
        prop::collection::vec(prop::collection::vec(step(), 0..4), 1..4),
    )
        .prop_map(|(setup, listing, limits, between)| Case {
            setup,
            listing,
            limits,
            between,
        })
}

struct World<S: Store> {
    engine: Engine<S>,
    clock: Arc<FixedClock>,
    context: CommandContext,
    held: Vec<TaskClaim>,
    /// Operations whose status a step changed.
    touched: BTreeSet<OperationId>,
    paths: usize,
}

impl<S: Store> World<S> {
    /// A world whose ids and times start after those of `earlier` cases
    /// run on the same database.
    async fn new(store: S, earlier: u32) -> Self {
        let earlier = i64::from(earlier);
        let start = Timestamp::from_micros(1_700_000_000_000_000 + earlier * 1_000_000_000_000);
        let clock = Arc::new(FixedClock::at(start));
        let first_id = 1 + earlier as u128 * 1_000_000;
        let engine = Engine::with_clock(store, clock.clone(), Arc::new(SequentialIds::starting_at(first_id)))
            .with_jitter(Arc::new(FixedJitter(0)));
        engine.startup().await.unwrap();
        engine
            .declare(&CommandContext::actor("deploy"), legacy::declarations())
            .await
            .unwrap();
        World {
            engine,
            clock,
            context: CommandContext::actor("test"),
            held: Vec::new(),
            touched: BTreeSet::new(),
            paths: 0,
        }
    }

    async fn step(&mut self, step: &Step) {
        match *step {
            Step::Create { kind, advance } => {
                if advance {
                    self.clock.advance_millis(1_000);
                }
                self.paths += 1;
                let media: MediaId = self
                    .engine
                    .register_media(
                        &self.context,
                        &format!("/p/{}.png", self.paths),
                        "image",
                        Some(format!("sha256:{}", self.paths)),
                        None,
                    )
                    .await
                    .unwrap();
                self.engine
                    .request_task(
                        &self.context,
                        TaskRequest {
                            target: TaskTarget::Media(media),
                            kind: KINDS[kind].into(),
                            inputs: json!({}),
                            priority: 0,
                        },
                    )
                    .await
                    .unwrap();
            }
            Step::Claim { kind, limit } => {
                let claims = self
                    .engine
                    .claim_tasks(
                        &self.context,
                        ClaimRequest {
                            kinds: vec![KINDS[kind].into()],
                            worker: "w".into(),
                            lease_ms: 600_000,
                            limit,
                            principal: None,
                            versions: Default::default(),
                        },
                    )
                    .await
                    .unwrap();
                self.touched.extend(claims.iter().map(|claim| claim.operation_id));
                self.held.extend(claims);
            }
            Step::Complete { count } => {
                for claim in self.take(count) {
                    self.engine
                        .complete_task(&self.context, &claim.fence(), Completion::Output(json!({})))
                        .await
                        .unwrap();
                }
            }
            Step::Fail { count, terminal } => {
                for claim in self.take(count) {
                    self.engine
                        .fail_task(&self.context, &claim.fence(), "broken", terminal)
                        .await
                        .unwrap();
                }
            }
        }
    }

    fn take(&mut self, count: usize) -> Vec<TaskClaim> {
        let count = count.min(self.held.len());
        self.held.drain(..count).collect()
    }

    async fn statuses(&self) -> BTreeMap<OperationId, (String, OperationStatus)> {
        self.engine
            .store()
            .scan_table(&OPERATIONS_TABLE)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|row| match row {
                Row::Operation(operation) => Some((operation.operation_id, (operation.kind, operation.status))),
                _ => None,
            })
            .collect()
    }
}

/// Runs one case on `store`; the first broken property is the error.
async fn check<S: Store>(store: S, earlier: u32, case: &Case) -> Result<(), TestCaseError> {
    let mut world = World::new(store, earlier).await;
    for step in &case.setup {
        world.step(step).await;
    }
    world.touched.clear();
    let filter = match case.listing {
        Listing::Every => OpsFilter::default(),
        Listing::Kind(kind) => OpsFilter {
            kinds: vec![KINDS[kind].into()],
            ..OpsFilter::default()
        },
        Listing::Queued => OpsFilter {
            statuses: vec![OperationStatus::Queued],
            ..OpsFilter::default()
        },
    };
    let before = world.statuses().await;
    let mut seen: Vec<OperationId> = Vec::new();
    let mut page = PageRequest::first(case.limits[0]);
    for index in 0.. {
        let answer = world.engine.list_operations(&filter, &page).await.unwrap();
        seen.extend(answer.items.iter().map(|item| item.operation_id));
        let Some(next) = answer.next else { break };
        prop_assert!(index < 1_000, "the listing ends");
        for step in &case.between[index % case.between.len()] {
            world.step(step).await;
        }
        page = PageRequest {
            limit: case.limits[(index + 1) % case.limits.len()],
            after: Some(next),
        };
    }
    let unique: BTreeSet<OperationId> = seen.iter().copied().collect();
    prop_assert_eq!(unique.len(), seen.len(), "an operation appeared twice: {:?}", seen);
    prop_assert!(
        unique.iter().all(|id| before.contains_key(id)),
        "an operation created after paging began was listed"
    );
    match case.listing {
        Listing::Every | Listing::Kind(_) => {
            let expected: BTreeSet<OperationId> = before
                .iter()
                .filter(|(_, (kind, _))| match case.listing {
                    Listing::Kind(wanted) => kind == KINDS[wanted],
                    _ => true,
                })
                .map(|(id, _)| *id)
                .collect();
            prop_assert_eq!(unique, expected, "skipped or foreign operations");
        }
        Listing::Queued => {
            for id in &unique {
                prop_assert_eq!(before[id].1, OperationStatus::Queued, "{} was not queued", id);
            }
            for (id, (_, status)) in &before {
                if *status == OperationStatus::Queued && !world.touched.contains(id) {
                    prop_assert!(unique.contains(id), "untouched queued {} was skipped", id);
                }
            }
        }
    }
    let report = world.engine.verify().await.unwrap();
    prop_assert!(report.is_identical(), "{}", report.render());
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

#[test]
fn paging_operations_while_they_change_never_skips_nor_repeats_one_that_existed() {
    let defaults = ProptestConfig::default();
    let config = ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            defaults.cases
        } else {
            32
        },
        failure_persistence: None,
        ..defaults
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&case(), |case| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        runtime().block_on(async {
            let store = SqliteStore::open(SqliteConfig::at(dir.path().join("paging.db")))
                .await
                .unwrap();
            check(store, 0, &case).await
        })
    });
    if let Err(error) = result {
        panic!("{error}");
    }
}

/// A few generated cases on every backend, one after another on one
/// database (each later in time than the ones before).
async fn generated_paging_cases_keep_the_guarantee_on_every_backend<B: Backend>(backend: &B) {
    let mut runner = TestRunner::deterministic();
    let strategy = case();
    for earlier in 0..3 {
        let case = strategy.new_tree(&mut runner).unwrap().current();
        if let Err(error) = check(backend.open().await, earlier, &case).await {
            panic!("{case:?}: {error}");
        }
    }
}

backend_tests!(generated_paging_cases_keep_the_guarantee_on_every_backend);
