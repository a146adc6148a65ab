//! Declared task kinds: applying a declaration file (each kind classified
//! against the one recorded, the whole catalogue checked, then every
//! declaration appended in one transaction), the upgrade of ledgers
//! written before declarations existed, and the catalogue's reads.
//!
//! The rules are the domain's (`opledger_domain::kinds`); this module loads
//! what is recorded, asks, and appends. A kind whose new version makes
//! results out of date has them marked `stale` right after its declaration
//! commits (`stale`), in chunks; an apply interrupted between the two is
//! completed by the next maintenance pass, which marks the same rows.

mod file;
mod reprocess;
mod stale;

pub use file::{parse_kinds, KindsDocument, LocatedKind, MAX_KINDS_FILE_BYTES};
pub use reprocess::ReprocessOutcome;

use crate::error::EngineError;
use crate::load::all_kinds;
use crate::tx::{CommandContext, Decided};
use crate::Engine;
use opledger_domain::events::{Event, TaskKindDeclared};
use opledger_domain::kinds::{check_catalogue, classify, legacy, KindChange, KindDeclaration};
use opledger_domain::projections::{Row, TaskKindRow, WorkingSet, TASK_KINDS_TABLE};
use opledger_domain::versions::VERSION_CHANGED;
use opledger_domain::EventEnvelope;
use opledger_domain::{DomainError, StreamId};
use opledger_store::{ErrorKind, ExpectedVersion, Store, StreamAppend};
use serde::Serialize;
use std::collections::BTreeMap;

/// The reason recorded on declarations `kinds apply` appends.
pub const APPLY_REASON: &str = "kinds apply";

/// The most task kinds a catalogue holds unless the engine is told more
/// ([`Engine::with_max_kinds`]).
pub const DEFAULT_MAX_KINDS: usize = 1_000;

/// What applying a file did (or, refused or dry, would do) to each kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindsReport {
    pub kinds: Vec<KindReport>,
    /// Whether the declarations were recorded: false for a dry run, and
    /// when any kind was refused (then nothing is appended).
    #[serde(skip)]
    pub applied: bool,
}

