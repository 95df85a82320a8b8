//! The delta of one table in a live store (`docs/live.md`): the rows written or removed since
//! its base, each entry tagged with the version (the log sequence number) that made it, so that
//! a lookup at version `v` over a base that holds everything up to `b` reads, per row, the newest
//! entry in `(b, v]`, or the base row when there is none.
//!
//! One writer inserts; any number of readers look up. The entries sit in shards under
//! `RwLock`s, and a **filter** in front of them answers "certainly not in the delta" for almost
//! every row with one relaxed load, so a lookup goes to a shard only for rows that may have been
//! written. The filter is a bit per row when the table is at most eight times the rows the delta
//! is sized for (exact, and small enough to stay in the CPU's caches: every lookup of a live
//! table reads it), else a bit per hashed slot; each word of it belongs to one shard, which sets
//! its bits on insert and recomputes them when rows leave it.
//!
//! A shard keeps its entries in two slabs — versions, and row bytes at a fixed stride — found
//! through an open-addressing index, so where a row's entry lies is arithmetic: a batch of
//! lookups prefetches the index slots ahead, then the entries, and their cache misses overlap
//! (behind a hash map and a box per row they came one after another: a delta hit cost 3–4
//! dependent misses). An entry superseded by a newer one is pruned once no reader at an older
//! version is left (the caller says which is the oldest), so a reader's row is never freed
//! under it; its slot is reused.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use nearrec_kernels::{RowHasher, RowPatch, prefetch_row};

use crate::request::Indices;

mod view;

pub use view::DeltaView;

/// Bytes a delta entry costs beside its row (its version and link, and the index's share, at
/// most half full): what the budget counts.
pub const ENTRY_OVERHEAD: u64 = 48;
const SHARDS: usize = 64;
/// Filter bits per row the delta is sized for (a hashed filter's false positives: about 1 in 8
/// when the delta is full), and the most bits a hashed filter has.
const BITS_PER_ROW: u64 = 8;
const MAX_HASHED_BITS: u64 = 1 << 30;
/// How many lookups ahead a batch prefetches a row's index slot.
const AHEAD: usize = 8;
/// No entry.
const NONE: u32 = u32::MAX;

/// What a delta holds for a row at a version.
#[derive(Debug, PartialEq, Eq)]
pub enum DeltaRow<R> {
    /// Written: the reader's result on the row's bytes.
    Written(R),
    /// Removed: it pools as a zero row.
    Removed,
}

/// One table's delta (see the module docs).
#[derive(Debug)]
pub struct TableDelta {
    row_bytes: usize,
    shards: Box<[RwLock<Shard>]>,
    filter: Filter,
    /// Rows with at least one entry, and entries.
    rows: AtomicU64,
    entries: AtomicU64,
    /// Lookups served from the delta, and those of removed rows (pooled as zero rows).
    served: AtomicU64,
    removed_served: AtomicU64,
}

