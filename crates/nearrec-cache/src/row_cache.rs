//! The dynamic row cache: set-associative, LRU / LFU victims, probabilistic admission, hits read
//! in place.
//!
//! A row hashes to one set of `ways` slots. A miss read from SSD is offered back: it takes a free
//! slot of its set if there is one; otherwise the `_pa` policies admit it with probability `p`
//! (HS-Rec: a one-off row must not push out a hot one), and it replaces the slot with the
//! smallest mark. A cache told that it has a slot for every row of its table
//! ([`RowCache::with_rows`]) places rows by number instead of by hash, so that no set is ever
//! asked to hold more rows than it has ways: it never evicts.
//!
//! **Readers and writers never meet.** A reader — one table's share of a batch, or one
//! [`RowCache::get`] — holds a [`Reader`], a read lock on the cache taken once for all its
//! lookups; writers (an offered row, a warm-up's row, a compaction's replaced row) take the
//! write lock. So a hit reads its row where it lies, with no copy, no sequence number and no
//! retry: the slot cannot change while the reader holds the cache. A row offered while readers
//! hold the cache is not waited for: it is kept aside ([`Offer::Deferred`], a few rows'
//! worth) and written by whoever next finds the cache free — the last reader out, or the next
//! writer. Only when the rows kept aside fill their room does an offer wait for the readers in
//! (each a table's share of one batch) to finish; the lock prefers writers, so readers coming
//! later wait behind it and it is never starved.
//!
//! A hit marks its slot (LRU: the shard's clock; LFU: its hit count) with plain atomic stores,
//! not read-modify-writes: a mark may be lost when two readers hit one shard at once, so victims
//! are exact for one thread and approximate under races (which row is kept never changes what a
//! lookup returns).
//!
//! A hit is three steps, each taken for a run of lookups at once and a run apart (the SSD tier
//! does, through `nearrec_kernels::RowSource`), each asking for the lines the next one reads:
//! [`Reader::locate`] hashes each row once and asks for its set's tags (a byte of the row's hash
//! per way); [`Reader::probe`] compares the tag with all of them at once (16 ways: one SSE2
//! compare; else eight to a word) and asks for the matching slot's lines, its head (key, mark)
//! and row lying together; [`Reader::read`] checks the key, marks the hit and lends the row.
//! A tag shared with another row of the set costs a key compare, never a wrong row. Each step
//! is a loop of its own (not inlined), so that its values stay in registers.
//!
//! Indices are checked where they enter, not per access: [`Set`] and [`Slot`] are made only by
//! this type, and [`Reader::probe`] / [`Reader::read`] compare them with the cache's size once
//! (one of another cache is refused or, if it lies inside this one, read as this cache's: its
//! key still decides), after which the set's tags and slots are in bounds by construction
//! (see `RowCache::new`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use nearrec_format::AlignedBuf;
use nearrec_kernels::{RowRef, SKIP, prefetch_line, prefetch_row};

use crate::hash::{fibonacci, mix, scale};
use crate::policy::CacheConfig;
use crate::stats::{CacheStats, CacheStatsSnapshot};

/// Bytes of bookkeeping per slot beside the row: its head (key, mark) and its tag.
pub const SLOT_OVERHEAD: u64 = 8 * HEAD_WORDS as u64 + 1;
/// Words of a slot's head, just before its row: key, mark.
const HEAD_WORDS: usize = 2;
/// An empty slot's key: a fresh (zeroed, untouched) cache is all empty slots. An empty slot's
/// tag is 0, as is one row in 256's: a probe may so find an empty way, whose key then sends the
/// read on to the set's later ways (rarely: only while the set has room).
const EMPTY: u64 = 0;
const MAX_SHARDS: usize = 256;
/// Bytes of offered rows a cache keeps aside while readers hold it (at least one row).
const DEFERRED_BYTES: usize = 256 * 1024;
/// Bytes of a row [`RowCache::get`] copies onto its stack.
const STACK_BYTES: usize = 512;
const LOW_BYTES: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// What became of an offered row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// It took a slot, replacing `evicted` if the set was full.
    Admitted { evicted: Option<u64> },
    /// The admission draw turned it away.
    Rejected,
    /// It was already cached (another batch admitted it first).
    Present,
    /// Readers held the cache: the row is kept aside and offered when the cache is next free.
    Deferred,
}

/// A row's set and tag, worked out once by [`Reader::locate`]: give it to [`Reader::probe`].
/// One word, stored and loaded whole: the set's number in the low 32 bits, the tag in each byte
/// of the high 32 (so that a probe spreads it over a vector's lanes with one shuffle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Set(u64);

