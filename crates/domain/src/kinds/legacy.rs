//! The six task kinds that builds before declared kinds compiled in, as
//! they were: version "1" and their policies of then.
//!
//! This is schema history, not a catalogue: a log written before
//! declarations existed holds operations of these kinds and no
//! declaration of them. The upcaster reads their `operation_created`
//! events with the facts below (what the build of then knew about the
//! kind), and opening such a ledger records these declarations once
//! (actor `system`, reason `upgrade`). Nothing else reads this list.

use super::inputs::{InputDecl, InputKind};
use super::{KindDeclaration, TaskFacts};
use crate::tasks::{Exhausted, RetryPolicy, TargetType};
use serde_json::Value;
use std::collections::BTreeMap;

/// The reason recorded on the declarations an upgrade appends.
pub const UPGRADE_REASON: &str = "upgrade";

fn input(kind: InputKind, required: bool, default: Option<Value>) -> InputDecl {
    InputDecl {
        kind,
        required,
        default,
        min: None,
        max: None,
        one_of: None,
        from_target: false,
    }
}

fn declaration(
    name: &str,
    target: TargetType,
    capability: Option<&str>,
    required: bool,
    inputs: Vec<(&str, InputDecl)>,
    exhausted: Exhausted,
    purpose: &str,
) -> KindDeclaration {
    let inputs: BTreeMap<String, InputDecl> = inputs
        .into_iter()
        .map(|(name, declared)| (name.to_string(), declared))
        .collect();
    KindDeclaration {
        name: name.to_string(),
        target,
        version: "1".to_string(),
        capability: capability.map(str::to_string),
        required,
        applies_to: Vec::new(),
        needs: Vec::new(),
        inputs,
        retry: RetryPolicy {
            exhausted,
            ..RetryPolicy::DEFAULT
        },
        purpose: Some(purpose.to_string()),
    }
    .normalized()
    .expect("the former built-in kinds are valid declarations")
}

/// The former built-in kinds, normalized, media kinds first.
pub fn declarations() -> Vec<KindDeclaration> {
    use InputKind::{Integer, Number, String};
    let model = || {
        vec![
            ("model", input(String, true, None)),
            ("model_revision", input(String, true, None)),
        ]
    };
    let mut thumbnail_side = input(Integer, true, Some(Value::from(256)));
    thumbnail_side.min = Some(1);
    vec![
        declaration(
            "metadata",
            TargetType::Media,
            Some("metadata"),
            true,
            vec![("extractor", input(String, false, None))],
            Exhausted::FailTerminal,
            "format, dimensions and byte size of a media item",
        ),
        declaration(
            "thumbnail",
            TargetType::Media,
            Some("thumbnail"),
            true,
            vec![
                ("max_side", thumbnail_side),
                ("format", input(String, true, Some(Value::from("png")))),
            ],
            Exhausted::FailTerminal,
            "a small preview image, written atomically under a name derived from the revision",
        ),
        declaration(
            "perceptual_hash",
            TargetType::Media,
            Some("perceptual_hash"),
            false,
            vec![("algorithm", input(String, true, Some(Value::from("dhash64"))))],
            Exhausted::FailTerminal,
            "a 64-bit perceptual hash for near-duplicate detection",
        ),
        declaration(
            "auto_tagging",
            TargetType::Media,
            Some("tags"),
            false,
            [model(), vec![("threshold", input(Number, false, None))]].concat(),
            Exhausted::DeadLetter,
            "tags predicted by a model",
        ),
        declaration(
            "full_embedding",
            TargetType::Media,
            Some("embedding"),
            false,
            [model(), vec![("embedding_version", input(String, true, None))]].concat(),
            Exhausted::DeadLetter,
            "an embedding vector of the whole item",
        ),
        declaration(
            "crop_embedding",
            TargetType::Region,
            None,
            false,
            [model(), vec![("embedding_version", input(String, true, None))]].concat(),
            Exhausted::DeadLetter,
            "an embedding vector of one region (crop) of an item",
        ),
    ]
}

/// What a build before declarations knew of an operation of `kind` when
/// it created one: `None` for an operation that was not a task.
pub fn facts(kind: &str) -> Option<TaskFacts> {
    declarations()
        .iter()
        .find(|declaration| declaration.name == kind)
        .map(TaskFacts::of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::complete_inputs;
    use serde_json::json;

    #[test]
    fn a_negative_thumbnail_side_is_refused_at_request() {
        let target = [("content_digest".to_string(), json!("abc"))].into_iter().collect();
        let thumbnail = declarations()
            .into_iter()
            .find(|kind| kind.name == "thumbnail")
            .unwrap();
        let refused = complete_inputs(&thumbnail, &json!({"max_side": -5}), &target).unwrap_err();
        assert!(
            refused.to_string().contains("\"max_side\" must be at least 1"),
            "{refused}"
        );
    }
}
