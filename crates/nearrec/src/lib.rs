//! nearrec: embedding tables larger than memory, served where the rows are read.
//!
//! This crate is the product: what Python (`nearrec`), the `nearrec` command and the storage
//! node share. Open a [`Store`] with a [`StoreConfig`] (serde, TOML); pool a [`Batch`] of
//! [`TableLookup`]s with [`StoreApi::lookup`]; pipeline batches with [`Store::submit`] /
//! [`Store::stream`] and cut large ones with [`Store::lookup_split`]; run the model kept with the
//! store next to its embeddings with [`Inference::infer`]. A store opened `writable` takes
//! [`Writes::write_many`] / [`Store::remove`] while it serves (`docs/live.md`). Plans (where rows
//! live in a DRAM budget) come from [`plan`]; a plan file applies through [`StoreConfig::plan`].
//! `examples/serve.rs` walks through all of it (`cargo run -p nearrec --example serve --release`).
//!
//! The store's verbs are one contract, a narrow core ([`StoreApi`]) and capability traits it hands
//! out ([`Writes`], [`Schema`], [`Versions`], [`Replica`], [`Inference`]): [`Store`] implements it
//! here, `nearrec_client::Client` for a store on a storage node and
//! `nearrec_cluster::ShardedStore` for a sharded one; the node serves any implementation and the
//! Python binding holds any, both as an `Arc<dyn StoreApi>`. One conformance suite,
//! `tests/suite/`, holds every implementation to the same answers and typed errors.
//!
//! ```no_run
//! use nearrec::prelude::*;
//! use nearrec::{Batch, Indices, Bags, Store, StoreConfig, TableLookup};
//!
//! let config = StoreConfig::from_toml("tier = \"ssd\"\ndram_budget = \"1GiB\"")?;
//! let store = Store::open("bench/scratch/demo-rmc1", &config)?;
//! let (ids, lengths) = ([1i64, 2, 3], [2i64, 1]);
//! let batch = Batch::new(vec![TableLookup::new(
//!     "t0",
//!     Indices::I64(&ids),
//!     Bags::Lengths(Indices::I64(&lengths)),
//! )]);
//! let (pooled, read) = store.lookup(&batch)?; // [2, dim], at version read.version
//! # Ok::<(), nearrec::Error>(())
//! ```
//!
//! The layers underneath, each its own crate: `nearrec-format` (the store on disk),
//! `nearrec-kernels` (pooling), `nearrec-io` (block devices), `nearrec-cache` (DRAM tiers),
//! `nearrec-plan` (traces and placement), `nearrec-device` (the flash model), `nearrec-engine`
//! (serving).
//!
//! Modules:
//! - `api/`: the contract — `StoreApi`, the narrow core every store implements (a read-only
//!   store), and its capabilities, each a trait handed out as an `Option` (`caps.rs`: `Writes`,
//!   `Schema`, `Versions`, `Replica`, `Inference`); verbs made of other verbs written once for
//!   all (`sync.rs`: row digests, `sync_table`); `Info`, `NewTable`, `Submitted`; [`prelude`];
//! - `config/`: `StoreConfig` — serde, TOML and JSON, unknown keys refused, the defaults the
//!   engine's, `validate()`; where a plan and a drive come from (`sources.rs`);
//! - `store/`: `Store`, opened as its config says (engine, simulated drive, plan file or
//!   placement), the contract's core (`mod.rs`); its versions swapped and pinned (`serve.rs`),
//!   its writes and tables (`writes.rs`), a replica's verbs (`replica.rs`), the model kept with
//!   it (`infer.rs`); `prepare` / `execute` into the caller's buffer, stats, tier report;
//! - `batch.rs`: `Batch`, `OwnedBatch`, `Pooled`, batches from a trace file; `jagged.rs`: a
//!   KeyedJaggedTensor-shaped request as a `Batch` of slices of its arrays;
//! - `pipeline.rs`: `submit` → `Pending`, `stream`, `lookup_split`, on lanes shared by the
//!   process's stores;
//! - `raw.rs`: `Store::lookup_rows`, a batch's distinct rows per table at one version (the node's
//!   `raw` lookups); `coalesce.rs`: small batches of one `Shape` as one engine batch, split back;
//! - `model/`: the model kept with a store (`save`, `StoredModel`, a family or a program; its
//!   dense part built in `build.rs`), run next to its embeddings by `store/infer.rs`;
//! - `live/`: live stores — `mod.rs` (the writer's lock and log, calls applied in log order and
//!   published as `Snapshot`s read through arc-swap), `compact.rs` (compaction, crash-safe at each
//!   step), `tables.rs` (`create_table` / `drop_table`), `follow.rs` (a read-only store following
//!   its writer every `follow_ms`), `txn.rs` (the store's part in a write across shards:
//!   prepared, committed or aborted transactions, their `txn/` files recovered on open),
//!   `feed.rs` (a delta file's rows and its feed's cursor in one record, decided in log order);
//! - `feed.rs`: the feeder — delta files (`nearrec_format::delta`) from a `DeltaSource` applied
//!   in sequence order to any store that writes, each once;
//! - `membership.rs` + `store/replica.rs`: a store as a replica of its shard — its membership (an
//!   epoch and the shard's members, kept in `MEMBERSHIP`) checked by every write, the fence of
//!   a catch-up, the rows a replica catching up adopts at its shard's count of writes;
//! - `versions.rs`: a store opened from a repository of versions (`REPO/NAME/1`, `2`, ... and
//!   its `CURRENT` pointer): `SwapTo` a version or back to the one before, the pointer replaced
//!   atomically, versions beyond `keep_last` pruned after their last call;
//! - `swap.rs`: what a swap checks first — the new store answers what the served one answers,
//!   else refused naming the difference, unless forced; `pace.rs`: the byte rate background work
//!   keeps beside lookups;
//! - `shard.rs`: a store cut into the shards of a plan (`nearrec shard`), each an ordinary store
//!   tagged with its plan's id, the plan (`nearrec_plan::shards`) written last;
//! - `warm.rs`: start-up warm-up — the DRAM tiers filled at open from a recorded trace or the
//!   hot set a previous run kept (`StoreConfig::warm`, `hot_set_dir`), the hot set kept at close;
//! - `error.rs`: `Error`, every layer's error wrapped, and `ErrorKind`, the one table from an
//!   error to the name every surface gives it (Python's class, the node's gRPC status).
//!
//! Tests: `tests/contract.rs` runs the suite on the DRAM and SSD tiers; `tests/store.rs` holds the
//! store end to end; `tests/live.rs`, `compact.rs`, `tables.rs`, `swap.rs` live stores (the crash
//! tests re-run the test binary as a child stopped at a failpoint); `tests/coalesce.rs`.

