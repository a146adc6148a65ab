//! Declared task kinds: the application's pipeline as data.
//!
//! A task kind is declared by the application (`opledger kinds apply`, or
//! `Engine::apply_kinds`), recorded as a [`TaskKindDeclared`] event on the
//! `task_kinds` stream and folded into the `task_kinds` projection; every
//! command reads the declarations from there, in its own transaction. This
//! module owns the *rules* about declarations — what a valid one is
//! ([`KindDeclaration::normalized`]), how two of them differ
//! ([`classify`]), how a catalogue hangs together ([`check_catalogue`]), and
//! how a request's inputs are checked against one ([`complete_inputs`]) —
//! never the catalogue itself, which belongs to the log.
//!
//! [`TaskKindDeclared`]: crate::events::TaskKindDeclared

mod change;
mod inputs;
pub mod legacy;
mod needs;

pub use change::{check_catalogue, classify, KindChange};
pub use inputs::{complete_inputs, InputDecl, InputKind, TARGET_VALUES};
pub use needs::{unmet_need, BlockedOn, DEPENDENCY_SATISFIED};

use crate::error::DomainError;
use crate::tasks::{RetryPolicy, TargetType};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The stream every declaration is appended to: one stream, so two
/// concurrent applies of the catalogue cannot interleave unseen.
pub const TASK_KINDS_STREAM: &str = "task_kinds";

/// The longest kind, capability or media-kind name.
pub const MAX_NAME_LEN: usize = 64;

/// One task kind as the application declares it, and as the log records
/// it once [normalized](KindDeclaration::normalized).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KindDeclaration {
    /// `[a-z][a-z0-9_.]{0,63}`.
    pub name: String,
    pub target: TargetType,
    /// What produced a result: an implementation, model or package
    /// version. Part of every revision.
    pub version: String,
    /// The capability of the item the kind produces; the kind's name when
    /// left out. Region kinds produce none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<String>,
    /// A required capability that ends missing needs a person (review
    /// queue); an optional one that finds nothing ends `no_result`.
    #[serde(default = "required_by_default")]
    pub required: bool,
    /// The media kinds the kind applies to; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applies_to: Vec<String>,
    /// Capabilities that must have succeeded on the item first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs: Vec<String>,
    /// The inputs that determine the result, by name.
    #[serde(default)]
    pub inputs: BTreeMap<String, InputDecl>,
    /// How the kind retries failures and survives interruptions.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// What the kind is for, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
}

fn required_by_default() -> bool {
    true
}

impl KindDeclaration {
    /// The capability the kind produces, if any (after normalizing).
    pub fn capability(&self) -> Option<&str> {
        self.capability.as_deref()
    }

    /// Whether the kind runs on items of `media_kind`.
    pub fn applies_to(&self, media_kind: &str) -> bool {
        self.applies_to.is_empty() || self.applies_to.iter().any(|kind| kind == media_kind)
    }

    /// Why the kind does not apply to an item of `media_kind`: the reason
    /// its task is recorded `not_applicable` with.
    pub fn not_applicable_reason(&self, media_kind: &str) -> String {
        format!(
            "{} applies to {}, not to {media_kind:?}",
            self.name,
            self.applies_to.join(", ")
        )
    }

    /// The declaration in its one recorded form, or why it is invalid:
    /// the capability filled in (media kinds), `applies_to` and `needs`
    /// sorted and without repeats, and the inputs every kind of its target
    /// gets from the target (`content_digest`; for regions also `bbox` and
    /// `region_revision`) added. Two declarations that mean the same are
    /// equal once normalized.
    pub fn normalized(mut self) -> Result<KindDeclaration, DomainError> {
        check_name("task kind name", &self.name)?;
        let name = self.name.clone();
        let invalid = |message: String| DomainError::InvalidInput(format!("task kind {name}: {message}"));
        let version = self.version.trim();
        if version.is_empty() || version.len() > MAX_NAME_LEN || version.chars().any(char::is_control) {
            return Err(invalid(format!(
                "version must be 1 to {MAX_NAME_LEN} printable characters"
            )));
        }
        self.version = version.to_string();
        match self.target {
            TargetType::Media => {
                let capability = self.capability.take().unwrap_or_else(|| self.name.clone());
                check_name("capability", &capability).map_err(|error| invalid(error.to_string()))?;
                self.capability = Some(capability);
            }
            TargetType::Region => {
                if self.capability.is_some() {
                    return Err(invalid(
                        "a region kind produces no capability of the item; leave `capability` out".to_string(),
                    ));
                }
            }
        }
        for list in [&mut self.applies_to, &mut self.needs] {
            list.sort();
            list.dedup();
        }
        for media_kind in &self.applies_to {
            check_name("media kind in applies_to", media_kind).map_err(|error| invalid(error.to_string()))?;
        }
        if self.target == TargetType::Region && !self.needs.is_empty() {
            return Err(invalid(
                "a region kind cannot have needs: needs wait for capabilities of a media item, which media kinds produce"
                    .to_string(),
            ));
        }
        for capability in &self.needs {
            check_name("capability in needs", capability).map_err(|error| invalid(error.to_string()))?;
            if Some(capability.as_str()) == self.capability() {
                return Err(invalid(format!("needs its own capability {capability:?}")));
            }
        }
        for (input, declared) in &self.inputs {
            check_name("input name", input).map_err(|error| invalid(error.to_string()))?;
            declared.check(input).map_err(&invalid)?;
        }
        for (input, implied) in inputs::implied_inputs(self.target) {
            match self.inputs.get(input) {
                Some(declared) if *declared != implied => {
                    return Err(invalid(format!(
                        "input {input:?} is always filled from the target; leave it out of the declaration"
                    )))
                }
                _ => {
                    self.inputs.insert(input.to_string(), implied);
                }
            }
        }
        for (input, declared) in &self.inputs {
            if declared.from_target
                && !TARGET_VALUES
                    .iter()
                    .any(|(target, name)| *target == self.target && name == input)
            {
                let known: Vec<&str> = TARGET_VALUES
                    .iter()
                    .filter(|(target, _)| *target == self.target)
                    .map(|(_, name)| *name)
                    .collect();
                return Err(invalid(format!(
                    "input {input:?} cannot come from a {} target, which provides: {}",
                    self.target,
                    known.join(", ")
                )));
            }
        }
        self.retry
            .check()
            .map_err(|message| invalid(format!("retry: {message}")))?;
        if let Some(purpose) = &self.purpose {
            if purpose.len() > 500 {
                return Err(invalid("purpose must be at most 500 bytes".to_string()));
            }
        }
        Ok(self)
    }
}

