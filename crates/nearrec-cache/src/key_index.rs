//! The DRAM index of a keyed table whose rows live elsewhere (its file, on SSD or whole in DRAM):
//! raw 64-bit keys to row numbers, at 64 bytes per five keys.
//!
//! Buckets are one cache line each — five keys, their five rows (`u32`) and an overflow flag —
//! probed linearly from the bucket the key hashes to, so a lookup reads one line almost always
//! (FBGEMM's and Aerospike's indexes cost 16–64 bytes a key; this one is
//! [`KeyIndex::bytes_per_key`], at most 15.1 at its fullest). A slot is empty when its row is
//! 0 (a keyed table's row 0 is its zero row, never a key's), so the buckets are one zeroed
//! buffer on huge pages when large (a probe of a 4 KiB-paged index of hundreds of MiB would
//! miss the TLB as well as the cache). A bucket's overflow flag is set when an insert passed it full, and a lookup goes
//! on to the next bucket only past a flagged one, and never further than any insert went; a
//! removal empties its slot and leaves the flags (cleared when the index is rebuilt), so every
//! key stays reachable. Keys are hashed with a seed
//! drawn per index, so keys chosen to collide cannot lengthen the probes of a served store.
//!
//! A batch of lookups prefetches the bucket of the key a few positions ahead, so their cache
//! misses overlap (as the kernels do for rows).

use std::hash::BuildHasher;

use nearrec_format::AlignedBuf;

use crate::hash::{mix, scale};

/// Keys per bucket.
const WAYS: usize = 5;
/// A slot without a key.
const EMPTY: u32 = 0;
/// The most rows an index addresses (row numbers are `u32`, and 0 marks an empty slot).
pub const MAX_ROWS: u64 = u32::MAX as u64;
/// What [`KeyIndex::get_many`] gives a key the index does not hold.
pub const MISSING: u32 = EMPTY;
/// Keys ahead of the one probed whose bucket is prefetched.
const AHEAD: usize = 8;
/// The fullest an index is sized to be, in keys per 100 slots.
const LOAD_PERCENT: u64 = 85;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    keys: [u64; WAYS],
    rows: [u32; WAYS],
    /// Non-zero: an insert found this bucket full and went on.
    overflow: u32,
}

const _: () = assert!(size_of::<Bucket>() == 64);

// SAFETY: plain integers with no padding between or after them (64 bytes, checked above):
// every bit pattern is a bucket, all zeros the empty one.
unsafe impl bytemuck::Zeroable for Bucket {}
// SAFETY: as above; `Copy` and `'static`.
unsafe impl bytemuck::Pod for Bucket {}

/// What inserting a key found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// The key was new.
    New,
    /// The key was there already, with this row (left as it was).
    Present(u32),
}

/// Raw keys to row numbers (see the module docs).
pub struct KeyIndex {
    /// The buckets' memory (`[Bucket]`, see [`KeyIndex::buckets`]).
    memory: AlignedBuf,
    seed: u64,
    len: u64,
    /// The most buckets any insert went past its key's home: no probe needs to go further.
    longest: usize,
}

impl std::fmt::Debug for KeyIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyIndex")
            .field("keys", &self.len)
            .field("buckets", &self.buckets().len())
            .finish()
    }
}

impl KeyIndex {
    /// Buckets an index sized for `keys` keys has.
    fn buckets_for(keys: u64) -> u64 {
        (keys * 100).div_ceil(WAYS as u64 * LOAD_PERCENT).max(1)
    }

    /// The DRAM an index sized for `keys` keys takes: what a budget is checked against before
    /// one is built.
    pub fn bytes_for(keys: u64) -> u64 {
        Self::buckets_for(keys) * size_of::<Bucket>() as u64
    }

    /// An empty index with room for `keys` keys at its intended load (it takes more and stays
    /// correct, with longer probes: it never grows by itself).
    pub fn with_capacity(keys: u64) -> Self {
        Self::with_seed(keys, Self::random_seed())
    }

    /// [`Self::with_capacity`], or `None` when the memory cannot be had.
    pub fn try_with_capacity(keys: u64) -> Option<Self> {
        let memory = AlignedBuf::try_zeroed(usize::try_from(Self::bytes_for(keys)).ok()?)?;
        Some(Self::over(memory, Self::random_seed()))
    }

    /// [`Self::with_capacity`] with a given hash seed (tests that need one layout).
    pub fn with_seed(keys: u64, seed: u64) -> Self {
        Self::over(AlignedBuf::zeroed(Self::bytes_for(keys) as usize), seed)
    }

    /// An empty index in `memory` (zeroed, whole buckets long).
    fn over(memory: AlignedBuf, seed: u64) -> Self {
        Self {
            memory,
            seed,
            len: 0,
            longest: 0,
        }
    }

    fn random_seed() -> u64 {
        std::collections::hash_map::RandomState::new().hash_one(0x6b65_7973u64)
    }

    fn buckets(&self) -> &[Bucket] {
        // the buffer is aligned past 64 bytes and whole buckets long
        bytemuck::cast_slice(self.memory.as_slice())
    }

    fn buckets_mut(&mut self) -> &mut [Bucket] {
        bytemuck::cast_slice_mut(self.memory.as_mut_slice())
    }

    /// Keys held.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// DRAM taken.
    pub fn bytes(&self) -> u64 {
        self.memory.len() as u64
    }

    /// DRAM taken per key held (`∞` for an empty index).
    pub fn bytes_per_key(&self) -> f64 {
        self.bytes() as f64 / self.len as f64
    }

