use std::marker::PhantomData;

/// How the rows of a bag are reduced (as `torch.nn.EmbeddingBag`'s `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolingMode {
    Sum,
    Mean,
    Max,
}

impl PoolingMode {
    pub fn name(self) -> &'static str {
        match self {
            PoolingMode::Sum => "sum",
            PoolingMode::Mean => "mean",
            PoolingMode::Max => "max",
        }
    }

    /// The mode [`PoolingMode::name`] names.
    pub fn from_name(name: &str) -> Option<Self> {
        [PoolingMode::Sum, PoolingMode::Mean, PoolingMode::Max]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

/// An index element type accepted from callers (`int32` or `int64` arrays).
pub trait RowIndex: Copy + Send + Sync + 'static {
    fn to_i64(self) -> i64;
}

impl RowIndex for i32 {
    #[inline(always)]
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
}

impl RowIndex for i64 {
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self
    }
}

/// A run of bags of one table to pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolJob<'a, I> {
    /// All indices of the table's request.
    pub indices: &'a [I],
    /// `bags + 1` ascending positions into `indices`: bag `b` is `indices[bounds[b]..bounds[b + 1]]`.
    pub bounds: &'a [usize],
    /// Per-index weights aligned with `indices` (sum only).
    pub weights: Option<&'a [f32]>,
    pub mode: PoolingMode,
    /// Rows equal to this are skipped and not counted (already normalised to `0..rows`).
    pub padding_idx: Option<u64>,
}

impl<I> PoolJob<'_, I> {
    pub fn bags(&self) -> usize {
        self.bounds.len().saturating_sub(1)
    }
}

/// An index that is negative or not below the table's row count, at `position` in `indices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexError {
    pub position: usize,
    pub value: i64,
}

/// Where pooled bags go: bag `b` of a run is written to the `dim` floats at `ptr + b * stride`.
///
/// Several `BagsOut` may point into one `[batch, Σ dim]` matrix (one per (table, bag-block) task);
/// the constructor's contract is that their cells never overlap.
#[derive(Debug)]
pub struct BagsOut<'a> {
    ptr: *mut f32,
    stride: usize,
    dim: usize,
    bags: usize,
    _out: PhantomData<&'a mut [f32]>,
}

// SAFETY: a BagsOut is an exclusive handle on its cells (see `from_raw`), like `&mut [f32]`.
unsafe impl Send for BagsOut<'_> {}

impl<'a> BagsOut<'a> {
    /// Output for `bags` bags whose rows are `stride` apart in `out`, each `dim` wide.
    pub fn from_slice(out: &'a mut [f32], stride: usize, dim: usize, bags: usize) -> Self {
        assert!(dim <= stride && (bags == 0 || (bags - 1) * stride + dim <= out.len()));
        Self {
            ptr: out.as_mut_ptr(),
            stride,
            dim,
            bags,
            _out: PhantomData,
        }
    }

    /// # Safety
    /// For every `b < bags`, `ptr + b * stride .. + dim` must be valid for writes for `'a` and not
    /// accessed through any other reference or `BagsOut` meanwhile.
    pub unsafe fn from_raw(ptr: *mut f32, stride: usize, dim: usize, bags: usize) -> Self {
        Self {
            ptr,
            stride,
            dim,
            bags,
            _out: PhantomData,
        }
    }

    pub fn bags(&self) -> usize {
        self.bags
    }

    /// Bags `range` of this output, as an output of their own (borrowing this one).
    pub fn sub(&mut self, range: std::ops::Range<usize>) -> BagsOut<'_> {
        assert!(range.start <= range.end && range.end <= self.bags);
        BagsOut {
            // SAFETY: in bounds (asserted), and the cells stay exclusive through &mut self
            ptr: unsafe { self.ptr.add(range.start * self.stride) },
            stride: self.stride,
            dim: self.dim,
            bags: range.end - range.start,
            _out: PhantomData,
        }
    }

    #[inline(always)]
    pub fn bag(&mut self, b: usize) -> &mut [f32] {
        assert!(b < self.bags);
        // SAFETY: in bounds by the constructor's contract; exclusive through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(b * self.stride), self.dim) }
    }
}
