//! The arithmetic every workload's figures share: one quantile, one rounding,
//! rates, and the process's peak memory.

use std::time::Duration;

/// The `fraction` quantile (0.5 = median) of `sorted` samples: the sample
/// at rank `round((n - 1) × fraction)`, or the default value of none.
pub fn quantile<T: Copy + Default>(sorted: &[T], fraction: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let index = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// The median of `samples`, sorting them first.
pub fn median<T: Copy + Default + Ord>(samples: &mut [T]) -> T {
    samples.sort_unstable();
    quantile(samples, 0.5)
}

/// A figure as printed: three decimals.
pub fn round3(value: f64) -> f64 {
    (value * 1_000.0).round() / 1_000.0
}

pub fn per_second(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

pub fn millis(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64() * 1_000.0
}

/// The process's peak resident set size in bytes (VmHWM), when readable.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resets the peak RSS to the current RSS (Linux: writing 5 to clear_refs),
/// so the peak measured afterwards belongs to what runs next alone.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quantile_is_the_sample_at_the_rounded_rank() {
        let samples = [10u64, 20, 30, 40];
        assert_eq!(quantile(&samples, 0.0), 10);
        // rank 1.5 rounds up, as the median of an even count takes the upper one
        assert_eq!(quantile(&samples, 0.5), 30);
        assert_eq!(quantile(&samples, 0.99), 40);
        assert_eq!(quantile::<u64>(&[], 0.5), 0);
        let mut rounds = [Duration::from_secs(3), Duration::from_secs(1), Duration::from_secs(2)];
        assert_eq!(median(&mut rounds), Duration::from_secs(2));
    }

    #[test]
    fn figures_round_to_three_decimals() {
        assert_eq!(round3(0.123_456), 0.123);
        assert_eq!(round3(2.0 / 3.0), 0.667);
    }
}
