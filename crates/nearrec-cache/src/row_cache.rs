//! The dynamic row cache: set-associative, sharded, LRU / LFU victims, probabilistic admission,
//! hits read without a lock.
//!
//! A row hashes to one set of `ways` slots; sets are spread over shards. A miss read from SSD is
//! offered back: it takes a free slot of its set if there is one; otherwise the `_pa` policies
//! admit it with probability `p` (HS-Rec: a one-off row must not push out a hot one), and it
//! replaces the slot with the smallest mark. Writers — an offered row, a compaction's replaced
//! row — take their shard's mutex, so they never meet. A cache told that it has a slot for every
//! row of its table ([`RowCache::with_rows`]) places rows by number instead of by hash, so that
//! no set is ever asked to hold more rows than it has ways: it never evicts.
//!
//! Readers take no lock. Each slot carries a sequence number (a seqlock): a writer makes it odd
//! while it changes the slot's key and row and even again after, and a reader copies the row out
//! and keeps the copy only if the number was the same even value before and after — a row is
//! never seen torn. A hit bumps the slot's mark (LRU: the shard's clock; LFU: its hit count) with
//! plain atomic stores, not read-modify-writes: a bump may be lost when two threads hit one
//! shard at once, so victims are exact for one thread and approximate under races (which row is
//! kept never changes what a lookup returns).
//!
//! A hit is three steps a caller spreads over the lookups ahead of it (the SSD tier does, through
//! `nearrec_kernels::RowSource`), each asking for the lines the next one reads:
//! [`RowCache::set`] hashes the row once and asks for its set's tags (a byte of the row's hash
//! per way, eight ways to a word); [`RowCache::probe`] compares the tag with all of them at once
//! (SWAR: no per-way loop) and asks for the matching slot's head (key, sequence number, mark) and
//! row; [`RowCache::read`] checks the key, copies the row and marks the hit. A tag shared with
//! another row of the set costs a key compare, never a wrong row.
//!
//! Indices are checked where they enter, not per access: [`Set`] and [`Slot`] are made only by
//! this type, and [`RowCache::probe`] / [`RowCache::read`] compare them with the cache's size
//! once (a [`Set`] of another cache is refused, not trusted), after which the set's slots, heads
//! and rows are in bounds by construction (see `RowCache::new`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering, fence};

use nearrec_format::AlignedBuf;
use nearrec_kernels::prefetch_row;

use crate::hash::{mix, scale};
use crate::policy::CacheConfig;
use crate::stats::{CacheStats, CacheStatsSnapshot};

/// Bytes of bookkeeping per slot beside the row: its head (key, sequence number, mark) and its
/// tag.
pub const SLOT_OVERHEAD: u64 = 8 * HEAD_WORDS as u64 + 1;
/// Words of a slot's head: key, sequence number, mark (the first two always on one line).
const HEAD_WORDS: usize = 3;
/// Keys are stored as `row + 1`, so a fresh (zeroed, untouched) table is all empty slots; an
/// empty slot's tag is 0, a row's never is.
const EMPTY: u64 = 0;
const MAX_SHARDS: usize = 256;
/// Reads [`RowCache::get`] tries while writers change the slot before it calls the lookup a miss.
const READ_TRIES: usize = 1000;
/// Words of a row (8 bytes each) that [`RowCache::get`] copies onto its stack.
const STACK_WORDS: usize = 64;
const LOW_BYTES: u64 = 0x0101_0101_0101_0101;
const LOW_7_BITS: u64 = 0x7f7f_7f7f_7f7f_7f7f;

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

/// A row's set and tag, worked out once by [`RowCache::set`]: give it to [`RowCache::probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Set {
    /// The set's first slot.
    base: u32,
    /// The set's first word of tags.
    tags: u32,
    shard: u16,
    tag: u8,
}

impl Set {
    /// The set's first slot: rows with the same one share the set.
    pub fn first_slot(self) -> usize {
        self.base as usize
    }
}

