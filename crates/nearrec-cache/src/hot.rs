//! The hot partition (RecSSD's static partitioning): rows picked ahead of time from a profiled
//! trace, pinned in DRAM for the engine's life, read without locks.
//!
//! Pinned rows sit back to back; an open-addressing index (linear probing, at most half full)
//! maps a row id to its place. The index is this type's own so that a lookup's probe can be
//! prefetched a few lookups ahead ([`HotPartition::prefetch`]): a hash map's probe is a cache
//! miss the caller cannot overlap.

use nearrec_format::AlignedBuf;
use nearrec_kernels::prefetch_row;

use crate::hash::{fibonacci, scale};

/// One index entry: `row + 1` (0: empty) and the row's place among the pinned rows.
#[derive(Debug, Clone, Copy, Default)]
#[repr(C, packed)]
struct Entry {
    key: u64,
    place: u32,
}

/// Index entries per pinned row: the index is at most half full.
const ENTRIES_PER_ROW: usize = 2;
/// Bytes of index per pinned row.
const INDEX_BYTES: u64 = (ENTRIES_PER_ROW * std::mem::size_of::<Entry>()) as u64;

/// Where a row's probe of the index starts, worked out once by [`HotPartition::prefetch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Home(usize);

/// Pinned rows of one table, in their stored encoding.
#[derive(Debug, Default)]
pub struct HotPartition {
    /// `[Entry]`, in a buffer of its own so that a large index sits on huge pages (a probe on
    /// 4 KiB pages misses the TLB as well as the cache).
    index: AlignedBuf,
    /// Entries in `index`.
    slots: usize,
    data: AlignedBuf,
    row_bytes: usize,
    rows: usize,
}

impl HotPartition {
    /// Pins `rows` (distinct, below `u64::MAX`, fewer than 2^32), whose bytes `fill` writes: it
    /// gets the rows in order and a buffer of `rows.len() × row_bytes` bytes.
    pub fn new<E>(
        rows: &[u64],
        row_bytes: usize,
        fill: impl FnOnce(&[u64], &mut [u8]) -> Result<(), E>,
    ) -> Result<Self, E> {
        let mut data = AlignedBuf::zeroed(rows.len() * row_bytes);
        fill(rows, data.as_mut_slice())?;
        let slots = (rows.len() * ENTRIES_PER_ROW).max(1);
        let mut hot = Self {
            index: AlignedBuf::zeroed(slots * std::mem::size_of::<Entry>()),
            slots,
            data,
            row_bytes,
            rows: rows.len(),
        };
        for (place, &row) in rows.iter().enumerate() {
            let mut i = hot.home(row);
            while hot.entries()[i].key != 0 && hot.entries()[i].key != row + 1 {
                i = hot.next(i);
            }
            hot.entries_mut()[i] = Entry {
                key: row + 1,
                place: place as u32,
            };
        }
        Ok(hot)
    }

    fn entries(&self) -> &[Entry] {
        // SAFETY: `index` holds `slots` entries, zeroed (empty) or written by `entries_mut`;
        // Entry is packed (alignment 1) and every bit pattern is one
        unsafe { std::slice::from_raw_parts(self.index.as_slice().as_ptr().cast(), self.slots) }
    }

    fn entries_mut(&mut self) -> &mut [Entry] {
        // SAFETY: as in `entries`, and exclusive through `&mut self`
        unsafe {
            std::slice::from_raw_parts_mut(
                self.index.as_mut_slice().as_mut_ptr().cast(),
                self.slots,
            )
        }
    }

    /// Bytes of bookkeeping per pinned row beside the row itself.
    pub const ROW_OVERHEAD: u64 = INDEX_BYTES;

    /// What pinning `rows` rows of `row_bytes` bytes costs: the rows and their index.
    pub fn bytes_for(rows: u64, row_bytes: usize) -> u64 {
        rows * (row_bytes as u64 + INDEX_BYTES)
    }

    /// Bytes of each row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn bytes(&self) -> u64 {
        Self::bytes_for(self.rows as u64, self.row_bytes)
    }

    /// `row`'s bytes, if pinned.
    pub fn get(&self, row: u64) -> Option<&[u8]> {
        let at = self.place(row)? * self.row_bytes;
        Some(&self.data.as_slice()[at..][..self.row_bytes])
    }

    /// The pinned rows, in no order.
    pub fn row_ids(&self) -> Vec<u64> {
        self.entries()
            .iter()
            .filter(|e| e.key != 0)
            .map(|e| e.key - 1)
            .collect()
    }

    /// Where `row` sits among the pinned rows, if pinned.
    fn place(&self, row: u64) -> Option<usize> {
        self.place_from(Home(self.home(row)), row)
    }

    /// [`Self::place`] from `row`'s home (worked out by [`Self::prefetch`]).
    #[inline(always)]
    fn place_from(&self, Home(mut i): Home, row: u64) -> Option<usize> {
        if i >= self.slots {
            // another partition's home
            return None;
        }
        let entries = self.index.as_slice().as_ptr().cast::<Entry>();
        loop {
            // SAFETY: i < slots (checked above, kept by `next`); the index holds `slots`
            // entries, every bit pattern one (see `entries`); read unaligned (packed)
            let Entry { key, place } = unsafe { entries.add(i).read_unaligned() };
            if key == 0 {
                return None;
            }
            if key == row.wrapping_add(1) {
                return Some(place as usize);
            }
            i = self.next(i);
        }
    }

    /// Overwrites `row`'s bytes if it is pinned (a live store's compaction); returns whether it
    /// was.
    ///
    /// # Safety
    /// No reader reads `row` from this partition meanwhile (see
    /// [`AlignedBuf::write_shared`]).
    pub unsafe fn overwrite(&self, row: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), self.row_bytes, "row of the wrong size");
        let Some(place) = self.place(row) else {
            return false;
        };
        // SAFETY: the caller's contract
        unsafe { self.data.write_shared(place * self.row_bytes, bytes) };
        true
    }

    /// As [`Self::get`] from `row`'s home ([`Self::prefetch`]), and asks for the row's cache
    /// lines (a read soon after finds them near).
    #[inline]
    pub fn get_prefetched(&self, home: Home, row: u64) -> Option<&[u8]> {
        let at = self.place_from(home, row)? * self.row_bytes;
        // SAFETY: a place is below `rows`, and `data` holds `rows × row_bytes` bytes
        let bytes = unsafe { self.data.as_slice().get_unchecked(at..at + self.row_bytes) };
        prefetch_row(bytes.as_ptr(), bytes.len());
        Some(bytes)
    }

    /// Works out where a [`Self::get_prefetched`] of `row` starts, and asks for that index
    /// line. Reads nothing.
    #[inline]
    pub fn prefetch(&self, row: u64) -> Home {
        let home = self.home(row);
        let entry = self
            .index
            .as_slice()
            .as_ptr()
            .wrapping_add(home * size_of::<Entry>());
        prefetch_row(entry, size_of::<Entry>());
        Home(home)
    }

    /// Where `row`'s probe starts: the hash scaled onto the index (no power-of-two size needed).
    #[inline(always)]
    fn home(&self, row: u64) -> usize {
        scale(fibonacci(row), self.slots)
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots { 0 } else { i + 1 }
    }
}
