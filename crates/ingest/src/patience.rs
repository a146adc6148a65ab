//! The run's own writes wait out storage trouble as its workers' claims
//! do: a write the store answers `Unavailable` (a full disk, an
//! unreachable server) is tried again after a wait that doubles from 50 ms
//! up to 5 s, until [`crate::IngestOptions::give_up_after`] has passed;
//! then the run stops with the storage error, which says what it is first
//! (`disk full: …`), and how long it was tried. *Why:* a run that failed
//! at once on its own writes but waited for ever on its workers' (or the
//! other way round) would end or hang depending on which write met the
//! full disk first.

use opledger_engine::EngineError;
use opledger_store::{ErrorKind, StoreError};
use std::future::Future;
use std::time::{Duration, Instant};

const FIRST_WAIT: Duration = Duration::from_millis(50);
const MOST_WAIT: Duration = Duration::from_secs(5);

/// Runs `call` until it answers anything but `Unavailable`, or until
/// `give_up_after` has passed since its first failure.
pub(crate) async fn patiently<T, F, Fut>(give_up_after: Duration, what: &str, mut call: F) -> Result<T, EngineError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, EngineError>>,
{
    let started = Instant::now();
    let mut wait = FIRST_WAIT;
    let mut tries: u32 = 0;
    loop {
        match call().await {
            Err(EngineError::Store(error)) if error.is(ErrorKind::Unavailable) => {
                tries += 1;
                let failing = started.elapsed();
                if failing >= give_up_after {
                    return Err(EngineError::Store(StoreError::new(
                        error.kind,
                        format!(
                            "{} ({what} failed {tries} times over {:.0} s; stopped trying)",
                            error.message,
                            failing.as_secs_f64()
                        ),
                    )));
                }
                tracing::warn!(%error, ?wait, "could not {what}; trying again after a wait");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MOST_WAIT);
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[tokio::test]
    async fn unavailable_writes_are_tried_again_until_the_limit_then_stop_with_the_error() {
        let calls = Cell::new(0);
        let started = Instant::now();
        let answer = patiently(Duration::from_millis(300), "record", || {
            calls.set(calls.get() + 1);
            async { Err::<(), _>(EngineError::Store(StoreError::unavailable("disk full: no room"))) }
        })
        .await
        .unwrap_err();
        let message = answer.to_string();
        assert!(message.starts_with("disk full: no room (record failed"), "{message}");
        assert!(message.ends_with("stopped trying)"), "{message}");
        // Waits of 50, 100, 200 ms: at least four tries, and not for long.
        assert!(calls.get() >= 4, "{}", calls.get());
        assert!(started.elapsed() < Duration::from_secs(2));

        let calls = Cell::new(0);
        let answer = patiently(Duration::from_secs(3), "record", || {
            calls.set(calls.get() + 1);
            let fail = calls.get() < 3;
            async move {
                if fail {
                    Err(EngineError::Store(StoreError::unavailable("busy")))
                } else {
                    Ok(7)
                }
            }
        })
        .await;
        assert_eq!(answer.unwrap(), 7);
        // Other refusals are answered at once.
        let conflict = patiently(Duration::from_secs(3), "record", || async {
            Err::<(), _>(EngineError::Store(StoreError::conflict("x")))
        })
        .await;
        assert!(conflict.is_err());
    }
}
