//! The in-memory rows a fold reads and changes.

use super::cells::{Cell, TableSpec};
use super::Row;
use crate::ids::{BatchId, MediaId, OperationId, RegionId};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use uuid::Uuid;

/// The slots by key. A hash map, because a fold looks rows up several times
/// per event and replay keeps up to 25,000 rows cached: a B-tree lookup
/// compares keys a dozen times (profiled, with text keys: a third of
/// replay's time went to those comparisons). The hasher has fixed keys, so
/// the same history gives the same map in every process, and nothing reads
/// the map in its own order: the write-back goes by the sorted dirty set,
/// and `rows` and `take_removed_with` sort. The hasher is foldhash's with
/// its fixed seed (`FixedState`, never its `RandomState`): SipHash of a
/// 36-character text key was 8% of replay.
#[allow(clippy::disallowed_types)]
type SlotMap = std::collections::HashMap<RowKey, Slot, foldhash::fast::FixedState>;

/// Names one row: its table and its primary key.
#[derive(Debug, Clone, Eq)]
pub struct RowKey {
    pub table: &'static str,
    pub key: Key,
}

/// A row's primary key, held in the form cheapest to hash and compare. A
/// fold builds and looks up several keys per event, and nearly all are one
/// UUID (an id) or two (a batch item): as 36-character text each was an
/// allocation, a format and a hash and compare of 36 bytes, about a third
/// of replay's fold. [`fmt::Display`] renders the text the key column
/// stores, and [`Key::from_text`] gives back the same key for that text,
/// so a key built from a row's fields and one read back from a store are
/// equal exactly when their texts are. Within one table every key has the
/// same shape, and each shape orders as its text does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// One UUID, stored hyphenated lower-case.
    Id(Uuid),
    /// Two UUIDs, stored as `<first>/<second>`.
    Pair(Uuid, Uuid),
    /// Any other text (the names of counts rows, mostly constants).
    Name(Cow<'static, str>),
}

const UUID_TEXT: usize = 36;

/// The UUID whose canonical text (hyphenated lower-case) is exactly `text`.
fn canonical_uuid(text: &str) -> Option<Uuid> {
    if text.len() != UUID_TEXT {
        return None;
    }
    let uuid = Uuid::try_parse(text).ok()?;
    let mut buffer = Uuid::encode_buffer();
    (uuid.hyphenated().encode_lower(&mut buffer) == text).then_some(uuid)
}

impl Key {
    /// The key whose stored text is `text`.
    pub fn from_text(text: &str) -> Key {
        if let Some(uuid) = canonical_uuid(text) {
            return Key::Id(uuid);
        }
        if text.len() == 2 * UUID_TEXT + 1 && text.as_bytes()[UUID_TEXT] == b'/' {
            if let (Some(first), Some(second)) = (
                canonical_uuid(&text[..UUID_TEXT]),
                canonical_uuid(&text[UUID_TEXT + 1..]),
            ) {
                return Key::Pair(first, second);
            }
        }
        Key::Name(Cow::Owned(text.to_string()))
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Id(uuid) => uuid.hyphenated().fmt(f),
            Key::Pair(first, second) => write!(f, "{}/{}", first.hyphenated(), second.hyphenated()),
            Key::Name(name) => f.write_str(name),
        }
    }
}

/// Each id as a row key, rendered as the id's `to_string` renders it (and
/// so as every stored key of it).
macro_rules! id_keys {
    ($($id:ident),*) => {
        $(impl $id {
            pub fn key(&self) -> Key {
                Key::Id(self.0)
            }
        })*
    };
}

id_keys!(MediaId, RegionId, OperationId, BatchId);

impl From<Uuid> for Key {
    fn from(uuid: Uuid) -> Self {
        Key::Id(uuid)
    }
}

impl From<&str> for Key {
    fn from(text: &str) -> Self {
        Key::from_text(text)
    }
}

impl From<String> for Key {
    fn from(text: String) -> Self {
        Key::from_text(&text)
    }
}

