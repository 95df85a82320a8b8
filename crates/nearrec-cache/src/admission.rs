//! Admission of new keys to a keyed table (DeepRec's counting filter, NVIDIA dynamicemb's
//! admission): a key is given a row only once it has been seen `after` times within one window.
//!
//! The counts are a count-min sketch — [`DEPTH`] rows of saturating one-byte counters, each key
//! counted once per row at a slot its seeded hash picks, its estimate the least of them — so the
//! memory is fixed (`DEPTH × width` bytes) however many keys pass, and an estimate is never
//! below the key's true count (collisions only raise it: a key may be admitted early, never
//! late). Windows are fixed spans of the caller's clock: the first count after one ends clears
//! every counter. Counters are relaxed atomics: counts from concurrent lookups may be lost to a
//! race, never invented.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU8, AtomicU64};

use crate::hash::mix;

/// Counter rows of the sketch.
pub const DEPTH: usize = 4;

/// A table's admission counts (see the module docs).
#[derive(Debug)]
pub struct Admission {
    counters: Box<[AtomicU8]>,
    /// `width - 1`, a power of two less one.
    mask: u64,
    seed: u64,
    /// A key is admitted at this many sightings.
    after: u8,
    window: u64,
    /// When the current window started, on the caller's clock.
    started: AtomicU64,
}

impl Admission {
    /// Admits a key at its `after`-th sighting (1..=255) within windows of `window` time units
    /// (at least 1), counting in `DEPTH × width` bytes (`width` rounded up to a power of two,
    /// at least 64); the first window starts at `now`.
    pub fn new(after: u8, window: u64, width: u64, seed: u64, now: u64) -> Self {
        let width = width.max(64).next_power_of_two();
        Self {
            counters: (0..DEPTH as u64 * width)
                .map(|_| AtomicU8::new(0))
                .collect(),
            mask: width - 1,
            seed,
            after: after.max(1),
            window: window.max(1),
            started: AtomicU64::new(now),
        }
    }

    /// Bytes the counters of a sketch `width` wide take.
    pub fn bytes_for(width: u64) -> u64 {
        DEPTH as u64 * width.max(64).next_power_of_two()
    }

    /// Bytes the counters take.
    pub fn bytes(&self) -> u64 {
        self.counters.len() as u64
    }

    pub fn after(&self) -> u8 {
        self.after
    }

    fn slots(&self, key: u64) -> [usize; DEPTH] {
        let h = mix(key ^ self.seed);
        // two halves of one hash make the rows' slots (Kirsch–Mitzenmacher)
        let (a, b) = (h, (h >> 32) | 1);
        std::array::from_fn(|i| {
            let slot = a.wrapping_add(b.wrapping_mul(i as u64)) & self.mask;
            i * (self.mask as usize + 1) + slot as usize
        })
    }

    /// A new window once the current one has passed at `now`: every counter cleared.
    fn roll(&self, now: u64) {
        let started = self.started.load(Relaxed);
        if now >= started.saturating_add(self.window)
            && self
                .started
                .compare_exchange(started, now, Relaxed, Relaxed)
                .is_ok()
        {
            for c in self.counters.iter() {
                c.store(0, Relaxed);
            }
        }
    }

    /// Counts one sighting of `key` at `now`; returns its estimated sightings in this window.
    pub fn see(&self, key: u64, now: u64) -> u8 {
        self.roll(now);
        let slots = self.slots(key);
        let least = slots
            .iter()
            .map(|&s| self.counters[s].load(Relaxed))
            .min()
            .unwrap_or(0);
        // conservative update: only the counters at the least rise (tighter estimates)
        let next = least.saturating_add(1);
        for &s in &slots {
            self.counters[s].fetch_max(next, Relaxed);
        }
        next
    }

    /// Counts a sighting of `key` at `now`: whether it is admitted now.
    pub fn admit(&self, key: u64, now: u64) -> bool {
        self.see(key, now) >= self.after
    }

    /// The estimated sightings of `key` in the current window, without counting one.
    pub fn estimate(&self, key: u64) -> u8 {
        self.slots(key)
            .iter()
            .map(|&s| self.counters[s].load(Relaxed))
            .min()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_admitted_at_its_nth_sighting_within_a_window() {
        let a = Admission::new(3, 10, 1024, 7, 100);
        assert!(!a.admit(42, 100));
        assert!(!a.admit(42, 101));
        assert!(a.admit(42, 102));
        assert_eq!(a.estimate(42), 3);
        // a new window forgets
        assert!(!a.admit(42, 110));
        assert_eq!(a.estimate(42), 1);
        assert_eq!(a.bytes(), 4 * 1024);
    }

    #[test]
    fn estimates_are_never_below_the_true_count() {
        // a sketch far smaller than the keys: collisions everywhere, yet never an undercount
        let a = Admission::new(255, 1 << 40, 64, 3, 0);
        let mut truth = std::collections::HashMap::new();
        for i in 0..5000u64 {
            let key = mix(i % 700);
            a.see(key, 0);
            *truth.entry(key).or_insert(0u32) += 1;
        }
        for (key, n) in truth {
            assert!(u32::from(a.estimate(key)) >= n.min(255), "{key}");
        }
    }
}
