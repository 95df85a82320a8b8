//! The dynamic row cache: set-associative, sharded, LRU / LFU victims, probabilistic admission.
//!
//! A row hashes to one set of `ways` slots; sets are spread over shards, each behind its own
//! mutex, so lookups on different shards never meet and there is no global lock. A hit bumps the
//! slot's mark (LRU: the shard's clock; LFU: its hit count). A miss read from SSD is offered back:
//! it takes a free slot of its set if there is one; otherwise the `_pa` policies admit it with
//! probability `p` (HS-Rec: a one-off row must not push out a hot one), and it replaces the slot
//! with the smallest mark.

use std::sync::Mutex;

use nearrec_kernels::prefetch_row;

use crate::hash::{mix, scale};
use crate::policy::CacheConfig;
use crate::stats::{CacheStats, CacheStatsSnapshot};

/// Bytes of bookkeeping per slot beside the row (key and mark).
pub const SLOT_OVERHEAD: u64 = 16;
/// Keys are stored as `row + 1`, so a fresh (zeroed, untouched) table is all empty slots.
const EMPTY: u64 = 0;
const MAX_SHARDS: usize = 256;

/// What became of an offered row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// It took a slot, replacing `evicted` if the set was full.
    Admitted { evicted: Option<u64> },
    /// The admission draw turned it away.
    Rejected,
    /// It was already cached (another batch admitted it first).
    Present,
}

#[derive(Debug)]
struct Shard {
    keys: Vec<u64>,
    marks: Vec<u64>,
    data: Vec<u8>,
    /// LRU time of this shard's sets.
    clock: u64,
    /// Admission draws made so far (the draw is a hash of seed, shard and this count).
    draws: u64,
    /// Lookups of this shard's sets, counted under its lock (a shared atomic would bounce
    /// between the cores on every lookup).
    hits: u64,
    misses: u64,
}

/// A set-associative cache of encoded rows (see the module docs).
#[derive(Debug)]
pub struct RowCache {
    row_bytes: usize,
    ways: usize,
    sets: usize,
    shard_bits: u32,
    shards: Box<[Mutex<Shard>]>,
    /// Each shard's `keys` and `marks` addresses, for prefetch hints only (never dereferenced;
    /// the vectors are never resized).
    addrs: Box<[(usize, usize)]>,
    config: CacheConfig,
    /// A draw below this admits (`p × 2^64`).
    admit_below: u64,
    stats: CacheStats,
}

impl RowCache {
    /// The smallest budget whose cache has a slot for each of `rows` rows (sets are rounded as
    /// [`RowCache::new`] rounds them): more would never be used.
    pub fn budget_for_rows(rows: u64, row_bytes: usize, ways: usize) -> u64 {
        let ways = ways.max(1) as u64;
        let sets = rows.div_ceil(ways).max(1);
        let sets = if sets <= MAX_SHARDS as u64 {
            sets.next_power_of_two()
        } else {
            sets.next_multiple_of(MAX_SHARDS as u64)
        };
        sets.saturating_mul(ways)
            .saturating_mul(row_bytes as u64 + SLOT_OVERHEAD)
    }

    /// A cache of `row_bytes`-byte rows taking at most `budget_bytes` (rows and bookkeeping).
    pub fn new(budget_bytes: u64, row_bytes: usize, config: CacheConfig) -> Self {
        let ways = config.ways.max(1);
        let slot = row_bytes as u64 + SLOT_OVERHEAD;
        let sets = usize::try_from(budget_bytes / slot / ways as u64).unwrap_or(usize::MAX);
        let shards = if sets == 0 {
            1
        } else {
            1 << sets.min(MAX_SHARDS).ilog2()
        };
        let sets = sets / shards * shards;
        let per_shard = sets / shards * ways;
        let p = config.admission_probability.clamp(0.0, 1.0);
        let shards: Box<[Mutex<Shard>]> = (0..shards)
            .map(|_| {
                Mutex::new(Shard {
                    keys: vec![EMPTY; per_shard], // zeroed pages: committed when used
                    marks: vec![0; per_shard],
                    data: vec![0; per_shard * row_bytes],
                    clock: 0,
                    draws: 0,
                    hits: 0,
                    misses: 0,
                })
            })
            .collect();
        let addrs = shards
            .iter()
            .map(|m| {
                let s = m.lock().unwrap_or_else(|e| e.into_inner());
                (s.keys.as_ptr() as usize, s.marks.as_ptr() as usize)
            })
            .collect();
        Self {
            row_bytes,
            ways,
            sets,
            shard_bits: shards.len().ilog2(),
            shards,
            addrs,
            config,
            admit_below: if p >= 1.0 {
                u64::MAX
            } else {
                (p * 2f64.powi(64)) as u64
            },
            stats: CacheStats::default(),
        }
    }

    /// Rows it can hold.
    pub fn capacity_rows(&self) -> u64 {
        (self.sets * self.ways) as u64
    }

