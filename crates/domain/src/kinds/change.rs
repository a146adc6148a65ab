//! How a declaration differs from the one recorded, and whether a whole
//! catalogue hangs together.

use super::KindDeclaration;
use crate::error::DomainError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What applying a declaration does to the recorded one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KindChange {
    /// Nothing recorded yet: the kind is declared.
    Declared,
    /// The same declaration: nothing is appended.
    Unchanged,
    /// A new version: every capability produced at another version
    /// becomes `stale`.
    NewVersion,
    /// Only policy (retry, required, purpose) changed: recorded, results
    /// stay current.
    Policy,
}

/// Classifies `new` (normalized) against the recorded `old`. A change of
/// what determines results (inputs, applies_to, needs) needs a new
/// version, so that older results are recognisably older; a kind's target
/// and capability never change (declare a new kind instead).
pub fn classify(old: Option<&KindDeclaration>, new: &KindDeclaration) -> Result<KindChange, DomainError> {
    let Some(old) = old else {
        return Ok(KindChange::Declared);
    };
    if old == new {
        return Ok(KindChange::Unchanged);
    }
    let refuse = |message: String| Err(DomainError::Conflict(format!("task kind {}: {message}", new.name)));
    if old.target != new.target {
        return refuse(format!(
            "its target cannot change from {} to {}; declare a kind with another name",
            old.target, new.target
        ));
    }
    if old.capability != new.capability {
        return refuse(format!(
            "the capability it produces cannot change from {:?} to {:?}; declare a kind with another name",
            old.capability.as_deref().unwrap_or("none"),
            new.capability.as_deref().unwrap_or("none")
        ));
    }
    if old.version != new.version {
        return Ok(KindChange::NewVersion);
    }
    let mut altered = Vec::new();
    if old.inputs != new.inputs {
        altered.push("inputs");
    }
    if old.applies_to != new.applies_to {
        altered.push("applies_to");
    }
    if old.needs != new.needs {
        altered.push("needs");
    }
    if !altered.is_empty() {
        return refuse(format!(
            "{} changed but the version is still {:?}; a change that alters results needs a new version",
            altered.join(", "),
            new.version
        ));
    }
    Ok(KindChange::Policy)
}

/// Checks that a whole catalogue (what is recorded, with what is being
/// applied in its place) hangs together: each capability is produced by one
/// kind, every capability in `needs` is produced by some kind, and no kind
/// needs itself through others. The error names the offending kind.
pub fn check_catalogue(kinds: &[&KindDeclaration]) -> Result<(), (String, DomainError)> {
    let mut producers: BTreeMap<&str, &str> = BTreeMap::new();
    for kind in kinds {
        if let Some(capability) = kind.capability() {
            if let Some(other) = producers.insert(capability, &kind.name) {
                return Err((
                    kind.name.clone(),
                    DomainError::InvalidInput(format!(
                        "task kind {} produces capability {capability:?}, which {other} already produces",
                        kind.name
                    )),
                ));
            }
        }
    }
    for kind in kinds {
        for capability in &kind.needs {
            if !producers.contains_key(capability.as_str()) {
                let known: Vec<&str> = producers.keys().copied().collect();
                return Err((
                    kind.name.clone(),
                    DomainError::InvalidInput(format!(
                        "task kind {} needs capability {capability:?}, which no kind produces (known: {})",
                        kind.name,
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    )),
                ));
            }
        }
    }
    // A cycle: walking needs → producing kind → its needs returns to a kind
    // on the current path (depth-first, kinds in name order so the error
    // names the same kind every time).
    let by_name: BTreeMap<&str, &KindDeclaration> = kinds.iter().map(|kind| (kind.name.as_str(), *kind)).collect();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    for start in by_name.keys() {
        let mut path: Vec<&str> = Vec::new();
        if let Some(cycle) = find_cycle(start, &by_name, &producers, &mut path, &mut done) {
            return Err((
                cycle[0].to_string(),
                DomainError::InvalidInput(format!("the needs form a cycle: {}", cycle.join(" → "))),
            ));
        }
    }
    Ok(())
}