/// Where [`RowCache::probe`] found a slot whose tag is the row's: read it with
/// [`RowCache::read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    set: Set,
    way: u32,
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
    /// Words of tags per set (`ways` bytes rounded up to a word; the padding stays 0).
    tag_words: usize,
    sets: usize,
    /// Slots in all (`sets × ways`, below 2^32).
    slots: usize,
    /// `Some(shift)`: rows are placed by number, row `r` in set `r >> shift` (every row has a
    /// slot; see [`Self::with_rows`]); `None`: by hash.
    by_number: Option<u32>,
    /// Sets are laid out shard by shard (a shard's sets, and their slots, consecutive).
    shard_bits: u32,
    shards: Box<[Shard]>,
    /// Set `s`'s tags at word `s × tag_words` (way `w`: byte `w % 8` of word `w / 8`, little
    /// end first); slot `i`'s head at word `HEAD_WORDS × i` of `heads` (key, sequence number,
    /// mark: the mark beside the sequence number, which a hit reads anyway); its row at word
    /// `i × words` of `data`. One buffer each for all shards, so that large caches sit on huge
    /// pages: a hit on 4 KiB pages misses the TLB as well as the cache.
    tags: AlignedBuf,
    heads: AlignedBuf,
    data: AlignedBuf,
    config: CacheConfig,
    /// A draw below this admits (`p × 2^64`).
    admit_below: u64,
    stats: CacheStats,
}

impl RowCache {
    /// Bytes one slot of a `row_bytes`-byte row takes: the row in whole words, and
    /// [`SLOT_OVERHEAD`] (a set whose ways are not a multiple of 8 also pads its tags to a
    /// word).
    pub fn slot_bytes(row_bytes: usize) -> u64 {
        row_bytes.next_multiple_of(8) as u64 + SLOT_OVERHEAD
    }

    /// Bytes a set of `ways` slots takes.
    fn set_bytes(row_bytes: usize, ways: usize) -> u64 {
        ways as u64 * Self::slot_bytes(row_bytes) + (ways.next_multiple_of(8) - ways) as u64
    }

    /// The smallest budget whose cache has a slot for each of `rows` rows (sets are rounded as
    /// [`RowCache::new`] rounds them): more would never be used. Such a cache told the rows'
    /// count ([`Self::with_rows`]) holds all of them at once.
    pub fn budget_for_rows(rows: u64, row_bytes: usize, ways: usize) -> u64 {
        let ways = ways.max(1);
        let sets = rows.div_ceil(ways as u64).max(1);
        let sets = if sets <= MAX_SHARDS as u64 {
            sets.next_power_of_two()
        } else {
            sets.next_multiple_of(MAX_SHARDS as u64)
        };
        sets.saturating_mul(Self::set_bytes(row_bytes, ways))
    }

