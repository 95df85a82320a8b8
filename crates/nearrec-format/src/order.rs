//! Row orders: where each row of a co-located table sits in its file.
//!
//! A co-located table stores its rows permuted, so that rows read together (or hot rows) share
//! blocks. The permutation is kept beside the table file as `table-NNNN.order`: `rows`
//! little-endian `u32`s, entry `r` the slot (row position in the file's layout) of row `r`. The
//! manifest names the file and its CRC-32C; readers map row ids through it, so lookups keep their
//! ids. Stores with an order are format version 2, which version-1 readers refuse.

use serde::{Deserialize, Serialize};

/// How the manifest names a table's order file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderMeta {
    /// File name relative to the store directory.
    pub file: String,
    pub crc32c: u32,
}

/// A permutation of a table's rows: `slot(row)` is where `row` is stored.
#[derive(Clone, PartialEq, Eq)]
pub struct RowOrder {
    slot_of: Vec<u32>,
}

impl RowOrder {
    /// The order with row `r` at slot `slot_of[r]`. `Err` says why `slot_of` is not a permutation
    /// of `0..slot_of.len()` (which must fit `u32`).
    pub fn from_slots(slot_of: Vec<u32>) -> Result<Self, String> {
        let n = slot_of.len();
        if n > u32::MAX as usize {
            return Err(format!(
                "{n} rows: co-location supports tables of at most {} rows",
                u32::MAX
            ));
        }
        let mut seen = vec![false; n];
        for (row, &slot) in slot_of.iter().enumerate() {
            match seen.get_mut(slot as usize) {
                None => return Err(format!("row {row} has slot {slot}, past the {n} rows")),
                Some(true) => {
                    return Err(format!("slot {slot} is given to two rows (one is {row})"));
                }
                Some(s) => *s = true,
            }
        }
        Ok(Self { slot_of })
    }

    /// The order that stores `rows_by_slot[s]` at slot `s` (the inverse view).
    pub fn from_rows_by_slot(rows_by_slot: &[u32]) -> Result<Self, String> {
        let mut slot_of = vec![u32::MAX; rows_by_slot.len()];
        for (slot, &row) in rows_by_slot.iter().enumerate() {
            match slot_of.get_mut(row as usize) {
                None => return Err(format!("slot {slot} holds row {row}, past the rows")),
                Some(s) if *s != u32::MAX => {
                    return Err(format!("row {row} is placed twice (again at slot {slot})"));
                }
                Some(s) => *s = slot as u32,
            }
        }
        Self::from_slots(slot_of)
    }

    pub fn rows(&self) -> u64 {
        self.slot_of.len() as u64
    }

    /// The slot of `row` (`row < rows()`).
    #[inline]
    pub fn slot(&self, row: u64) -> u64 {
        u64::from(self.slot_of[row as usize])
    }

    /// The row stored at each slot.
    pub fn rows_by_slot(&self) -> Vec<u32> {
        let mut rows = vec![0u32; self.slot_of.len()];
        for (row, &slot) in self.slot_of.iter().enumerate() {
            rows[slot as usize] = row as u32;
        }
        rows
    }

    pub fn is_identity(&self) -> bool {
        self.slot_of
            .iter()
            .enumerate()
            .all(|(r, &s)| r == s as usize)
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        self.slot_of.iter().flat_map(|s| s.to_le_bytes()).collect()
    }

    /// Decodes an order file of a table of `rows` rows whose manifest entry is `meta`.
    pub(crate) fn decode(bytes: &[u8], rows: u64, meta: &OrderMeta) -> Result<Self, String> {
        if bytes.len() as u64 != rows * 4 {
            return Err(format!(
                "order file is {} bytes, expected {} (4 per row)",
                bytes.len(),
                rows * 4
            ));
        }
        let crc = crc32c::crc32c(bytes);
        if crc != meta.crc32c {
            return Err(format!(
                "order file checksum mismatch (stored {:#010x}, computed {crc:#010x})",
                meta.crc32c
            ));
        }
        let slot_of = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Self::from_slots(slot_of)
    }
}

impl std::fmt::Debug for RowOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowOrder")
            .field("rows", &self.slot_of.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_only() {
        assert!(RowOrder::from_slots(vec![2, 0, 1]).is_ok());
        assert!(
            RowOrder::from_slots(vec![0, 0, 1])
                .unwrap_err()
                .contains("two rows")
        );
        assert!(
            RowOrder::from_slots(vec![0, 3, 1])
                .unwrap_err()
                .contains("past")
        );
        assert!(RowOrder::from_rows_by_slot(&[1, 1, 0]).is_err());
    }

    #[test]
    fn inverse_and_round_trip() {
        let o = RowOrder::from_slots(vec![3, 0, 2, 1]).unwrap();
        assert_eq!(o.rows_by_slot(), vec![1, 3, 2, 0]);
        assert_eq!(RowOrder::from_rows_by_slot(&o.rows_by_slot()).unwrap(), o);
        assert!(!o.is_identity());
        let bytes = o.encode();
        let meta = OrderMeta {
            file: "x".into(),
            crc32c: crc32c::crc32c(&bytes),
        };
        assert_eq!(RowOrder::decode(&bytes, 4, &meta).unwrap(), o);
        assert!(RowOrder::decode(&bytes, 5, &meta).is_err());
        let mut bad = bytes.clone();
        bad[0] ^= 1;
        assert!(
            RowOrder::decode(&bad, 4, &meta)
                .unwrap_err()
                .contains("checksum")
        );
    }
}
