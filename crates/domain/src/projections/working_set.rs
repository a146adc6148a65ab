//! The in-memory rows a fold reads and changes.

use super::cells::TableSpec;
use super::Row;
use std::collections::{BTreeMap, BTreeSet};

/// Names one row: its table and its primary key rendered as text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowKey {
    pub table: &'static str,
    pub key: String,
}

impl RowKey {
    pub fn new(table: &'static TableSpec, key: String) -> Self {
        RowKey { table: table.name, key }
    }
}

#[derive(Debug, Clone)]
struct Slot {
    row: Option<Row>,
    dirty: bool,
}

/// Rows known to the fold: loaded from the store (present or known absent)
/// or changed by events. Dirty rows are written back by the caller.
/// A BTreeMap, so iteration (and so write order) is deterministic.
#[derive(Debug, Clone, Default)]
pub struct WorkingSet {
    slots: BTreeMap<RowKey, Slot>,
    /// The keys of dirty slots, so writing back costs the changes, not the
    /// size of the cache (replay keeps up to 100,000 rows cached).
    dirty: BTreeSet<RowKey>,
}

impl WorkingSet {
    /// Whether the row is loaded or was produced by a fold.
    pub fn is_known(&self, key: &RowKey) -> bool {
        self.slots.contains_key(key)
    }

    /// Records what the store holds for `key` (None: no such row).
    pub fn insert_loaded(&mut self, key: RowKey, row: Option<Row>) {
        self.slots.insert(key, Slot { row, dirty: false });
    }

    pub fn get(&self, key: &RowKey) -> Option<&Row> {
        self.slots.get(key).and_then(|slot| slot.row.as_ref())
    }

    /// Inserts or replaces a row.
    pub fn put(&mut self, row: Row) {
        self.slots.insert(
            row.key(),
            Slot {
                row: Some(row),
                dirty: true,
            },
        );
    }

    /// Deletes a row. Rows whose parent it is vanish with it, as the
    /// stores' ON DELETE CASCADE makes them vanish from stored tables.
    pub fn delete(&mut self, key: &RowKey) {
        self.dirty.insert(key.clone());
        self.slots.insert(key.clone(), Slot { row: None, dirty: true });
        for (child_key, slot) in self.slots.iter_mut() {
            if slot.row.as_ref().and_then(Row::parent).as_ref() == Some(key) {
                // The stored copy (if any) goes by cascade; nothing to write.
                slot.row = None;
                slot.dirty = false;
                self.dirty.remove(child_key);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The changed rows, clearing their dirty marks: `(key, Some(row))` to
    /// upsert, `(key, None)` to delete.
    pub fn take_dirty(&mut self) -> Vec<(RowKey, Option<Row>)> {
        let mut changes = Vec::with_capacity(self.dirty.len());
        for key in std::mem::take(&mut self.dirty) {
            if let Some(slot) = self.slots.get_mut(&key) {
                if slot.dirty {
                    slot.dirty = false;
                    let row = slot.row.clone();
                    changes.push((key, row));
                }
            }
        }
        changes
    }

    /// Forgets every row; callers flush dirty rows first.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.dirty.clear();
    }

    /// Every present row, in key order.
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        self.slots.values().filter_map(|slot| slot.row.as_ref())
    }
}