impl Set {
    /// No set: a row skipped, or a cache with none.
    pub const NONE: Set = Set(u32::MAX as u64);

    /// Tag bytes: each of the high four.
    const TAG_BYTES: u64 = 0x0101_0101 << 32;

    fn new(order: usize, tag: u8) -> Set {
        debug_assert!(order < u32::MAX as usize);
        Set(order as u64 | (u64::from(tag) * Self::TAG_BYTES))
    }

    /// The set's number: rows with the same one share the set. Its slots start at
    /// `number × ways`, its tags at word `number × tag_words`.
    pub fn number(self) -> usize {
        self.0 as u32 as usize
    }

    /// The row's tag.
    #[inline(always)]
    fn tag(self) -> u8 {
        (self.0 >> 32) as u8
    }
}

/// Where [`Reader::probe`] found a way whose tag is the row's: the slot's number (its set's
/// `number × ways` + the way). Read it with [`Reader::read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(u32);

impl Slot {
    /// No slot: the set had no way with the row's tag (a cache has fewer than `u32::MAX`
    /// slots, so no slot is this one).
    pub const NONE: Slot = Slot(u32::MAX);
}

/// Where `row` lives in a cache of `sets` sets (`None` when it has none): placed by number
/// (`by_number`: row `r` in set `r >> shift`) or hashed by one multiplication, whose high bits
/// pick the set and middle bits the tag. Writers' and readers' one way of finding a row's set.
#[inline(always)]
fn place(row: u64, sets: usize, seed: u64, by_number: Option<u32>) -> Option<Set> {
    if sets == 0 {
        return None;
    }
    Some(match by_number {
        Some(shift) => place_as::<true>(row, sets, seed, shift),
        None => place_as::<false>(row, sets, seed, 0),
    })
}

/// [`place`] in a cache that has sets, placing by number (`BY_NUMBER`, by `shift`) or not.
#[inline(always)]
fn place_as<const BY_NUMBER: bool>(row: u64, sets: usize, seed: u64, shift: u32) -> Set {
    if BY_NUMBER && row >> shift < sets as u64 {
        Set((row >> shift) | ((row & 0xff) * Set::TAG_BYTES))
    } else {
        // a row beyond those the cache was told of (outside the contract) is hashed too
        let h = fibonacci(row ^ seed);
        // the tag: bits 32..40 of the hash, spread where `Set` keeps it
        Set(scale(h, sets) as u64 | ((h >> 32 & 0xff) * Set::TAG_BYTES))
    }
}

/// Row `row`'s key: `row + 2`. 0 is an empty slot's ([`EMPTY`]), and 1 would be [`SKIP`]'s,
/// which no slot holds: a padding lookup matches no slot, whatever way its probe found. (Row
/// `u64::MAX - 1`, whose key would be 0, is never offered: see [`RowCache::offer`].)
#[inline(always)]
fn key_of(row: u64) -> u64 {
    row.wrapping_add(2)
}

/// The row whose key is `key` (not [`EMPTY`]).
fn row_of(key: u64) -> u64 {
    key - 2
}

/// The first way at or after `from` whose tag is `set`'s, of a set of `ways` ways
/// whose `tag_words` words of tags are at `tags` (`TW`: that count where the caller knows it,
/// 0 where only `tag_words` says). The tags are compared all at once: sixteen with SSE2 in a
/// set of two words, else eight to a word (SWAR). The padding after the last way's tag is 0,
/// as a tag may be: it is never a way. Writers' and readers' one way of searching a set's tags.
///
/// # Safety
/// `tags` points at `tag_words` readable words that no one writes meanwhile (the cache is held).
#[inline(always)]
unsafe fn first_tagged<const TW: usize>(
    tags: *const u64,
    tag_words: usize,
    ways: usize,
    set: Set,
    from: usize,
) -> Option<usize> {
    debug_assert!(ways <= tag_words * 8);
    let tag_words = if TW == 0 { tag_words } else { TW };
    #[cfg(target_arch = "x86_64")]
    if TW == 2 {
        use std::arch::x86_64::{
            _mm_cmpeq_epi8, _mm_cvtsi64_si128, _mm_loadu_si128, _mm_movemask_epi8,
            _mm_shuffle_epi32,
        };
        // SAFETY: two readable words at `tags` (the contract); SSE2 is part of x86_64
        let equal = unsafe {
            let got = _mm_loadu_si128(tags.cast());
            // the set's high half, four tag bytes, in every lane
            let wanted = _mm_shuffle_epi32::<0x55>(_mm_cvtsi64_si128(set.0 as i64));
            _mm_movemask_epi8(_mm_cmpeq_epi8(got, wanted))
        } as u32;
        // the ways from `from` to the last (`ways` ≤ 16 here)
        let equal = equal & ((1 << ways) - 1) & u32::MAX.checked_shl(from as u32).unwrap_or(0);
        return (equal != 0).then(|| equal.trailing_zeros() as usize);
    }
    let wanted = LOW_BYTES * u64::from(set.tag());
    for w in from / 8..tag_words {
        // SAFETY: w < tag_words (the contract)
        let mut x = unsafe { tags.add(w).read() } ^ wanted;
        if w == from / 8 {
            // the ways before `from` made unequal
            x |= (1 << (from % 8 * 8)) - 1;
        }
        // bytes equal to the tag are 0 in `x`; the lowest byte flagged is the first of them
        // exactly (a borrow starts only at a zero byte, so it can flag only bytes above one)
        let zero = x.wrapping_sub(LOW_BYTES) & !x & HIGH_BITS;
        if zero != 0 {
            let way = w * 8 + zero.trailing_zeros() as usize / 8;
            // past the last way: padding, and no way after it
            return (way < ways).then_some(way);
        }
    }
    None
}

