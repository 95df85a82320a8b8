//! Traces and placement: what requests look like and where rows should live.
//!
//! - [`generate`]: seeded synthetic traces (uniform, Zipf, DLRM's stack-distance generator with
//!   RecSSD's locality knob K, in its continuous and per-bag variants, over whole tables or
//!   RecSSD's strided ids);
//! - [`profile`]: stack-distance profiles and LRU hit-ratio curves (Mattson), O(log n) per access;
//! - [`file`](mod@file): the binary trace file, mapped without copying;
//! - [`curves`]: one table's value of DRAM bytes on a trace (hot-partition and LRU curves, ranked
//!   on the first half, scored on the second);
//! - [`planner`]: the greedy DRAM-budget planner over a store's tables, from a trace;
//! - [`plan`](mod@plan): what it decides ([`Plan`], [`TablePlan`], EMB-SSD's [`TableKind`]);
//! - [`plan_file`]: the plan file (TOML, with its hot rows in a numpy `.hot.npz` beside it),
//!   read and written only here;
//! - [`placement`]: which tables and rows live in DRAM (what the engine applies);
//! - [`shards`]: which shard serves which rows of which table (table-, row- and
//!   table-row-wise, balanced by bytes and a trace's load) and the shard plan file;
//! - [`units`]: byte sizes as people write them (`"64MiB"`), in config and plan files;
//! - [`colocate`](mod@colocate): an order of a table's rows that puts rows read together in the
//!   same blocks (the format layer stores it);
//! - `stack.rs` + `fenwick.rs`: the LRU stack that the generator and the profiler both walk,
//!   O(log n) per access over a Fenwick tree;
//! - `error.rs`: `PlanError`, every malformed plan file a `BadPlan` naming the file and table.
//!
//! The planner is the one `nearrec.plan` calls (Python only translates); the plan file's numpy
//! archive goes through `nearrec-format`'s `npz`. `tests/traces.rs` checks the generators against
//! the published locality numbers (K shares, LRU hit rates) and the trace file's round trip;
//! `tests/planner.rs` and `tests/plan_file.rs` the planner and the plan file; `examples/plan.rs`
//! plans a store from a trace file (JSON out).

pub mod colocate;
pub mod curves;
mod error;
mod fenwick;
pub mod file;
pub mod generate;
pub mod placement;
pub mod plan;
pub mod plan_file;
pub mod planner;
pub mod profile;
pub mod shards;
mod stack;
pub mod units;

pub use colocate::{Colocation, colocate};
pub use curves::{CURVE_POINTS, Curve, HOT_ROW_OVERHEAD, PlanTable, SLOT_OVERHEAD, SPLITS};
pub use error::{PlanError, PlanFileProblem, Result};
pub use file::{TableData, TableEntry, TraceFile, TraceHeader, write_trace};
pub use generate::{Generator, Ids, Permutation, TableSpec, TableTrace, Variant, table_seed};
pub use placement::{Placement, TablePlacement, TableSize};
pub use plan::{Plan, TableKind, TablePlan};
pub use plan_file::{hot_rows_path, load_plan};
pub use planner::{
    DEFAULT_STEPS, TraceTable, check_trace, make_plan, plan_trace_file, trace_tables,
};
pub use profile::{Distances, LruCurve, Profile};
pub use shards::{Part, Scheme, ShardOptions, ShardPlan, ShardedTable, key_part, plan_shards};
pub use units::{MAX_SIZE, Size, SizeError, parse_size};
