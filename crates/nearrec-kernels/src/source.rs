//! Rows that are not one table in memory: the SSD tier's DRAM tiers (a live table's patch, a
//! pinned partition, a row cache) in front of a file. [`crate::pool_found`] pools the rows a
//! [`RowSource`] finds and hands the others back to its caller.

use std::marker::PhantomData;
use std::ptr::NonNull;

/// Lookups a [`RowSource`] is asked to find at once, at most.
pub const RUN: usize = 64;

/// Lookups whose rows go with a run as hints: the run after the next one.
pub const AHEAD: usize = RUN;

/// Stands for a padding lookup in a run given to [`RowSource::resolve`]: nothing to find.
pub const SKIP: u64 = u64::MAX;

/// A lookup a [`RowSource`] did not hold: `(row, position, bag)`.
pub type Lacked = (u64, usize, usize);

/// A row a [`RowSource`] found: where its encoded bytes start, borrowed for `'s`. A thin
/// pointer (one word, `None` included), so that a run's rows are as cheap to hand over and to
/// read as the rows of a table in memory; the row's length is the one every row of the call
/// has, which the source vouches for (see [`RowSource`]'s safety contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRef<'s>(NonNull<u8>, PhantomData<&'s [u8]>);

impl<'s> RowRef<'s> {
    /// The row whose bytes are `row` (from its first byte on).
    #[inline(always)]
    pub fn new(row: &'s [u8]) -> Self {
        Self(NonNull::from(row).cast(), PhantomData)
    }

    /// The row's `len` bytes.
    ///
    /// # Safety
    /// The row this was made from is at least `len` bytes long.
    #[inline(always)]
    pub unsafe fn bytes(self, len: usize) -> &'s [u8] {
        // SAFETY: made from a slice borrowed for 's of at least `len` bytes (the contract)
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), len) }
    }
}

/// Where [`crate::pool_found`] gets each lookup's row.
///
/// # Safety
/// Every row a source finds ([`RowRef`]) is at least as long as the rows of the call (the
/// `dtype.row_bytes(dim)` of [`crate::pool_found`]'s arguments; fp32 rows 4-byte aligned): the
/// kernel reads that many bytes from it without a check.
///
/// The kernel walks a job's positions in order and asks for their rows a run at a time (up to
/// [`RUN`] lookups), before it pools any of them, and tells the source the rows of the run
/// after the next one as well. A source whose rows take dependent memory reads to find (an index or a set's
/// tags, then a slot's key, then the row) can so take one step for a whole run in one short
/// loop — every lookup's line asked for — and the next step a run later, when the lines have
/// come: a software pipeline whose stages are runs.
pub unsafe trait RowSource {
    /// Finds the rows of the lookups at positions `first..first + rows.len()` (at most
    /// [`RUN`]; runs come in ascending order, each position once): `found[i]`, `None` on
    /// entry, becomes row `rows[i]`'s encoded bytes, or stays `None` when the source does
    /// not hold it (the caller pools it later; it counts towards its bag's rows). A `rows[i]`
    /// of [`SKIP`] is a padding lookup: its `found[i]` stays `None`. Rows are in range.
    ///
    /// `ahead`: the rows of the run after the next one (the [`AHEAD`] lookups from
    /// `first + rows.len() + RUN`; fewer or none at the job's end), which a call two calls on
    /// will most likely ask for — hints, unchecked: they may be out of range or padding, and
    /// the run may still come otherwise (after a bad index).
    fn resolve<'s>(
        &'s self,
        first: usize,
        rows: &[u64],
        ahead: &[u64],
        found: &mut [Option<RowRef<'s>>],
    );
}
