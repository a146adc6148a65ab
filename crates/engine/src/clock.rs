//! Time and ids enter the system here, and only here.

use opledger_domain::Timestamp;
use opledger_store::TimeSource;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use uuid::Uuid;

/// Where commands get the time they record.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;

    /// Whose clock a write command decides and records by
    /// (`WriteTx::command_time`): this one as it is (the default), or the
    /// clock the store's clients share where the store has one.
    fn source(&self) -> TimeSource {
        TimeSource::Caller
    }
}

/// The machine's clock. Write commands take the time from the store's
/// shared clock where it has one (PostgreSQL's server), read inside their
/// transaction: the hosts of one ledger need not agree on the time.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_datetime(chrono::Utc::now())
    }

    fn source(&self) -> TimeSource {
        TimeSource::Shared
    }
}

/// The machine's clock, off by a fixed amount: a host whose clock is
/// wrong, as tests of clock skew need it. Like [`SystemClock`], it defers
/// to the store's shared clock where there is one.
pub struct SkewedClock {
    offset_micros: i64,
}

impl SkewedClock {
    /// A clock `offset_millis` ahead of the machine's (behind when negative).
    pub fn by_millis(offset_millis: i64) -> Self {
        SkewedClock {
            offset_micros: offset_millis.saturating_mul(1000),
        }
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        let now = Timestamp::from_datetime(chrono::Utc::now());
        Timestamp::from_micros(now.as_micros().saturating_add(self.offset_micros))
    }

    fn source(&self) -> TimeSource {
        TimeSource::Shared
    }
}

/// A clock tests move by hand.
pub struct FixedClock {
    micros: AtomicI64,
}

impl FixedClock {
    pub fn at(start: Timestamp) -> Self {
        FixedClock {
            micros: AtomicI64::new(start.as_micros()),
        }
    }

    pub fn advance_millis(&self, millis: i64) {
        self.micros.fetch_add(millis * 1000, Ordering::SeqCst);
    }

    pub fn set(&self, at: Timestamp) {
        self.micros.store(at.as_micros(), Ordering::SeqCst);
    }
}

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_micros(self.micros.load(Ordering::SeqCst))
    }
}

/// Where commands get new ids (media, operations, claim tokens, commands).
pub trait Ids: Send + Sync {
    fn next(&self) -> Uuid;
}

/// Time-ordered random UUIDs (v7): sortable by creation, unique across hosts.
pub struct UuidV7Ids;

impl Ids for UuidV7Ids {
    fn next(&self) -> Uuid {
        Uuid::now_v7()
    }
}

/// Predictable ids for tests and fixtures: 1, 2, 3, ...
#[derive(Default)]
pub struct SequentialIds {
    next: AtomicU64,
}

impl SequentialIds {
    /// Ids from `first` + 1 on: a second engine over the same database
    /// (a restarted process in a test) must not reuse the first one's ids.
    pub fn starting_at(first: u128) -> Self {
        SequentialIds {
            next: AtomicU64::new(u64::try_from(first).unwrap_or(u64::MAX)),
        }
    }
}

impl Ids for SequentialIds {
    fn next(&self) -> Uuid {
        Uuid::from_u128(u128::from(self.next.fetch_add(1, Ordering::SeqCst) + 1))
    }
}

/// Where retry jitter comes from: a uniform draw in `0..=1000` (per mille of
/// the largest jitter the policy allows). The fail command draws once and
/// records the resulting time, so replay never draws.
pub trait Jitter: Send + Sync {
    fn draw(&self) -> u32;
}

/// Operating-system randomness.
pub struct RandomJitter;

impl Jitter for RandomJitter {
    fn draw(&self) -> u32 {
        // A v4 UUID is 122 random bits from the OS; 32 of them suffice.
        let bits = Uuid::new_v4().as_u128() as u32;
        bits % 1_001
    }
}

/// The same draw every time, for tests.
pub struct FixedJitter(pub u32);

impl Jitter for FixedJitter {
    fn draw(&self) -> u32 {
        self.0.min(1_000)
    }
}
