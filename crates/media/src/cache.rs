//! One decode per file for all its image tasks: a small, bounded cache of
//! [`WorkingImage`]s keyed by content digest and working side, shared by
//! the `metadata`, `thumbnail` and `perceptual_hash` tasks of one worker.
//!
//! *Why by digest:* a task's output is a function of the bytes its claim's
//! digest names. A working image decoded from bytes whose SHA-256 was
//! checked against that digest is exactly what the next task of the same
//! revision would decode, so that task takes it without reading the file
//! again; the fencing is unchanged (each task still reports, and writes its
//! own file, under its own claim). A decode's refusal (not an image, too
//! large) is cached too: it is about the bytes, and the same bytes are
//! refused the same way. Nothing retryable is cached (a read that failed, a
//! digest that no longer matches, a job told to stop): the next task tries
//! for itself.
//!
//! Tasks of one file that run at once wait for the one decode under way
//! instead of starting their own, without holding a compute thread while
//! they wait.
//!
//! Bounded by entries, oldest first out: a working image holds at most
//! side × side × 4 bytes (1 MiB at the default side), and the tasks of one
//! file are requested together, so they run close together.

use crate::error::MediaError;
use crate::working::WorkingImage;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::OnceCell;

/// What a decode of a digest came to: a working image, or why the bytes
/// are refused.
pub(crate) type Decoded = Result<Arc<WorkingImage>, Arc<MediaError>>;

/// One digest's decode at one side, done or under way.
pub(crate) type Slot = Arc<OnceCell<Decoded>>;

type Key = (String, u32);

/// See the module documentation.
#[derive(Debug)]
pub struct DecodeCache {
    capacity: usize,
    entries: Mutex<Entries>,
    decodes: AtomicU64,
}

#[derive(Debug, Default)]
struct Entries {
    slots: HashMap<Key, Slot>,
    /// Keys oldest first.
    order: VecDeque<Key>,
}

impl DecodeCache {
    /// Entries kept by default: the three tasks of a few dozen files.
    pub const DEFAULT_ENTRIES: usize = 48;

    /// A cache of at most `capacity` working images (at least one).
    pub fn new(capacity: usize) -> Self {
        DecodeCache {
            capacity: capacity.max(1),
            entries: Mutex::new(Entries::default()),
            decodes: AtomicU64::new(0),
        }
    }

    /// How many decodes the tasks sharing this cache have run (each a
    /// file's bytes decoded once, whether it succeeded or was refused).
    pub fn decodes(&self) -> u64 {
        self.decodes.load(Ordering::Relaxed)
    }

    pub(crate) fn count_decode(&self) {
        self.decodes.fetch_add(1, Ordering::Relaxed);
    }

    /// The slot of `digest` (lowercase hex) at `side`, new if absent; the
    /// oldest slots beyond the capacity are dropped (a task still holding
    /// one keeps it).
    pub(crate) fn slot(&self, digest: &str, side: u32) -> Slot {
        let key = (digest.to_string(), side);
        let mut entries = self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(slot) = entries.slots.get(&key) {
            return slot.clone();
        }
        let slot: Slot = Arc::new(OnceCell::new());
        entries.slots.insert(key.clone(), slot.clone());
        entries.order.push_back(key);
        while entries.order.len() > self.capacity {
            if let Some(oldest) = entries.order.pop_front() {
                entries.slots.remove(&oldest);
            }
        }
        slot
    }
}

impl Default for DecodeCache {
    fn default() -> Self {
        DecodeCache::new(Self::DEFAULT_ENTRIES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_shared_by_digest_and_side_and_the_oldest_go_first() {
        let cache = DecodeCache::new(2);
        let first = cache.slot("aa", 512);
        assert!(Arc::ptr_eq(&first, &cache.slot("aa", 512)));
        assert!(!Arc::ptr_eq(&first, &cache.slot("aa", 1024)), "another side");
        cache.slot("bb", 512);
        assert!(
            !Arc::ptr_eq(&first, &cache.slot("aa", 512)),
            "the oldest was dropped beyond the capacity"
        );
    }
}
