//! Settling on real files. The growing-file tests step a background writer
//! in lockstep with the settler's clock (each poll's sleep lets the writer
//! append one chunk, and waits until it has), so they show "not settled
//! while growing" without racing the wall clock, and assert no durations.

use futures::future::BoxFuture;
use opledger_media::{is_settled, FileState, SettleClock, SettleError, Settler};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, oneshot};

const CHUNK: usize = 4096;

/// Virtual time that moves only when the settler sleeps; each sleep also
/// hands the writer (if any) one step and waits for it to finish the step.
struct LockstepClock {
    now: Mutex<SystemTime>,
    sleeps: AtomicU32,
    steps: Option<mpsc::UnboundedSender<oneshot::Sender<()>>>,
}

impl LockstepClock {
    fn new(steps: Option<mpsc::UnboundedSender<oneshot::Sender<()>>>) -> Arc<Self> {
        Arc::new(LockstepClock {
            now: Mutex::new(SystemTime::now()),
            sleeps: AtomicU32::new(0),
            steps,
        })
    }
}

impl SettleClock for LockstepClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            *self.now.lock().unwrap() += duration;
            self.sleeps.fetch_add(1, Ordering::SeqCst);
            if let Some(steps) = &self.steps {
                let (done, stepped) = oneshot::channel();
                if steps.send(done).is_ok() {
                    let _ = stepped.await;
                }
            }
        })
    }
}

/// A background task that appends one chunk to `path` per step, `chunks`
/// times, then only acknowledges steps. `finished` is set after the last
/// chunk was written.
fn spawn_writer(
    path: PathBuf,
    chunks: u32,
    mut steps: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
) -> (Arc<AtomicBool>, Arc<AtomicU32>) {
    let finished = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU32::new(0));
    let (finished_flag, written_count) = (finished.clone(), written.clone());
    tokio::spawn(async move {
        while let Some(done) = steps.recv().await {
            if written_count.load(Ordering::SeqCst) < chunks {
                let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
                file.write_all(&[b'x'; CHUNK]).unwrap();
                file.sync_data().unwrap();
                if written_count.fetch_add(1, Ordering::SeqCst) + 1 == chunks {
                    finished_flag.store(true, Ordering::SeqCst);
                }
            }
            let _ = done.send(());
        }
    });
    (finished, written)
}

/// A one-chunk file last modified at `modified` (the test clock's start,
/// so a slow machine between writing it and starting the clock cannot make
/// it look old).
fn new_file(folder: &Path, modified: SystemTime) -> PathBuf {
    let path = folder.join("incoming.bin");
    std::fs::write(&path, [b'x'; CHUNK]).unwrap();
    set_modified(&path, modified);
    path
}

fn set_modified(path: &Path, modified: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(modified)
        .unwrap();
}

#[tokio::test]
async fn a_growing_file_is_not_settled_until_it_stops() {
    let folder = tempfile::tempdir().unwrap();
    let (steps_tx, steps_rx) = mpsc::unbounded_channel();
    let clock = LockstepClock::new(Some(steps_tx));
    let path = new_file(folder.path(), clock.now());
    let chunks = 30;
    let (finished, written) = spawn_writer(path.clone(), chunks, steps_rx);
    let settler = Settler::new(Duration::from_millis(500))
        .with_poll(Duration::from_millis(50))
        .with_clock(clock.clone());

    let settled = settler.settle(&path).await.unwrap();

    assert!(
        finished.load(Ordering::SeqCst),
        "reported settled while the writer was still appending ({} of {chunks} chunks written)",
        written.load(Ordering::SeqCst)
    );
    assert_eq!(
        settled.state.size,
        (CHUNK * (chunks as usize + 1)) as u64,
        "the whole file"
    );
    assert_eq!(settled.state, opledger_media::file_state(&path).unwrap());
    assert!(
        settled.polls > chunks,
        "it polled through every append and at least once after: {} polls",
        settled.polls
    );
    assert_eq!(clock.sleeps.load(Ordering::SeqCst), settled.polls);

    // Settling and hashing in one call gives the digest of the whole file.
    let (again, hashed) = settler.settle_and_hash(&path).await.unwrap();
    assert_eq!(again.state, settled.state);
    assert_eq!(hashed, opledger_media::hash_file(&path).unwrap());
    assert_eq!(hashed.byte_size, settled.state.size);
}

