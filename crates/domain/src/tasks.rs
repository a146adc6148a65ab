//! The registry of task kinds: what each kind runs on, its current version,
//! which inputs determine its result, and how it retries.
//!
//! A task kind is declared once, here, and everything else reads it: the
//! request command validates inputs against it, the revision hashes its
//! version with the inputs, the fail and recovery commands take their retry
//! policy from it, and the processing-state tables' CHECK constraints list
//! exactly its kinds per target type (a test keeps the DDL and this list in
//! step). Pure data and pure arithmetic: the jitter a retry uses is drawn by
//! the engine and passed in.

use crate::error::DomainError;
use crate::status::OperationStatus;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

/// What a task kind runs on; each has its own processing-state table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetType {
    /// A media item (`media_processing_states`).
    Media,
    /// A region of a media item (`region_processing_states`).
    Region,
}

impl fmt::Display for TargetType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TargetType::Media => "media",
            TargetType::Region => "region",
        })
    }
}

/// What happens when a task kind runs out of error retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Exhausted {
    /// `failed_terminal`: the failure is final and goes to review.
    FailTerminal,
    /// `dead_lettered`: parked for an operator, who may retry it later.
    DeadLetter,
}

/// How a task kind retries application errors and survives interruptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RetryPolicy {
    /// Attempts that may end in an application error; the last one's
    /// failure is final ([`RetryPolicy::exhausted`]).
    pub max_attempts: u32,
    /// The first retry waits this long; each further one twice as long as
    /// the one before, up to [`RetryPolicy::max_backoff_ms`].
    pub base_backoff_ms: i64,
    pub max_backoff_ms: i64,
    /// Up to this share (per mille) of the backoff is added as jitter, drawn
    /// by the command and recorded, so replay never draws again.
    pub jitter_per_mille: i64,
    pub exhausted: Exhausted,
    /// Interruptions (crashes, expired leases) are not the item's fault and
    /// have their own budget; an item interrupted more often than this is
    /// quarantined (`failed_terminal`) instead of killing worker after worker.
    pub max_interruptions: u32,
    /// Whether recovery puts interrupted work back in the queue. Kinds with
    /// effects outside the ledger (exports) must not re-run on their own.
    pub requeue_after_interruption: bool,
}

impl RetryPolicy {
    pub const DEFAULT: RetryPolicy = RetryPolicy {
        max_attempts: 5,
        base_backoff_ms: 1_000,
        max_backoff_ms: 600_000,
        jitter_per_mille: 250,
        exhausted: Exhausted::FailTerminal,
        max_interruptions: 3,
        requeue_after_interruption: true,
    };

    /// The backoff before the retry that follows failure number
    /// `failures` (1 for the first failure), without jitter.
    pub fn backoff_ms(&self, failures: u32) -> i64 {
        let doublings = failures.saturating_sub(1).min(40);
        self.base_backoff_ms
            .saturating_mul(1_i64 << doublings)
            .min(self.max_backoff_ms)
    }

    /// The largest jitter that may be added to `backoff_ms`.
    pub fn max_jitter_ms(&self, backoff_ms: i64) -> i64 {
        backoff_ms.saturating_mul(self.jitter_per_mille) / 1_000
    }
}

/// One input of a task kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InputSpec {
    pub name: &'static str,
    pub kind: InputKind,
    pub required: bool,
    /// Filled from the target (the media item's digest, the region's box)
    /// when the caller leaves it out.
    pub from_target: bool,
}

/// The JSON type an input must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    String,
    Integer,
    Number,
    Object,
}

impl InputKind {
    fn accepts(self, value: &Value) -> bool {
        match self {
            InputKind::String => value.is_string(),
            // 256.0 is the integer 256 (and canonicalizes to the same text).
            InputKind::Integer => {
                value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|number| number.fract() == 0.0)
            }
            InputKind::Number => value.is_number(),
            InputKind::Object => value.is_object(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            InputKind::String => "a string",
            InputKind::Integer => "an integer",
            InputKind::Number => "a number",
            InputKind::Object => "an object",
        }
    }
}

/// A declared task kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TaskKindSpec {
    pub name: &'static str,
    pub target: TargetType,
    /// The implementation / model / package version. Part of every
    /// revision: a new version makes a new revision, so results produced by
    /// an older version are recognisably older.
    pub version: &'static str,
    pub inputs: &'static [InputSpec],
    pub policy: RetryPolicy,
    /// What the kind is for, for `docs/revision.md` and error messages.
    pub purpose: &'static str,
    /// JSON object of input values used when a batch or an ingest requests
    /// the kind without saying (e.g. a thumbnail's size and format). Part
    /// of the inputs, so part of the revision like any given value.
    pub defaults: &'static str,
}

