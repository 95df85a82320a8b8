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
//! per way, eight ways to a word); [`Reader::probe`] compares the tag with all of them at once
//! (SWAR: no per-way loop) and asks for the matching slot's head (key, mark) and row;
//! [`Reader::read`] checks the key, marks the hit and lends the row's bytes. A tag shared with
//! another row of the set costs a key compare, never a wrong row.
//!
//! Indices are checked where they enter, not per access: [`Set`] and [`Slot`] are made only by
//! this type, and [`Reader::probe`] / [`Reader::read`] compare them with the cache's size once
//! (one of another cache is refused or, if it lies inside this one, read as this cache's: its
//! key still decides), after which the set's slots, heads and rows are in bounds by construction
//! (see `RowCache::new`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use nearrec_format::AlignedBuf;
use nearrec_kernels::{SKIP, prefetch_line, prefetch_row};

use crate::hash::{fibonacci, mix, scale};
use crate::policy::CacheConfig;
use crate::stats::{CacheStats, CacheStatsSnapshot};

/// Bytes of bookkeeping per slot beside the row: its head (key, mark) and its tag.
pub const SLOT_OVERHEAD: u64 = 8 * HEAD_WORDS as u64 + 1;
/// Words of a slot's head: key, mark (four heads to a line).
const HEAD_WORDS: usize = 2;
/// Keys are stored as `row + 1`, so a fresh (zeroed, untouched) table is all empty slots; an
/// empty slot's tag is 0, a row's never is.
const EMPTY: u64 = 0;
const MAX_SHARDS: usize = 256;
/// Bytes of offered rows a cache keeps aside while readers hold it (at least one row).
const DEFERRED_BYTES: usize = 256 * 1024;
/// Bytes of a row [`RowCache::get`] copies onto its stack.
const STACK_BYTES: usize = 512;
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
    /// Readers held the cache: the row is kept aside and offered when the cache is next free.
    Deferred,
}

/// A row's set and tag, worked out once by [`Reader::locate`]: give it to [`Reader::probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Set {
    /// The set's number: its slots start at `order × ways`, its tags at word
    /// `order × tag_words`.
    order: u32,
    tag: u8,
}

impl Set {
    /// No set: a row skipped, or a cache with none.
    pub const NONE: Set = Set {
        order: u32::MAX,
        tag: 0,
    };

    /// The set's number: rows with the same one share the set.
    pub fn number(self) -> usize {
        self.order as usize
    }
}

/// Where [`Reader::probe`] found a slot whose tag is the row's: read it with [`Reader::read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    set: Set,
    way: u32,
}

impl Slot {
    /// No slot: the set had no way with the row's tag.
    pub const NONE: Slot = Slot {
        set: Set::NONE,
        way: 0,
    };
}

/// Where `row` lives in a cache of `sets` sets (`None` when it has none): placed by number
/// (`by_number`: row `r` in set `r >> shift`) or hashed by one multiplication, whose high bits
/// pick the set and middle bits the tag. Writers' and readers' one way of finding a row's set.
#[inline(always)]
fn place(row: u64, sets: usize, seed: u64, by_number: Option<u32>) -> Option<Set> {
    if sets == 0 {
        return None;
    }
    let (order, tag) = match by_number {
        // a row beyond those it was told of (outside the contract) is hashed
        Some(shift) if row >> shift < sets as u64 => ((row >> shift) as usize, row as u8),
        _ => {
            let h = fibonacci(row ^ seed);
            (scale(h, sets), (h >> 32) as u8)
        }
    };
    Some(Set {
        order: order as u32,
        tag: tag.max(1),
    })
}

