use nearrec_format::{DType, RowLayout};

/// A read-only view of one table's data region, with the row arithmetic the kernels need.
#[derive(Debug, Clone, Copy)]
pub struct TableView<'a> {
    data: &'a [u8],
    layout: RowLayout,
    dtype: DType,
    dim: usize,
    /// `Some(row_bytes)` when rows are back to back (no padding), so a row's offset is one multiply.
    dense_stride: Option<usize>,
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
        let dense_stride = layout.is_dense().then_some(layout.row_bytes as usize);
        Some(Self {
            data,
            layout,
            dtype,
            dim: dim as usize,
            dense_stride,
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

    /// Byte offset of `row` in the data region. Defined (wrapping) for any `row`, so prefetching
    /// may ask for rows not yet range-checked; only rows `< rows()` lie inside the region.
    #[inline(always)]
    pub fn offset(&self, row: u64) -> usize {
        match self.dense_stride {
            Some(s) => (row as usize).wrapping_mul(s),
            None => {
                let (per, l) = (self.layout.rows_per_span(), &self.layout);
                ((row / per).wrapping_mul(l.span_bytes()))
                    .wrapping_add((row % per).wrapping_mul(l.row_bytes)) as usize
            }
        }
    }

    /// The encoded bytes of `row`, which must be `< rows()`.
    #[inline(always)]
    pub fn row(&self, row: u64) -> &'a [u8] {
        debug_assert!(row < self.layout.rows);
        let at = self.offset(row);
        let rb = self.layout.row_bytes as usize;
        // SAFETY: `new` checked that data covers the layout, and every row < rows lies inside it.
        unsafe { self.data.get_unchecked(at..at + rb) }
    }

    /// Where `row` would start, for prefetching only: any `row` is accepted, and the address of
    /// one past the end is meaningless (never dereference it).
    #[inline(always)]
    pub(crate) fn row_addr(&self, row: u64) -> *const u8 {
        self.data.as_ptr().wrapping_add(self.offset(row))
    }
}
