//! `task_kinds`: the declared task kinds — the application's pipeline —
//! each with its current declaration.
//!
//! One row per kind, replaced by each `task_kind_declared` on the
//! `task_kinds` stream. The processing-state tables reference this table by
//! `(name, target)`, so a state row of an undeclared kind, or of a region
//! kind on a media row, cannot exist. A log written before declarations
//! existed creates its tasks before declaring their kinds; for such a task
//! the fold records its kind as *seen, not declared* (from the facts its
//! event carries) so that the reference holds from the first task on, and
//! the declaration an upgrade appends completes the row.

use super::cells::{text_or_null, Cell, CellReader, ColumnSpec, ColumnType, MapError, TableSpec};
use super::working_set::{Key, RowKey, WorkingSet};
use super::{ProjectionSpec, Projector, Row};
use crate::envelope::EventEnvelope;
use crate::error::FoldError;
use crate::events::Event;
use crate::kinds::KindDeclaration;
use crate::tasks::TargetType;
use crate::time::Timestamp;

pub static TASK_KINDS_TABLE: TableSpec = TableSpec {
    name: "task_kinds",
    columns: &[
        ColumnSpec::required("name", ColumnType::Text),
        ColumnSpec::required("target", ColumnType::Text),
        ColumnSpec::required("kind_version", ColumnType::Text),
        ColumnSpec::optional("capability", ColumnType::Text),
        ColumnSpec::required("required", ColumnType::Bool),
        ColumnSpec::required("declared", ColumnType::Bool),
        ColumnSpec::optional("declaration", ColumnType::Json),
        ColumnSpec::required("declared_at", ColumnType::Timestamp),
        ColumnSpec::required("updated_at", ColumnType::Timestamp),
        ColumnSpec::required("version", ColumnType::Integer),
    ],
    key_columns: 1,
};

pub static TASK_KINDS: ProjectionSpec = ProjectionSpec {
    name: "task_kinds",
    version: 1,
    tables: &[&TASK_KINDS_TABLE],
    question: "Which task kinds does the application declare: their target, version, inputs, capability, needs and retry policy?",
    depends_on: &[],
};

/// One task kind.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskKindRow {
    pub name: String,
    pub target: TargetType,
    /// The declared version (for a kind only seen, the version its first
    /// task was requested at).
    pub kind_version: String,
    pub capability: Option<String>,
    pub required: bool,
    /// False for a kind seen in a log written before declarations, until
    /// its declaration is recorded.
    pub declared: bool,
    /// The current declaration, normalized.
    pub declaration: Option<KindDeclaration>,
    pub declared_at: Timestamp,
    pub updated_at: Timestamp,
    /// The `task_kinds` stream's version after the kind's last
    /// declaration (0 while only seen).
    pub version: i64,
}

impl TaskKindRow {
    pub fn to_cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text(self.name.clone()),
            Cell::Text(self.target.to_string()),
            Cell::Text(self.kind_version.clone()),
            text_or_null(&self.capability),
            Cell::Bool(self.required),
            Cell::Bool(self.declared),
            match &self.declaration {
                Some(declaration) => Cell::Text(serde_json::to_string(declaration).expect("a declaration serializes")),
                None => Cell::Null,
            },
            Cell::Timestamp(self.declared_at),
            Cell::Timestamp(self.updated_at),
            Cell::Integer(self.version),
        ]
    }

    pub fn from_cells(cells: Vec<Cell>) -> Result<Self, MapError> {
        let mut reader = CellReader::new(&TASK_KINDS_TABLE, cells);
        let name = reader.text()?;
        let target = reader.parsed()?;
        let kind_version = reader.text()?;
        let capability = reader.optional_text()?;
        let required = reader.boolean()?;
        let declared = reader.boolean()?;
        let declaration = match reader.optional_text()? {
            Some(text) => Some(
                serde_json::from_str(&text)
                    .map_err(|error| MapError::new("task_kinds", format!("declaration of {name}: {error}")))?,
            ),
            None => None,
        };
        Ok(TaskKindRow {
            name,
            target,
            kind_version,
            capability,
            required,
            declared,
            declaration,
            declared_at: reader.timestamp()?,
            updated_at: reader.timestamp()?,
            version: reader.integer()?,
        })
    }
}

pub fn task_kind_key(name: &str) -> RowKey {
    RowKey::new(&TASK_KINDS_TABLE, Key::from_text(name))
}

/// Folds declarations (and, in logs from before them, the kinds their
/// tasks name) into `task_kinds`.
pub struct TaskKinds;

impl Projector for TaskKinds {
    fn spec(&self) -> &'static ProjectionSpec {
        &TASK_KINDS
    }

    fn keys(&self, event: &EventEnvelope, keys: &mut Vec<RowKey>) {
        match &event.event {
            Event::TaskKindDeclared(declared) => keys.push(task_kind_key(&declared.declaration.name)),
            Event::OperationCreated(created) if created.task.is_some() => keys.push(task_kind_key(&created.kind)),
            _ => {}
        }
    }

    fn apply(&self, event: &EventEnvelope, rows: &mut WorkingSet) -> Result<(), FoldError> {
        let fail = |reason: String| FoldError {
            seq: event.seq,
            event_type: event.event_type(),
            reason,
        };
        match &event.event {
            Event::TaskKindDeclared(declared) => {
                let declaration = &declared.declaration;
                let key = task_kind_key(&declaration.name);
                let declared_at = match rows.get(&key) {
                    Some(Row::TaskKind(row)) if row.target != declaration.target => {
                        return Err(fail(format!(
                            "task kind {} runs on {} targets, not {}",
                            row.name, row.target, declaration.target
                        )))
                    }
                    Some(Row::TaskKind(row)) if row.declared => row.declared_at,
                    _ => event.recorded_at,
                };
                rows.put(Row::TaskKind(TaskKindRow {
                    name: declaration.name.clone(),
                    target: declaration.target,
                    kind_version: declaration.version.clone(),
                    capability: declaration.capability.clone(),
                    required: declaration.required,
                    declared: true,
                    declaration: Some(declaration.as_ref().clone()),
                    declared_at,
                    updated_at: event.recorded_at,
                    version: event.stream_version,
                }));
            }
            Event::OperationCreated(created) => {
                let Some(facts) = &created.task else {
                    return Ok(());
                };
                match rows.get(&task_kind_key(&created.kind)) {
                    Some(Row::TaskKind(row)) if row.target != facts.target => {
                        return Err(fail(format!(
                            "task kind {} runs on {} targets, not {}",
                            row.name, row.target, facts.target
                        )))
                    }
                    Some(_) => {}
                    None => rows.put(Row::TaskKind(TaskKindRow {
                        name: created.kind.clone(),
                        target: facts.target,
                        kind_version: created.task_version.clone().unwrap_or_else(|| "1".to_string()),
                        capability: facts.capability.clone(),
                        required: facts.required,
                        declared: false,
                        declaration: None,
                        declared_at: event.recorded_at,
                        updated_at: event.recorded_at,
                        version: 0,
                    })),
                }
            }
            _ => {}
        }
        Ok(())
    }
}