    /// Bytes it takes (rows and bookkeeping).
    pub fn bytes(&self) -> u64 {
        self.capacity_rows() * (self.row_bytes as u64 + SLOT_OVERHEAD)
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub fn stats(&self) -> CacheStatsSnapshot {
        let mut snap = self.stats.snapshot();
        for shard in &self.shards {
            let s = self.lock(shard);
            snap.hits += s.hits;
            snap.misses += s.misses;
        }
        snap
    }

    /// Rows held now.
    pub fn len(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| self.lock(s).keys.iter().filter(|&&k| k != EMPTY).count() as u64)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock<'a>(&self, shard: &'a Mutex<Shard>) -> std::sync::MutexGuard<'a, Shard> {
        // a panic while holding a shard cannot leave it torn: every write completes before
        // the key that exposes it is set
        shard.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shard of `row`'s set, and the set's first slot inside the shard.
    fn locate(&self, row: u64) -> Option<(&Mutex<Shard>, usize)> {
        self.locate_index(row)
            .map(|(shard, base)| (&self.shards[shard], base))
    }

    fn locate_index(&self, row: u64) -> Option<(usize, usize)> {
        if self.sets == 0 {
            return None;
        }
        let set = scale(mix(row ^ self.config.seed), self.sets);
        let shard = set & ((1 << self.shard_bits) - 1);
        Some((shard, (set >> self.shard_bits) * self.ways))
    }

    /// Hints the processor to fetch the lines a [`Self::get`] of `row` will probe, so several
    /// lookups' cache misses overlap. Reads nothing, takes no lock.
    pub fn prefetch(&self, row: u64) {
        if let Some((shard, base)) = self.locate_index(row) {
            let (keys, marks) = self.addrs[shard];
            prefetch_row((keys + base * 8) as *const u8, self.ways * 8);
            prefetch_row((marks + base * 8) as *const u8, self.ways * 8);
        }
    }

    /// Looks `row` up; on a hit, calls `read` with its bytes (under the shard's lock: keep it
    /// short) and counts the hit.
    /// Rows are below `u64::MAX`.
    pub fn get<R>(&self, row: u64, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let Some((shard, base)) = self.locate(row) else {
            CacheStats::add(&self.stats.misses, 1);
            return None;
        };
        let mut s = self.lock(shard);
        let Some(way) = s.keys[base..base + self.ways]
            .iter()
            .position(|&k| k == row + 1)
        else {
            s.misses += 1;
            return None;
        };
        let slot = base + way;
        s.hits += 1;
        s.clock += 1;
        s.marks[slot] = if self.config.policy.frequency() {
            s.marks[slot].saturating_add(1)
        } else {
            s.clock
        };
        Some(read(&s.data[slot * self.row_bytes..][..self.row_bytes]))
    }

    /// The rows cached now, in no order (what warms another cache for the same table).
    pub fn rows(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let s = shard.lock().unwrap_or_else(|e| e.into_inner());
            out.extend(s.keys.iter().filter(|&&k| k != EMPTY).map(|&k| k - 1));
        }
        out
    }

    /// Replaces `row`'s bytes if it is cached (a live store's compaction: the row changed
    /// below); returns whether it was. Neither a hit nor an admission: no counter moves.
    pub fn replace(&self, row: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        let Some((shard, base)) = self.locate(row) else {
            return false;
        };
        let mut s = self.lock(shard);
        let Some(way) = s.keys[base..base + self.ways]
            .iter()
            .position(|&k| k == row + 1)
        else {
            return false;
        };
        let slot = base + way;
        s.data[slot * self.row_bytes..][..self.row_bytes].copy_from_slice(bytes);
        true
    }

    /// Offers a row read from below after a miss (see the module docs).
    pub fn offer(&self, row: u64, bytes: &[u8]) -> Offer {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        let Some((shard, base)) = self.locate(row) else {
            CacheStats::add(&self.stats.rejections, 1);
            return Offer::Rejected;
        };
        let mut s = self.lock(shard);
        let set = base..base + self.ways;
        if s.keys[set.clone()].contains(&(row + 1)) {
            return Offer::Present;
        }
        let (slot, evicted) = match s.keys[set.clone()].iter().position(|&k| k == EMPTY) {
            Some(way) => (base + way, None),
            None => {
                if self.config.policy.probabilistic() {
                    s.draws += 1;
                    let draw = mix(self.config.seed ^ mix(base as u64) ^ s.draws);
                    if draw >= self.admit_below {
                        CacheStats::add(&self.stats.rejections, 1);
                        return Offer::Rejected;
                    }
                }
                let way = (0..self.ways)
                    .min_by_key(|&w| s.marks[base + w])
                    .expect("a set has at least one way");
                (base + way, Some(s.keys[base + way] - 1))
            }
        };
        s.clock += 1;
        s.marks[slot] = if self.config.policy.frequency() {
            1
        } else {
            s.clock
        };
        s.data[slot * self.row_bytes..][..self.row_bytes].copy_from_slice(bytes);
        s.keys[slot] = row + 1;
        CacheStats::add(&self.stats.admissions, 1);
        if evicted.is_some() {
            CacheStats::add(&self.stats.evictions, 1);
        }
        Offer::Admitted { evicted }
    }
}
