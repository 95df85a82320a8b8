//! Where each row lives inside a table file.
//!
//! The data region is a sequence of *block spans*. A row never straddles a span boundary, so any
//! row can be fetched with one aligned read of at most one span (the SSD tier reads only the
//! sectors that hold it). Rows no larger than a block are packed `rows_per_block` to a block and the
//! tail of each block is zero padding; a row larger than a block occupies its own span of whole
//! blocks. The padding cost is `1 - rows_per_span * row_bytes / span_bytes` (see `padding_ratio`).

use serde::{Deserialize, Serialize};

/// The default alignment unit: one 4 KiB page, the largest logical block size seen on NVMe drives.
pub const DEFAULT_BLOCK_BYTES: u32 = 4096;

/// The offset of the data region inside a table file; the header occupies the first block.
pub const DATA_OFFSET: u64 = 4096;

/// Row placement inside a table's data region. Pure arithmetic; cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowLayout {
    /// Number of rows.
    pub rows: u64,
    /// Bytes of one encoded row.
    pub row_bytes: u64,
    /// The alignment unit in bytes (a power of two, at least 512).
    pub block_bytes: u64,
}

impl RowLayout {
    pub fn new(rows: u64, row_bytes: u64, block_bytes: u64) -> Self {
        debug_assert!(row_bytes > 0 && block_bytes.is_power_of_two());
        Self {
            rows,
            row_bytes,
            block_bytes,
        }
    }

    /// Bytes of one span: one block, or the whole blocks a single oversized row needs.
    #[inline]
    pub fn span_bytes(&self) -> u64 {
        if self.row_bytes <= self.block_bytes {
            self.block_bytes
        } else {
            self.row_bytes.div_ceil(self.block_bytes) * self.block_bytes
        }
    }

    /// Rows stored in one span (at least one).
    #[inline]
    pub fn rows_per_span(&self) -> u64 {
        (self.span_bytes() / self.row_bytes).max(1)
    }

    /// Byte offset of `row` from the start of the data region.
    #[inline]
    pub fn row_offset(&self, row: u64) -> u64 {
        let per = self.rows_per_span();
        (row / per) * self.span_bytes() + (row % per) * self.row_bytes
    }

    /// Number of spans the data region holds.
    pub fn spans(&self) -> u64 {
        self.rows.div_ceil(self.rows_per_span())
    }

    /// Bytes of the data region: whole spans, so the file size is a multiple of the block size.
    pub fn data_bytes(&self) -> u64 {
        self.spans() * self.span_bytes()
    }

    /// True when rows sit back to back with no padding, so the data region is a dense
    /// `[rows, row_bytes]` array (up to the zero tail of the last span).
    pub fn is_dense(&self) -> bool {
        self.rows_per_span() * self.row_bytes == self.span_bytes()
    }

    /// Share of the data region that is padding (0.0 when dense), ignoring the last span's tail.
    pub fn padding_ratio(&self) -> f64 {
        1.0 - (self.rows_per_span() * self.row_bytes) as f64 / self.span_bytes() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn power_of_two_rows_are_dense() {
        let l = RowLayout::new(1000, 128, 4096);
        assert!(l.is_dense());
        assert_eq!(l.rows_per_span(), 32);
        assert_eq!(l.row_offset(33), 33 * 128);
        assert_eq!(l.data_bytes(), 32 * 4096);
    }

    #[test]
    fn int8_dim32_pads_each_block() {
        // 40-byte rows: 102 per block, 16 bytes of padding per block (0.39 %).
        let l = RowLayout::new(205, 40, 4096);
        assert_eq!(l.rows_per_span(), 102);
        assert_eq!(l.row_offset(102), 4096);
        assert_eq!(l.row_offset(103), 4096 + 40);
        assert!((l.padding_ratio() - 16.0 / 4096.0).abs() < 1e-12);
        assert_eq!(l.data_bytes(), 3 * 4096);
    }

    #[test]
    fn oversized_rows_take_whole_blocks() {
        let l = RowLayout::new(3, 4400, 4096);
        assert_eq!(l.span_bytes(), 8192);
        assert_eq!(l.rows_per_span(), 1);
        assert_eq!(l.row_offset(2), 16384);
    }

    proptest! {
        #[test]
        fn no_row_straddles_a_block(row_bytes in 1u64..10_000, shift in 9u32..13, row in 0u64..100_000) {
            let block = 1u64 << shift;
            let l = RowLayout::new(row + 1, row_bytes, block);
            let start = l.row_offset(row);
            let end = start + row_bytes;
            // A row fits in the span it starts in, and spans start on block boundaries.
            let span_start = start / l.span_bytes() * l.span_bytes();
            prop_assert_eq!(span_start % block, 0);
            prop_assert!(end <= span_start + l.span_bytes());
            prop_assert!(end <= l.data_bytes());
            if row_bytes <= block {
                prop_assert_eq!(start / block, (end - 1) / block);
            }
        }
    }
}
