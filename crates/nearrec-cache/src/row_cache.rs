//! The dynamic row cache: set-associative, sharded, LRU / LFU victims, probabilistic admission,
//! hits read without a lock.
//!
//! A row hashes to one set of `ways` slots; sets are spread over shards. A miss read from SSD is
//! offered back: it takes a free slot of its set if there is one; otherwise the `_pa` policies
//! admit it with probability `p` (HS-Rec: a one-off row must not push out a hot one), and it
//! replaces the slot with the smallest mark. Writers — an offered row, a compaction's replaced
//! row — take their shard's mutex, so they never meet.
//!
//! Readers take no lock. Each slot carries a sequence number (a seqlock): a writer makes it odd
//! while it changes the slot's key and row and even again after, and a reader copies the row out
//! and keeps the copy only if the number was the same even value before and after — a row is
//! never seen torn. A hit bumps the slot's mark (LRU: the shard's clock; LFU: its hit count) with
//! plain atomic stores, not read-modify-writes: a bump may be lost when two threads hit one
//! shard at once, so victims are exact for one thread and approximate under races (which row is
//! kept never changes what a lookup returns).
//!
//! A hit costs two dependent memory reads, the set's keys and then the row.
//! [`RowCache::prefetch`] asks for the first and [`RowCache::probe`] finds the slot and asks for
//! the second, so a caller a few lookups ahead overlaps both (as the SSD tier does through
//! `nearrec_kernels::RowSource`); [`RowCache::read`] then copies the row.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use nearrec_format::AlignedBuf;
use nearrec_kernels::prefetch_row;

use crate::hash::{mix, scale};
use crate::policy::CacheConfig;
use crate::stats::{CacheStats, CacheStatsSnapshot};

/// Bytes of bookkeeping per slot beside the row: key, mark and sequence number.
pub const SLOT_OVERHEAD: u64 = 24;
/// Keys are stored as `row + 1`, so a fresh (zeroed, untouched) table is all empty slots.
const EMPTY: u64 = 0;
const MAX_SHARDS: usize = 256;
/// Reads [`RowCache::get`] tries while writers change the slot before it calls the lookup a miss.
const READ_TRIES: usize = 1000;
/// Words of a row (8 bytes each) that [`RowCache::get`] copies onto its stack.
const STACK_WORDS: usize = 64;

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

/// Where [`RowCache::probe`] found a row: read it with [`RowCache::read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    shard: u32,
    slot: u32,
}

/// What one shard's writers share, on a line of its own.
#[derive(Debug)]
#[repr(align(64))]
struct Shard {
    /// Held by writers; admission draws made so far (the draw is a hash of seed, set and count).
    writer: Mutex<u64>,
    /// LRU time of this shard's sets.
    clock: AtomicU64,
}

/// A set-associative cache of encoded rows (see the module docs).
#[derive(Debug)]
pub struct RowCache {
    row_bytes: usize,
    /// Words a row takes (`row_bytes` rounded up to 8 bytes).
    words: usize,
    ways: usize,
    sets: usize,
    shard_bits: u32,
    /// Slots per shard (its sets' slots are consecutive).
    per_shard: usize,
    shards: Box<[Shard]>,
    /// Slot `i`: key `keys[i]`, mark `meta[2 i]`, sequence number `meta[2 i + 1]` (beside the
    /// mark, which a hit writes anyway: one line), row at word `i × words` of `data`. One
    /// buffer each for all shards, so that large caches sit on huge pages: a hit on 4 KiB
    /// pages misses the TLB as well as the cache.
    keys: AlignedBuf,
    meta: AlignedBuf,
    data: AlignedBuf,
    config: CacheConfig,
    /// A draw below this admits (`p × 2^64`).
    admit_below: u64,
    stats: CacheStats,
}