    /// Keys the index holds before it is fuller than it was sized for.
    pub fn capacity(&self) -> u64 {
        (self.buckets().len() * WAYS) as u64 * LOAD_PERCENT / 100
    }

    fn home(&self, key: u64) -> usize {
        scale(mix(key ^ self.seed), self.buckets().len())
    }

    fn next(&self, b: usize) -> usize {
        if b + 1 == self.buckets().len() {
            0
        } else {
            b + 1
        }
    }

    /// The row of `key`, if the index holds it.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        self.find(self.home(key), key)
            .map(|(b, w)| self.buckets()[b].rows[w])
    }

    /// Where `key` sits (bucket, way), probing from its home bucket `b`. A probe ends at an
    /// unflagged bucket, or past the furthest any insert went (flags outlive the removals that
    /// could clear them).
    #[inline]
    fn find(&self, mut b: usize, key: u64) -> Option<(usize, usize)> {
        let buckets = self.buckets();
        for _ in 0..=self.longest {
            let bucket = &buckets[b];
            // all five compared, then the first match taken: no branch per way
            let hit = (0..WAYS).fold(WAYS, |at, w| {
                if at == WAYS && bucket.keys[w] == key && bucket.rows[w] != EMPTY {
                    w
                } else {
                    at
                }
            });
            if hit < WAYS {
                return Some((b, hit));
            }
            if bucket.overflow == 0 {
                return None;
            }
            b = self.next(b);
        }
        None
    }

    /// Rows of `keys` into `rows` ([`MISSING`] for a key not held), each key hashed once and
    /// its bucket asked for `AHEAD` keys before it is probed, so that the misses overlap.
    pub fn get_many(&self, keys: &[u64], rows: &mut [u32]) {
        assert_eq!(keys.len(), rows.len(), "one row per key");
        let mut homes = [0usize; AHEAD];
        let buckets = self.buckets();
        let fetch = |key: u64| {
            let h = self.home(key);
            let p: *const Bucket = &buckets[h];
            nearrec_kernels::prefetch_row(p.cast(), size_of::<Bucket>());
            h
        };
        for (h, &key) in homes.iter_mut().zip(keys) {
            *h = fetch(key);
        }
        for (i, (&key, row)) in keys.iter().zip(rows.iter_mut()).enumerate() {
            let home = homes[i % AHEAD];
            if let Some(&ahead) = keys.get(i + AHEAD) {
                homes[i % AHEAD] = fetch(ahead);
            }
            *row = self
                .find(home, key)
                .map_or(MISSING, |(b, w)| buckets[b].rows[w]);
        }
    }

    /// Adds `key` with `row` (`1..=MAX_ROWS`: 0 marks an empty slot); a key already held keeps
    /// its row. Refuses
    /// (`Err`, nothing changed) to fill the last free slot, so that an insert always finds one.
    pub fn insert(&mut self, key: u64, row: u32) -> Result<Inserted, Full> {
        assert!(row != EMPTY, "row 0 is the empty mark");
        if let Some(r) = self.get(key) {
            return Ok(Inserted::Present(r));
        }
        if self.len + 1 >= (self.buckets().len() * WAYS) as u64 {
            return Err(Full { keys: self.len });
        }
        let mut b = self.home(key);
        for passed in 0.. {
            let next = self.next(b);
            let bucket = &mut self.buckets_mut()[b];
            if let Some(w) = bucket.rows.iter().position(|&r| r == EMPTY) {
                bucket.keys[w] = key;
                bucket.rows[w] = row;
                self.len += 1;
                self.longest = self.longest.max(passed);
                return Ok(Inserted::New);
            }
            bucket.overflow = 1;
            b = next;
        }
        unreachable!("a free slot is left")
    }

    /// Removes `key`; its row, if it was held.
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        let (b, w) = self.find(self.home(key), key)?;
        self.len -= 1;
        Some(std::mem::replace(&mut self.buckets_mut()[b].rows[w], EMPTY))
    }

    /// Every `(key, row)` held, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.buckets().iter().flat_map(|b| {
            (0..WAYS)
                .filter(move |&w| b.rows[w] != EMPTY)
                .map(move |w| (b.keys[w], b.rows[w]))
        })
    }
}

/// An index refused a key: one more would leave no free slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the key index is full at {keys} keys")]
pub struct Full {
    pub keys: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_at_its_load_costs_at_most_16_bytes_a_key() {
        for n in [1u64, 5, 1000, 1 << 20] {
            let mut ix = KeyIndex::with_capacity(n);
            for k in 0..n {
                ix.insert(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), k as u32 + 1)
                    .unwrap();
            }
            if n >= 1000 {
                assert!(ix.bytes_per_key() <= 15.2, "{n}: {}", ix.bytes_per_key());
            }
            assert!(ix.capacity() >= n);
            for k in 0..n {
                assert_eq!(
                    ix.get(k.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                    Some(k as u32 + 1)
                );
            }
        }
    }

    #[test]
    fn keys_past_its_size_still_go_in_until_one_slot_is_left() {
        let mut ix = KeyIndex::with_seed(4, 7);
        let slots = (ix.buckets().len() * WAYS) as u64;
        for k in 0..slots - 1 {
            assert_eq!(ix.insert(k, k as u32 + 1), Ok(Inserted::New));
        }
        assert_eq!(ix.insert(u64::MAX, 1), Err(Full { keys: slots - 1 }));
        assert_eq!(ix.insert(3, 9), Ok(Inserted::Present(4)));
        for k in 0..slots - 1 {
            assert_eq!(ix.get(k), Some(k as u32 + 1));
        }
        assert_eq!(ix.get(u64::MAX), None);
    }
}
