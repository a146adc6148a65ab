//! Projection positions as every backend keeps them: a (version, position)
//! per projection name, checked before inline folding moves them and read
//! back for `status`. Pure: backends read and write the rows, this module
//! decides what they mean.

use crate::tables::SHADOW_SUFFIX;
use crate::{ProjectionState, StoreError};
use opledger_domain::projections::all_specs;
use std::collections::BTreeMap;

/// Every stored projection's (version, position), by name, shadows included.
pub type Positions = BTreeMap<String, (i64, i64)>;

/// Conflict unless every projection this build knows is stored at its
/// version and at exactly `from`. *Why:* inline folding must never skip an
/// event; a projection left behind, or built by another version, makes
/// writes fail until startup has brought it to the head.
pub fn check_all_at(positions: &Positions, from: i64) -> Result<(), StoreError> {
    for spec in all_specs() {
        match positions.get(spec.name) {
            Some((version, position)) if *version == i64::from(spec.version) && *position == from => {}
            found => {
                return Err(StoreError::conflict(format!(
                    "projection {} is at {found:?} (version, seq), not at seq {from} at version {}; \
                     the database was changed by another version of opledger or needs catching up (restart)",
                    spec.name, spec.version
                )))
            }
        }
    }
    Ok(())
}

/// Moves every projection this build knows to `to` in a cached copy of the
/// positions, as the backend's write does in the database.
pub fn move_all(positions: &mut Positions, to: i64) {
    for spec in all_specs() {
        if let Some(entry) = positions.get_mut(spec.name) {
            entry.1 = to;
        }
    }
}

/// The live projections' states from stored (name, version, position)
/// rows: shadows left out, in the build's fold order (the order `status`
/// shows them in), unknown names last.
pub fn live_states(rows: impl IntoIterator<Item = (String, i64, i64)>) -> Result<Vec<ProjectionState>, StoreError> {
    let mut states = Vec::new();
    for (name, version, position) in rows {
        if name.ends_with(SHADOW_SUFFIX) {
            continue;
        }
        states.push(ProjectionState {
            name,
            version: u32::try_from(version).map_err(|error| StoreError::corrupt(error.to_string()))?,
            position,
        });
    }
    let order: Vec<&str> = all_specs().iter().map(|spec| spec.name).collect();
    states.sort_by_key(|state| order.iter().position(|name| *name == state.name).unwrap_or(usize::MAX));
    Ok(states)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn all_at(position: i64) -> Positions {
        all_specs()
            .iter()
            .map(|spec| (spec.name.to_string(), (i64::from(spec.version), position)))
            .collect()
    }

    #[test]
    fn positions_pass_only_when_every_projection_is_at_the_old_head_at_this_builds_version() {
        assert!(check_all_at(&all_at(5), 5).is_ok());
        assert_eq!(check_all_at(&all_at(4), 5).unwrap_err().kind, ErrorKind::Conflict);
        let first = all_specs()[0];
        let mut other_version = all_at(5);
        other_version.insert(first.name.to_string(), (i64::from(first.version) + 1, 5));
        assert!(check_all_at(&other_version, 5).is_err());
        let mut missing = all_at(5);
        missing.remove(first.name);
        assert!(check_all_at(&missing, 5).is_err());
    }

    #[test]
    fn moving_all_moves_every_known_projection_and_leaves_shadows() {
        let mut positions = all_at(5);
        positions.insert(format!("batches{SHADOW_SUFFIX}"), (1, 2));
        move_all(&mut positions, 9);
        assert_eq!(positions, {
            let mut expected = all_at(9);
            expected.insert(format!("batches{SHADOW_SUFFIX}"), (1, 2));
            expected
        });
    }

    #[test]
    fn live_states_skip_shadows_and_follow_the_fold_order() {
        let mut rows: Vec<(String, i64, i64)> = all_specs()
            .iter()
            .rev()
            .map(|spec| (spec.name.to_string(), i64::from(spec.version), 3))
            .collect();
        rows.push((format!("batches{SHADOW_SUFFIX}"), 1, 1));
        rows.insert(0, ("unknown".to_string(), 1, 1));
        let names: Vec<String> = live_states(rows).unwrap().into_iter().map(|state| state.name).collect();
        let mut expected: Vec<String> = all_specs().iter().map(|spec| spec.name.to_string()).collect();
        expected.push("unknown".to_string());
        assert_eq!(names, expected);
        let error = live_states([("batches".to_string(), -1, 0)]).unwrap_err();
        assert_eq!(error.kind, ErrorKind::Corrupt);
    }
}