impl RowCache {
    /// Bytes one slot of a `row_bytes`-byte row takes: the row in whole words, and
    /// [`SLOT_OVERHEAD`].
    pub fn slot_bytes(row_bytes: usize) -> u64 {
        row_bytes.next_multiple_of(8) as u64 + SLOT_OVERHEAD
    }

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
            .saturating_mul(Self::slot_bytes(row_bytes))
    }

    /// A cache of `row_bytes`-byte rows taking at most `budget_bytes` (rows and bookkeeping).
    pub fn new(budget_bytes: u64, row_bytes: usize, config: CacheConfig) -> Self {
        let ways = config.ways.max(1);
        let words = row_bytes.div_ceil(8);
        let sets = usize::try_from(budget_bytes / Self::slot_bytes(row_bytes) / ways as u64)
            .unwrap_or(usize::MAX);
        let shards = if sets == 0 {
            1
        } else {
            1 << sets.min(MAX_SHARDS).ilog2()
        };
        let sets = sets / shards * shards;
        let per_shard = sets / shards * ways;
        let p = config.admission_probability.clamp(0.0, 1.0);
        let slots = sets * ways;
        Self {
            row_bytes,
            words,
            ways,
            sets,
            shard_bits: shards.ilog2(),
            per_shard,
            shards: (0..shards)
                .map(|_| Shard {
                    writer: Mutex::new(0),
                    clock: AtomicU64::new(0),
                })
                .collect(),
            // zeroed pages, committed when used
            keys: AlignedBuf::zeroed(slots * 8),
            meta: AlignedBuf::zeroed(slots * 16),
            data: AlignedBuf::zeroed(slots * words * 8),
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
        self.capacity_rows() * Self::slot_bytes(self.row_bytes)
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// The `u64` words a row copied out by [`Self::read`] takes.
    pub fn words(&self) -> usize {
        self.words
    }

    pub fn stats(&self) -> CacheStatsSnapshot {
        self.stats.snapshot()
    }

    /// Counts lookups that a caller of [`Self::probe`] / [`Self::read`] served (`hits`) or did
    /// not (`misses`); [`Self::get`] counts its own.
    pub fn count(&self, hits: u64, misses: u64) {
        CacheStats::add(&self.stats.hits, hits);
        CacheStats::add(&self.stats.misses, misses);
    }

    /// Rows held now.
    pub fn len(&self) -> u64 {
        self.keys()
            .iter()
            .filter(|k| k.load(Ordering::Relaxed) != EMPTY)
            .count() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn writer<'a>(&self, shard: &'a Shard) -> std::sync::MutexGuard<'a, u64> {
        // a panic while writing leaves the slot's sequence number odd: readers miss it, and the
        // next write of the slot makes it even again
        shard.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keys(&self) -> &[AtomicU64] {
        self.keys.as_words()
    }

    fn meta(&self) -> &[AtomicU64] {
        self.meta.as_words()
    }

    fn data(&self) -> &[AtomicU64] {
        self.data.as_words()
    }

    /// The shard of `row`'s set, and the set's first slot.
    fn locate(&self, row: u64) -> Option<(usize, usize)> {
        if self.sets == 0 {
            return None;
        }
        let set = scale(mix(row ^ self.config.seed), self.sets);
        let shard = set & ((1 << self.shard_bits) - 1);
        Some((
            shard,
            shard * self.per_shard + (set >> self.shard_bits) * self.ways,
        ))
    }

    /// Asks for the lines a [`Self::probe`] of `row` reads: its set's keys. Reads nothing.
    pub fn prefetch(&self, row: u64) {
        if let Some((_, base)) = self.locate(row) {
            prefetch_row(
                self.keys().as_ptr().wrapping_add(base).cast(),
                self.ways * 8,
            );
        }
    }

    /// Finds `row`'s slot, if it holds the row now, and asks for the lines of the slot and its
    /// row; takes no
    /// lock and counts nothing. [`Self::read`] copies the row (a write between the two makes
    /// the read fail, never wrong).
    pub fn probe(&self, row: u64) -> Option<Slot> {
        let (shard, base) = self.locate(row)?;
        let way = self.keys()[base..base + self.ways]
            .iter()
            .position(|k| k.load(Ordering::Relaxed) == row.wrapping_add(1))?;
        let slot = base + way;
        // what `read` touches: the slot's mark and sequence number, and its row
        prefetch_row(self.meta().as_ptr().wrapping_add(2 * slot).cast(), 16);
        prefetch_row(
            self.data().as_ptr().wrapping_add(slot * self.words).cast(),
            self.row_bytes,
        );
        Some(Slot {
            shard: shard as u32,
            slot: slot as u32,
        })
    }

    /// Copies `row`'s bytes from `at` (where [`Self::probe`] found it) into `out`'s first
    /// [`Self::words`] words and marks the hit; `false` when the slot no longer holds the row,
    /// or a writer is changing it (the caller probes again or reads the row elsewhere).
    pub fn read(&self, at: Slot, row: u64, out: &mut [u64]) -> bool {
        let s = &self.shards[at.shard as usize];
        let slot = at.slot as usize;
        let (meta, seq) = (self.meta(), &self.meta()[2 * slot + 1]);
        let before = seq.load(Ordering::Acquire);
        if before & 1 == 1 || self.keys()[slot].load(Ordering::Relaxed) != row.wrapping_add(1) {
            return false;
        }
        let data = &self.data()[slot * self.words..][..self.words];
        for (o, w) in out[..self.words].iter_mut().zip(data) {
            *o = w.load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) != before {
            return false;
        }
        let mark = &meta[2 * slot];
        if self.config.policy.frequency() {
            mark.store(
                mark.load(Ordering::Relaxed).saturating_add(1),
                Ordering::Relaxed,
            );
        } else {
            let now = s.clock.load(Ordering::Relaxed) + 1;
            s.clock.store(now, Ordering::Relaxed);
            mark.store(now, Ordering::Relaxed);
        }
        true
    }

    /// Looks `row` up; on a hit, calls `read` with a copy of its bytes and counts the hit.
    /// Rows are below `u64::MAX`.
    pub fn get<R>(&self, row: u64, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let mut stack = [0u64; STACK_WORDS];
        let mut heap = Vec::new();
        let out = if self.words <= STACK_WORDS {
            &mut stack[..]
        } else {
            heap.resize(self.words, 0);
            &mut heap[..]
        };
        // a writer changing the slot: probe again (writes are short), a bounded number of times
        // (a writer that panicked mid-write leaves the slot unreadable: a miss, not a hang)
        for _ in 0..READ_TRIES {
            let Some(at) = self.probe(row) else {
                break;
            };
            if self.read(at, row, out) {
                self.count(1, 0);
                return Some(read(&words_as_bytes(out)[..self.row_bytes]));
            }
            std::hint::spin_loop();
        }
        self.count(0, 1);
        None
    }

    /// The rows cached now, in no order (what warms another cache for the same table).
    pub fn rows(&self) -> Vec<u64> {
        self.keys()
            .iter()
            .map(|k| k.load(Ordering::Relaxed))
            .filter(|&k| k != EMPTY)
            .map(|k| k - 1)
            .collect()
    }

    /// Writes `row`'s key and bytes into slot `slot` of `s` (the caller holds its writer lock),
    /// under the slot's sequence number.
    fn write(&self, slot: usize, key: u64, bytes: &[u8]) {
        let seq = &self.meta()[2 * slot + 1];
        let now = seq.load(Ordering::Relaxed);
        // odd (whatever a panicked writer left), then even again when done
        let odd = now | 1;
        seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        self.keys()[slot].store(key, Ordering::Relaxed);
        let data = &self.data()[slot * self.words..][..self.words];
        for (w, chunk) in data.iter().zip(bytes.chunks(8)) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            w.store(u64::from_ne_bytes(word), Ordering::Relaxed);
        }
        seq.store(odd + 1, Ordering::Release);
    }

    /// The way of `row` in the set at `base` of `s`, if it holds it.
    fn way_of(&self, base: usize, row: u64) -> Option<usize> {
        self.keys()[base..base + self.ways]
            .iter()
            .position(|k| k.load(Ordering::Relaxed) == row + 1)
    }

    /// Replaces `row`'s bytes if it is cached (a live store's compaction: the row changed
    /// below); returns whether it was. Neither a hit nor an admission: no counter moves.
    pub fn replace(&self, row: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        let Some((shard, base)) = self.locate(row) else {
            return false;
        };
        let s = &self.shards[shard];
        let _writer = self.writer(s);
        let Some(way) = self.way_of(base, row) else {
            return false;
        };
        self.write(base + way, row + 1, bytes);
        true
    }

    /// Offers a row read from below after a miss (see the module docs).
    pub fn offer(&self, row: u64, bytes: &[u8]) -> Offer {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        let Some((shard, base)) = self.locate(row) else {
            CacheStats::add(&self.stats.rejections, 1);
            return Offer::Rejected;
        };
        let s = &self.shards[shard];
        let mut draws = self.writer(s);
        if self.way_of(base, row).is_some() {
            return Offer::Present;
        }
        let (keys, meta) = (self.keys(), self.meta());
        let free = (0..self.ways).find(|&w| keys[base + w].load(Ordering::Relaxed) == EMPTY);
        let (slot, evicted) = match free {
            Some(way) => (base + way, None),
            None => {
                if self.config.policy.probabilistic() {
                    *draws += 1;
                    let draw = mix(self.config.seed ^ mix(base as u64) ^ *draws);
                    if draw >= self.admit_below {
                        CacheStats::add(&self.stats.rejections, 1);
                        return Offer::Rejected;
                    }
                }
                let way = (0..self.ways)
                    .min_by_key(|&w| meta[2 * (base + w)].load(Ordering::Relaxed))
                    .expect("a set has at least one way");
                let slot = base + way;
                (slot, Some(keys[slot].load(Ordering::Relaxed) - 1))
            }
        };
        self.admit(shard, slot, row, bytes);
        if evicted.is_some() {
            CacheStats::add(&self.stats.evictions, 1);
        }
        Offer::Admitted { evicted }
    }

    /// Puts a row into a free way of its set, evicting nothing: a warm-up's rows, offered most
    /// wanted first, so that a less wanted row never displaces a more wanted one. False when
    /// its set is full or the row is cached already.
    pub fn fill(&self, row: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        let Some((shard, base)) = self.locate(row) else {
            return false;
        };
        let _writer = self.writer(&self.shards[shard]);
        if self.way_of(base, row).is_some() {
            return false;
        }
        let keys = self.keys();
        let free = (0..self.ways).find(|&w| keys[base + w].load(Ordering::Relaxed) == EMPTY);
        let Some(way) = free else {
            return false;
        };
        self.admit(shard, base + way, row, bytes);
        true
    }

    /// Writes `row` into `slot` of shard `shard` (whose writer the caller holds), marked as
    /// just used.
    fn admit(&self, shard: usize, slot: usize, row: u64, bytes: &[u8]) {
        let s = &self.shards[shard];
        let now = s.clock.load(Ordering::Relaxed) + 1;
        s.clock.store(now, Ordering::Relaxed);
        let mark = if self.config.policy.frequency() {
            1
        } else {
            now
        };
        self.meta()[2 * slot].store(mark, Ordering::Relaxed);
        self.write(slot, row + 1, bytes);
        CacheStats::add(&self.stats.admissions, 1);
    }
}

/// Words as their bytes (native order: what [`RowCache::read`] copied is what was written).
pub fn words_as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u8 has no alignment or validity requirement; the length is in bytes
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), words.len() * 8) }
}