fn find_cycle<'a>(
    kind: &'a str,
    by_name: &BTreeMap<&'a str, &'a KindDeclaration>,
    producers: &BTreeMap<&'a str, &'a str>,
    path: &mut Vec<&'a str>,
    done: &mut BTreeSet<&'a str>,
) -> Option<Vec<&'a str>> {
    if let Some(at) = path.iter().position(|on_path| *on_path == kind) {
        let mut cycle = path[at..].to_vec();
        cycle.push(kind);
        return Some(cycle);
    }
    if done.contains(kind) {
        return None;
    }
    path.push(kind);
    if let Some(declaration) = by_name.get(kind) {
        for capability in &declaration.needs {
            if let Some(producer) = producers.get(capability.as_str()) {
                if let Some(cycle) = find_cycle(producer, by_name, producers, path, done) {
                    return Some(cycle);
                }
            }
        }
    }
    path.pop();
    done.insert(kind);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::legacy;
    use serde_json::json;

    fn kind(value: serde_json::Value) -> KindDeclaration {
        serde_json::from_value::<KindDeclaration>(value)
            .unwrap()
            .normalized()
            .unwrap()
    }

    #[test]
    fn changes_are_classified_by_what_they_alter() {
        let v1 = kind(json!({"name": "caption", "target": "media", "version": "1",
            "inputs": {"model": {"type": "string", "required": true}}}));
        assert_eq!(classify(None, &v1).unwrap(), KindChange::Declared);
        assert_eq!(classify(Some(&v1), &v1.clone()).unwrap(), KindChange::Unchanged);
        let v2 = KindDeclaration {
            version: "2".into(),
            ..v1.clone()
        };
        assert_eq!(classify(Some(&v1), &v2).unwrap(), KindChange::NewVersion);
        let mut policy = v1.clone();
        policy.required = false;
        policy.retry.max_attempts = 9;
        assert_eq!(classify(Some(&v1), &policy).unwrap(), KindChange::Policy);
        let mut inputs = v1.clone();
        inputs.inputs.remove("model");
        let refused = classify(Some(&v1), &inputs).unwrap_err().to_string();
        assert!(
            refused.contains("inputs changed but the version is still \"1\""),
            "{refused}"
        );
        let mut needs = v1.clone();
        needs.needs = vec!["metadata".into()];
        assert!(classify(Some(&v1), &needs).is_err());
        let mut applies = v1.clone();
        applies.applies_to = vec!["image".into()];
        assert!(classify(Some(&v1), &applies).is_err());
        let mut capability = v2.clone();
        capability.capability = Some("words".into());
        assert!(classify(Some(&v1), &capability)
            .unwrap_err()
            .to_string()
            .contains("capability"));
    }

    #[test]
    fn a_catalogue_with_a_cycle_or_an_unknown_need_is_refused() {
        let a = kind(json!({"name": "a", "target": "media", "version": "1", "needs": ["b"]}));
        let b = kind(json!({"name": "b", "target": "media", "version": "1", "needs": ["c"]}));
        let c = kind(json!({"name": "c", "target": "media", "version": "1", "needs": ["a"]}));
        let (name, error) = check_catalogue(&[&a, &b, &c]).unwrap_err();
        assert_eq!(name, "a");
        assert_eq!(
            error.to_string(),
            "invalid input: the needs form a cycle: a → b → c → a"
        );
        let (name, error) = check_catalogue(&[&a]).unwrap_err();
        assert_eq!(name, "a");
        assert!(error
            .to_string()
            .contains("needs capability \"b\", which no kind produces"));
        let c = kind(json!({"name": "c", "target": "media", "version": "1"}));
        check_catalogue(&[&a, &b, &c]).unwrap();
        let twin = kind(json!({"name": "d", "target": "media", "version": "1", "capability": "c"}));
        assert!(check_catalogue(&[&c, &twin]).is_err());
        let legacy = legacy::declarations();
        check_catalogue(&legacy.iter().collect::<Vec<_>>()).unwrap();
    }

    #[test]
    fn normalizing_refuses_what_no_catalogue_could_hold() {
        let refused = [
            json!({"name": "Caption", "target": "media", "version": "1"}),
            json!({"name": "caption", "target": "media", "version": " "}),
            json!({"name": "caption", "target": "media", "version": "1", "needs": ["caption"]}),
            json!({"name": "crop", "target": "region", "version": "1", "capability": "crop"}),
            json!({"name": "caption", "target": "media", "version": "1",
                "inputs": {"content_digest": {"type": "integer"}}}),
            json!({"name": "caption", "target": "media", "version": "1",
                "inputs": {"bbox": {"type": "object", "from_target": true}}}),
            json!({"name": "caption", "target": "media", "version": "1", "retry": {"max_attempts": 0}}),
            json!({"name": "caption", "target": "media", "version": "1", "retry": {"jitter": 2.0}}),
        ];
        for declaration in refused {
            let parsed: KindDeclaration = serde_json::from_value(declaration.clone()).unwrap();
            assert!(parsed.normalized().is_err(), "{declaration}");
        }
        let normal = kind(json!({"name": "caption", "target": "media", "version": "1",
            "applies_to": ["video", "image", "image"]}));
        assert_eq!(normal.capability(), Some("caption"));
        assert_eq!(normal.applies_to, ["image", "video"]);
        assert!(normal.inputs.contains_key("content_digest"));
        assert!(
            serde_json::from_value::<KindDeclaration>(json!({"name": "x", "target": "media",
            "version": "1", "colour": "red"}))
            .is_err()
        );
    }
}
