//! Rows that are not one table in memory: the SSD tier's DRAM tiers (a live table's patch, a
//! pinned partition, a row cache) in front of a file. [`crate::pool_found`] pools the rows a
//! [`RowSource`] finds and leaves the others to its caller.

/// Lookups between a [`RowSource::touch`] and the lookup itself.
pub const TOUCH_AHEAD: usize = 16;
/// Lookups between a [`RowSource::find`] and the lookup itself.
pub const FIND_AHEAD: usize = 8;

/// Where [`crate::pool_found`] gets each lookup's row.
///
/// The kernel walks a job's positions in order and says, ahead of each lookup, which row is
/// coming, so that finding rows in structures that take two dependent memory reads (an index or
/// a set's keys, then the row) overlaps across lookups: [`Self::touch`] [`TOUCH_AHEAD`] lookups
/// ahead (ask for the lines a search starts at), [`Self::find`] [`FIND_AHEAD`] ahead (search,
/// and ask for the row's lines), then [`Self::row`] at the lookup. Hints may name indices that
/// are out of range or padding (the kernel checks indices only when it reaches them), and the
/// first lookups of a job get no `find`: `row` must answer for any position on its own.
pub trait RowSource {
    /// A hint: `row` is asked for at position `pos`, [`TOUCH_AHEAD`] lookups from now.
    fn touch(&mut self, pos: usize, row: u64);
    /// A hint: `row` is asked for at position `pos`, [`FIND_AHEAD`] lookups from now.
    fn find(&mut self, pos: usize, row: u64);
    /// The encoded bytes of `row`, wanted at position `pos` by bag `bag`, or `None`: the source
    /// does not hold it, and the caller pools it later (it counts towards the bag's rows).
    fn row(&mut self, pos: usize, bag: usize, row: u64) -> Option<&[u8]>;
}
