//! Reading the cache for a run of lookups: `Reader`, held once per table per batch, and its
//! three prefetchable steps, `locate` → `probe` → `read`.

use super::*;

/// A hold on a [`RowCache`] for reading, taken once for many lookups (one table's share of a
/// batch): while it lives no slot changes, so a hit's row is read where it lies. Writers keep
/// their rows aside meanwhile, and the last reader to leave writes them.
#[derive(Debug)]
pub struct Reader<'a> {
    pub(super) cache: &'a RowCache,
    /// `None` once let go (in `drop`, before the rows kept aside are written).
    pub(super) held: Option<RwLockReadGuard<'a, u64>>,
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
