//! A declared kind's inputs: their types and constraints, and the check a
//! request's inputs pass before anything is appended.

use super::{short, KindDeclaration};
use crate::error::DomainError;
use crate::tasks::TargetType;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The JSON type an input must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    String,
    Integer,
    Number,
    Boolean,
    Object,
}

impl InputKind {
    fn accepts(self, value: &Value) -> bool {
        match self {
            InputKind::String => value.is_string(),
            // 256.0 is the integer 256 (and canonicalizes to the same text);
            // an integer is a signed 64-bit one, so 1e30 and 2^64 - 1 are not.
            InputKind::Integer => {
                value.is_i64()
                    || value.as_f64().is_some_and(|number| {
                        number.fract() == 0.0 && (i64::MIN as f64..i64::MAX as f64).contains(&number)
                    })
            }
            InputKind::Number => value.is_number(),
            InputKind::Boolean => value.is_boolean(),
            InputKind::Object => value.is_object(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            InputKind::String => "a string",
            InputKind::Integer => "an integer (of 64 bits)",
            InputKind::Number => "a number",
            InputKind::Boolean => "a boolean",
            InputKind::Object => "an object",
        }
    }
}

/// One declared input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputDecl {
    #[serde(rename = "type")]
    pub kind: InputKind,
    /// Must be present once defaults and target values are filled in.
    #[serde(default, skip_serializing_if = "is_false")]
    pub required: bool,
    /// Used when the caller leaves the input out; hashed like a given value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    /// Bounds of an integer or number input, inclusive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<i64>,
    /// The values a string input may take.
    #[serde(rename = "enum", default, skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<String>>,
    /// Filled from the target (see [`TARGET_VALUES`]) when the caller
    /// leaves it out.
    #[serde(default, skip_serializing_if = "is_false")]
    pub from_target: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The values a target provides, by target type.
pub const TARGET_VALUES: &[(TargetType, &str)] = &[
    (TargetType::Media, "content_digest"),
    (TargetType::Media, "media_kind"),
    (TargetType::Region, "content_digest"),
    (TargetType::Region, "media_kind"),
    (TargetType::Region, "bbox"),
    (TargetType::Region, "region_revision"),
];

fn target_input(kind: InputKind) -> InputDecl {
    InputDecl {
        kind,
        required: true,
        default: None,
        min: None,
        max: None,
        one_of: None,
        from_target: true,
    }
}

/// The inputs every kind of `target` has, filled from the target.
pub(super) fn implied_inputs(target: TargetType) -> Vec<(&'static str, InputDecl)> {
    let mut implied = vec![("content_digest", target_input(InputKind::String))];
    if target == TargetType::Region {
        implied.push(("bbox", target_input(InputKind::Object)));
        implied.push(("region_revision", target_input(InputKind::Integer)));
    }
    implied
}

impl InputDecl {
    /// Whether the declaration itself is consistent; `Err` says why.
    pub(super) fn check(&self, name: &str) -> Result<(), String> {
        let numeric = matches!(self.kind, InputKind::Integer | InputKind::Number);
        if (self.min.is_some() || self.max.is_some()) && !numeric {
            return Err(format!(
                "input {name:?}: min and max apply to integer and number inputs only"
            ));
        }
        if let (Some(min), Some(max)) = (self.min, self.max) {
            if min > max {
                return Err(format!("input {name:?}: min {min} is above max {max}"));
            }
        }
        match &self.one_of {
            Some(_) if self.kind != InputKind::String => {
                return Err(format!("input {name:?}: enum applies to string inputs only"))
            }
            Some(values) if values.is_empty() => return Err(format!("input {name:?}: enum lists no values")),
            _ => {}
        }
        if self.from_target && self.default.is_some() {
            return Err(format!(
                "input {name:?}: an input filled from the target has no default"
            ));
        }
        if let Some(default) = &self.default {
            self.check_value("the default of", name, default)?;
        }
        Ok(())
    }