mod api;
pub mod batch;
pub mod coalesce;
pub mod config;
mod error;
pub mod feed;
pub mod jagged;
mod live;
mod membership;
pub mod model;
mod pace;
pub mod pipeline;
mod raw;
mod scrub;
pub mod shard;
mod store;
mod swap;
pub mod versions;
mod warm;

pub use api::{
    CAPABILITIES, Inference, Info, MAX_DIGEST_ROWS, NewTable, PendingLookup, Replica, Rows, Schema,
    Stats, StoreApi, Submitted, Synced, TableInfo, Versioned, Versions, Writes, check_digest_rows,
    row_digest,
};
/// The contract's traits, to call any verb on a concrete store: `use nearrec::prelude::*;`.
pub mod prelude {
    pub use crate::{Inference, Replica, Schema, StoreApi, Versions, Writes};
}

pub use batch::{
    AsBatch, Bags, Batch, IndexVec, Indices, OutDtype, OwnedBags, OwnedBatch, OwnedLookup, Pooled,
    PoolingMode, Read, TableLookup,
};
pub use coalesce::{Coalesced, Shape, coalesce};
pub use config::{DeviceSource, DurabilityMode, PlanSource, StoreConfig, WalRecovery};
pub use error::{Error, ErrorKind, Result};
pub use jagged::{JaggedBlock, jagged};
pub use live::{
    Compaction, Decision, Fed, Feeds, LastWriter, OwnedValues, RowValues, RowWrite, Snapshot,
    Transaction, WRITERS_KEPT, WriteOptions, check_encoded, check_values,
};
pub use membership::{MEMBERSHIP_FILE, Membership};
pub use model::{Inferred, SavedModel, StoredModel};
pub use nearrec_format::wal::TxState;
pub use pipeline::{Pending, Stream};
pub use scrub::scrub;
pub use store::{Changes, Store, TableData, Tables};
pub use versions::{Located, SwapTo};

pub use nearrec_cache::CacheStatsSnapshot;
pub use nearrec_engine::{InferTimes, Prepared, Stages, Tier, TierReport};
pub use nearrec_format::wal::Init;
pub use nearrec_format::{
    FeedCursor, GcReport, Leftover, Manifest, ProgressFn, StoreReader, TableCheck, TableMeta,
    attach, gc,
};
/// A pooled answer in the dtype its caller asks for ([`OutDtype`]): encoded for a wire, decoded,
/// rounded in place.
pub use nearrec_kernels::out;
pub use nearrec_plan::{Placement, Size, TablePlacement};

/// The planner and traces: generators, trace files, profiles, the DRAM budget split, plan
/// files (`nearrec-plan`).
pub use nearrec_plan as plan;

/// The store on disk: its writer (`StoreWriter`, `TableSpec`, `DType`, seeded `UniformInit`),
/// reader, attachments and checks (`nearrec-format`).
pub use nearrec_format as format;

/// Checks every data byte of the store at `path` against its checksums, every attachment, and
/// lists what interrupted writes left (`orphan PATH`).
pub fn verify(
    path: impl AsRef<std::path::Path>,
    progress: Option<&ProgressFn>,
) -> Result<Vec<TableCheck>> {
    Ok(StoreReader::open(path)?.verify(progress))
}