/// Equal when table and key are; a table name is almost always the same
/// `&'static str` of its `TableSpec`, so the names compare by address
/// first (key comparisons in the working set were 11% of replay).
impl PartialEq for RowKey {
    fn eq(&self, other: &Self) -> bool {
        (std::ptr::eq(self.table, other.table) || self.table == other.table) && self.key == other.key
    }
}

/// By table name, then key; names that are the same `&'static str` skip
/// comparing their bytes (the write-back sorts the dirty keys).
impl Ord for RowKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if std::ptr::eq(self.table, other.table) {
            self.key.cmp(&other.key)
        } else {
            self.table.cmp(other.table).then_with(|| self.key.cmp(&other.key))
        }
    }
}

impl PartialOrd for RowKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Consistent with equality, which compares names by content: equal names
/// have equal lengths and first bytes. Hashing those instead of the whole
/// name keeps the tables apart well enough (one UUID keys five tables'
/// rows) at a fraction of the cost; equality sorts out the rest.
impl std::hash::Hash for RowKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let first = self.table.as_bytes().first().copied().unwrap_or(0);
        state.write_usize(self.table.len() << 8 | usize::from(first));
        self.key.hash(state);
    }
}

impl RowKey {
    pub fn new(table: &'static TableSpec, key: impl Into<Key>) -> Self {
        RowKey {
            table: table.name,
            key: key.into(),
        }
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

/// One cached row. The row is behind a pointer so the map's entries stay
/// small (a row is ~400 bytes inline): replay keeps tens of thousands
/// cached, and with rows inline every probe strode over them and every
/// growth of the map moved them all (measured: a third of replay's time
/// went to finding and inserting keys, mostly rehashing and page faults).
/// The pointer is shared with the write-back ([`RowChange::after`]) rather
/// than the row cloned into it; once the write-back is dropped, a replaced
/// row reuses its allocation.
#[derive(Debug, Clone)]
struct Slot {
    row: Option<Arc<Row>>,
    dirty: bool,
}

/// What the store holds for a row as far as the working set knows. The
/// row is boxed: the dirty list holds one of these per changed row, and
/// with a row inline (~400 bytes) growing that list moved them all.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    /// Never loaded: the row may or may not exist, so it is written whole.
    Unknown,
    /// Loaded and found missing (or deleted by an earlier write-back).
    Absent,
    /// Loaded (or written) with these values.
    Present(Box<Row>),
}

/// One changed row for a store to write back: `after` None deletes it.
/// `after` is shared with the working set's cached copy.
#[derive(Debug, Clone, PartialEq)]
pub struct RowChange {
    pub key: RowKey,
    pub before: Stored,
    pub after: Option<Arc<Row>>,
}

impl RowChange {
    /// Writes `row` whole, whatever the store holds.
    pub fn upsert(row: Row) -> Self {
        RowChange {
            key: row.key(),
            before: Stored::Unknown,
            after: Some(Arc::new(row)),
        }
    }

    /// Deletes the row named by `key`, if it exists.
    pub fn delete(key: RowKey) -> Self {
        RowChange {
            key,
            before: Stored::Unknown,
            after: None,
        }
    }

