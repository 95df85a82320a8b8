//! A byte rate for background work beside the lookups that share its disk: a compaction's
//! writes, old table files' removal, a swap's loading of the new version.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// Counts bytes as they go and sleeps whoever counts them long enough to keep the total under
/// `rate` a second since it was made (`0`: counts, never sleeps). Shared by threads as `&self`.
#[derive(Debug)]
pub(crate) struct Pace {
    start: Instant,
    rate: u64,
    bytes: AtomicU64,
}

impl Pace {
    pub(crate) fn new(rate: u64) -> Self {
        Self {
            start: Instant::now(),
            rate,
            bytes: AtomicU64::new(0),
        }
    }

    /// Counts `n` more bytes, then sleeps until they are due.
    pub(crate) fn take(&self, n: u64) {
        let wait = self.owed(n);
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }

    /// Counts `n` more bytes; how long until they are due (for a caller that waits its own
    /// way, one it can cut short).
    pub(crate) fn owed(&self, n: u64) -> Duration {
        let total = self.bytes.fetch_add(n, Relaxed) + n;
        if self.rate == 0 {
            return Duration::ZERO;
        }
        let due = Duration::from_secs_f64(total as f64 / self.rate as f64);
        due.saturating_sub(self.start.elapsed())
    }

    /// Bytes counted so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }
}