    /// Whether `value` satisfies the input's type and constraints.
    fn check_value(&self, kind_name: &str, name: &str, value: &Value) -> Result<(), String> {
        if !self.kind.accepts(value) {
            return Err(format!(
                "{kind_name} input {name:?} must be {}, not {}",
                self.kind.name(),
                json_type(value)
            ));
        }
        if let Some(number) = value.as_f64() {
            if let Some(min) = self.min {
                if number < min as f64 {
                    return Err(format!(
                        "{kind_name} input {name:?} must be at least {min}, not {value}"
                    ));
                }
            }
            if let Some(max) = self.max {
                if number > max as f64 {
                    return Err(format!("{kind_name} input {name:?} must be at most {max}, not {value}"));
                }
            }
        }
        if let (Some(values), Some(text)) = (&self.one_of, value.as_str()) {
            if !values.iter().any(|allowed| allowed == text) {
                return Err(format!(
                    "{kind_name} input {name:?} must be one of {}, not {:?}",
                    values.join(", "),
                    short(text)
                ));
            }
        }
        Ok(())
    }
}

/// Checks the caller's inputs against the kind and fills in its defaults
/// and the values the target provides (`target_values`) where the caller
/// left them out. Returns the complete inputs: what is hashed into the
/// revision and what the claim hands to the worker.
pub fn complete_inputs(
    kind: &KindDeclaration,
    inputs: &Value,
    target_values: &Map<String, Value>,
) -> Result<Map<String, Value>, DomainError> {
    let Value::Object(given) = inputs else {
        return Err(DomainError::InvalidInput(format!(
            "{} inputs must be a JSON object, not {}",
            kind.name,
            json_type(inputs)
        )));
    };
    let unknown: Vec<&str> = given
        .iter()
        .filter(|(key, value)| !value.is_null() && !kind.inputs.contains_key(key.as_str()))
        .map(|(key, _)| key.as_str())
        .collect();
    if !unknown.is_empty() {
        let known: Vec<&str> = kind.inputs.keys().map(String::as_str).collect();
        let unknown: Vec<String> = unknown.iter().take(5).map(|key| format!("{:?}", short(key))).collect();
        return Err(DomainError::InvalidInput(format!(
            "{} does not take input(s) {}; it takes: {}",
            kind.name,
            unknown.join(", "),
            known.join(", ")
        )));
    }
    // An input given as null is an input left out: both must hash alike.
    let mut complete: Map<String, Value> = given
        .iter()
        .filter(|(_, value)| !value.is_null())
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    // A caller's digest stands for the content the work runs on: it must
    // be a digest, or revisions would differ by the spelling of one.
    if let Some(digest) = complete.get("content_digest") {
        let text = digest.as_str().ok_or_else(|| {
            DomainError::InvalidInput(format!(
                "{} input \"content_digest\" must be a string, not {}",
                kind.name,
                json_type(digest)
            ))
        })?;
        crate::digest::check(text).map_err(|refused| {
            DomainError::InvalidInput(format!("{} input \"content_digest\": {refused}", kind.name))
        })?;
    }
    for (name, declared) in &kind.inputs {
        if !complete.contains_key(name) {
            let filled = if declared.from_target {
                target_values.get(name).cloned()
            } else {
                declared.default.clone()
            };
            if let Some(value) = filled {
                complete.insert(name.clone(), value);
            }
        }
        match complete.get(name) {
            None if declared.required => {
                let hint = if declared.from_target {
                    " (and the target has none to fill it with)"
                } else {
                    ""
                };
                return Err(DomainError::InvalidInput(format!(
                    "{} needs input {name:?}{hint}",
                    kind.name
                )));
            }
            Some(value) => declared
                .check_value(&kind.name, name, value)
                .map_err(DomainError::InvalidInput)?,
            None => {}
        }
    }
    Ok(complete)
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

    fn target() -> Map<String, Value> {
        [("content_digest".to_string(), json!("abc"))].into_iter().collect()
    }

    fn caption() -> KindDeclaration {
        serde_json::from_value::<KindDeclaration>(json!({
            "name": "caption", "target": "media", "version": "2",
            "inputs": {
                "model": {"type": "string", "required": true},
                "max_words": {"type": "integer", "min": 1, "max": 200, "default": 30},
                "language": {"type": "string", "enum": ["en", "ja", "de"], "default": "en"}
            }
        }))
        .unwrap()
        .normalized()
        .unwrap()
    }

    #[test]
    fn inputs_are_checked_and_filled_from_defaults_and_the_target() {
        let kind = caption();
        let complete = complete_inputs(&kind, &json!({"model": "blip"}), &target()).unwrap();
        assert_eq!(
            Value::Object(complete),
            json!({"model": "blip", "max_words": 30, "language": "en", "content_digest": "abc"})
        );
        let mine = format!("sha256:{}", "ab".repeat(32));
        let given = complete_inputs(&kind, &json!({"model": "blip", "content_digest": mine}), &target()).unwrap();
        assert_eq!(given["content_digest"], json!(mine), "the caller's value wins");
        let refused =
            complete_inputs(&kind, &json!({"model": "blip", "content_digest": "mine"}), &target()).unwrap_err();
        assert!(refused.to_string().contains("64 lowercase hex digits"), "{refused}");
    }

    #[test]
    fn every_constraint_is_refused_with_the_input_and_the_rule() {
        let kind = caption();
        let refusals = [
            (json!([1]), "must be a JSON object"),
            (json!({}), "needs input \"model\""),
            (json!({"model": 7}), "must be a string, not a number"),
            (
                json!({"model": "m", "max_words": 0}),
                "\"max_words\" must be at least 1, not 0",
            ),
            (
                json!({"model": "m", "max_words": 201}),
                "\"max_words\" must be at most 200, not 201",
            ),
            (json!({"model": "m", "max_words": 2.5}), "must be an integer"),
            (
                json!({"model": "m", "language": "fr"}),
                "\"language\" must be one of en, ja, de, not \"fr\"",
            ),
            (
                json!({"model": "m", "colour": "red"}),
                "does not take input(s) \"colour\"",
            ),
        ];
        for (inputs, expected) in refusals {
            match complete_inputs(&kind, &inputs, &target()) {
                Err(DomainError::InvalidInput(message)) => {
                    assert!(message.contains(expected), "{inputs}: {message}")
                }
                other => panic!("{inputs} should be refused, got {other:?}"),
            }
        }
        assert!(complete_inputs(&kind, &json!({"model": "m"}), &Map::new()).is_err());
    }

    #[test]
    fn inconsistent_input_declarations_are_refused() {
        let bad = [
            json!({"type": "string", "min": 1}),
            json!({"type": "integer", "min": 5, "max": 1}),
            json!({"type": "integer", "enum": ["a"]}),
            json!({"type": "integer", "default": "x"}),
            json!({"type": "string", "enum": ["a"], "default": "b"}),
        ];
        for input in bad {
            let declared: InputDecl = serde_json::from_value(input.clone()).unwrap();
            assert!(declared.check("x").is_err(), "{input}");
        }
    }
}