/// Marks a hit of the slot whose mark is `mark` (`LFU`: counts it; LRU: stamps it with its
/// shard's `clock`, moved on). Plain stores, not read-modify-writes (see the module docs).
#[inline(always)]
fn mark<const LFU: bool>(mark: &AtomicU64, clock: &AtomicU64) {
    if LFU {
        // a hit count: 2^64 hits are never reached
        mark.store(
            mark.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
    } else {
        let now = clock.load(Ordering::Relaxed) + 1;
        clock.store(now, Ordering::Relaxed);
        mark.store(now, Ordering::Relaxed);
    }
}

/// One shard's LRU clock, on a line of its own (sets are dealt to shards by their number's low
/// bits, so that readers of different sets seldom share a clock).
#[derive(Debug, Default)]
#[repr(align(64))]
struct Clock(AtomicU64);

/// Rows offered while readers held the cache (see the module docs).
#[derive(Debug, Default)]
struct Deferred {
    rows: Vec<u64>,
    /// `rows.len() × row_bytes` bytes, row by row.
    bytes: Vec<u8>,
}

/// A set-associative cache of encoded rows (see the module docs).
#[derive(Debug)]
pub struct RowCache {
    row_bytes: usize,
    /// Bytes a slot takes in `data`: its head, then its row rounded up to whole words.
    stride: usize,
    ways: usize,
    /// `log2(ways)` where `ways` is a power of two: a slot's set is then its number shifted.
    ways_shift: Option<u32>,
    /// Words of tags per set (`ways` bytes rounded up to a word; the padding stays 0).
    tag_words: usize,
    sets: usize,
    /// Slots in all (`sets × ways`, below 2^32).
    slots: usize,
    /// `Some(shift)`: rows are placed by number, row `r` in set `r >> shift` (every row has a
    /// slot; see [`Self::with_rows`]); `None`: by hash.
    by_number: Option<u32>,
    /// A set's shard is its number's low bits: `order & shard_mask`.
    shard_mask: usize,
    clocks: Box<[Clock]>,
    /// Readers hold it shared, writers alone; it guards the admission draws made so far (the
    /// draw is a hash of seed, set and count).
    gate: RwLock<u64>,
    deferred: Mutex<Deferred>,
    /// Whether `deferred` holds rows (read without its lock by readers leaving).
    any_deferred: AtomicBool,
    /// Set `s`'s tags at word `s × tag_words` (way `w`: byte `w % 8` of word `w / 8`, little
    /// end first); slot `i` at byte `i × stride` of `data`: its head (key, mark), then its row,
    /// so that a hit's key and row are one run of lines. One buffer each, so that large caches
    /// sit on huge pages: a hit on 4 KiB pages misses the TLB as well as the cache. Heads are
    /// only ever accessed through atomics; tags and rows are written only under the write lock
    /// and read under a read lock (or the write lock).
    tags: AlignedBuf,
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
        let stride = 8 * (HEAD_WORDS + row_bytes.div_ceil(8));
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
        // The bounds every access relies on: a set's number is below `sets`, so its slots end
        // at or before `slots` and its tag words at or before `sets × tag_words`; `data` has
        // `stride` bytes (HEAD_WORDS words and the row) per slot; a shard (a number's low bits
        // under `shard_mask`) is below `shards`.
        Self {
            row_bytes,
            stride,
            ways,
            ways_shift: ways.is_power_of_two().then(|| ways.ilog2()),
            tag_words,
            sets,
            slots,
            by_number: None,
            shard_mask: shards - 1,
            clocks: (0..shards).map(|_| Clock::default()).collect(),
            gate: RwLock::new(0),
            deferred: Mutex::default(),
            any_deferred: AtomicBool::new(false),
            // zeroed pages, committed when used
            tags: AlignedBuf::zeroed(sets * tag_words * 8),
            data: AlignedBuf::zeroed(slots * stride),
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

    /// Bytes of each row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
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

    pub fn stats(&self) -> CacheStatsSnapshot {
        self.stats.snapshot()
    }

    /// Counts lookups that a [`Reader`]'s caller served (`hits`) or did not (`misses`);
    /// [`Self::get`] counts its own.
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

    /// Holds the cache for reading (see [`Reader`]): writers wait, or keep their rows aside,
    /// until it is dropped.
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            cache: self,
            held: Some(self.gate.read().unwrap_or_else(PoisonError::into_inner)),
        }
    }

    /// Word `i` of `buf`.
    ///
    /// # Safety
    /// `i` is below `buf`'s length in words.
    #[inline(always)]
    unsafe fn word(buf: &AlignedBuf, i: usize) -> &AtomicU64 {
        debug_assert!(i < buf.len() / 8);
        // SAFETY: in bounds (the caller's contract); the buffer is 8-aligned, zero-initialised,
        // lives as long as `buf` and is only ever accessed through atomics
        unsafe { &*buf.as_slice().as_ptr().cast::<AtomicU64>().add(i) }
    }

    /// Slot `slot`'s head: key, mark.
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
        let at = slot * self.stride / 8;
        // SAFETY: `data` has `stride` bytes, its head's HEAD_WORDS words first, per slot and
        // slot < slots (the contract)
        unsafe { [Self::word(&self.data, at), Self::word(&self.data, at + 1)] }
    }

    fn key(&self, slot: usize) -> u64 {
        self.head(slot)[0].load(Ordering::Relaxed)
    }

    /// Where `row` lives: its set and tag (see [`place`]).
    #[inline(always)]
    fn locate(&self, row: u64) -> Option<Set> {
        place(row, self.sets, self.config.seed, self.by_number)
    }

    /// Set `order`'s tags (`order` below `sets`): a pointer only, nothing read.
    #[inline(always)]
    fn tags_of(&self, order: usize) -> *const u64 {
        debug_assert!(order < self.sets);
        self.tags
            .as_slice()
            .as_ptr()
            .cast::<u64>()
            .wrapping_add(order * self.tag_words)
    }

    /// The first way at or after `from` of `set` (whose number is below `sets`) whose tag is
    /// the row's.
    fn tagged(&self, set: Set, from: usize) -> Option<usize> {
        assert!(set.number() < self.sets);
        // SAFETY: the set's tag words lie inside `tags` (its number is below `sets`); the
        // caller holds the cache, so no one writes them
        unsafe {
            first_tagged::<0>(
                self.tags_of(set.number()),
                self.tag_words,
                self.ways,
                set,
                from,
            )
        }
    }

    /// The set slot `slot` belongs to.
    #[inline(always)]
    fn order_of(slot: usize, ways: usize, ways_shift: Option<u32>) -> usize {
        match ways_shift {
            Some(shift) => slot >> shift,
            None => slot / ways,
        }
    }

    /// The LRU clock of set `order`'s shard.
    #[inline(always)]
    fn clock(&self, order: usize) -> &AtomicU64 {
        // SAFETY: order & shard_mask < clocks.len() (see `new`)
        unsafe { &self.clocks.get_unchecked(order & self.shard_mask).0 }
    }

    /// Slot `slot`'s row (`slot` below `slots`): a pointer only, nothing read.
    #[inline(always)]
    fn row_ptr(&self, slot: usize) -> *const u8 {
        debug_assert!(slot < self.slots);
        self.data
            .as_slice()
            .as_ptr()
            .wrapping_add(slot * self.stride + 8 * HEAD_WORDS)
    }

    /// Looks `row` up; on a hit, calls `read` with a copy of its bytes (taken with the cache
    /// held, called with it free) and counts the hit.
    pub fn get<R>(&self, row: u64, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let mut stack = [0u8; STACK_BYTES];
        let mut heap = Vec::new();
        let copy = if self.row_bytes <= STACK_BYTES {
            &mut stack[..self.row_bytes]
        } else {
            heap.resize(self.row_bytes, 0);
            &mut heap[..]
        };
        let hit = {
            let reader = self.reader();
            let (mut set, mut slot, mut found) = ([Set::NONE], [Slot::NONE], [None]);
            reader.locate(&[row], &mut set);
            reader.probe(&set, &mut slot);
            reader.read(&slot, &[row], &mut found);
            // SAFETY: a row found here is one of this cache's, `row_bytes` long
            found[0]
                .map(|row| copy.copy_from_slice(unsafe { row.bytes(self.row_bytes) }))
                .is_some()
        };
        self.count(u64::from(hit), u64::from(!hit));
        hit.then(|| read(copy))
    }

    /// The rows cached now, in no order (what warms another cache for the same table).
    pub fn rows(&self) -> Vec<u64> {
        (0..self.slots)
            .map(|i| self.key(i))
            .filter(|&k| k != EMPTY)
            .map(row_of)
            .collect()
    }

    /// The write lock: every reader has left (a poisoned lock is taken as it is: a write never
    /// panics half-way, see [`Self::write`]).
    fn write_lock(&self) -> RwLockWriteGuard<'_, u64> {
        self.gate.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes key `key` (0: empty), tag `tag` and `bytes` into slot `way` of `set`; the caller
    /// holds the write lock, so no reader is looking.
    fn write(&self, set: Set, way: usize, key: u64, tag: u8, bytes: &[u8]) {
        let slot = set.number() * self.ways + way;
        let [stored, _] = self.head(slot);
        // SAFETY: the slot's bytes lie inside `data` (`write_shared` checks); the write lock
        // keeps every reader out, and every other writer waits for it
        unsafe {
            self.data
                .write_shared(slot * self.stride + 8 * HEAD_WORDS, bytes)
        };
        stored.store(key, Ordering::Relaxed);
        let tags = set.number() * self.tag_words + way / 8;
        // SAFETY: inside the set's tag words (way < ways)
        let word = unsafe { Self::word(&self.tags, tags) };
        let shift = way % 8 * 8;
        let old = word.load(Ordering::Relaxed) & !(0xff << shift);
        word.store(old | u64::from(tag) << shift, Ordering::Relaxed);
    }

    /// The tag of way `way` of set `order` (both in range).
    fn tag_at(&self, order: usize, way: usize) -> u8 {
        assert!(order < self.sets && way < self.ways);
        // SAFETY: inside the set's tag words (checked above)
        let word = unsafe { Self::word(&self.tags, order * self.tag_words + way / 8) };
        (word.load(Ordering::Relaxed) >> (way % 8 * 8)) as u8
    }

    /// The way of `row` in `set`, if it holds it.
    fn way_of(&self, set: Set, row: u64) -> Option<usize> {
        let base = set.number() * self.ways;
        (0..self.ways).find(|&w| self.key(base + w) == key_of(row))
    }

    /// The first free way of `set`.
    fn free_way(&self, set: Set) -> Option<usize> {
        let base = set.number() * self.ways;
        (0..self.ways).find(|&w| self.key(base + w) == EMPTY)
    }

    /// Replaces `row`'s bytes if it is cached (a live store's compaction: the row changed
    /// below); returns whether it was. Waits for the readers in; rows kept aside are written
    /// first, so an older copy of the row never lands after it. Neither a hit nor an
    /// admission: no counter moves.
    pub fn replace(&self, row: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        assert!(row < u64::MAX - 1, "row {row} is no table's");
        let Some(set) = self.locate(row) else {
            return false;
        };
        let replaced = {
            let mut draws = self.write_lock();
            self.drain(&mut draws);
            let way = self.way_of(set, row);
            way.inspect(|&way| self.write(set, way, key_of(row), set.tag(), bytes))
                .is_some()
        };
        self.settle();
        replaced
    }

    /// Offers a row read from below after a miss (see the module docs). Never call it while
    /// holding a [`Reader`] of this cache: an offer that finds no room aside waits for every
    /// reader to leave.
    pub fn offer(&self, row: u64, bytes: &[u8]) -> Offer {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        assert!(row < u64::MAX - 1, "row {row} is no table's");
        let mut draws = match self.gate.try_write() {
            Ok(draws) => draws,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                if self.defer(row, bytes) {
                    return Offer::Deferred;
                }
                self.write_lock()
            }
        };
        self.drain(&mut draws);
        let offer = self.offer_now(&mut draws, row, bytes);
        drop(draws);
        self.settle();
        offer
    }

    /// [`Self::offer`] with the write lock held (`draws`: its admission draws).
    fn offer_now(&self, draws: &mut u64, row: u64, bytes: &[u8]) -> Offer {
        let Some(set) = self.locate(row) else {
            CacheStats::add(&self.stats.rejections, 1);
            return Offer::Rejected;
        };
        if self.way_of(set, row).is_some() {
            return Offer::Present;
        }
        let base = set.number() * self.ways;
        let (way, evicted) = match self.free_way(set) {
            Some(way) => (way, None),
            None => {
                if self.config.policy.probabilistic() {
                    *draws += 1;
                    let draw = mix(self.config.seed ^ mix(set.number() as u64) ^ *draws);
                    if draw >= self.admit_below {
                        CacheStats::add(&self.stats.rejections, 1);
                        return Offer::Rejected;
                    }
                }
                let way = (0..self.ways)
                    .min_by_key(|&w| self.head(base + w)[1].load(Ordering::Relaxed))
                    .expect("a set has at least one way");
                (way, Some(row_of(self.key(base + way))))
            }
        };
        self.admit(set, way, row, bytes);
        if evicted.is_some() {
            CacheStats::add(&self.stats.evictions, 1);
        }
        Offer::Admitted { evicted }
    }

    /// Keeps an offered row aside while readers hold the cache; false when there is no room.
    fn defer(&self, row: u64, bytes: &[u8]) -> bool {
        {
            let mut aside = self.deferred.lock().unwrap_or_else(PoisonError::into_inner);
            if aside.bytes.len() + bytes.len() > DEFERRED_BYTES.max(bytes.len()) {
                return false;
            }
            aside.rows.push(row);
            aside.bytes.extend_from_slice(bytes);
            self.any_deferred.store(true, Ordering::SeqCst);
        }
        // the readers may all have left since the lock was tried
        self.settle();
        true
    }

    /// Offers the rows kept aside; the caller holds the write lock (`draws`).
    fn drain(&self, draws: &mut u64) {
        if !self.any_deferred.load(Ordering::Relaxed) {
            return;
        }
        let Deferred { rows, bytes } = {
            let mut aside = self.deferred.lock().unwrap_or_else(PoisonError::into_inner);
            self.any_deferred.store(false, Ordering::SeqCst);
            std::mem::take(&mut *aside)
        };
        for (&row, bytes) in rows.iter().zip(bytes.chunks_exact(self.row_bytes.max(1))) {
            self.offer_now(draws, row, bytes);
        }
    }

    /// After the lock is let go: writes the rows kept aside if no one holds it now (whoever
    /// does settles when they let go). The fence pairs with the one a deferring writer's store
    /// of `any_deferred` is followed by (in its own `settle`): either that writer finds the
    /// lock free, or this one finds its row.
    fn settle(&self) {
        fence(Ordering::SeqCst);
        while self.any_deferred.load(Ordering::SeqCst) {
            let mut draws = match self.gate.try_write() {
                Ok(draws) => draws,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            self.drain(&mut draws);
        }
    }

    /// Puts a row into a free way of its set, evicting nothing: a warm-up's rows, offered most
    /// wanted first, so that a less wanted row never displaces a more wanted one. False when
    /// its set is full or the row is cached already. Waits for the readers in.
    pub fn fill(&self, row: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        assert!(row < u64::MAX - 1, "row {row} is no table's");
        let Some(set) = self.locate(row) else {
            return false;
        };
        let filled = {
            let mut draws = self.write_lock();
            self.drain(&mut draws);
            match self.free_way(set) {
                Some(way) if self.way_of(set, row).is_none() => {
                    self.admit(set, way, row, bytes);
                    true
                }
                _ => false,
            }
        };
        self.settle();
        filled
    }

    /// Writes `row` into way `way` of `set` (the caller holds the write lock), marked as just
    /// used.
    fn admit(&self, set: Set, way: usize, row: u64, bytes: &[u8]) {
        let stamp = self.head(set.number() * self.ways + way)[1];
        if self.config.policy.frequency() {
            stamp.store(1, Ordering::Relaxed);
        } else {
            mark::<false>(stamp, self.clock(set.number()));
        }
        self.write(set, way, key_of(row), set.tag(), bytes);
        CacheStats::add(&self.stats.admissions, 1);
    }
}

