//! Pooling kernels: reduce the rows of each bag (sum, weighted sum, mean, max) straight into the
//! bag's output row, decoding fp16 / bf16 / int8 rows on the fly.
//!
//! [`pool_bags`] is the fast path (fixed-width register accumulators, software prefetch, wide
//! SIMD chosen at run time); [`reference::pool_bags`] is its plain scalar twin, which every parity
//! test compares against. [`pool_found`] (and its twin [`reference::pool_found`]) pools the rows
//! a [`RowSource`] finds — the SSD tier's DRAM tiers — with the same loop.
//!
//! Modules:
//! - `fast/`: the fast path — `pool_bags`; `pool_bags_patched`, the same loop with a cursor
//!   over a live table's patched positions, compiled only into its patched instances;
//!   `pool_found`; `prefetch_row`. AVX-512 and AVX2 versions are picked at run time; a dtype's
//!   row decoding, one `Decode` each, in `fast/decode.rs`;
//! - `reference.rs`: the scalar twin of each of the three, decode then reduce, one value at a time;
//! - `job.rs`: `PoolJob` (a run of one table's bags: indices, bag bounds, weights, mode, padding
//!   index), `BagsOut` (the cells the pooled bags are written to), `PoolingMode`, `RowIndex`
//!   (int32 / int64 ids), `IndexError`;
//! - `out.rs`: a pooled answer in the dtype its caller asks for (`OutDtype`: fp32, fp16, bf16,
//!   FBGEMM's fused row-wise int8), encoded for a wire, decoded, or rounded in place;
//! - `table.rs`: `TableView`, a table's data region with its row arithmetic;
//! - `patch.rs`: `RowPatch`, rows that stand in for the table's own in one task (a live store's
//!   written and removed rows);
//! - `source.rs`: `RowSource`, asked for the rows of a run of lookups at once (`resolve`), with
//!   the rows of the next two runs as hints, so that it can take each step of finding them (an
//!   index or a set's tags, a slot's key, the row) for a whole run at a time, a run apart.
//!
//! `examples/row_cost.rs` prints what a row costs by dtype and width from a table in the
//! caches (where the decode, not memory, binds).
//!
//! `tests/parity.rs` holds the fast path to the twin (proptest over dtypes, widths, layouts,
//! modes, weights, padding, bad indices; `pool_found` also completed with the rows it left and
//! compared with the whole table's pooling).

mod fast;
mod job;
pub mod out;
mod patch;
pub mod reference;
mod source;
mod table;

pub use fast::{pool_bags, pool_bags_patched, pool_found, prefetch_line, prefetch_row};
pub use job::{BagsOut, IndexError, PoolJob, PoolingMode, RowIndex};
pub use patch::{RowHasher, RowPatch};
pub use source::{AHEAD, Lacked, RUN, RowRef, RowSource, SKIP};
pub use table::TableView;