    /// A cache of `row_bytes`-byte rows taking at most `budget_bytes` (rows and bookkeeping),
    /// with slots for fewer than 2^32 rows (a larger budget is not used).
    pub fn new(budget_bytes: u64, row_bytes: usize, config: CacheConfig) -> Self {
        let ways = config.ways.max(1);
        let words = row_bytes.div_ceil(8);
        let max_sets = (u32::MAX as usize - 1) / ways;
        let sets = usize::try_from(budget_bytes / Self::set_bytes(row_bytes, ways))
            .unwrap_or(usize::MAX)
            .min(max_sets);
        let shards = if sets == 0 {
            1
        } else {
            1 << sets.min(MAX_SHARDS).ilog2()
        };
        let sets = sets / shards * shards;
        let p = config.admission_probability.clamp(0.0, 1.0);
        let (slots, tag_words) = (sets * ways, ways.div_ceil(8));
        // The bounds every access relies on: a set's order is `shard × sets / shards + k` with
        // `shard < shards` and `k < sets / shards`, so below `sets`: its slots end at or before
        // `slots` and its tag words at or before `sets × tag_words`; `heads` has HEAD_WORDS
        // words per slot and `data` `words` per slot.
        Self {
            row_bytes,
            words,
            ways,
            tag_words,
            sets,
            slots,
            by_number: None,
            shard_bits: shards.ilog2(),
            shards: (0..shards)
                .map(|_| Shard {
                    writer: Mutex::new(0),
                    clock: AtomicU64::new(0),
                })
                .collect(),
            // zeroed pages, committed when used
            tags: AlignedBuf::zeroed(sets * tag_words * 8),
            heads: AlignedBuf::zeroed(slots * HEAD_WORDS * 8),
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

    /// Tells the cache that its rows are numbered below `rows`. When it has a slot for each
    /// (and `ways` is a power of two), it places row `r` in set `r / ways`: no set is ever
    /// full, so every row offered stays (hashed sets overflow long before the cache is full —
    /// a fifth of the rows of a table its cache just holds). Otherwise nothing changes.
    pub fn with_rows(mut self, rows: u64) -> Self {
        if self.ways.is_power_of_two() && rows <= self.slots as u64 {
            self.by_number = Some(self.ways.ilog2());
        }
        self
    }

    /// Rows it can hold.
    pub fn capacity_rows(&self) -> u64 {
        self.slots as u64
    }

    /// Bytes it takes (rows and bookkeeping).
    pub fn bytes(&self) -> u64 {
        self.sets as u64 * Self::set_bytes(self.row_bytes, self.ways)
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
        (0..self.slots).filter(|&i| self.key(i) != EMPTY).count() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn writer<'a>(&self, shard: &'a Shard) -> std::sync::MutexGuard<'a, u64> {
        // a panic while writing leaves the slot's sequence number odd: readers miss it, and the
        // next write of the slot makes it even again
        shard.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Word `i` of `buf`.
    ///
    /// # Safety
    /// `i` is below `buf`'s length in words.
    #[inline(always)]
    unsafe fn word(buf: &AlignedBuf, i: usize) -> &AtomicU64 {
        debug_assert!(i < buf.len() / 8);
        // SAFETY: in bounds (the caller's contract); the buffer is 8-aligned, zero-initialised,
        // lives as long as `buf` and is only ever accessed through atomics (`as_words`)
        unsafe { &*buf.as_slice().as_ptr().cast::<AtomicU64>().add(i) }
    }

    /// Slot `slot`'s head: key, sequence number, mark.
    fn head(&self, slot: usize) -> [&AtomicU64; HEAD_WORDS] {
        assert!(slot < self.slots);
        // SAFETY: slot < slots (asserted)
        unsafe { self.head_unchecked(slot) }
    }

    /// [`Self::head`] without the check, for the hit path.
    ///
    /// # Safety
    /// `slot` is below `slots`.
    #[inline(always)]
    unsafe fn head_unchecked(&self, slot: usize) -> [&AtomicU64; HEAD_WORDS] {
        let at = HEAD_WORDS * slot;
        // SAFETY: `heads` has HEAD_WORDS words per slot and slot < slots (the contract)
        unsafe { [0, 1, 2].map(|k| Self::word(&self.heads, at + k)) }
    }

    fn key(&self, slot: usize) -> u64 {
        self.head(slot)[0].load(Ordering::Relaxed)
    }

    /// Where `row` lives (its set's first slot, its shard and its tag); asks for the lines a
    /// [`Self::probe`] of it reads, the set's tags.
    #[inline(always)]
    pub fn set(&self, row: u64) -> Option<Set> {
        if self.sets == 0 {
            return None;
        }
        let (set, tag) = match self.by_number {
            // a row beyond those it was told of (outside the contract) is hashed
            Some(shift) if row >> shift < self.sets as u64 => ((row >> shift) as usize, row as u8),
            _ => {
                let h = mix(row ^ self.config.seed);
                (scale(h, self.sets), h as u8)
            }
        };
        // sets are laid out shard by shard: set `s` is the `s >> shard_bits`-th of its shard
        let shard = set & ((1 << self.shard_bits) - 1);
        let order = shard * (self.sets >> self.shard_bits) + (set >> self.shard_bits);
        let set = Set {
            base: (order * self.ways) as u32,
            tags: (order * self.tag_words) as u32,
            shard: shard as u16,
            tag: tag.max(1),
        };
        // a hint: a prefetch never faults, and nothing is read here
        let tags = self
            .tags
            .as_slice()
            .as_ptr()
            .wrapping_add(8 * order * self.tag_words);
        prefetch_row(tags, self.tag_words * 8);
        Some(set)
    }

    /// The first way at or after `from` of `set` whose tag is the set's, compared eight at a
    /// time.
    #[inline(always)]
    fn tagged(&self, set: Set, from: usize) -> Option<usize> {
        let first = set.tags as usize;
        let wanted = LOW_BYTES * u64::from(set.tag);
        for w in from / 8..self.tag_words {
            // SAFETY: first + tag_words ≤ sets × tag_words (`probe` checked the set's base)
            let tags = unsafe { Self::word(&self.tags, first + w) }.load(Ordering::Relaxed);
            // bytes equal to the tag become 0; the high bit of each zero byte, exactly
            let x = tags ^ wanted;
            let mut zero = !(((x & LOW_7_BITS) + LOW_7_BITS) | x | LOW_7_BITS);
            if w == from / 8 {
                zero &= u64::MAX << (from % 8 * 8);
            }
            if zero != 0 {
                return Some(w * 8 + zero.trailing_zeros() as usize / 8);
            }
        }
        None
    }

    /// Finds the first slot of `set` whose tag is its row's, if any, and asks for its head and
    /// row: [`Self::read`] checks the key and copies the row (a write between the two makes the
    /// read fail, never wrong). Takes no lock and counts nothing. `None` for a set of another
    /// cache.
    #[inline(always)]
    pub fn probe(&self, set: Set) -> Option<Slot> {
        if !self.holds(set) {
            return None;
        }
        let way = self.tagged(set, 0)?;
        let slot = set.base as usize + way;
        // what `read` touches: the slot's head, and its row (pointers only: nothing is read)
        let head = self
            .heads
            .as_slice()
            .as_ptr()
            .wrapping_add(HEAD_WORDS * 8 * slot);
        prefetch_row(head, HEAD_WORDS * 8);
        prefetch_row(self.row_ptr(slot).cast(), self.row_bytes);
        Some(Slot {
            set,
            way: way as u32,
        })
    }

    /// Slot `slot`'s row (`slot` below `slots`).
    #[inline(always)]
    fn row_ptr(&self, slot: usize) -> *const AtomicU64 {
        debug_assert!(slot < self.slots);
        // in bounds of `data` (words per slot), but only ever a pointer: no access here
        self.data
            .as_slice()
            .as_ptr()
            .cast::<AtomicU64>()
            .wrapping_add(slot * self.words)
    }

    /// Copies `row`'s bytes from `at` (where [`Self::probe`] found its tag) into `out`'s first
    /// [`Self::words`] words and marks the hit; `false` when the set no longer holds the row,
    /// or a writer is changing its slot (the caller probes again or reads the row elsewhere).
    #[inline(always)]
    pub fn read(&self, at: Slot, row: u64, out: &mut [u64]) -> bool {
        let (set, way, key) = (at.set, at.way as usize, row.wrapping_add(1));
        if !self.holds(set) || way >= self.ways || out.len() < self.words {
            return false;
        }
        match self.copy_out(set, set.base as usize + way, key, out) {
            Some(hit) => hit,
            None => self.read_other_ways(set, way, key, out),
        }
    }

    /// [`Self::read`] on from `way`, whose tag was another row's too: the set's next ways with
    /// the tag.
    #[cold]
    fn read_other_ways(&self, set: Set, mut way: usize, key: u64, out: &mut [u64]) -> bool {
        while let Some(next) = self.tagged(set, way + 1) {
            way = next;
            if let Some(hit) = self.copy_out(set, set.base as usize + way, key, out) {
                return hit;
            }
        }
        false
    }

    /// Whether `set` lies inside this cache (one made by another cache may not): its slots and
    /// its tag words.
    #[inline(always)]
    fn holds(&self, set: Set) -> bool {
        set.base as usize + self.ways <= self.slots
            && set.tags as usize + self.tag_words <= self.sets * self.tag_words
    }

    /// [`Self::read`] of one slot: `None` when it holds another key.
    #[inline(always)]
    fn copy_out(&self, set: Set, slot: usize, key: u64, out: &mut [u64]) -> Option<bool> {
        // `read` checked that the set lies inside the cache and the way below `ways`; `tagged`
        // finds only ways below `ways` (tag padding is never written, a row's tag is never 0)
        debug_assert!(slot < self.slots);
        // SAFETY: slot < slots (above)
        let [stored, seq, mark] = unsafe { self.head_unchecked(slot) };
        let before = seq.load(Ordering::Acquire);
        if stored.load(Ordering::Relaxed) != key {
            return None;
        }
        if before & 1 == 1 {
            return Some(false);
        }
        let src = self.row_ptr(slot);
        for i in 0..self.words {
            // SAFETY: slot < slots, i < words: inside `data`, accessed only through atomics;
            // `read` checked that `out` has room for `words`
            unsafe { *out.get_unchecked_mut(i) = (*src.add(i)).load(Ordering::Relaxed) };
        }
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) != before {
            return Some(false);
        }
        if self.config.policy.frequency() {
            mark.store(
                mark.load(Ordering::Relaxed).saturating_add(1),
                Ordering::Relaxed,
            );
        } else {
            let clock = &self.shards[set.shard as usize].clock;
            let now = clock.load(Ordering::Relaxed) + 1;
            clock.store(now, Ordering::Relaxed);
            mark.store(now, Ordering::Relaxed);
        }
        Some(true)
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
        let set = self.set(row);
        // a writer changing the slot: probe again (writes are short), a bounded number of times
        // (a writer that panicked mid-write leaves the slot unreadable: a miss, not a hang)
        for _ in 0..READ_TRIES {
            let Some(at) = set.and_then(|set| self.probe(set)) else {
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
        (0..self.slots)
            .map(|i| self.key(i))
            .filter(|&k| k != EMPTY)
            .map(|k| k - 1)
            .collect()
    }

    /// Writes key `key` (0: empty), tag `tag` and `bytes` into slot `way` of `set` (the caller
    /// holds its shard's writer lock), under the slot's sequence number.
    fn write(&self, set: Set, way: usize, key: u64, tag: u8, bytes: &[u8]) {
        let slot = set.base as usize + way;
        let [stored, seq, _] = self.head(slot);
        let now = seq.load(Ordering::Relaxed);
        // odd (whatever a panicked writer left), then even again when done
        let odd = now | 1;
        seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        stored.store(key, Ordering::Relaxed);
        // the tag: a hint readers check against the key, changed by this shard's writers only
        let tags = set.tags as usize + way / 8;
        // SAFETY: inside the set's tag words (way < ways)
        let word = unsafe { Self::word(&self.tags, tags) };
        let shift = way % 8 * 8;
        let old = word.load(Ordering::Relaxed) & !(0xff << shift);
        word.store(old | u64::from(tag) << shift, Ordering::Relaxed);
        let dst = self.row_ptr(slot);
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: slot < slots, i < words: inside `data`, accessed only through atomics
            unsafe { &*dst.add(i) }.store(u64::from_ne_bytes(word), Ordering::Relaxed);
        }
        seq.store(odd + 1, Ordering::Release);
    }

    /// The way of `row` in `set`, if it holds it.
    fn way_of(&self, set: Set, row: u64) -> Option<usize> {
        (0..self.ways).find(|&w| self.key(set.base as usize + w) == row + 1)
    }

    /// The first free way of `set`.
    fn free_way(&self, set: Set) -> Option<usize> {
        (0..self.ways).find(|&w| self.key(set.base as usize + w) == EMPTY)
    }

    /// Replaces `row`'s bytes if it is cached (a live store's compaction: the row changed
    /// below); returns whether it was. Neither a hit nor an admission: no counter moves.
    pub fn replace(&self, row: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        let Some(set) = self.set(row) else {
            return false;
        };
        let _writer = self.writer(&self.shards[set.shard as usize]);
        let Some(way) = self.way_of(set, row) else {
            return false;
        };
        self.write(set, way, row + 1, set.tag, bytes);
        true
    }

    /// Offers a row read from below after a miss (see the module docs).
    pub fn offer(&self, row: u64, bytes: &[u8]) -> Offer {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        let Some(set) = self.set(row) else {
            CacheStats::add(&self.stats.rejections, 1);
            return Offer::Rejected;
        };
        let mut draws = self.writer(&self.shards[set.shard as usize]);
        if self.way_of(set, row).is_some() {
            return Offer::Present;
        }
        let (way, evicted) = match self.free_way(set) {
            Some(way) => (way, None),
            None => {
                if self.config.policy.probabilistic() {
                    *draws += 1;
                    let draw = mix(self.config.seed ^ mix(u64::from(set.base)) ^ *draws);
                    if draw >= self.admit_below {
                        CacheStats::add(&self.stats.rejections, 1);
                        return Offer::Rejected;
                    }
                }
                let way = (0..self.ways)
                    .min_by_key(|&w| self.head(set.base as usize + w)[2].load(Ordering::Relaxed))
                    .expect("a set has at least one way");
                (way, Some(self.key(set.base as usize + way) - 1))
            }
        };
        self.admit(set, way, row, bytes);
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
        let Some(set) = self.set(row) else {
            return false;
        };
        let _writer = self.writer(&self.shards[set.shard as usize]);
        if self.way_of(set, row).is_some() {
            return false;
        }
        let Some(way) = self.free_way(set) else {
            return false;
        };
        self.admit(set, way, row, bytes);
        true
    }

    /// Writes `row` into way `way` of `set` (whose shard's writer the caller holds), marked as
    /// just used.
    fn admit(&self, set: Set, way: usize, row: u64, bytes: &[u8]) {
        let clock = &self.shards[set.shard as usize].clock;
        let now = clock.load(Ordering::Relaxed) + 1;
        clock.store(now, Ordering::Relaxed);
        let mark = if self.config.policy.frequency() {
            1
        } else {
            now
        };
        self.head(set.base as usize + way)[2].store(mark, Ordering::Relaxed);
        self.write(set, way, row + 1, set.tag, bytes);
        CacheStats::add(&self.stats.admissions, 1);
    }
}

/// Words as their bytes (native order: what [`RowCache::read`] copied is what was written).
pub fn words_as_bytes(words: &[u64]) -> &[u8] {
    // SAFETY: u8 has no alignment or validity requirement; the length is in bytes
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), words.len() * 8) }
}
