//! A shard's count of this router's commits on their way to it after their writes answered
//! (`txn/commits.rs`), which the router's own next calls wait for: a write that meets a row one
//! of them holds, `version`, `info`, `close`.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// This router's commits on their way to a shard after their writes answered, counted
/// (`txn/commits.rs`).
#[derive(Debug, Default)]
pub(crate) struct Committing {
    count: Mutex<usize>,
    done: Condvar,
}

impl Committing {
    /// One more on its way.
    pub fn begin(&self) {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }

    /// One landed (or given up on).
    pub fn end(&self) {
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        *count -= 1;
        if *count == 0 {
            self.done.notify_all();
        }
    }

    /// Waits until none is on its way, at most `within`: whether there were some and they all
    /// landed.
    pub fn landed(&self, within: Duration) -> bool {
        let until = Instant::now() + within;
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        if *count == 0 {
            return false;
        }
        while *count > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            count = match self.done.wait_timeout(count, left) {
                Ok((c, _)) => c,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }
}
