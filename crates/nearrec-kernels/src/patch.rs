//! Rows that stand in for a table's own in one pooling task: a live store's written and removed
//! rows (`docs/live.md`), gathered before the task from the delta at the task's version. A
//! [`TableView`](crate::TableView) given a patch reads a patched row from it and every other row
//! from the table, so the kernels and their reference twin pool both alike.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Rows by id: each is `row_bytes` of the table's encoding; a removed row is all zero bytes,
/// which every encoding decodes as zeros (int8's scale and bias included).
#[derive(Debug, Clone)]
pub struct RowPatch {
    row_bytes: usize,
    at: HashMap<u64, usize, BuildHasherDefault<RowHasher>>,
    data: Vec<u8>,
    removed: u64,
    /// Positions in the task's indices that read a patched row, when its maker recorded them
    /// ([`Self::read_at`]); empty: not recorded (the kernels look at every index).
    read_at: Vec<usize>,
}

impl RowPatch {
    pub fn new(row_bytes: usize) -> Self {
        Self::with_capacity(row_bytes, 0)
    }

    /// A patch with room for `rows` rows (it grows past them).
    pub fn with_capacity(row_bytes: usize, rows: usize) -> Self {
        Self {
            row_bytes,
            at: HashMap::with_capacity_and_hasher(rows, Default::default()),
            data: Vec::with_capacity(rows * row_bytes),
            removed: 0,
            read_at: Vec::new(),
        }
    }

    /// The positions recorded by [`Self::read_at`].
    pub fn read_positions(&self) -> &[usize] {
        &self.read_at
    }

    /// Records the positions (ascending) of the task's indices that read a patched row: with
    /// every such position recorded, the kernels find them without a look-up per index.
    pub fn read_at(&mut self, positions: Vec<usize>) {
        assert!(positions.is_sorted(), "positions in ascending order");
        self.read_at = positions;
    }

    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// Rows patched.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Removed rows patched (as zero rows).
    pub fn removed(&self) -> u64 {
        self.removed
    }

    /// Row `row` reads as `bytes` (`None`: removed, a zero row). The first patch of a row stands.
    pub fn set(&mut self, row: u64, bytes: Option<&[u8]>) {
        if self.at.contains_key(&row) {
            return;
        }
        let at = self.data.len();
        match bytes {
            Some(b) => {
                assert_eq!(b.len(), self.row_bytes, "a patch row of the table's size");
                self.data.extend_from_slice(b);
            }
            None => {
                self.data.resize(at + self.row_bytes, 0);
                self.removed += 1;
            }
        }
        self.at.insert(row, at);
    }

    /// Whether `row` is patched (as [`Self::get`] without the bytes).
    pub fn contains(&self, row: u64) -> bool {
        self.at.contains_key(&row)
    }

    #[inline]
    pub fn get(&self, row: u64) -> Option<&[u8]> {
        let &at = self.at.get(&row)?;
        Some(&self.data[at..at + self.row_bytes])
    }
}

/// A row id mixed into a hash (splitmix64's finaliser): ids are often dense and sequential.
#[derive(Debug, Default)]
pub struct RowHasher(u64);

impl Hasher for RowHasher {
    fn finish(&self) -> u64 {
        let x = self.0;
        let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
}