    /// When the store is known to hold the row and it stays: the columns
    /// (positions in its table's column list, keys excluded) whose cells
    /// differ, with the new cells. An empty list means nothing changed.
    /// None when the row must be written whole (unknown or new) or deleted.
    pub fn changed_cells(&self) -> Option<Vec<(usize, Cell)>> {
        let (Stored::Present(before), Some(after)) = (&self.before, &self.after) else {
            return None;
        };
        let key_columns = after.table().key_columns;
        let changed = before
            .to_cells()
            .into_iter()
            .zip(after.to_cells())
            .enumerate()
            .skip(key_columns)
            .filter(|(_, (old, new))| old != new)
            .map(|(position, (_, new))| (position, new))
            .collect();
        Some(changed)
    }
}

/// Rows known to the fold: loaded from the store (present or known absent)
/// or changed by events. Dirty rows are written back by the caller, in key
/// order (the dirty set is sorted), so the write order is deterministic.
#[derive(Debug, Clone, Default)]
pub struct WorkingSet {
    slots: SlotMap,
    /// The keys of dirty slots in the order they were first dirtied, so
    /// writing back costs the changes, not the size of the cache (replay
    /// keeps up to 25,000 rows cached), each with what the store held
    /// before the slot was dirtied, so the write-back can touch only the
    /// columns that changed. Kept here rather than in the slots: only dirty
    /// rows pay for the second copy (in the slots it doubled the size of
    /// every cached row). A list sorted once at the write-back, not a
    /// B-tree: a slot's dirty mark says whether its key is listed, so
    /// dirtying a row costs no second lookup.
    dirty: Vec<(RowKey, Stored)>,
    /// Rows that vanished by cascade since the last write-back, so a fold
    /// folding after the one that deleted their parent can see what went
    /// (and keep its counts true).
    cascaded: Vec<Row>,
    /// Whether dirtied slots keep what the store held (see [`Stored`]).
    forget_stored: bool,
}

impl WorkingSet {
    /// A working set whose changes all say [`Stored::Unknown`]: for writers
    /// that write every row whole anyway (replay into scratch tables), so
    /// dirtied rows do not hold a second copy until the write-back.
    pub fn forgetting_stored_rows() -> Self {
        WorkingSet {
            forget_stored: true,
            ..WorkingSet::default()
        }
    }

    /// Whether the row is loaded or was produced by a fold.
    pub fn is_known(&self, key: &RowKey) -> bool {
        self.slots.contains_key(key)
    }

    /// Records what the store holds for `key` (None: no such row).
    pub fn insert_loaded(&mut self, key: RowKey, row: Option<Row>) {
        self.slots.insert(
            key,
            Slot {
                row: row.map(Arc::new),
                dirty: false,
            },
        );
    }

    pub fn get(&self, key: &RowKey) -> Option<&Row> {
        self.slots.get(key).and_then(|slot| slot.row.as_deref())
    }

    /// Inserts or replaces a row.
    pub fn put(&mut self, row: Row) {
        let key = row.key();
        self.replace(key, Some(row));
    }

    /// Sets a slot's row and marks it dirty, remembering what the store
    /// held the first time a clean slot is dirtied.
    fn replace(&mut self, key: RowKey, row: Option<Row>) {
        match self.slots.get_mut(&key) {
            Some(slot) => {
                // The row the store held is kept only when the slot is
                // first dirtied; a row shared with a write-back is not
                // copied just to be dropped.
                let keep_previous = !slot.dirty && !self.forget_stored;
                let previous = match (slot.row.as_mut().and_then(Arc::get_mut), row) {
                    (Some(cached), Some(row)) => Some(std::mem::replace(cached, row)),
                    (_, row) => std::mem::replace(&mut slot.row, row.map(Arc::new))
                        .filter(|_| keep_previous)
                        .map(Arc::unwrap_or_clone),
                };
                // A dirty slot's entry already says what the store holds.
                if !std::mem::replace(&mut slot.dirty, true) {
                    let before = match previous {
                        _ if self.forget_stored => Stored::Unknown,
                        Some(previous) => Stored::Present(Box::new(previous)),
                        None => Stored::Absent,
                    };
                    self.dirty.push((key, before));
                }
            }
            None => {
                self.slots.insert(
                    key.clone(),
                    Slot {
                        row: row.map(Arc::new),
                        dirty: true,
                    },
                );
                self.dirty.push((key, Stored::Unknown));
            }
        }
    }

    /// Changes the present row `key` names in place (never its key), and
    /// marks it dirty; false, with nothing changed, when the working set
    /// holds no present row for `key`. A row shared with a write-back is
    /// copied first, so the write-back keeps what it was given.
    pub fn modify(&mut self, key: &RowKey, change: impl FnOnce(&mut Row)) -> bool {
        let Some(slot) = self.slots.get_mut(key) else {
            return false;
        };
        let Some(row) = slot.row.as_mut() else {
            return false;
        };
        if !slot.dirty {
            let before = if self.forget_stored {
                Stored::Unknown
            } else {
                Stored::Present(Box::new(Row::clone(row)))
            };
            slot.dirty = true;
            self.dirty.push((key.clone(), before));
        }
        change(Arc::make_mut(row));
        true
    }

