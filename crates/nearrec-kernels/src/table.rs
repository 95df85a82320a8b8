use nearrec_format::{DType, RowLayout};

/// A read-only view of one table's data region, with the row arithmetic the kernels need.
#[derive(Debug, Clone, Copy)]
pub struct TableView<'a> {
    data: &'a [u8],
    layout: RowLayout,
    dtype: DType,
    dim: usize,
    /// Rows per span and bytes per span, worked out once: a row's offset is then one division
    /// (none when the rows are back to back: see [`TableView::is_dense`]).
    per: u64,
    span: u64,
    /// `⌈2^64 / per⌉`: the division by `per` of a row below 2^32 as a multiply (Lemire, Kaser
    /// and Kurz, "Faster remainder by direct computation", 2019); 0 when `per` is 1.
    per_inverse: u64,
    /// The layout's [`RowLayout::is_dense`], worked out once.
    dense: bool,
}

impl<'a> TableView<'a> {
    /// `data` must hold the whole data region (`layout.data_bytes()` bytes); `None` otherwise.
    pub fn new(data: &'a [u8], layout: RowLayout, dtype: DType, dim: u32) -> Option<Self> {
        if (data.len() as u64) < layout.data_bytes() || dtype.row_bytes(dim) != layout.row_bytes {
            return None;
        }
        // fp32 rows are read as f32 slices: the data region must be 4-byte aligned.
        // (An empty region, a table of no rows, has nothing to read.)
        if dtype == DType::Fp32 && !data.is_empty() && !(data.as_ptr() as usize).is_multiple_of(4) {
            return None;
        }
        Some(Self {
            data,
            layout,
            dtype,
            dim: dim as usize,
            per: layout.rows_per_span(),
            span: layout.span_bytes(),
            per_inverse: (u64::MAX / layout.rows_per_span()).wrapping_add(1),
            dense: layout.is_dense(),
        })
    }

    pub fn rows(&self) -> u64 {
        self.layout.rows
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn row_bytes(&self) -> usize {
        self.layout.row_bytes as usize
    }

    /// True when rows sit back to back, so row `r` starts at `r * row_bytes()` (what the
    /// kernels' loops specialise on: no branch and no division per lookup).
    #[inline(always)]
    pub fn is_dense(&self) -> bool {
        self.dense
    }

    /// Byte offset of `row` in the data region. Defined (wrapping) for any `row`, so prefetching
    /// may ask for rows not yet range-checked; only rows `< rows()` lie inside the region.
    #[inline(always)]
    pub fn offset(&self, row: u64) -> usize {
        if self.is_dense() {
            (row as usize).wrapping_mul(self.layout.row_bytes as usize)
        } else {
            // a 64-bit division costs tens of cycles a lookup: below 2^32 (every row of a table
            // of fewer rows), a multiply by the inverse gives the same quotient
            let span = if row < 1 << 32 && self.per > 1 {
                ((u128::from(self.per_inverse) * u128::from(row)) >> 64) as u64
            } else {
                row / self.per
            };
            (span.wrapping_mul(self.span))
                .wrapping_add((row - span * self.per).wrapping_mul(self.layout.row_bytes))
                as usize
        }
    }

    /// The `len` bytes at `offset`, for a loop that has range-checked its row and worked out
    /// its offset (and length) itself.
    ///
    /// # Safety
    /// `offset` must be [`TableView::offset`] of a row `< rows()`, and `len` `row_bytes()`.
    #[inline(always)]
    pub(crate) unsafe fn row_at(&self, offset: usize, len: usize) -> &'a [u8] {
        debug_assert!(len == self.row_bytes() && offset + len <= self.data.len());
        // SAFETY: the caller's contract: a row inside the region.
        unsafe { self.data.get_unchecked(offset..offset + len) }
    }

    /// The encoded bytes of `row`, which must be `< rows()`.
    #[inline(always)]
    pub fn row(&self, row: u64) -> &'a [u8] {
        debug_assert!(row < self.layout.rows);
        // SAFETY: `new` checked that data covers the layout, and every row < rows lies inside it.
        unsafe { self.row_at(self.offset(row), self.row_bytes()) }
    }

    /// The address `offset` bytes into the region, for prefetching only: any offset is accepted
    /// (an [`TableView::offset`] of a row not yet range-checked), and an address past the end
    /// is meaningless (never dereference it).
    #[inline(always)]
    pub(crate) fn addr_at(&self, offset: usize) -> *const u8 {
        self.data.as_ptr().wrapping_add(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_by_the_inverse_equal_the_layouts() {
        let mut state = 7u64;
        for rb in [20u64, 36, 40, 72, 1000, 4000, 4097, 9000] {
            let layout = RowLayout::new(1 << 40, rb, 4096);
            let view = TableView {
                data: &[],
                layout,
                dtype: DType::Fp8,
                dim: rb as usize,
                per: layout.rows_per_span(),
                span: layout.span_bytes(),
                per_inverse: (u64::MAX / layout.rows_per_span()).wrapping_add(1),
                dense: layout.is_dense(),
            };
            let edges = [0, 1, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, (1 << 40) - 1];
            for row in edges.into_iter().chain((0..20_000).map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state % (1 << 33)
            })) {
                assert_eq!(
                    view.offset(row) as u64,
                    layout.row_offset(row),
                    "{rb} B, row {row}"
                );
            }
        }
    }
}
