//! Pooling kernels: reduce the rows of each bag (sum, weighted sum, mean, max) straight into the
//! bag's output row, decoding fp16 / bf16 / int8 rows on the fly.
//!
//! [`pool_bags`] is the fast path (fixed-width register accumulators, software prefetch, wide
//! SIMD chosen at run time); [`reference::pool_bags`] is its plain scalar twin, which every parity
//! test compares against. [`pool_found`] (and its twin [`reference::pool_found`]) pools the rows
//! a [`RowSource`] finds — the SSD tier's DRAM tiers — with the same loop.

mod fast;
mod job;
mod patch;
pub mod reference;
mod source;
mod table;

pub use fast::{pool_bags, pool_bags_patched, pool_found, prefetch_row};
pub use job::{BagsOut, IndexError, PoolJob, PoolingMode, RowIndex};
pub use patch::{RowHasher, RowPatch};
pub use source::{FIND_AHEAD, RowSource, TOUCH_AHEAD};
pub use table::TableView;
