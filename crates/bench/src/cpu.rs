//! CPU time: the process's (`getrusage`), and by thread, sampled from
//! `/proc/self/task` while a run goes on, so the ledger's share of the CPU
//! can be told from the image work's. Linux only, like the benchmarks'
//! figures.
//!
//! Threads are told apart by name: the ingest's image threads
//! (`opledger-image-N`) and the threads jpeg-decoder starts for the
//! components of one decode (`worker thread for component N`) are image
//! work; every other thread (the async runtime running the engine's
//! commands, the SQLite writer, the blocking pool) is the ledger's and the
//! pipeline's own. A thread that ends between two samples loses what it
//! ran since the last one: the sampler looks every 20 ms, and the ledger's
//! threads that end (a store's writer) end idle, at the end of a run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// CPU seconds the whole process has used so far (user and system, every
/// thread, ended ones included).
pub fn process_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct it is given and nothing else.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Whether a thread of this name does image work.
fn is_image_thread(name: &str) -> bool {
    name.starts_with("opledger-image") || name.starts_with("worker thread") || name.starts_with("floor-image")
}

/// Per thread id: its name and CPU ticks when last seen.
type Seen = BTreeMap<u32, (String, u64)>;

/// Samples every thread's CPU time until stopped.
pub struct ThreadSampler {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    before: Seen,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ThreadSampler {
    /// Starts sampling; what the threads ran before now is not counted.
    pub fn start() -> ThreadSampler {
        let before = sample();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(before.clone()));
        let thread = {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::Builder::new()
                .name("cpu-sampler".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let now = sample();
                        if let Ok(mut seen) = seen.lock() {
                            seen.extend(now);
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
                .ok()
        };
        ThreadSampler {
            stop,
            seen,
            before,
            thread,
        }
    }

    /// Stops sampling; the CPU seconds the threads that are not image
    /// threads (nor the sampler) ran since the start.
    pub fn stop(mut self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let mut seen = self.seen.lock().map(|seen| seen.clone()).unwrap_or_default();
        seen.extend(sample());
        let ticks: u64 = seen
            .iter()
            .filter(|(_, (name, _))| !is_image_thread(name) && name != "cpu-sampler")
            .map(|(id, (_, ticks))| ticks - self.before.get(id).map_or(0, |(_, before)| (*before).min(*ticks)))
            .sum();
        ticks as f64 / ticks_per_second()
    }
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// Every live thread's name and CPU ticks (user + system).
fn sample() -> Seen {
    let mut seen = Seen::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return seen;
    };
    for task in tasks.flatten() {
        let Some(id) = task.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // `pid (name) state ...`: the name may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // Fields 14 and 15 of the line (utime, stime) are 11 and 12 here.
        let ticks = |index: usize| {
            fields
                .get(index)
                .and_then(|field| field.parse::<u64>().ok())
                .unwrap_or(0)
        };
        seen.insert(id, (name, ticks(11) + ticks(12)));
    }
    seen
}