/// Checks a kind, capability, input or media-kind name: `[a-z][a-z0-9_.]*`,
/// at most [`MAX_NAME_LEN`] bytes.
/// The catalogue holds at most `max` declared kinds: `declared` are there,
/// `adding` would be new. A catalogue is read whole by some commands and
/// shown whole by `kinds list`, so its size is bounded.
pub fn check_catalogue_size(declared: usize, adding: usize, max: usize) -> Result<(), DomainError> {
    if adding == 0 || declared + adding <= max {
        return Ok(());
    }
    Err(DomainError::InvalidInput(format!(
        "the catalogue may hold {max} task kinds; it holds {declared} and this declares {adding} more \
         (raise the bound with --max-kinds)"
    )))
}

/// The media kinds every ledger knows: what the reference pipeline's
/// classification gives a file.
pub const BUILT_IN_MEDIA_KINDS: &[&str] = &["image", "video", "audio", "other"];

/// Whether an item of `media_kind` may be registered: a built-in media kind,
/// or one a declared kind (of `declared`) applies to — anything else is a
/// kind no task could ever run on, most likely a typo.
pub fn check_media_kind<'a>(
    media_kind: &str,
    declared: impl IntoIterator<Item = &'a KindDeclaration>,
) -> Result<(), DomainError> {
    check_name("media kind", media_kind)?;
    let known = BUILT_IN_MEDIA_KINDS.contains(&media_kind)
        || declared
            .into_iter()
            .any(|kind| kind.applies_to.iter().any(|applies| applies == media_kind));
    if known {
        return Ok(());
    }
    Err(DomainError::InvalidInput(format!(
        "media kind {:?} is none of {} and no declared task kind applies to it",
        short(media_kind),
        BUILT_IN_MEDIA_KINDS.join(", ")
    )))
}

pub fn check_name(what: &str, name: &str) -> Result<(), DomainError> {
    let mut chars = name.chars();
    let well_formed = name.len() <= MAX_NAME_LEN
        && chars.next().is_some_and(|first| first.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.');
    if well_formed {
        Ok(())
    } else {
        Err(DomainError::InvalidInput(format!(
            "{what} {:?} must match [a-z][a-z0-9_.]{{0,63}}",
            short(name)
        )))
    }
}

/// A short quote of caller text for an error message.
pub(crate) fn short(text: &str) -> String {
    if text.chars().count() <= 40 {
        text.to_string()
    } else {
        let head: String = text.chars().take(40).collect();
        format!("{head}…")
    }
}

/// What the fold and the engine need to know of a task operation's kind
/// when it is created, recorded on the `operation_created` event so that
/// replay never consults a catalogue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFacts {
    pub target: TargetType,
    /// The capability of the item the task produces (media kinds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<String>,
    /// Whether that capability is required, as declared when requested.
    pub required: bool,
}

impl TaskFacts {
    pub fn of(declaration: &KindDeclaration) -> TaskFacts {
        TaskFacts {
            target: declaration.target,
            capability: declaration.capability.clone(),
            required: declaration.required,
        }
    }
}

/// Declared kinds a refusal names at most.
const NAMED_KINDS: usize = 20;

/// The refusal of a kind that is not declared, naming (the first of) those
/// that are.
pub fn undeclared(name: &str, declared: &[String]) -> DomainError {
    let shown: String = name.chars().take(64).collect();
    let named = match declared.len() {
        0 => "none".to_string(),
        count if count <= NAMED_KINDS => declared.join(", "),
        count => format!(
            "{}, and {} more",
            declared[..NAMED_KINDS].join(", "),
            count - NAMED_KINDS
        ),
    };
    DomainError::InvalidInput(format!(
        "task kind {shown:?} is not declared; declared kinds: {named} (declare kinds with `opledger kinds apply FILE`)"
    ))
}
