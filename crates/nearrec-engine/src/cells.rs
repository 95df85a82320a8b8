//! The `[batch, width]` output matrix, shared by the tasks that pool into it at once: each task
//! owns some cells (a table's columns, in some rows) and writes no others.

use nearrec_kernels::BagsOut;

/// A raw view of the output matrix (see the module note).
pub(crate) struct Cells {
    base: *mut f32,
    batch: usize,
    width: usize,
}

// SAFETY: tasks write disjoint cells through it (see `Cells::cell`, `Cells::ptr`).
unsafe impl Sync for Cells {}

impl Cells {
    pub(crate) fn new(out: &mut [f32], batch: usize, width: usize) -> Self {
        assert!(out.len() >= batch * width, "output has the wrong size");
        Self {
            base: out.as_mut_ptr(),
            batch,
            width,
        }
    }

    /// Where bag `bag`'s cell of the table whose columns start at `col` begins.
    pub(crate) fn ptr(&self, bag: usize, col: usize) -> *mut f32 {
        assert!(
            bag < self.batch && col < self.width,
            "cell out of the matrix"
        );
        // SAFETY: in bounds (checked above).
        unsafe { self.base.add(bag * self.width + col) }
    }

    /// Bag `bag`'s cell of the table whose columns start at `col`.
    ///
    /// # Safety
    /// Only the task that owns columns `col..col + dim` of that bag may ask for them, and it may
    /// hold one such cell at a time.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn cell(&self, bag: usize, col: usize, dim: usize) -> &mut [f32] {
        assert!(col + dim <= self.width, "cell out of the matrix");
        // SAFETY: in bounds (checked here and in `ptr`); exclusive per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(bag, col), dim) }
    }

    /// Columns `col..col + dim` of every bag, as the kernels' output.
    ///
    /// # Safety
    /// Only the task that owns those columns may ask for them, once at a time.
    pub(crate) unsafe fn bags(&self, col: usize, dim: usize) -> BagsOut<'_> {
        assert!(col + dim <= self.width, "block out of the matrix");
        if self.batch == 0 {
            return BagsOut::from_slice(&mut [], self.width, dim, 0);
        }
        // SAFETY: bag b's cell is ptr(0, col) + b × width .. + dim, inside the matrix (checked
        // above and in `ptr`); exclusive per the contract.
        unsafe { BagsOut::from_raw(self.ptr(0, col), self.width, dim, self.batch) }
    }

    /// Columns `col..col + dim` of every bag, copied out (`[batch, dim]`).
    ///
    /// # Safety
    /// No one writes those columns during the call.
    pub(crate) unsafe fn block(&self, col: usize, dim: usize) -> Vec<f32> {
        assert!(col + dim <= self.width, "block out of the matrix");
        let mut v = Vec::with_capacity(self.batch * dim);
        for b in 0..self.batch {
            // SAFETY: in bounds (checked above); not written meanwhile per the contract.
            v.extend_from_slice(unsafe { std::slice::from_raw_parts(self.ptr(b, col), dim) });
        }
        v
    }
}

/// Where a tier hands each table the moment it is final: `(position in the request, pooled
/// [batch, dim])` (whole-model offload multiplies it into the first dense layer at once).
pub(crate) type Ready<'a> = dyn Fn(usize, Vec<f32>) + Sync + 'a;
