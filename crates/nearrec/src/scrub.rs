//! Scrubbing: a store's table files read through in the background, at a bounded rate, and
//! checked against their sector sums and checksums — so that damage to rows nobody reads is
//! found (counted, logged) before a lookup or a compaction that must carry them meets it.
//!
//! A store opened with `scrub_rate` (bytes a second; 0: none) runs passes one after another on
//! a thread of its own — each over the version served when it begins (cut short when another
//! is served), at least a second long, read from the device (each range's cached pages let go
//! of first: a page cached before the damage would hide it). What it finds is counted ([`Scrub::stats`]: `scrub_passes`, `scrub_bytes`, `scrub_damaged`,
//! `scrub_last_damaged`) and logged; it changes nothing, and the store goes on serving —
//! every other table, and the damaged one's sound sectors, as before (a read of a damaged
//! sector is refused `StoreCorrupted` whether or not a scrub found it first). [`scrub`] is one
//! pass, for `nearrec scrub` on a store another process serves.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nearrec_format::{ProgressFn, StoreReader, TableCheck};

use crate::error::Result;
use crate::pace::Pace;

/// Bytes a scrub reads at once: small enough that its pace is even and a closed store's
/// scrub stops soon, large enough to cost little per read.
const CHUNK: usize = 1 << 20;
/// How long a scrub that could not open the store (a compaction replacing its files) waits
/// before it tries again.
const RETRY: Duration = Duration::from_secs(1);
/// The shortest a pass takes: a small store is not read through over and over.
const MIN_PASS: Duration = Duration::from_secs(1);

/// One pass over the store `reader` opened: every table's data read at most `rate` bytes a
/// second (0: as fast as the disk goes) and checked, as [`StoreReader::verify`] checks it;
/// `progress` told of the bytes as they go. The checks, each table's error if it has one.
pub fn scrub(reader: &StoreReader, rate: u64, progress: Option<&ProgressFn>) -> Vec<TableCheck> {
    let pace = Pace::new(rate);
    reader.scrub_tables(CHUNK, &mut |n| {
        pace.take(n);
        if let Some(p) = progress {
            p(n);
        }
        ControlFlow::Continue(())
    })
}

/// A store's background scrub: what it has found, and the switch that stops it.
#[derive(Debug, Default)]
pub(crate) struct Scrub {
    rate: u64,
    /// Set by [`Scrub::stop`]; the thread waits on `wake` between chunks and passes.
    stopped: Mutex<bool>,
    wake: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
    passes: AtomicU64,
    bytes: AtomicU64,
    /// Damaged tables found, every pass counted.
    damaged: AtomicU64,
    /// Damaged tables the last finished pass found.
    last_damaged: AtomicU64,
}

impl Scrub {
    /// A scrub at `rate` bytes a second, not started.
    pub(crate) fn new(rate: u64) -> Arc<Self> {
        Arc::new(Self {
            rate,
            ..Self::default()
        })
    }

    /// Starts scrubbing the store `path_of` names while `owner` lives. A pass covers the
    /// version served when it begins, and ends early when another is served (a swap): the
    /// next pass scrubs that one, and no pass holds a version let go of.
    pub(crate) fn spawn<T: Send + Sync + 'static>(
        self: &Arc<Self>,
        owner: Weak<T>,
        name: String,
        path_of: fn(&T) -> PathBuf,
    ) -> Result<()> {
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name("nearrec-scrub".into())
            .spawn(move || me.run(&owner, &name, path_of))
            .map_err(|e| crate::Error::Internal(format!("cannot start the scrub's thread: {e}")))?;
        *lock(&self.thread) = Some(thread);
        Ok(())
    }

    /// Stops the scrub and waits for its thread (at most a chunk's read).
    pub(crate) fn stop(&self) {
        *lock(&self.stopped) = true;
        self.wake.notify_all();
        let thread = lock(&self.thread).take();
        if let Some(t) = thread
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }

    /// Waits `d` unless stopped first; whether the scrub goes on.
    fn wait(&self, d: Duration) -> bool {
        let stopped = lock(&self.stopped);
        let (stopped, _) = (self.wake)
            .wait_timeout_while(stopped, d, |s| !*s)
            .unwrap_or_else(PoisonError::into_inner);
        !*stopped
    }

    fn run<T>(&self, owner: &Weak<T>, name: &str, path_of: fn(&T) -> PathBuf) {
        let served = || owner.upgrade().map(|o| path_of(&o));
        // chunks of a tenth of a second's bytes at most: the pace even, a stop prompt
        let chunk = CHUNK.min(usize::try_from(self.rate / 10).unwrap_or(CHUNK));
        while let Some(path) = served() {
            let reader = match StoreReader::open(&path) {
                Ok(r) => r,
                Err(e) => {
                    // a compaction replacing the files, or a version let go: the next try
                    tracing::debug!(store = name, "scrub: cannot open the store yet: {e}");
                    if !self.wait(RETRY) {
                        return;
                    }
                    continue;
                }
            };
            let start = Instant::now();
            let pace = Pace::new(self.rate);
            let mut cut = false;
            let checks = reader.scrub_tables(chunk, &mut |n| {
                self.bytes.fetch_add(n, Relaxed);
                let on = self.wait(pace.owed(n));
                cut = !on || served().as_ref() != Some(&path);
                if cut {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            let damaged: Vec<&TableCheck> = checks.iter().filter(|c| c.error.is_some()).collect();
            for c in &damaged {
                let error = c.error.as_deref().unwrap_or_default();
                tracing::warn!(store = name, table = %c.table, path = %path.display(),
                               "scrub found damage: {error}");
            }
            self.damaged.fetch_add(damaged.len() as u64, Relaxed);
            if !cut {
                self.last_damaged.store(damaged.len() as u64, Relaxed);
                self.passes.fetch_add(1, Relaxed);
            }
            // a pass takes at least a second: a small or empty store is not reopened in a loop
            if !self.wait(MIN_PASS.saturating_sub(start.elapsed())) {
                return;
            }
        }
    }

    /// What the scrub has done, as the store's stats name it.
    pub(crate) fn stats(&self) -> [(&'static str, f64); 5] {
        [
            ("scrub_rate", self.rate as f64),
            ("scrub_passes", self.passes.load(Relaxed) as f64),
            ("scrub_bytes", self.bytes.load(Relaxed) as f64),
            ("scrub_damaged", self.damaged.load(Relaxed) as f64),
            ("scrub_last_damaged", self.last_damaged.load(Relaxed) as f64),
        ]
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
