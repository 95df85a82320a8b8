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

mod read;
mod write;

pub use read::Reader;

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
}
