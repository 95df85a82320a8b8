//! Batch execution of pooled embedding lookups.
//!
//! A [`Batch`] names, per table, the indices of a batch of bags and the pooling; the [`Engine`]
//! validates it ([`Engine::prepare`]), splits it into (table, bag-run) tasks across a fork-safe
//! worker pool and pools every bag straight into its cell of the `[batch, Σ dim]` output
//! ([`Engine::execute`]). Tables are resident in DRAM ([`Tier::Dram`]) or read per batch from
//! their files with direct I/O ([`Tier::Ssd`], `ssd.rs`), behind the same request type.
//! [`Engine::infer`] runs a whole model's dense layers ([`dense`]) next to the embeddings and
//! returns only its outputs (RM-SSD's offload).
//!
//! Modules:
//! - `request.rs`: `Batch` of `TableLookup`s, borrowed from the caller's buffers and shared by
//!   every tier, placement and surface (indices, offsets / lengths / fixed bags, weights, mode,
//!   padding), and its validation — the only one a lookup gets;
//! - `engine/`: `Engine` — `mod.rs` (the struct, its accessors), `open.rs` (over a store: tables
//!   loaded into DRAM or opened for the SSD tier), `execute.rs` (`prepare`, `execute`,
//!   `execute_at` a snapshot's version, `read_rows`), `rebase.rs` (a live store's changes:
//!   `rebase` to a compaction's new base, `derive` over created or dropped tables sharing the
//!   others' tiers, `warm_from` to fill a swapped-in version's row caches from the old one's);
//! - `config.rs`: `EngineConfig`, `Tier` (`Dram`, `Ssd`, or `Auto` by the DRAM budget);
//! - `keyed/`: keyed tables — each one's DRAM index of keys to rows (`nearrec_cache::KeyIndex`)
//!   built at open, a batch's keys resolved to rows in `prepare`, the unknown-key policy
//!   (`KeyPolicy`: error, zero row, init row; bags with init keys pooled again), `KeyReport`;
//!   a live table's TTL, cap and admission, and each row's touches (`keyed/life.rs`: `KeyLimits`,
//!   `KeyLife`);
//! - `tiers.rs`: each table's DRAM tiers — whole table, hot partition, row cache — laid out from a
//!   `Placement` (checked against the store whatever tier `Auto` picks) within the DRAM budget;
//!   `TierReport`;
//! - `files.rs`: the table files behind the SSD tier (device, co-located tables' row orders,
//!   sector sums checked as reads land, staging buffers, counters), built whole before anything
//!   reads through it;
//! - `ssd.rs`: the SSD tier — each table's DRAM side pooled first (the kernels' `pool_found`),
//!   the misses sorted, de-duplicated and planned as merged, vector-grained block reads, one
//!   `read_batch`, each row pooled into its bags as its read lands and offered to the row cache;
//!   its files behind an `ArcSwap`, so that a compaction moves it to new ones;
//! - `cells.rs`: the shared `[batch, Σ dim]` output both paths pool into;
//! - `delta/`: a live table's delta — versioned entries in per-shard slabs behind a filter —
//!   `DeltaView` (`view.rs`), what one snapshot reads, and the `RowPatch` each pooling task takes from it;
//! - `stats.rs`: `IoStats` counters and latency `Histogram`s behind a store's stats; `Stages`,
//!   where one batch's time went (route, I/O wait, pooling);
//! - `dense/` (`linear.rs`: FC layers, SGEMM from the `gemm` crate; `model.rs`: DLRM, Wide & Deep,
//!   NCF, each cut into the dense features' work, each table's slice of the first layer it feeds,
//!   and the rest; `graph.rs`: any model's dense part as a program, cut the same way) and
//!   `infer.rs` (`Engine::infer`: the bottom MLP beside the reads, each table's slice multiplied
//!   the moment its last row lands; `InferTimes`);
//! - `error.rs`: `EngineError`.
//!
//! Tests: `tests/tiers.rs` (every placement and policy against the DRAM path), `tests/delta.rs`
//! (a live table's rows at every snapshot, on every tier), `tests/infer.rs` (every model family
//! against plain loops, on every tier), `tests/ssd_faults.rs` (a failing device: typed errors,
//! never a hang).

mod cells;
mod config;
pub mod delta;
pub mod dense;
mod engine;
mod error;
mod files;
mod infer;
mod keyed;
mod request;
mod ssd;
mod stats;
mod tiers;

pub use config::{EngineConfig, Tier};
pub use engine::{Engine, Prepared};
pub use error::{EngineError, Result};
pub use infer::InferTimes;
pub use keyed::{
    Clock, Evict, KEY_ROW_BYTES, KeyLife, KeyLimits, KeyPolicy, KeyReport, Touch, decode_row,
};
pub use nearrec_cache::Unknown;
pub use nearrec_format::Memory;
pub use request::{
    Bags, Batch, Checked, Indices, OutDtype, PoolingMode, TableLookup, check, check_batch,
};
pub use stats::{Histogram, IoStats, Stages};
pub use tiers::TierReport;