/// The high bit of each zero byte of `x`, exactly (no false positives from borrows).
#[inline(always)]
fn zero_bytes(x: u64) -> u64 {
    !(((x & LOW_7_BITS) + LOW_7_BITS) | x | LOW_7_BITS)
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
    /// Words a row's place takes (`row_bytes` rounded up to 8 bytes).
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
    /// end first); slot `i`'s head at word `HEAD_WORDS × i` of `heads` (key, mark); its row at
    /// word `i × words` of `data`. One buffer each, so that large caches sit on huge pages: a
    /// hit on 4 KiB pages misses the TLB as well as the cache. Tags and heads are only ever
    /// accessed through atomics; rows are written only under the write lock and read only
    /// under a read lock.
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
        // The bounds every access relies on: a set's number is below `sets`, so its slots end
        // at or before `slots` and its tag words at or before `sets × tag_words`; `heads` has
        // HEAD_WORDS words per slot and `data` `words` per slot; a shard (a number's low bits
        // under `shard_mask`) is below `shards`.
        Self {
            row_bytes,
            words,
            ways,
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
        let at = HEAD_WORDS * slot;
        // SAFETY: `heads` has HEAD_WORDS words per slot and slot < slots (the contract)
        unsafe { [Self::word(&self.heads, at), Self::word(&self.heads, at + 1)] }
    }

    fn key(&self, slot: usize) -> u64 {
        self.head(slot)[0].load(Ordering::Relaxed)
    }

    /// Where `row` lives: its set and tag (see [`place`]).
    #[inline(always)]
    fn locate(&self, row: u64) -> Option<Set> {
        place(row, self.sets, self.config.seed, self.by_number)
    }

    /// The first way at or after `from` of `set` (whose number is below `sets`) whose tag is
    /// the set's, compared eight at a time.
    #[inline(always)]
    fn tagged(&self, set: Set, from: usize) -> Option<usize> {
        debug_assert!((set.order as usize) < self.sets);
        let first = set.order as usize * self.tag_words;
        let wanted = LOW_BYTES * u64::from(set.tag);
        for w in from / 8..self.tag_words {
            // SAFETY: first + tag_words ≤ sets × tag_words (the set's number is below `sets`)
            let tags = unsafe { Self::word(&self.tags, first + w) }.load(Ordering::Relaxed);
            // bytes equal to the tag become 0
            let x = tags ^ wanted;
            let mut zero = zero_bytes(x);
            if w == from / 8 {
                zero &= u64::MAX << (from % 8 * 8);
            }
            if zero != 0 {
                return Some(w * 8 + zero.trailing_zeros() as usize / 8);
            }
        }
        None
    }

    /// Slot `slot`'s row (`slot` below `slots`): a pointer only, nothing read.
    #[inline(always)]
    fn row_ptr(&self, slot: usize) -> *const u8 {
        debug_assert!(slot < self.slots);
        self.data
            .as_slice()
            .as_ptr()
            .wrapping_add(slot * self.words * 8)
    }

    /// Marks a hit of a slot of `set` (`LFU`: the policy counts hits).
    #[inline(always)]
    fn mark<const LFU: bool>(&self, set: Set, mark: &AtomicU64) {
        if LFU {
            // a hit count: 2^64 hits are never reached
            mark.store(
                mark.load(Ordering::Relaxed).wrapping_add(1),
                Ordering::Relaxed,
            );
        } else {
            // SAFETY: shard_mask < clocks.len() (see `new`)
            let clock = unsafe {
                self.clocks
                    .get_unchecked(set.order as usize & self.shard_mask)
            };
            let now = clock.0.load(Ordering::Relaxed) + 1;
            clock.0.store(now, Ordering::Relaxed);
            mark.store(now, Ordering::Relaxed);
        }
    }

    /// Looks `row` up; on a hit, calls `read` with a copy of its bytes (taken with the cache
    /// held, called with it free) and counts the hit. Rows are below `u64::MAX`.
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
            found[0].map(|bytes| copy.copy_from_slice(bytes)).is_some()
        };
        self.count(u64::from(hit), u64::from(!hit));
        hit.then(|| read(copy))
    }

    /// The rows cached now, in no order (what warms another cache for the same table).
    pub fn rows(&self) -> Vec<u64> {
        (0..self.slots)
            .map(|i| self.key(i))
            .filter(|&k| k != EMPTY)
            .map(|k| k - 1)
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
        let slot = set.order as usize * self.ways + way;
        let [stored, _] = self.head(slot);
        // SAFETY: the slot's bytes lie inside `data` (`write_shared` checks); the write lock
        // keeps every reader out, and every other writer waits for it
        unsafe { self.data.write_shared(slot * self.words * 8, bytes) };
        stored.store(key, Ordering::Relaxed);
        let tags = set.order as usize * self.tag_words + way / 8;
        // SAFETY: inside the set's tag words (way < ways)
        let word = unsafe { Self::word(&self.tags, tags) };
        let shift = way % 8 * 8;
        let old = word.load(Ordering::Relaxed) & !(0xff << shift);
        word.store(old | u64::from(tag) << shift, Ordering::Relaxed);
    }

    /// The way of `row` in `set`, if it holds it.
    fn way_of(&self, set: Set, row: u64) -> Option<usize> {
        let base = set.order as usize * self.ways;
        (0..self.ways).find(|&w| self.key(base + w) == row + 1)
    }

    /// The first free way of `set`.
    fn free_way(&self, set: Set) -> Option<usize> {
        let base = set.order as usize * self.ways;
        (0..self.ways).find(|&w| self.key(base + w) == EMPTY)
    }

    /// Replaces `row`'s bytes if it is cached (a live store's compaction: the row changed
    /// below); returns whether it was. Waits for the readers in; rows kept aside are written
    /// first, so an older copy of the row never lands after it. Neither a hit nor an
    /// admission: no counter moves.
    pub fn replace(&self, row: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        let Some(set) = self.locate(row) else {
            return false;
        };
        let replaced = {
            let mut draws = self.write_lock();
            self.drain(&mut draws);
            let way = self.way_of(set, row);
            way.inspect(|&way| self.write(set, way, row + 1, set.tag, bytes))
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
        let base = set.order as usize * self.ways;
        let (way, evicted) = match self.free_way(set) {
            Some(way) => (way, None),
            None => {
                if self.config.policy.probabilistic() {
                    *draws += 1;
                    let draw = mix(self.config.seed ^ mix(u64::from(set.order)) ^ *draws);
                    if draw >= self.admit_below {
                        CacheStats::add(&self.stats.rejections, 1);
                        return Offer::Rejected;
                    }
                }
                let way = (0..self.ways)
                    .min_by_key(|&w| self.head(base + w)[1].load(Ordering::Relaxed))
                    .expect("a set has at least one way");
                (way, Some(self.key(base + way) - 1))
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
        let clock = &self.clocks[set.order as usize & self.shard_mask].0;
        let now = clock.load(Ordering::Relaxed) + 1;
        clock.store(now, Ordering::Relaxed);
        let mark = if self.config.policy.frequency() {
            1
        } else {
            now
        };
        self.head(set.order as usize * self.ways + way)[1].store(mark, Ordering::Relaxed);
        self.write(set, way, row + 1, set.tag, bytes);
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

    /// Works out each row's set and tag ([`Set::NONE`] for a row of [`SKIP`], or when the
    /// cache has no sets) and asks for the set's tags: what [`Self::probe`] reads.
    #[inline]
    pub fn locate(&self, rows: &[u64], sets: &mut [Set]) {
        let c = self.cache;
        // the fields a step reads, in locals: stores into `sets` cannot be seen to leave them be
        let (n, seed, by_number) = (c.sets, c.config.seed, c.by_number);
        let (tags, tag_bytes) = (c.tags.as_slice().as_ptr(), c.tag_words * 8);
        for (&row, set) in rows.iter().zip(sets) {
            *set = match row {
                SKIP => Set::NONE,
                row => place(row, n, seed, by_number).unwrap_or(Set::NONE),
            };
            // a hint: a prefetch never faults, and nothing is read here
            let at = tags.wrapping_add(set.order as usize * tag_bytes);
            prefetch_line(at);
            prefetch_line(at.wrapping_add(tag_bytes - 1));
        }
    }

    /// Finds the first slot of each set whose tag is its row's ([`Slot::NONE`] if none, or
    /// for a set beyond this cache) and asks for its head and row: what [`Self::read`] reads.
    #[inline]
    pub fn probe(&self, sets: &[Set], slots: &mut [Slot]) {
        let c = self.cache;
        let (n, ways, tag_words) = (c.sets, c.ways, c.tag_words);
        let tags = c.tags.as_slice().as_ptr().cast::<AtomicU64>();
        let heads = c.heads.as_slice().as_ptr();
        let (data, stride, row_bytes) = (c.data.as_slice().as_ptr(), c.words * 8, c.row_bytes);
        for (&set, slot) in sets.iter().zip(slots) {
            *slot = Slot::NONE;
            if set.order as usize >= n {
                continue;
            }
            let first = set.order as usize * tag_words;
            let wanted = LOW_BYTES * u64::from(set.tag);
            let mut way = None;
            for w in 0..tag_words {
                // SAFETY: first + w < (order + 1) × tag_words ≤ sets × tag_words, the tags'
                // words; accessed only through atomics
                let word = unsafe { &*tags.add(first + w) }.load(Ordering::Relaxed);
                let zero = zero_bytes(word ^ wanted);
                if zero != 0 {
                    way = Some(w * 8 + zero.trailing_zeros() as usize / 8);
                    break;
                }
            }
            let Some(way) = way else {
                continue;
            };
            let i = set.order as usize * ways + way;
            // pointers only: nothing is read here
            prefetch_line(heads.wrapping_add(HEAD_WORDS * 8 * i));
            prefetch_row(data.wrapping_add(i * stride), row_bytes);
            *slot = Slot {
                set,
                way: way as u32,
            };
        }
    }

    /// Sets `found[i]` to row `rows[i]`'s bytes where `slots[i]` holds it (or, when that
    /// slot's tag was another row's too, the set's next way with the tag does), and marks the
    /// hit; leaves the others as they are, and skips a lookup already found (`found[i]` is
    /// `Some`) or of [`SKIP`]. Returns the hits.
    #[inline]
    pub fn read<'r>(&'r self, slots: &[Slot], rows: &[u64], found: &mut [Option<&'r [u8]>]) -> u64 {
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
        found: &mut [Option<&'r [u8]>],
    ) -> u64 {
        let c = self.cache;
        let (n, ways, mask) = (c.sets, c.ways, c.shard_mask);
        let heads = c.heads.as_slice().as_ptr().cast::<AtomicU64>();
        let (data, stride, row_bytes) = (c.data.as_slice().as_ptr(), c.words * 8, c.row_bytes);
        let clocks = c.clocks.as_ptr();
        let mut hits = 0;
        for ((&at, &row), found) in slots.iter().zip(rows).zip(found) {
            let (set, way, key) = (at.set, at.way as usize, row.wrapping_add(1));
            if found.is_some() || row == SKIP || set.order as usize >= n || way >= ways {
                continue;
            }
            let slot = set.order as usize * ways + way;
            // SAFETY: slot < sets × ways = slots (checked above): its head's words lie inside
            // `heads`, accessed only through atomics
            let (stored, mark) = unsafe {
                (
                    &*heads.add(HEAD_WORDS * slot),
                    &*heads.add(HEAD_WORDS * slot + 1),
                )
            };
            if stored.load(Ordering::Relaxed) != key {
                if let Some(bytes) = self.row_in_other_ways::<LFU>(set, way, key) {
                    *found = Some(bytes);
                    hits += 1;
                }
                continue;
            }
            if LFU {
                // a hit count: 2^64 hits are never reached
                mark.store(
                    mark.load(Ordering::Relaxed).wrapping_add(1),
                    Ordering::Relaxed,
                );
            } else {
                // SAFETY: order & shard_mask < clocks (see `RowCache::new`)
                let clock = unsafe { &(*clocks.add(set.order as usize & mask)).0 };
                let now = clock.load(Ordering::Relaxed) + 1;
                clock.store(now, Ordering::Relaxed);
                mark.store(now, Ordering::Relaxed);
            }
            // SAFETY: slot < slots, so its `stride ≥ row_bytes` bytes lie inside `data`;
            // writers write rows only under the write lock, which this reader's read lock keeps
            // out for as long as the bytes are borrowed (`'r`, no longer than `self`)
            *found =
                Some(unsafe { std::slice::from_raw_parts(data.add(slot * stride), row_bytes) });
            hits += 1;
        }
        hits
    }

    /// A read on from `way`, whose tag was another row's too: the set's next ways with the tag.
    #[cold]
    fn row_in_other_ways<const LFU: bool>(
        &self,
        set: Set,
        mut way: usize,
        key: u64,
    ) -> Option<&[u8]> {
        let c = self.cache;
        while let Some(next) = c.tagged(set, way + 1) {
            way = next;
            let slot = set.order as usize * c.ways + way;
            let [stored, mark] = c.head(slot);
            if stored.load(Ordering::Relaxed) == key {
                c.mark::<LFU>(set, mark);
                // SAFETY: slot < slots (`tagged` finds only ways below `ways`)
                return Some(unsafe { self.bytes(slot) });
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
        // SAFETY: slot < slots (the contract), so its `words × 8 ≥ row_bytes` bytes lie inside
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