const fn input(name: &'static str, kind: InputKind) -> InputSpec {
    InputSpec {
        name,
        kind,
        required: true,
        from_target: false,
    }
}

const fn optional(name: &'static str, kind: InputKind) -> InputSpec {
    InputSpec {
        name,
        kind,
        required: false,
        from_target: false,
    }
}

const fn from_target(name: &'static str, kind: InputKind) -> InputSpec {
    InputSpec {
        name,
        kind,
        required: true,
        from_target: true,
    }
}

const CONTENT_DIGEST: InputSpec = from_target("content_digest", InputKind::String);

/// Every task kind this build knows, media kinds first.
pub const TASK_KINDS: &[TaskKindSpec] = &[
    TaskKindSpec {
        name: "metadata",
        target: TargetType::Media,
        version: "1",
        inputs: &[CONTENT_DIGEST, optional("extractor", InputKind::String)],
        policy: RetryPolicy::DEFAULT,
        purpose: "format, dimensions and byte size of a media item",
        defaults: r#"{}"#,
    },
    TaskKindSpec {
        name: "thumbnail",
        target: TargetType::Media,
        version: "1",
        inputs: &[
            CONTENT_DIGEST,
            input("max_side", InputKind::Integer),
            input("format", InputKind::String),
        ],
        policy: RetryPolicy::DEFAULT,
        purpose: "a small preview image, written atomically under a name derived from the revision",
        defaults: r#"{"max_side": 256, "format": "png"}"#,
    },
    TaskKindSpec {
        name: "perceptual_hash",
        target: TargetType::Media,
        version: "1",
        inputs: &[CONTENT_DIGEST, input("algorithm", InputKind::String)],
        policy: RetryPolicy::DEFAULT,
        purpose: "a 64-bit perceptual hash for near-duplicate detection",
        defaults: r#"{"algorithm": "dhash64"}"#,
    },
    TaskKindSpec {
        name: "auto_tagging",
        target: TargetType::Media,
        version: "1",
        inputs: &[
            CONTENT_DIGEST,
            input("model", InputKind::String),
            input("model_revision", InputKind::String),
            optional("threshold", InputKind::Number),
        ],
        policy: RetryPolicy {
            exhausted: Exhausted::DeadLetter,
            ..RetryPolicy::DEFAULT
        },
        purpose: "tags predicted by a model",
        defaults: r#"{}"#,
    },
    TaskKindSpec {
        name: "full_embedding",
        target: TargetType::Media,
        version: "1",
        inputs: &[
            CONTENT_DIGEST,
            input("model", InputKind::String),
            input("model_revision", InputKind::String),
            input("embedding_version", InputKind::String),
        ],
        policy: RetryPolicy {
            exhausted: Exhausted::DeadLetter,
            ..RetryPolicy::DEFAULT
        },
        purpose: "an embedding vector of the whole item",
        defaults: r#"{}"#,
    },
    TaskKindSpec {
        name: "crop_embedding",
        target: TargetType::Region,
        version: "1",
        inputs: &[
            CONTENT_DIGEST,
            from_target("bbox", InputKind::Object),
            from_target("region_revision", InputKind::Integer),
            input("model", InputKind::String),
            input("model_revision", InputKind::String),
            input("embedding_version", InputKind::String),
        ],
        policy: RetryPolicy {
            exhausted: Exhausted::DeadLetter,
            ..RetryPolicy::DEFAULT
        },
        purpose: "an embedding vector of one region (crop) of an item",
        defaults: r#"{}"#,
    },
];

/// The task kind named `name`.
pub fn task_kind(name: &str) -> Result<&'static TaskKindSpec, DomainError> {
    TASK_KINDS.iter().find(|kind| kind.name == name).ok_or_else(|| {
        let known: Vec<&str> = TASK_KINDS.iter().map(|kind| kind.name).collect();
        DomainError::InvalidInput(format!("unknown task kind {name:?}; known kinds: {}", known.join(", ")))
    })
}

/// The names of the kinds that run on `target`, in registry order.
pub fn kinds_for(target: TargetType) -> Vec<&'static str> {
    TASK_KINDS
        .iter()
        .filter(|kind| kind.target == target)
        .map(|kind| kind.name)
        .collect()
}

/// The statuses a worker may claim from (with `available_at <= now`).
pub const CLAIMABLE_STATUSES: &[OperationStatus] = &[OperationStatus::Queued, OperationStatus::RetryWaiting];

