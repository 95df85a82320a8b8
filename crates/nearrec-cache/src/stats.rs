use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

/// A cache's counters (relaxed atomics: cheap, and exact once the lookups that touched them have
/// returned).
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Misses that took a slot.
    pub admissions: AtomicU64,
    /// Misses the admission draw turned away.
    pub rejections: AtomicU64,
    /// Admissions that replaced a resident row.
    pub evictions: AtomicU64,
}

/// A copy of [`CacheStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CacheStatsSnapshot {
    pub hits: u64,
    pub misses: u64,
    pub admissions: u64,
    pub rejections: u64,
    pub evictions: u64,
}

impl CacheStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub fn snapshot(&self) -> CacheStatsSnapshot {
        CacheStatsSnapshot {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            admissions: self.admissions.load(Relaxed),
            rejections: self.rejections.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
        }
    }
}

impl CacheStatsSnapshot {
    pub fn hit_ratio(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }
}
