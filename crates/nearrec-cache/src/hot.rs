//! The hot partition (RecSSD's static partitioning): rows picked ahead of time from a profiled
//! trace, pinned in DRAM for the engine's life, read without locks.

use rustc_hash::FxHashMap;

/// Pinned rows of one table, in their stored encoding.
#[derive(Debug, Default)]
pub struct HotPartition {
    slot_of: FxHashMap<u64, u32>,
    data: Vec<u8>,
    row_bytes: usize,
}

/// Bytes of index per pinned row (hash-map entry with its control byte, rounded up).
const INDEX_BYTES: u64 = 16;

impl HotPartition {
    /// Pins `rows` (distinct), whose bytes `fill` writes: it gets the rows in order and a buffer
    /// of `rows.len() × row_bytes` bytes.
    pub fn new<E>(
        rows: &[u64],
        row_bytes: usize,
        fill: impl FnOnce(&[u64], &mut [u8]) -> Result<(), E>,
    ) -> Result<Self, E> {
        let mut data = vec![0u8; rows.len() * row_bytes];
        fill(rows, &mut data)?;
        let slot_of = rows
            .iter()
            .enumerate()
            .map(|(i, &r)| (r, i as u32))
            .collect();
        Ok(Self {
            slot_of,
            data,
            row_bytes,
        })
    }

    /// What pinning `rows` rows of `row_bytes` bytes costs.
    pub fn bytes_for(rows: u64, row_bytes: usize) -> u64 {
        rows * (row_bytes as u64 + INDEX_BYTES)
    }

    pub fn rows(&self) -> usize {
        self.slot_of.len()
    }

    pub fn bytes(&self) -> u64 {
        Self::bytes_for(self.rows() as u64, self.row_bytes)
    }

    /// `row`'s bytes, if pinned, its cache lines asked for (a later read finds them near).
    pub fn get_prefetched(&self, row: u64) -> Option<&[u8]> {
        let bytes = self.get(row)?;
        nearrec_kernels::prefetch_row(bytes.as_ptr(), bytes.len());
        Some(bytes)
    }

    /// `row`'s bytes, if pinned.
    pub fn get(&self, row: u64) -> Option<&[u8]> {
        let slot = *self.slot_of.get(&row)? as usize;
        Some(&self.data[slot * self.row_bytes..][..self.row_bytes])
    }
}