#[tokio::test]
async fn a_file_that_never_stops_growing_gives_up_at_the_limit() {
    let folder = tempfile::tempdir().unwrap();
    let (steps_tx, steps_rx) = mpsc::unbounded_channel();
    let clock = LockstepClock::new(Some(steps_tx));
    let path = new_file(folder.path(), clock.now());
    let (finished, written) = spawn_writer(path.clone(), u32::MAX, steps_rx);
    let settler = Settler::new(Duration::from_millis(500))
        .with_poll(Duration::from_millis(50))
        .with_max_wait(Duration::from_secs(2))
        .with_clock(clock.clone());

    let error = settler.settle(&path).await.unwrap_err();

    let SettleError::StillChanging { last, .. } = &error else {
        panic!("expected StillChanging, got {error}");
    };
    assert!(!finished.load(Ordering::SeqCst));
    assert_eq!(
        last.size,
        (CHUNK as u64) * (u64::from(written.load(Ordering::SeqCst)) + 1),
        "the last size seen is the file's size"
    );
    assert!(error.to_string().contains("still changing"), "{error}");
    // 2 s of virtual time at 50 ms per poll.
    assert_eq!(clock.sleeps.load(Ordering::SeqCst), 40);
}

#[tokio::test]
async fn a_static_file_is_settled_at_a_glance_without_waiting() {
    let folder = tempfile::tempdir().unwrap();
    let clock = LockstepClock::new(None);
    let path = new_file(folder.path(), clock.now() - Duration::from_secs(3600));
    let settler = Settler::default().with_clock(clock.clone());

    let settled = settler.settle(&path).await.unwrap();
    assert_eq!(settled.polls, 0);
    assert_eq!(settled.state.size, CHUNK as u64);
    assert_eq!(settler.check(&path).await.unwrap(), Some(settled.state));
    assert_eq!(clock.sleeps.load(Ordering::SeqCst), 0, "no sleep for a static file");
    let (settled, hashed) = settler.settle_and_hash(&path).await.unwrap();
    assert_eq!(settled.polls, 0);
    assert_eq!(hashed.sha256, opledger_media::sha256_hex(&[b'x'; CHUNK]));
}

#[tokio::test]
async fn a_fresh_file_needs_watching_and_then_settles() {
    let folder = tempfile::tempdir().unwrap();
    // Written at the clock's start: a moment ago.
    let clock = LockstepClock::new(None);
    let path = new_file(folder.path(), clock.now());
    let settler = Settler::new(Duration::from_millis(500))
        .with_poll(Duration::from_millis(100))
        .with_clock(clock.clone());
    assert_eq!(
        settler.check(&path).await.unwrap(),
        None,
        "too fresh to settle at a glance"
    );

    let settled = settler.settle(&path).await.unwrap();
    assert_eq!(settled.state.size, CHUNK as u64);
    assert!(settled.polls >= 1);
}

#[tokio::test]
async fn settling_on_the_system_clock() {
    let folder = tempfile::tempdir().unwrap();
    let path = new_file(folder.path(), SystemTime::now());
    let settler = Settler::new(Duration::from_millis(30)).with_poll(Duration::from_millis(5));
    let settled = settler.settle(&path).await.unwrap();
    assert_eq!(settled.state.size, CHUNK as u64);
}

#[tokio::test]
async fn a_missing_file_is_reported_as_not_found() {
    let folder = tempfile::tempdir().unwrap();
    let error = Settler::default()
        .settle(&folder.path().join("gone.jpg"))
        .await
        .unwrap_err();
    assert!(error.is_not_found(), "{error}");
}

#[test]
fn settled_at_a_glance_needs_an_mtime_a_quiet_period_old() {
    let now = SystemTime::now();
    let quiet = Duration::from_millis(500);
    let state = |age_ms: i64| FileState {
        size: 1,
        modified: if age_ms >= 0 {
            now - Duration::from_millis(age_ms as u64)
        } else {
            now + Duration::from_millis((-age_ms) as u64)
        },
    };
    assert!(is_settled(&state(500), now, quiet));
    assert!(is_settled(&state(60_000), now, quiet));
    assert!(!is_settled(&state(499), now, quiet));
    assert!(
        !is_settled(&state(-1_000), now, quiet),
        "an mtime in the future is not settled"
    );
}
