//! What every task kind has, whoever declares it: the target it runs on,
//! its retry policy with the backoff arithmetic, and the statuses a worker
//! may claim from. The kinds themselves are declared by the application
//! (`crate::kinds`). Pure data and pure arithmetic: the jitter a retry
//! uses is drawn by the engine and passed in.

use crate::status::OperationStatus;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
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

impl std::str::FromStr for TargetType {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "media" => Ok(TargetType::Media),
            "region" => Ok(TargetType::Region),
            other => Err(format!("unknown target type {other:?}; known: media, region")),
        }
    }
}

/// What happens when a task kind runs out of error retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Exhausted {
    /// `failed_terminal`: the failure is final and goes to review.
    #[serde(rename = "failed_terminal")]
    FailTerminal,
    /// `dead_lettered`: parked for an operator, who may retry it later.
    #[serde(rename = "dead_lettered")]
    DeadLetter,
}

/// How a task kind retries application errors and survives interruptions.
/// Declared as `retry = { max_attempts = 5, jitter = 0.25, ... }`; every
/// field has the default of [`RetryPolicy::DEFAULT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts that may end in an application error; the last one's
    /// failure is final ([`RetryPolicy::exhausted`]).
    pub max_attempts: u32,
    /// The first retry waits this long; each further one twice as long as
    /// the one before, up to [`RetryPolicy::max_backoff_ms`].
    pub base_backoff_ms: i64,
    pub max_backoff_ms: i64,
    /// Up to this share (per mille) of the backoff is added as jitter, drawn
    /// by the command and recorded, so replay never draws again. Declared
    /// as a fraction (`jitter = 0.25`).
    #[serde(rename = "jitter", serialize_with = "jitter_out", deserialize_with = "jitter_in")]
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

    /// Whether the policy can be followed; `Err` says why not.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=1_000).contains(&self.max_attempts) {
            return Err(format!("max_attempts must be 1 to 1000, not {}", self.max_attempts));
        }
        if self.base_backoff_ms < 0 || self.max_backoff_ms < self.base_backoff_ms {
            return Err(format!(
                "backoffs must satisfy 0 <= base_backoff_ms ({}) <= max_backoff_ms ({})",
                self.base_backoff_ms, self.max_backoff_ms
            ));
        }
        if self.max_backoff_ms > 30 * 86_400_000 {
            return Err("max_backoff_ms must be at most 30 days".to_string());
        }
        if !(0..=1_000).contains(&self.jitter_per_mille) {
            return Err("jitter must be between 0 and 1".to_string());
        }
        if self.max_interruptions > 1_000 {
            return Err(format!(
                "max_interruptions must be at most 1000, not {}",
                self.max_interruptions
            ));
        }
        Ok(())
    }

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

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::DEFAULT
    }
}

fn jitter_out<S: Serializer>(per_mille: &i64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(*per_mille as f64 / 1_000.0)
}

fn jitter_in<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    let fraction = f64::deserialize(deserializer)?;
    if !(0.0..=1.0).contains(&fraction) {
        // Out of range is kept out of range, for `check` to name.
        return Ok(if fraction < 0.0 { -1 } else { 1_001 });
    }
    Ok((fraction * 1_000.0).round() as i64)
}

/// The statuses a worker may claim from (with `available_at <= now`).
pub const CLAIMABLE_STATUSES: &[OperationStatus] = &[OperationStatus::Queued, OperationStatus::RetryWaiting];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let policy = RetryPolicy::DEFAULT;
        assert_eq!(policy.backoff_ms(1), 1_000);
        assert_eq!(policy.backoff_ms(2), 2_000);
        assert_eq!(policy.backoff_ms(3), 4_000);
        assert_eq!(policy.backoff_ms(60), 600_000);
        assert_eq!(policy.max_jitter_ms(4_000), 1_000);
    }
}