/// A hold on a [`RowCache`] for reading, taken once for many lookups (one table's share of a
/// batch): while it lives no slot changes, so a hit's row is read where it lies. Writers keep
/// their rows aside meanwhile, and the last reader to leave writes them.
#[derive(Debug)]
pub struct Reader<'a> {
    cache: &'a RowCache,
    /// `None` once let go (in `drop`, before the rows kept aside are written).
    held: Option<RwLockReadGuard<'a, u64>>,
}

impl<'a> Reader<'a> {
    pub fn cache(&self) -> &'a RowCache {
        self.cache
    }

    /// Works out each row's set and tag ([`Set::NONE`] when the cache has no sets) and asks
    /// for the set's tags: what [`Self::probe`] reads. A row of [`SKIP`] is located as any
    /// other: no slot holds it (see [`Self::read`]).
    #[inline(never)]
    pub fn locate(&self, rows: &[u64], sets: &mut [Set]) {
        let c = self.cache;
        if c.sets == 0 {
            sets.iter_mut().for_each(|set| *set = Set::NONE);
            return;
        }
        match (c.by_number, c.tag_words) {
            (None, 2) => self.locate_in::<false, 2>(rows, sets, 0),
            (None, 1) => self.locate_in::<false, 1>(rows, sets, 0),
            (None, _) => self.locate_in::<false, 0>(rows, sets, 0),
            (Some(shift), 2) => self.locate_in::<true, 2>(rows, sets, shift),
            (Some(shift), _) => self.locate_in::<true, 0>(rows, sets, shift),
        }
    }

    /// [`Self::locate`] in a cache that has sets, placing by number (`BY_NUMBER`, by `shift`)
    /// or not, whose sets have `TW` words of tags (0: as many as the cache says).
    #[inline(always)]
    fn locate_in<const BY_NUMBER: bool, const TW: usize>(
        &self,
        rows: &[u64],
        sets: &mut [Set],
        shift: u32,
    ) {
        let c = self.cache;
        // the fields a step reads, in locals: stores into `sets` cannot be seen to leave them be
        let (n, seed) = (c.sets, c.config.seed);
        let tag_bytes = 8 * if TW == 0 { c.tag_words } else { TW };
        let tags = c.tags.as_slice().as_ptr();
        for (&row, set) in rows.iter().zip(sets) {
            *set = place_as::<BY_NUMBER>(row, n, seed, shift);
            // a hint: a prefetch never faults, and nothing is read here
            let at = tags.wrapping_add(set.number() * tag_bytes);
            prefetch_line(at);
            if TW == 0 {
                // one or two words of tags never cross a line (the buffer is aligned); more may
                prefetch_line(at.wrapping_add(tag_bytes - 1));
            }
        }
    }

    /// Finds the first slot of each set whose tag is its row's ([`Slot::NONE`] if none, or
    /// for a set beyond this cache) and asks for its lines: what [`Self::read`] reads.
    ///
    /// Not inlined, as [`Self::read`] is not: a loop of its own keeps its values in registers.
    #[inline(never)]
    pub fn probe(&self, sets: &[Set], slots: &mut [Slot]) {
        let c = self.cache;
        if c.tag_words == 2 && c.ways == 16 && c.stride <= 193 {
            self.probe_in::<true>(sets, slots);
        } else {
            self.probe_in::<false>(sets, slots);
        }
    }

    /// [`Self::probe`]; `USUAL`: the usual shape, whose loop is the shortest (16 ways, so two
    /// words of tags compared at once, and slots of at most 193 bytes, four lines at most).
    #[inline(always)]
    fn probe_in<const USUAL: bool>(&self, sets: &[Set], slots: &mut [Slot]) {
        let c = self.cache;
        // the fields a step reads, in locals: stores into `slots` cannot be seen to leave them be
        let n = c.sets;
        let (tag_words, ways) = if USUAL {
            (2, 16)
        } else {
            (c.tag_words, c.ways)
        };
        let tags = c.tags.as_slice().as_ptr().cast::<u64>();
        let (data, stride) = (c.data.as_slice().as_ptr(), c.stride);
        // a slot's lines: the lines of its first byte, of the bytes 64 and 128 on and of its
        // last byte are all of them for a slot of up to 193 bytes, which starts anywhere (a
        // shorter one asks for some line twice)
        let last = stride - 1;
        let (second, third) = (last.min(64), last.min(128));
        let long = !USUAL && stride > 193;
        for (&set, slot) in sets.iter().zip(slots) {
            let order = set.number();
            let way = if order < n {
                let at = tags.wrapping_add(order * tag_words);
                // SAFETY: order < sets, so its tag words lie inside `tags`; writers keep out
                // while this reader holds the cache
                unsafe {
                    if USUAL {
                        first_tagged::<2>(at, 2, 16, set, 0)
                    } else {
                        first_tagged::<0>(at, tag_words, ways, set, 0)
                    }
                }
            } else {
                None
            };
            *slot = match way {
                Some(way) => {
                    let i = order * ways + way;
                    // pointers only: nothing is read here
                    let at = data.wrapping_add(i * stride);
                    prefetch_line(at);
                    prefetch_line(at.wrapping_add(second));
                    prefetch_line(at.wrapping_add(third));
                    prefetch_line(at.wrapping_add(last));
                    if long {
                        prefetch_row(at, stride);
                    }
                    Slot(i as u32)
                }
                None => Slot::NONE,
            };
        }
    }

    /// Sets `found[i]` to row `rows[i]`'s bytes where `slots[i]` (its probe's) holds it — or,
    /// when that slot's tag was another row's too, a later way of the set with the tag does —
    /// and marks the hit; leaves the others as they are. A lookup given [`Slot::NONE`] is passed
    /// over (as one found elsewhere should be); one of [`SKIP`] is never found (no slot holds
    /// its key). Returns the hits.
    #[inline(never)]
    pub fn read<'r>(
        &'r self,
        slots: &[Slot],
        rows: &[u64],
        found: &mut [Option<RowRef<'r>>],
    ) -> u64 {
        if self.cache.config.policy.frequency() {
            self.read_marking::<true>(slots, rows, found)
        } else {
            self.read_marking::<false>(slots, rows, found)
        }
    }

    #[inline(always)]
    fn read_marking<'r, const LFU: bool>(
        &'r self,
        slots: &[Slot],
        rows: &[u64],
        found: &mut [Option<RowRef<'r>>],
    ) -> u64 {
        let c = self.cache;
        let (n, ways, ways_shift) = (c.slots, c.ways, c.ways_shift);
        let (data, stride, row_bytes) = (c.data.as_slice().as_ptr(), c.stride, c.row_bytes);
        let mut hits = 0;
        for ((&Slot(slot), &row), found) in slots.iter().zip(rows).zip(found) {
            let slot = slot as usize;
            if slot >= n {
                continue;
            }
            let at = data.wrapping_add(slot * stride);
            // SAFETY: slot < slots (checked above), so its `stride` bytes lie inside `data`:
            // first its head's words (8-aligned: `data` is, and `stride` a multiple of 8),
            // accessed only through atomics
            let (stored, stamp) = unsafe {
                let head = at.cast::<AtomicU64>();
                (&*head, &*head.add(1))
            };
            if stored.load(Ordering::Relaxed) != key_of(row) {
                if let Some(bytes) = self.row_in_later_ways::<LFU>(slot, row) {
                    *found = Some(RowRef::new(bytes));
                    hits += 1;
                }
                continue;
            }
            mark::<LFU>(stamp, c.clock(RowCache::order_of(slot, ways, ways_shift)));
            // SAFETY: slot < slots, so its row's `row_bytes` bytes (after its head) lie inside
            // `data`; writers write rows only under the write lock, which this reader's read
            // lock keeps out for as long as the bytes are borrowed (`'r`, no longer than `self`)
            *found = Some(RowRef::new(unsafe {
                std::slice::from_raw_parts(at.add(8 * HEAD_WORDS), row_bytes)
            }));
            hits += 1;
        }
        hits
    }

    /// A read on from slot `slot`, whose tag was another row's too: the set's later ways with
    /// that tag, for `row`.
    #[cold]
    fn row_in_later_ways<const LFU: bool>(&self, slot: usize, row: u64) -> Option<&[u8]> {
        if row == SKIP {
            return None;
        }
        let c = self.cache;
        let (order, mut way) = (slot / c.ways, slot % c.ways);
        // the probe's tag: the slot's own (`order` < sets, as slot < slots)
        let set = Set::new(order, c.tag_at(order, way));
        while let Some(next) = c.tagged(set, way + 1) {
            way = next;
            let [stored, stamp] = c.head(order * c.ways + way);
            if stored.load(Ordering::Relaxed) == key_of(row) {
                mark::<LFU>(stamp, c.clock(order));
                // SAFETY: order × ways + way < slots (`tagged` finds only ways below `ways`)
                return Some(unsafe { self.bytes(order * c.ways + way) });
            }
        }
        None
    }

    /// Slot `slot`'s row, borrowed for as long as this reader holds the cache.
    ///
    /// # Safety
    /// `slot` is below `slots`.
    #[inline(always)]
    unsafe fn bytes(&self, slot: usize) -> &[u8] {
        // SAFETY: slot < slots (the contract), so its row's `row_bytes` bytes lie inside
        // `data`; writers write rows only under the write lock, which this reader's read lock
        // keeps out for as long as the bytes are borrowed (no longer than `self`)
        unsafe { std::slice::from_raw_parts(self.cache.row_ptr(slot), self.cache.row_bytes) }
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        drop(self.held.take());
        // the last reader out writes the rows kept aside while it read
        self.cache.settle();
    }
}
