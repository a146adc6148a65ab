//! The in-memory rows a fold reads and changes.

use super::cells::{Cell, TableSpec};
use super::Row;
use std::collections::BTreeSet;
use std::hash::{BuildHasherDefault, DefaultHasher};

/// The slots by key. A hash map, because a fold looks rows up several times
/// per event and replay keeps up to 25,000 rows cached: a B-tree lookup
/// compares 36-character keys with long common prefixes a dozen times
/// (profiled: a third of replay's time went to those comparisons). The
/// hasher has fixed keys, so the same history gives the same map in every
/// process, and nothing reads the map in its own order: the write-back goes
/// by the sorted dirty set, and `rows` and `take_removed_with` sort.
#[allow(clippy::disallowed_types)]
type SlotMap = std::collections::HashMap<RowKey, Slot, BuildHasherDefault<DefaultHasher>>;

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

/// Names the rows of `table` whose `column` equals `value`: what a fold
/// needs when an event touches rows it cannot name by key (the capability
/// states of a media item about to be removed, whose counts must go down
/// with them).
#[derive(Debug, Clone, PartialEq)]
pub struct RowQuery {
    pub table: &'static TableSpec,
    pub column: &'static str,
    pub value: Cell,
}

#[derive(Debug, Clone)]
struct Slot {
    row: Option<Row>,
    dirty: bool,
}

/// Rows known to the fold: loaded from the store (present or known absent)
/// or changed by events. Dirty rows are written back by the caller, in key
/// order (the dirty set is sorted), so the write order is deterministic.
#[derive(Debug, Clone, Default)]
pub struct WorkingSet {
    slots: SlotMap,
    /// The keys of dirty slots, so writing back costs the changes, not the
    /// size of the cache (replay keeps up to 25,000 rows cached).
    dirty: BTreeSet<RowKey>,
    /// Rows that vanished by cascade since the last write-back, so a fold
    /// folding after the one that deleted their parent can see what went
    /// (and keep its counts true).
    cascaded: Vec<Row>,
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
        let key = row.key();
        self.dirty.insert(key.clone());
        self.slots.insert(
            key,
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
        self.cascade(key);
    }

    /// Forgets the known descendants of a deleted row, grandchildren too
    /// (a media item's regions and their processing states).
    fn cascade(&mut self, parent: &RowKey) {
        let mut orphans = Vec::new();
        for (child_key, slot) in self.slots.iter_mut() {
            if slot.row.as_ref().and_then(Row::parent).as_ref() == Some(parent) {
                // The stored copy (if any) goes by cascade; nothing to write.
                if let Some(row) = slot.row.take() {
                    self.cascaded.push(row);
                }
                slot.dirty = false;
                orphans.push(child_key.clone());
            }
        }
        for orphan in orphans {
            self.dirty.remove(&orphan);
            self.cascade(&orphan);
        }
    }

    /// Takes the rows of `table` whose parent `parent` was deleted (by
    /// cascade) since the last write-back.
    pub fn take_removed_with(&mut self, parent: &RowKey, table: &'static TableSpec) -> Vec<Row> {
        let (mut taken, kept): (Vec<Row>, Vec<Row>) = std::mem::take(&mut self.cascaded)
            .into_iter()
            .partition(|row| row.table().name == table.name && row.parent().as_ref() == Some(parent));
        self.cascaded = kept;
        taken.sort_by_key(Row::key);
        taken
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
        self.cascaded.clear();
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
        self.cascaded.clear();
    }

    /// Every present row, in key order.
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        let mut present: Vec<(&RowKey, &Row)> = self
            .slots
            .iter()
            .filter_map(|(key, slot)| slot.row.as_ref().map(|row| (key, row)))
            .collect();
        present.sort_by(|a, b| a.0.cmp(b.0));
        present.into_iter().map(|(_, row)| row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{MediaId, RegionId};
    use crate::projections::{MediaRow, RegionRow};
    use crate::time::Timestamp;
    use uuid::Uuid;

    fn media(n: u128) -> Row {
        Row::Media(MediaRow {
            media_id: MediaId(Uuid::from_u128(n)),
            path: format!("/{n}"),
            media_kind: "image".into(),
            content_digest: None,
            byte_size: None,
            registered_at: Timestamp::from_micros(0),
            updated_at: Timestamp::from_micros(0),
            version: 1,
        })
    }

    fn region(n: u128, parent: u128) -> Row {
        Row::Region(RegionRow {
            region_id: RegionId(Uuid::from_u128(n)),
            media_id: MediaId(Uuid::from_u128(parent)),
            x: 0,
            y: 0,
            width: 1,
            height: 1,
            region_revision: 1,
            created_at: Timestamp::from_micros(0),
        })
    }

    #[test]
    fn put_rows_are_written_back_exactly_once() {
        let mut rows = WorkingSet::default();
        rows.insert_loaded(media(1).key(), None);
        rows.insert_loaded(media(2).key(), Some(media(2)));
        rows.put(media(1));
        let changes = rows.take_dirty();
        assert_eq!(changes, vec![(media(1).key(), Some(media(1)))]);
        assert!(
            rows.take_dirty().is_empty(),
            "a written row is clean until changed again"
        );
        assert_eq!(rows.get(&media(1).key()), Some(&media(1)), "written rows stay cached");
    }

    #[test]
    fn deleting_a_parent_drops_its_cached_children_without_writing_them() {
        let mut rows = WorkingSet::default();
        rows.put(media(1));
        rows.put(region(10, 1));
        rows.put(region(11, 2));
        rows.delete(&media(1).key());
        let changes = rows.take_dirty();
        assert_eq!(
            changes,
            vec![(media(1).key(), None), (region(11, 2).key(), Some(region(11, 2)))]
        );
        assert!(rows.get(&region(10, 1).key()).is_none());
    }

    #[test]
    fn rows_removed_by_cascade_can_be_taken_once_until_the_write_back() {
        let mut rows = WorkingSet::default();
        rows.put(media(1));
        rows.put(region(10, 1));
        rows.put(region(11, 1));
        rows.put(region(12, 2));
        rows.delete(&media(1).key());
        let removed = rows.take_removed_with(&media(1).key(), &crate::projections::REGIONS_TABLE);
        assert_eq!(removed, vec![region(10, 1), region(11, 1)]);
        assert!(rows
            .take_removed_with(&media(1).key(), &crate::projections::REGIONS_TABLE)
            .is_empty());
        rows.delete(&media(2).key());
        rows.take_dirty();
        assert!(
            rows.take_removed_with(&media(2).key(), &crate::projections::REGIONS_TABLE)
                .is_empty(),
            "a write-back forgets what was cascaded"
        );
    }
}