    /// Deletes a row. Rows whose parent it is vanish with it, as the
    /// stores' ON DELETE CASCADE makes them vanish from stored tables.
    pub fn delete(&mut self, key: &RowKey) {
        self.replace(key.clone(), None);
        self.cascade(key);
    }

    /// Forgets the known descendants of a deleted row, grandchildren too
    /// (a media item's regions and their processing states).
    fn cascade(&mut self, parent: &RowKey) {
        let mut orphans = Vec::new();
        for (child_key, slot) in self.slots.iter_mut() {
            if slot.row.as_deref().and_then(Row::parent).as_ref() == Some(parent) {
                // The stored copy (if any) goes by cascade; nothing to write.
                if let Some(row) = slot.row.take() {
                    self.cascaded.push(Arc::unwrap_or_clone(row));
                }
                slot.dirty = false;
                orphans.push(child_key.clone());
            }
        }
        for orphan in orphans {
            // Rare (a deletion with cached children), so a scan.
            self.dirty.retain(|(key, _)| key != &orphan);
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

    /// The changed rows in key order, clearing their dirty marks: each
    /// with what the store held before (so a store can write only the
    /// changed columns of a row it is known to hold) and the row to write
    /// (None: delete it). The caller writes them back; from then on the
    /// working set takes the store to hold what it holds.
    pub fn take_dirty(&mut self) -> Vec<RowChange> {
        self.cascaded.clear();
        // The list keeps its capacity for the next chunk or command.
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut changes = Vec::with_capacity(dirty.len());
        for (key, before) in dirty.drain(..) {
            if let Some(slot) = self.slots.get_mut(&key) {
                if slot.dirty {
                    slot.dirty = false;
                    let after = slot.row.clone();
                    changes.push(RowChange { key, before, after });
                }
            }
        }
        self.dirty = dirty;
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
            .filter_map(|(key, slot)| slot.row.as_deref().map(|row| (key, row)))
            .collect();
        present.sort_by(|a, b| a.0.cmp(b.0));
        present.into_iter().map(|(_, row)| row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projections::{MediaRow, RegionRow, MEDIA_TABLE};
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

    /// The write-back shares the cached row; a fold that changes the row
    /// again while a write-back still holds it must leave the held copy as
    /// it was and record the written copy as what the store holds.
    #[test]
    fn a_row_changed_while_its_write_back_is_held_keeps_the_held_copy() {
        let moved = |row: Row| match row {
            Row::Media(mut media) => {
                media.path = "/moved".into();
                media.version = 2;
                Row::Media(media)
            }
            other => other,
        };
        let mut rows = WorkingSet::default();
        rows.insert_loaded(media(1).key(), None);
        rows.put(media(1));
        let held = rows.take_dirty();
        rows.put(moved(media(1)));
        assert_eq!(
            held[0].after.as_deref(),
            Some(&media(1)),
            "the held write-back is unchanged"
        );
        assert_eq!(rows.get(&media(1).key()), Some(&moved(media(1))));
        let next = rows.take_dirty();
        assert_eq!(
            next,
            vec![RowChange {
                key: media(1).key(),
                before: Stored::Present(Box::new(media(1))),
                after: Some(Arc::new(moved(media(1)))),
            }]
        );
        // Once no write-back holds it, the cached row is changed in place.
        drop((held, next));
        rows.put(media(1));
        assert_eq!(rows.take_dirty()[0].before, Stored::Present(Box::new(moved(media(1)))));
    }

    /// `modify` is `put` in place: the same guarantees for a held
    /// write-back and for what the store held before.
    #[test]
    fn a_row_modified_in_place_keeps_a_held_write_back_and_its_stored_copy() {
        let rename = |row: &mut Row| {
            if let Row::Media(media) = row {
                media.path = format!("{}+", media.path);
            }
        };
        let mut rows = WorkingSet::default();
        assert!(!rows.modify(&media(1).key(), rename), "nothing to modify yet");
        rows.insert_loaded(media(1).key(), None);
        assert!(
            !rows.modify(&media(1).key(), rename),
            "a known-absent row is not modified"
        );
        assert!(rows.take_dirty().is_empty());
        rows.put(media(1));
        let held = rows.take_dirty();
        assert!(rows.modify(&media(1).key(), rename));
        assert!(rows.modify(&media(1).key(), rename));
        assert_eq!(
            held[0].after.as_deref(),
            Some(&media(1)),
            "the held write-back is unchanged"
        );
        let mut twice = media(1);
        rename(&mut twice);
        rename(&mut twice);
        assert_eq!(
            rows.take_dirty(),
            vec![RowChange {
                key: media(1).key(),
                before: Stored::Present(Box::new(media(1))),
                after: Some(Arc::new(twice.clone())),
            }]
        );
        // A working set that forgets stored rows records none.
        let mut forgetting = WorkingSet::forgetting_stored_rows();
        forgetting.insert_loaded(media(1).key(), Some(media(1)));
        assert!(forgetting.modify(&media(1).key(), rename));
        assert_eq!(forgetting.take_dirty()[0].before, Stored::Unknown);
    }

    #[test]
    fn put_rows_are_written_back_exactly_once() {
        let mut rows = WorkingSet::default();
        rows.insert_loaded(media(1).key(), None);
        rows.insert_loaded(media(2).key(), Some(media(2)));
        rows.put(media(1));
        let changes = rows.take_dirty();
        assert_eq!(
            changes,
            vec![RowChange {
                key: media(1).key(),
                before: Stored::Absent,
                after: Some(Arc::new(media(1)))
            }]
        );
        assert!(
            rows.take_dirty().is_empty(),
            "a written row is clean until changed again"
        );
        assert_eq!(rows.get(&media(1).key()), Some(&media(1)), "written rows stay cached");
    }

    #[test]
    fn a_loaded_row_changed_twice_is_written_with_the_columns_that_differ_from_the_store() {
        let mut rows = WorkingSet::default();
        rows.insert_loaded(media(1).key(), Some(media(1)));
        let mut first = media(1);
        let Row::Media(changed) = &mut first else {
            unreachable!()
        };
        changed.byte_size = Some(10);
        rows.put(first.clone());
        let mut second = first.clone();
        let Row::Media(changed) = &mut second else {
            unreachable!()
        };
        changed.byte_size = Some(20);
        changed.version = 2;
        rows.put(second.clone());
        let changes = rows.take_dirty();
        assert_eq!(changes.len(), 1);
        assert_eq!(
            changes[0].before,
            Stored::Present(Box::new(media(1))),
            "the store's row, not the first put"
        );
        let changed_columns: Vec<&str> = changes[0]
            .changed_cells()
            .expect("a row the store holds")
            .iter()
            .map(|(position, _)| MEDIA_TABLE.columns[*position].name)
            .collect();
        assert_eq!(changed_columns, vec!["byte_size", "version"]);

        // Written back, the row is what the store holds: an unchanged put
        // has nothing to write, and the next change is measured from it.
        rows.put(second.clone());
        let changes = rows.take_dirty();
        assert_eq!(changes[0].before, Stored::Present(Box::new(second)));
        assert_eq!(changes[0].changed_cells(), Some(Vec::new()));
    }

    #[test]
    fn a_working_set_forgetting_stored_rows_writes_everything_whole() {
        let mut rows = WorkingSet::forgetting_stored_rows();
        rows.insert_loaded(media(1).key(), Some(media(1)));
        rows.put(media(1));
        let changes = rows.take_dirty();
        assert_eq!(changes, vec![RowChange::upsert(media(1))]);
    }

    #[test]
    fn rows_never_loaded_are_written_whole() {
        let mut rows = WorkingSet::default();
        rows.put(media(1));
        let changes = rows.take_dirty();
        assert_eq!(changes[0].before, Stored::Unknown);
        assert_eq!(changes[0].changed_cells(), None);
        rows.delete(&media(1).key());
        let changes = rows.take_dirty();
        assert_eq!(changes[0].before, Stored::Present(Box::new(media(1))));
        assert_eq!(changes[0].changed_cells(), None, "a deletion is no column update");
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
            vec![RowChange::delete(media(1).key()), RowChange::upsert(region(11, 2))]
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

#[cfg(test)]
mod key_tests {
    use super::Key;
    use crate::ids::{BatchId, MediaId, OperationId, RegionId};
    use proptest::prelude::*;
    use uuid::Uuid;

    fn text(uuid: Uuid) -> String {
        uuid.hyphenated().to_string()
    }

    #[test]
    fn only_canonical_uuid_text_becomes_an_id() {
        let uuid = Uuid::from_u128(0x0192_a3b4_c5d6_7e8f_9012_3456_789a_bcde);
        assert_eq!(Key::from_text(&text(uuid)), Key::Id(uuid));
        // Other spellings of the same UUID are other texts, so other keys,
        // as they were when keys were strings.
        for other in [
            text(uuid).to_uppercase(),
            uuid.simple().to_string(),
            format!("{{{}}}", text(uuid)),
            uuid.urn().to_string(),
        ] {
            let key = Key::from_text(&other);
            assert!(matches!(key, Key::Name(_)), "{other} became {key:?}");
            assert_eq!(key.to_string(), other);
        }
        let pair = format!("{}/{}", text(uuid), text(Uuid::nil()));
        assert_eq!(Key::from_text(&pair), Key::Pair(uuid, Uuid::nil()));
        assert!(matches!(Key::from_text(&pair.to_uppercase()), Key::Name(_)));
        assert!(matches!(Key::from_text(&pair.replace('/', ":")), Key::Name(_)));
        assert_eq!(Key::from_text("by_status"), Key::Name("by_status".into()));
        assert_eq!(Key::from_text(""), Key::Name("".into()));
    }

    proptest! {
        /// A key renders the text it was read from, and keys of one shape
        /// order and compare as their texts do, so the write-back order and
        /// every lookup are what they were with text keys.
        #[test]
        fn keys_round_trip_and_order_as_their_text(
            a in any::<u128>(), b in any::<u128>(), c in any::<u128>(), d in any::<u128>(),
            name_a in "[a-z_:0-9-]{0,40}", name_b in "[a-z_:0-9-]{0,40}",
        ) {
            let (a, b, c, d) = (Uuid::from_u128(a), Uuid::from_u128(b), Uuid::from_u128(c), Uuid::from_u128(d));
            let shapes = [
                (text(a), text(b)),
                (format!("{}/{}", text(a), text(b)), format!("{}/{}", text(c), text(d))),
                (format!("{}/{}", text(a), text(b)), format!("{}/{}", text(a), text(d))),
                (name_a.clone(), name_b.clone()),
            ];
            for (left, right) in shapes {
                let (left_key, right_key) = (Key::from_text(&left), Key::from_text(&right));
                prop_assert_eq!(left_key.to_string(), left.clone());
                prop_assert_eq!(right_key.to_string(), right.clone());
                prop_assert_eq!(left_key.cmp(&right_key), left.cmp(&right));
                prop_assert_eq!(left_key == right_key, left == right);
            }
        }
    }

    proptest! {
        /// Row keys are the stored key text: an id's `key` must be exactly
        /// what its `to_string` (and therefore every stored key) gives.
        #[test]
        fn an_id_key_is_its_display_text(bits in any::<u128>()) {
            let uuid = Uuid::from_u128(bits);
            prop_assert_eq!(MediaId(uuid).key().to_string(), MediaId(uuid).to_string());
            prop_assert_eq!(RegionId(uuid).key().to_string(), RegionId(uuid).to_string());
            prop_assert_eq!(OperationId(uuid).key().to_string(), OperationId(uuid).to_string());
            prop_assert_eq!(BatchId(uuid).key().to_string(), BatchId(uuid).to_string());
            prop_assert_eq!(Key::from_text(&MediaId(uuid).to_string()), MediaId(uuid).key());
        }
    }
}