impl TaskKindSpec {
    /// Checks the caller's inputs against the kind and fills the inputs the
    /// target provides (`target_values`) where the caller left them out.
    /// Returns the complete inputs: what is hashed into the revision and
    /// what the claim hands to the worker.
    pub fn complete_inputs(
        &self,
        inputs: &Value,
        target_values: &Map<String, Value>,
    ) -> Result<Map<String, Value>, DomainError> {
        let Value::Object(given) = inputs else {
            return Err(DomainError::InvalidInput(format!(
                "{} inputs must be a JSON object, not {}",
                self.name,
                json_type(inputs)
            )));
        };
        // An input given as null is an input left out: both must hash alike.
        let mut complete: Map<String, Value> = given
            .iter()
            .filter(|(_, value)| !value.is_null())
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        for spec in self.inputs {
            if spec.from_target && !complete.contains_key(spec.name) {
                if let Some(value) = target_values.get(spec.name) {
                    complete.insert(spec.name.to_string(), value.clone());
                }
            }
            match complete.get(spec.name) {
                None | Some(Value::Null) if spec.required => {
                    let hint = if spec.from_target {
                        " (and the target has none to fill it with)"
                    } else {
                        ""
                    };
                    return Err(DomainError::InvalidInput(format!(
                        "{} needs input {:?}{hint}",
                        self.name, spec.name
                    )));
                }
                Some(value) if !value.is_null() && !spec.kind.accepts(value) => {
                    return Err(DomainError::InvalidInput(format!(
                        "{} input {:?} must be {}, not {}",
                        self.name,
                        spec.name,
                        spec.kind.name(),
                        json_type(value)
                    )));
                }
                _ => {}
            }
        }
        let unknown: Vec<&str> = complete
            .keys()
            .filter(|key| !self.inputs.iter().any(|spec| spec.name == key.as_str()))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            let known: Vec<&str> = self.inputs.iter().map(|spec| spec.name).collect();
            return Err(DomainError::InvalidInput(format!(
                "{} does not take input(s) {}; it takes: {}",
                self.name,
                unknown.join(", "),
                known.join(", ")
            )));
        }
        Ok(complete)
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kind_names_are_unique_and_have_inputs() {
        for (index, kind) in TASK_KINDS.iter().enumerate() {
            assert!(
                TASK_KINDS[index + 1..].iter().all(|other| other.name != kind.name),
                "{} declared twice",
                kind.name
            );
            assert!(kind.inputs.iter().any(|input| input.name == "content_digest"));
        }
    }

    #[test]
    fn defaults_are_objects_of_declared_inputs() {
        let target: Map<String, Value> = [("content_digest".to_string(), json!("abc"))].into_iter().collect();
        for kind in TASK_KINDS {
            let defaults: Value = serde_json::from_str(kind.defaults).unwrap();
            assert!(defaults.is_object(), "{}", kind.name);
            for name in defaults.as_object().unwrap().keys() {
                assert!(
                    kind.inputs.iter().any(|input| input.name == name),
                    "{} default {name}",
                    kind.name
                );
            }
        }
        // The kinds an ingest runs need nothing beyond their defaults.
        for name in ["metadata", "thumbnail", "perceptual_hash"] {
            let kind = task_kind(name).unwrap();
            let defaults: Value = serde_json::from_str(kind.defaults).unwrap();
            kind.complete_inputs(&defaults, &target).unwrap();
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let policy = RetryPolicy::DEFAULT;
        assert_eq!(policy.backoff_ms(1), 1_000);
        assert_eq!(policy.backoff_ms(2), 2_000);
        assert_eq!(policy.backoff_ms(3), 4_000);
        assert_eq!(policy.backoff_ms(60), 600_000);
        assert_eq!(policy.max_jitter_ms(4_000), 1_000);
    }

    #[test]
    fn inputs_are_checked_and_filled_from_the_target() {
        let thumbnail = task_kind("thumbnail").unwrap();
        let target: Map<String, Value> = [("content_digest".to_string(), json!("abc"))].into_iter().collect();
        let complete = thumbnail
            .complete_inputs(&json!({"max_side": 256, "format": "png"}), &target)
            .unwrap();
        assert_eq!(complete["content_digest"], "abc");
        let given = thumbnail
            .complete_inputs(
                &json!({"max_side": 256, "format": "png", "content_digest": "mine"}),
                &target,
            )
            .unwrap();
        assert_eq!(given["content_digest"], "mine", "the caller's value wins");

        let refusals = [
            json!([1]),
            json!({"max_side": 256}),
            json!({"max_side": "big", "format": "png"}),
            json!({"max_side": 256, "format": "png", "colour": "red"}),
        ];
        for inputs in refusals {
            assert!(
                matches!(
                    thumbnail.complete_inputs(&inputs, &target),
                    Err(DomainError::InvalidInput(_))
                ),
                "{inputs} should be refused"
            );
        }
        assert!(thumbnail
            .complete_inputs(&json!({"max_side": 256, "format": "png"}), &Map::new())
            .is_err());
        assert!(task_kind("transcode").is_err());
    }
}