fn mix(x: u64) -> u64 {
    // splitmix64's finaliser
    let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The filter in front of a delta's map (see the module docs): bit `slot(row)` is set while
/// `row` has entries (and may be set for rows that share its slot).
#[derive(Debug)]
struct Filter {
    words: Box<[AtomicU64]>,
    /// `None`: a bit per row; `Some(mask)`: a bit per hashed slot, `mix(row) & mask`.
    hashed: Option<u64>,
}

impl Filter {
    fn new(rows: u64, capacity: u64) -> Self {
        let want = capacity.saturating_mul(BITS_PER_ROW);
        let (bits, hashed) = if rows <= want {
            (rows, None)
        } else {
            let bits = want.clamp(1 << 15, MAX_HASHED_BITS).next_power_of_two();
            (bits, Some(bits - 1))
        };
        let words = usize::try_from(bits.div_ceil(64)).expect("a filter that fits in memory");
        Self {
            words: (0..words.max(1)).map(|_| AtomicU64::new(0)).collect(),
            hashed,
        }
    }

    #[inline(always)]
    fn slot(&self, row: u64) -> u64 {
        match self.hashed {
            None => row,
            Some(mask) => mix(row) & mask,
        }
    }

    #[inline(always)]
    fn word(&self, row: u64) -> usize {
        // rows past the table (refused by the caller) share the last word
        ((self.slot(row) / 64) as usize).min(self.words.len() - 1)
    }

    #[inline(always)]
    fn get(&self, row: u64) -> bool {
        let bit = 1 << (self.slot(row) % 64);
        self.words[self.word(row)].load(Relaxed) & bit != 0
    }

    /// Sets `row`'s bit; called under the lock of the shard that owns its word.
    fn set(&self, row: u64) {
        self.words[self.word(row)].fetch_or(1 << (self.slot(row) % 64), Release);
    }

    /// After rows `left` left a shard that still holds `kept` (its lock held): the words of the
    /// rows that left, recomputed from the rows kept. A word belongs to one shard, so the store
    /// clears only bits of rows that left — a row kept never reads as absent, not even for an
    /// instant.
    fn recompute(&self, left: Vec<u64>, kept: impl Iterator<Item = u64>) {
        if left.is_empty() {
            return;
        }
        let mut words: HashMap<usize, u64, BuildHasherDefault<RowHasher>> =
            left.iter().map(|&row| (self.word(row), 0)).collect();
        for row in kept {
            if let Some(w) = words.get_mut(&self.word(row)) {
                *w |= 1 << (self.slot(row) % 64);
            }
        }
        for (w, bits) in words {
            self.words[w].store(bits, Release);
        }
    }
}

/// An entry: the version that made it, the row's next older entry (`NONE`: none), and whether
/// it removed the row (its bytes then unused).
#[derive(Debug, Clone, Copy)]
struct Head {
    version: u64,
    older: u32,
    removed: bool,
}

/// One shard's rows: entry `e` is `heads[e]` and the `row_bytes` at `bytes[e * row_bytes..]`;
/// a row's entries are a chain from its newest (in the index) down `older` links.
#[derive(Debug, Default)]
struct Shard {
    /// `(row, newest entry + 1)` at `mix(row)`, linear probing; `(_, 0)`: an empty slot. Its
    /// length is zero or a power of two, and it is at most half full.
    index: Vec<(u64, u32)>,
    rows: usize,
    heads: Vec<Head>,
    bytes: Vec<u8>,
    /// Entries pruned, for reuse.
    free: Vec<u32>,
}

impl Shard {
    /// Where `row`'s probe starts (the index is not empty).
    #[inline(always)]
    fn home(&self, row: u64) -> usize {
        mix(row) as usize & (self.index.len() - 1)
    }

    /// Asks for the index line where `row`'s probe starts.
    #[inline(always)]
    fn prefetch_slot(&self, row: u64) {
        if !self.index.is_empty() {
            let slot = self.index.as_ptr().wrapping_add(self.home(row));
            prefetch_row(slot.cast(), size_of::<(u64, u32)>());
        }
    }

    /// Asks for entry `e`'s lines: its head and its row.
    #[inline(always)]
    fn prefetch_entry(&self, e: u32, row_bytes: usize) {
        let e = e as usize;
        prefetch_row(
            self.heads.as_ptr().wrapping_add(e).cast(),
            size_of::<Head>(),
        );
        prefetch_row(self.bytes.as_ptr().wrapping_add(e * row_bytes), row_bytes);
    }

    /// `row`'s index slot: the one holding it, or the empty one where it would go.
    #[inline]
    fn slot(&self, row: u64) -> usize {
        let mask = self.index.len() - 1;
        let mut at = self.home(row);
        while self.index[at].1 != 0 && self.index[at].0 != row {
            at = (at + 1) & mask;
        }
        at
    }

    /// `row`'s newest entry.
    #[inline]
    fn find(&self, row: u64) -> Option<u32> {
        if self.index.is_empty() {
            return None;
        }
        self.index[self.slot(row)].1.checked_sub(1)
    }

    /// The newest entry from `e` down its older ones made at or before `version`, when it was
    /// made after `base`: `Some` of its row (`None`: removed), or `None` when the base row
    /// stands.
    fn visible(
        &self,
        mut e: u32,
        base: u64,
        version: u64,
        row_bytes: usize,
    ) -> Option<Option<&[u8]>> {
        loop {
            let h = self.heads[e as usize];
            if h.version <= version {
                let at = e as usize * row_bytes;
                return (h.version > base)
                    .then(|| (!h.removed).then(|| &self.bytes[at..at + row_bytes]));
            }
            if h.older == NONE {
                return None;
            }
            e = h.older;
        }
    }

    /// Every row and its newest entry, in no order.
    fn rows(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.index
            .iter()
            .filter(|s| s.1 != 0)
            .map(|&(row, e)| (row, e - 1))
    }

    /// Makes a new entry `row`'s newest — made by `version`, its row `value` (`None`:
    /// removed) — older ones below it; returns its number and whether the row is new here.
    fn push(
        &mut self,
        row_bytes: usize,
        row: u64,
        version: u64,
        value: Option<&[u8]>,
    ) -> (u32, bool) {
        if (self.rows + 1) * 2 > self.index.len() {
            self.grow();
        }
        let at = self.slot(row);
        let (older, fresh) = match self.index[at].1 {
            0 => (NONE, true),
            e => (e - 1, false),
        };
        debug_assert!(fresh || self.heads[older as usize].version <= version);
        let head = Head {
            version,
            older,
            removed: value.is_none(),
        };
        let e = match self.free.pop() {
            Some(e) => {
                self.heads[e as usize] = head;
                e
            }
            None => {
                let e = u32::try_from(self.heads.len())
                    .ok()
                    .filter(|&e| e != NONE)
                    .expect("a delta shard of fewer than 2^32 - 1 entries");
                self.heads.push(head);
                self.bytes.resize(self.bytes.len() + row_bytes, 0);
                e
            }
        };
        if let Some(v) = value {
            let at = e as usize * row_bytes;
            self.bytes[at..at + row_bytes].copy_from_slice(v);
        }
        self.index[at] = (row, e + 1);
        self.rows += usize::from(fresh);
        (e, fresh)
    }

    /// Twice the index (at least 16 slots), every row placed again.
    fn grow(&mut self) {
        let len = (self.index.len() * 2).max(16);
        let old = std::mem::replace(&mut self.index, vec![(0, 0); len]);
        for (row, e) in old.into_iter().filter(|s| s.1 != 0) {
            let at = self.slot(row);
            self.index[at] = (row, e);
        }
    }

    /// Drops the entries below `e` that no reader at `oldest` or later sees: all older than
    /// the newest made at or before `oldest`. Returns how many went.
    fn prune(&mut self, mut e: u32, oldest: u64) -> usize {
        while self.heads[e as usize].version > oldest {
            e = self.heads[e as usize].older;
            if e == NONE {
                return 0;
            }
        }
        let mut next = std::mem::replace(&mut self.heads[e as usize].older, NONE);
        let mut gone = 0;
        while next != NONE {
            self.free.push(next);
            next = self.heads[next as usize].older;
            gone += 1;
        }
        gone
    }
}

impl TableDelta {
    /// A delta for a table of `rows` rows of `row_bytes` bytes, its filter sized for `capacity`
    /// rows in the delta.
    pub fn new(row_bytes: usize, rows: u64, capacity: u64) -> Self {
        Self {
            row_bytes,
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            filter: Filter::new(rows, capacity),
            rows: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            served: AtomicU64::new(0),
            removed_served: AtomicU64::new(0),
        }
    }

    /// Distinct rows per batch served from the delta so far, and how many of them were removed
    /// rows (pooled as zero rows).
    pub fn served(&self) -> (u64, u64) {
        (self.served.load(Relaxed), self.removed_served.load(Relaxed))
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// No row has an entry: a lookup skips the delta.
    pub fn is_empty(&self) -> bool {
        self.rows.load(Relaxed) == 0
    }

    /// Rows with at least one entry.
    pub fn rows(&self) -> u64 {
        self.rows.load(Relaxed)
    }

    /// Bytes the entries cost (rows and bookkeeping).
    pub fn bytes(&self) -> u64 {
        self.entries.load(Relaxed) * (self.row_bytes as u64 + ENTRY_OVERHEAD)
    }

    /// The shard of `row`: the one that owns its filter word.
    fn shard(&self, row: u64) -> usize {
        (mix(self.filter.word(row) as u64) >> 58) as usize % SHARDS
    }

    fn read_shard(&self, shard: usize) -> RwLockReadGuard<'_, Shard> {
        self.shards[shard].read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_shard(&self, shard: usize) -> RwLockWriteGuard<'_, Shard> {
        self.shards[shard]
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `row` may have entries (false: certainly not).
    #[inline]
    pub fn may_hold(&self, row: u64) -> bool {
        self.filter.get(row)
    }

    /// The newest entry of `row` made after `base` and at or before `version`, handed to `read`;
    /// `None` when the base row stands.
    pub fn get<R>(
        &self,
        row: u64,
        base: u64,
        version: u64,
        read: impl FnOnce(&[u8]) -> R,
    ) -> Option<DeltaRow<R>> {
        if !self.may_hold(row) {
            return None;
        }
        let shard = self.read_shard(self.shard(row));
        let e = shard.find(row)?;
        Some(match shard.visible(e, base, version, self.row_bytes)? {
            Some(bytes) => DeltaRow::Written(read(bytes)),
            None => DeltaRow::Removed,
        })
    }

    /// Adds `row`'s entry made by `version` (`None`: removed); `version` must not be older than
    /// any entry before it. Entries a reader at `oldest` or later can no longer see go. Returns
    /// the change in entries (`+1`, or less when some were pruned).
    ///
    /// The caller publishes `version` to readers only after every insert of it (release).
    pub fn insert(&self, version: u64, row: u64, value: Option<&[u8]>, oldest: u64) -> i64 {
        assert!(
            value.is_none_or(|v| v.len() == self.row_bytes),
            "a row of the table's size"
        );
        let mut shard = self.write_shard(self.shard(row));
        let (e, fresh) = shard.push(self.row_bytes, row, version, value);
        let pruned = shard.prune(e, oldest);
        if fresh {
            self.filter.set(row);
            self.rows.fetch_add(1, Relaxed);
        }
        let change = 1 - pruned as i64;
        self.add_entries(change);
        change
    }

    fn add_entries(&self, change: i64) {
        if change >= 0 {
            self.entries.fetch_add(change as u64, Relaxed);
        } else {
            self.entries.fetch_sub(change.unsigned_abs(), Relaxed);
        }
    }

    /// After the base moved to `base` (it now holds every entry up to it), with no reader left
    /// at a version older than `oldest` or on a base older than `oldest_base`: drops the entries
    /// no reader can see any more — those superseded before `oldest`, and those at or before
    /// `base` once every reader reads that base (`oldest_base >= base`). Returns how many went.
    ///
    /// Each shard is rebuilt from the entries it keeps (its memory goes with the rest), one
    /// shard's lock at a time.
    pub fn fold(&self, base: u64, oldest: u64, oldest_base: u64) -> u64 {
        let rb = self.row_bytes;
        let mut gone = 0u64;
        let mut rows_gone = 0u64;
        for s in 0..SHARDS {
            let mut shard = self.write_shard(s);
            let before = shard.heads.len() - shard.free.len();
            let mut kept = Shard::default();
            let mut left = Vec::new();
            let mut chain = Vec::new();
            for (row, newest) in shard.rows() {
                // the entries that stay, newest first: down to the newest a reader at `oldest`
                // sees, less those the base now holds
                chain.clear();
                let mut e = newest;
                while e != NONE {
                    let h = shard.heads[e as usize];
                    if oldest_base < base || h.version > base {
                        chain.push(e);
                    }
                    if h.version <= oldest {
                        break;
                    }
                    e = h.older;
                }
                if chain.is_empty() {
                    left.push(row);
                }
                for &e in chain.iter().rev() {
                    let h = shard.heads[e as usize];
                    let at = e as usize * rb;
                    let value = (!h.removed).then(|| &shard.bytes[at..at + rb]);
                    kept.push(rb, row, h.version, value);
                }
            }
            gone += (before - kept.heads.len()) as u64;
            rows_gone += left.len() as u64;
            self.filter.recompute(left, kept.rows().map(|(row, _)| row));
            *shard = kept;
        }
        self.rows.fetch_sub(rows_gone, Relaxed);
        self.entries.fetch_sub(gone, Relaxed);
        gone
    }

    /// The rows with an entry made after `version` (written or removed since), in no order:
    /// what a cache above the store must drop to follow it.
    pub fn rows_after(&self, version: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for s in 0..SHARDS {
            let shard = self.read_shard(s);
            out.extend(
                shard
                    .rows()
                    .filter(|&(_, e)| shard.heads[e as usize].version > version)
                    .map(|(row, _)| row),
            );
        }
        out
    }

    /// Every row's newest entry at or before `version` and after `base`, in row order: what a
    /// compaction folds into the next base.
    pub fn newest(&self, base: u64, version: u64) -> Vec<(u64, Option<Box<[u8]>>)> {
        let mut out = Vec::new();
        for s in 0..SHARDS {
            let shard = self.read_shard(s);
            out.extend(shard.rows().filter_map(|(row, e)| {
                let value = shard.visible(e, base, version, self.row_bytes)?;
                Some((row, value.map(Box::from)))
            }));
        }
        out.sort_unstable_by_key(|(row, _)| *row);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(byte: u8) -> Vec<u8> {
        vec![byte; 4]
    }

    fn read(d: &TableDelta, r: u64, base: u64, v: u64) -> Option<DeltaRow<Vec<u8>>> {
        d.get(r, base, v, <[u8]>::to_vec)
    }

    #[test]
    fn a_reader_sees_the_newest_entry_of_its_version() {
        let d = TableDelta::new(4, 100, 100);
        assert!(d.is_empty());
        d.insert(3, 7, Some(&row(1)), 0);
        d.insert(5, 7, None, 0);
        d.insert(8, 7, Some(&row(2)), 0);
        assert_eq!(read(&d, 7, 0, 2), None);
        assert_eq!(read(&d, 7, 0, 3), Some(DeltaRow::Written(row(1))));
        assert_eq!(read(&d, 7, 0, 6), Some(DeltaRow::Removed));
        assert_eq!(read(&d, 7, 0, 9), Some(DeltaRow::Written(row(2))));
        // a base that holds version 5 hides the entries up to it
        assert_eq!(read(&d, 7, 5, 6), None);
        assert_eq!(read(&d, 8, 0, 9), None);
        assert_eq!((d.rows(), d.bytes()), (1, 3 * (4 + ENTRY_OVERHEAD)));
    }

    #[test]
    fn entries_no_reader_sees_are_pruned() {
        let d = TableDelta::new(4, 100, 100);
        d.insert(1, 7, Some(&row(1)), 0);
        d.insert(2, 7, Some(&row(2)), 0);
        // the oldest reader is at 2: version 1's entry is invisible to everyone
        assert_eq!(d.insert(3, 7, Some(&row(3)), 2), 0);
        assert_eq!(read(&d, 7, 0, 2), Some(DeltaRow::Written(row(2))));
        assert_eq!(d.bytes(), 2 * (4 + ENTRY_OVERHEAD));
        assert_eq!(d.rows_after(2), [7]);
        assert!(d.rows_after(3).is_empty());
        // the base now holds 3 and every reader reads it: the row leaves the delta
        assert_eq!(d.fold(3, 3, 3), 2);
        assert!(d.is_empty() && !d.may_hold(7));
        assert_eq!(read(&d, 7, 3, 10), None);
    }

    /// What the delta must answer: per row, its whole history.
    #[derive(Debug, Clone)]
    enum Step {
        Write(u64, Option<u8>),
        /// A reader starts (kept until a later `End`).
        Begin,
        End(prop::sample::Index),
        /// Compaction moves the base forward, up to the current version (a compaction folds
        /// what was written before it started; the writer goes on meanwhile).
        Compact(prop::sample::Index),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u64..12, any::<Option<u8>>()).prop_map(|(r, b)| Step::Write(r, b)),
            2 => Just(Step::Begin),
            2 => any::<prop::sample::Index>().prop_map(Step::End),
            1 => any::<prop::sample::Index>().prop_map(Step::Compact),
        ]
    }

    proptest! {
        /// Random writes, readers coming and going and compactions, against a model that keeps
        /// every row's full history: every live reader reads, for every row, exactly what the
        /// model says it saw at its version, and nothing a reader could see is ever pruned.
        #[test]
        fn the_delta_matches_a_full_history(
            steps in prop::collection::vec(step(), 1..80),
            hashed in any::<bool>(),
        ) {
            // a bit per row, or every row in one word of 64 hashed slots (rows share bits)
            let mut d = TableDelta::new(4, 16, 16);
            if hashed {
                d.filter = Filter { words: Box::new([AtomicU64::new(0)]), hashed: Some(63) };
            }
            let mut history: Vec<(u64, u64, Option<u8>)> = Vec::new(); // (version, row, value)
            let mut version = 0u64;
            let mut base = 0u64;
            let mut readers: Vec<(u64, u64)> = Vec::new(); // (base, version)
            let oldest = |readers: &[(u64, u64)], version: u64| {
                readers.iter().map(|r| r.1).min().unwrap_or(version)
            };
            let oldest_base = |readers: &[(u64, u64)], base: u64| {
                readers.iter().map(|r| r.0).min().unwrap_or(base)
            };
            for s in steps {
                match s {
                    Step::Write(r, b) => {
                        version += 1;
                        let o = oldest(&readers, version - 1);
                        d.insert(version, r, b.map(row).as_deref(), o);
                        history.push((version, r, b));
                    }
                    Step::Begin => readers.push((base, version)),
                    Step::End(i) if !readers.is_empty() => {
                        readers.remove(i.index(readers.len()));
                    }
                    Step::End(_) => {}
                    Step::Compact(to) => {
                        base += to.index((version - base + 1) as usize) as u64;
                        d.fold(base, oldest(&readers, version), oldest_base(&readers, base));
                    }
                }
                readers.push((base, version)); // a reader at the newest version, this step only
                for &(b, v) in &readers {
                    for r in 0..12 {
                        let want = history.iter().rev().find(|(hv, hr, _)| *hr == r && *hv <= v);
                        let want = match want {
                            Some((hv, _, value)) if *hv > b => Some(match value {
                                Some(x) => DeltaRow::Written(row(*x)),
                                None => DeltaRow::Removed,
                            }),
                            _ => None,
                        };
                        prop_assert_eq!(read(&d, r, b, v), want, "row {} at base {} version {}", r, b, v);
                    }
                }
                readers.pop();
            }
        }
    }
}