impl KindsReport {
    pub fn refused(&self) -> impl Iterator<Item = &KindReport> {
        self.kinds.iter().filter(|kind| kind.status == KindStatus::Refused)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KindReport {
    pub name: String,
    pub status: KindStatus,
    pub version: String,
    /// Capabilities whose result the new version made `stale` (or would).
    pub stale_items: usize,
    /// Waiting tasks the new version re-targeted in the same transaction
    /// (requested again at it, or blocked where it cannot run what they
    /// were requested with); 0 for a dry run.
    pub retargeted: usize,
    /// Why a refused kind was refused, with its line and column.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KindStatus {
    Declared,
    Unchanged,
    Changed,
    Refused,
}

/// A kind of the file, decided: its normalized declaration and change, or
/// why it is refused.
type Decision = Result<(KindDeclaration, KindChange), String>;

/// Decides every kind of `document` against what is recorded (`recorded`,
/// by name): each alone, then the catalogue they would make together.
fn decide(document: &KindsDocument, recorded: &BTreeMap<String, TaskKindRow>) -> Vec<Decision> {
    let mut decisions: Vec<Decision> = document
        .kinds
        .iter()
        .map(|located| {
            let refuse = |error: DomainError| format!("{}{}", located.at(), plain(&error));
            let declaration = located.declaration.clone().normalized().map_err(refuse)?;
            let row = recorded.get(&declaration.name);
            if let Some(row) = row.filter(|row| !row.declared) {
                // Seen in tasks of a log from before declarations: the
                // declaration must say what those tasks were.
                if row.target != declaration.target || row.capability != declaration.capability {
                    return Err(refuse(DomainError::Conflict(format!(
                        "task kind {} already has tasks on {} targets producing {:?}; declare it so",
                        row.name,
                        row.target,
                        row.capability.as_deref().unwrap_or("no capability")
                    ))));
                }
            }
            let change = classify(row.and_then(|row| row.declaration.as_ref()), &declaration).map_err(refuse)?;
            Ok((declaration, change))
        })
        .collect();
    // The catalogue after the apply: what is recorded, with the file's
    // valid kinds in place of theirs.
    let mut catalogue: BTreeMap<&str, &KindDeclaration> = recorded
        .values()
        .filter_map(|row| row.declaration.as_ref())
        .map(|declaration| (declaration.name.as_str(), declaration))
        .collect();
    for (declaration, _) in decisions.iter().flatten() {
        catalogue.insert(declaration.name.as_str(), declaration);
    }
    let catalogue: Vec<&KindDeclaration> = catalogue.into_values().collect();
    if let Err((name, error)) = check_catalogue(&catalogue) {
        let message = plain(&error);
        let index = document
            .kinds
            .iter()
            .position(|located| located.declaration.name == name);
        match index {
            Some(index) => decisions[index] = Err(format!("{}{message}", document.kinds[index].at())),
            // A recorded kind the file does not name: every kind of the
            // file shares the refusal.
            None => {
                for decision in decisions.iter_mut().filter(|decision| decision.is_ok()) {
                    *decision = Err(format!("{name}: {message}"));
                }
            }
        }
    }
    decisions
}

/// How many tasks of each kind the versions reaction moved to a new
/// version among `envelopes` (its events follow the declaration's).
fn retargeted(rows: &WorkingSet, envelopes: &[EventEnvelope]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for envelope in envelopes {
        let moved = match &envelope.event {
            Event::OperationRevisionRequested(requested) => requested.reason.as_deref() == Some(VERSION_CHANGED),
            Event::OperationBlocked(blocked) => blocked.reason.starts_with(VERSION_CHANGED),
            _ => false,
        };
        let Some(operation_id) = envelope.event.operation_id().filter(|_| moved) else {
            continue;
        };
        if let Some(state) = crate::work::state_in(rows, operation_id) {
            *counts.entry(state.task_kind).or_insert(0) += 1;
        }
    }
    counts
}

/// A domain refusal's message without its category prefix.
fn plain(error: &DomainError) -> String {
    match error {
        DomainError::InvalidInput(message) | DomainError::Conflict(message) => message.clone(),
        other => other.to_string(),
    }
}

impl<S: Store> Engine<S> {
    /// Applies a declaration file: a new kind is declared, an unchanged one
    /// appends nothing, a new version is recorded (and every capability
    /// produced at another version becomes `stale`), a policy-only change
    /// is recorded without staleness. A change that alters results without
    /// a new version, or any other refusal, refuses the whole file:
    /// nothing is appended, and the report says which kinds and why. A dry
    /// run decides the same and appends nothing.
    pub async fn apply_kinds(
        &self,
        context: &CommandContext,
        document: &KindsDocument,
        dry_run: bool,
    ) -> Result<KindsReport, EngineError> {
        self.declare_kinds(context, document, dry_run, APPLY_REASON).await
    }

    /// Declares kinds given in code (a pipeline that ships its own, or a
    /// test), as [`Engine::apply_kinds`] would from a file; any refusal is
    /// this call's error, and nothing is recorded.
    pub async fn declare(
        &self,
        context: &CommandContext,
        declarations: Vec<KindDeclaration>,
    ) -> Result<KindsReport, EngineError> {
        let report = self
            .apply_kinds(context, &KindsDocument::of(declarations), false)
            .await?;
        if let Some(refused) = report.refused().next() {
            return Err(EngineError::invalid(format!(
                "task kind {} refused: {}",
                refused.name,
                refused.error.as_deref().unwrap_or("refused")
            )));
        }
        Ok(report)
    }

    async fn declare_kinds(
        &self,
        context: &CommandContext,
        document: &KindsDocument,
        dry_run: bool,
        reason: &'static str,
    ) -> Result<KindsReport, EngineError> {
        let stamp = self.stamp(context);
        let document = document.clone();
        let max_kinds = self.max_kinds;
        let (mut report, bumped) = self
            .stamped(stamp, move |tx, _rows, stamp| {
                Box::pin(async move {
                    let recorded: BTreeMap<String, TaskKindRow> = all_kinds(tx)
                        .await?
                        .into_iter()
                        .map(|row| (row.name.clone(), row))
                        .collect();
                    let decisions = decide(&document, &recorded);
                    let refused = decisions.iter().any(Result::is_err);
                    let mut kinds = Vec::with_capacity(decisions.len());
                    let mut events = Vec::new();
                    let mut bumped = Vec::new();
                    for (located, decision) in document.kinds.iter().zip(decisions) {
                        let (status, version, error) = match decision {
                            Err(error) => (KindStatus::Refused, located.declaration.version.clone(), Some(error)),
                            Ok((declaration, change)) => {
                                let status = match change {
                                    KindChange::Declared => KindStatus::Declared,
                                    KindChange::Unchanged => KindStatus::Unchanged,
                                    KindChange::NewVersion | KindChange::Policy => KindStatus::Changed,
                                };
                                let version = declaration.version.clone();
                                if change == KindChange::NewVersion {
                                    bumped.push((declaration.name.clone(), version.clone()));
                                }
                                if change != KindChange::Unchanged {
                                    let previous_version = recorded
                                        .get(&declaration.name)
                                        .filter(|row| row.declared)
                                        .map(|row| row.kind_version.clone());
                                    events.push(stamp.event(Event::TaskKindDeclared(TaskKindDeclared {
                                        declaration: Box::new(declaration),
                                        change,
                                        previous_version,
                                        reason: reason.to_string(),
                                    })));
                                }
                                (status, version, None)
                            }
                        };
                        kinds.push(KindReport {
                            name: located.declaration.name.clone(),
                            status,
                            version,
                            stale_items: 0,
                            retargeted: 0,
                            error,
                        });
                    }
                    let adding = kinds.iter().filter(|kind| kind.status == KindStatus::Declared).count();
                    let declared = recorded.values().filter(|row| row.declared).count();
                    opledger_domain::kinds::check_catalogue_size(declared, adding, max_kinds)?;
                    let applied = !refused && !dry_run;
                    let appends = if applied && !events.is_empty() {
                        // One stream: every declaration moves its version,
                        // and each row keeps the version of its last one.
                        let head = recorded.values().map(|row| row.version).max().unwrap_or(0);
                        vec![StreamAppend {
                            stream_id: StreamId::task_kinds(),
                            expected: if head == 0 {
                                ExpectedVersion::NoStream
                            } else {
                                ExpectedVersion::Exactly(head)
                            },
                            events,
                        }]
                    } else {
                        Vec::new()
                    };
                    Ok(Decided::then(appends, move |rows, envelopes| {
                        let mut kinds = kinds;
                        for (kind, count) in retargeted(rows, &envelopes) {
                            if let Some(report) = kinds.iter_mut().find(|report| report.name == kind) {
                                report.retargeted = count;
                            }
                        }
                        Ok((KindsReport { kinds, applied }, bumped))
                    }))
                })
            })
            .await?;
        if report.refused().next().is_some() {
            return Ok(report);
        }
        for (name, version) in bumped {
            let stale = if report.applied {
                self.mark_stale(context, &name, &version).await?
            } else {
                self.count_stale(&name, &version).await?
            };
            if let Some(kind) = report.kinds.iter_mut().find(|kind| kind.name == name) {
                kind.stale_items = stale;
            }
        }
        Ok(report)
    }

    /// Records the declarations of the former built-in kinds (version "1",
    /// their policies of then; actor as given, reason `upgrade`) when the
    /// log holds tasks of kinds it never declared: a ledger written before
    /// declarations existed. Once recorded, there is nothing to do.
    /// Returns how many kinds it declared.
    pub async fn upgrade_kinds(&self, context: &CommandContext) -> Result<usize, EngineError> {
        let kinds = self.task_kinds().await?;
        if kinds.iter().all(|row| row.declared) {
            return Ok(0);
        }
        let missing: Vec<KindDeclaration> = legacy::declarations()
            .into_iter()
            .filter(|declaration| !kinds.iter().any(|row| row.declared && row.name == declaration.name))
            .collect();
        let report = match self
            .declare_kinds(context, &KindsDocument::of(missing), false, legacy::UPGRADE_REASON)
            .await
        {
            Ok(report) => report,
            // Another process opening the same ledger declared them first.
            Err(error) if error.is_store(ErrorKind::Conflict) => {
                if self.task_kinds().await?.iter().all(|row| row.declared) {
                    return Ok(0);
                }
                return Err(error);
            }
            Err(error) => return Err(error),
        };
        if let Some(refused) = report.refused().next() {
            return Err(EngineError::invalid(format!(
                "the former built-in kind {} cannot be declared: {}",
                refused.name,
                refused.error.as_deref().unwrap_or("refused")
            )));
        }
        Ok(report
            .kinds
            .iter()
            .filter(|kind| kind.status != KindStatus::Unchanged)
            .count())
    }

    /// Every task kind the ledger knows, in name order (`declared` is false
    /// for a kind seen only in tasks of a log from before declarations).
    pub async fn task_kinds(&self) -> Result<Vec<TaskKindRow>, EngineError> {
        let mut kinds: Vec<TaskKindRow> = self
            .store
            .scan_table(&TASK_KINDS_TABLE)
            .await?
            .into_iter()
            .filter_map(|row| match row {
                Row::TaskKind(row) => Some(row),
                _ => None,
            })
            .collect();
        kinds.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(kinds)
    }

    /// One declared task kind; refused, naming the declared ones, when it
    /// is not declared.
    pub async fn task_kind(&self, name: &str) -> Result<TaskKindRow, EngineError> {
        let kinds = self.task_kinds().await?;
        match kinds.iter().find(|row| row.name == name && row.declared) {
            Some(row) => Ok(row.clone()),
            None => Err(crate::load::undeclared(name, &kinds)),
        }
    }
}
