//! `nearrec._native`: the private extension module. Each file binds one core concept; the typed
//! public API lives in the pure-Python package `nearrec` above it. No product logic here: a
//! change of behaviour belongs in the facade or below, and every blocking call releases the GIL.
//! Its stubs, `python/nearrec/_native.pyi`, are checked against the built module by stubtest.
//!
//! Modules:
//! - `store/`: `NativeStore`, the one store class, over an `Arc<dyn StoreApi>` alone — the
//!   embedded `nearrec::Store` (its constructor; `nearrec.open`), a node's store through
//!   `nearrec-client` (`connect`; `nearrec.connect`) or a sharded store through
//!   `nearrec-cluster` (`connect_sharded`; `nearrec.distributed.connect`); its capabilities;
//!   its verbs (`verbs.rs`: lookups, `infer`, writes, stats); `submit` → `NativePending`,
//!   `stream` → `NativeStream` (`pending.rs`); what only an embedded store has answers
//!   `Unsupported`;
//! - `files.rs`: a store on disk without opening it: verify, scrub, gc, manifest, attachments;
//! - `delta.rs`: delta files written (a trainer's changed rows, `nearrec.feed.Publisher`);
//! - `lookup.rs`: the native `TableLookup`, its arrays converted once at construction and
//!   viewed by the engine without a copy; `HeldBatch`, a call's lookups held so that it runs
//!   without the GIL;
//! - `convert.rs`: the one set of argument conversions (contiguous int32 / int64 ids, float32
//!   weights and rows, never an unsafe cast; modes, `padding_idx`, a KeyedJaggedTensor's bags),
//!   also exported for `nearrec.request`'s helpers, so that every message comes from Rust;
//! - `raw.rs` and `tensor.rs`: a contiguous array's or CPU torch tensor's data read in place;
//! - `collection.rs`: `NativeCollection`, the native half of `nearrec.torch`'s
//!   `EmbeddingBagCollection`: a KeyedJaggedTensor's buffers sliced into one `Batch` and pooled;
//! - `config.rs`: the native `StoreConfig` (JSON from Python's mirror, TOML files), `parse_size`;
//! - `node.rs`: the node's `NodeConfig`, `serve` (the storage node in this process, for
//!   `nearrec serve`) and `node_flags` (the node's `FLAGS`, which the command builds its flags
//!   from);
//! - `error.rs`: each Rust error raised as the `nearrec.errors` class its `ErrorKind` names, with
//!   table and position; `error_kinds`, which a test holds to `nearrec.errors`; `detach`, the GIL
//!   released and a panic answered as `InternalError`;
//! - `model.rs`: `NativeModel`, a `nearrec::StoredModel` built from a PyTorch model's
//!   configuration and weights (for `nearrec.models`' offload); `model_save`, a model kept with a
//!   store, through the facade;
//! - `writer.rs` (the streaming store writer, the co-located copy), `progress.rs` (bars on
//!   stderr), `plan.rs` (the planner and plan files), `shards.rs` (shard plans, a store cut
//!   into shards), `trace.rs` (generators, trace files,
//!   profiles), `device.rs` (the flash model, its calibration, the disk's read rate), `cache.rs`
//!   (the row cache alone, for studies), `keyed.rs` (keyed tables).

mod cache;
mod collection;
mod config;
mod convert;
mod delta;
mod device;
mod error;
mod files;
mod keyed;
mod lookup;
mod model;
mod node;
mod plan;
mod progress;
mod raw;
mod shards;
mod store;
mod tensor;
mod trace;
mod writer;

use pyo3::prelude::*;

// Nothing here leans on the GIL for exclusion: every shared state is behind its own lock or
// atomic, and calls release the GIL while they run; free-threaded Python may load it as is.
#[pymodule(gil_used = false)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", nearrec_format::FORMAT_VERSION)?;
    m.add("CACHE_SLOT_OVERHEAD", nearrec_cache::SLOT_OVERHEAD)?;
    m.add(
        "HOT_ROW_OVERHEAD",
        nearrec_cache::HotPartition::ROW_OVERHEAD,
    )?;
    m.add_class::<store::NativeStore>()?;
    m.add_function(wrap_pyfunction!(keyed::key_index_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(node::serve, m)?)?;
    m.add_function(wrap_pyfunction!(node::node_flags, m)?)?;
    m.add_class::<node::NativeNodeConfig>()?;
    m.add_class::<store::NativePending>()?;
    m.add_class::<store::NativeStream>()?;
    m.add_class::<collection::NativeCollection>()?;
    m.add_class::<config::NativeConfig>()?;
    m.add_class::<lookup::PyTableLookup>()?;
    m.add_function(wrap_pyfunction!(convert::py_as_array, m)?)?;
    m.add_function(wrap_pyfunction!(convert::index_vector, m)?)?;
    m.add_function(wrap_pyfunction!(convert::round_out, m)?)?;
    m.add_function(wrap_pyfunction!(convert::weights_vector, m)?)?;
    m.add_function(wrap_pyfunction!(convert::pooling_mode, m)?)?;
    m.add_function(wrap_pyfunction!(convert::padding_idx, m)?)?;
    m.add_function(wrap_pyfunction!(convert::jagged, m)?)?;
    m.add_function(wrap_pyfunction!(config::parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(model::model_save, m)?)?;
    m.add_function(wrap_pyfunction!(delta::delta_write, m)?)?;
    m.add_function(wrap_pyfunction!(delta::delta_sequences, m)?)?;
    m.add_class::<plan::NativePlan>()?;
    m.add_function(wrap_pyfunction!(plan::plan_make, m)?)?;
    m.add_function(wrap_pyfunction!(plan::plan_check_trace, m)?)?;
    m.add_function(wrap_pyfunction!(plan::plan_load, m)?)?;
    m.add_function(wrap_pyfunction!(shards::shard_plan, m)?)?;
    m.add_function(wrap_pyfunction!(shards::shard_write, m)?)?;
    m.add_function(wrap_pyfunction!(shards::shard_store, m)?)?;
    m.add_function(wrap_pyfunction!(shards::shard_publish, m)?)?;
    m.add_function(wrap_pyfunction!(shards::shard_plan_read, m)?)?;
    m.add_class::<writer::NativeStoreWriter>()?;
    m.add_class::<keyed::NativeKeyedTable>()?;
    m.add_class::<model::NativeModel>()?;
    m.add_function(wrap_pyfunction!(cache::cache_simulate, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_simulate, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_preset, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_fit, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_read_rate, m)?)?;
    m.add_function(wrap_pyfunction!(device::disk_read_rate, m)?)?;
    m.add_function(wrap_pyfunction!(files::verify_store, m)?)?;
    m.add_function(wrap_pyfunction!(files::scrub_store, m)?)?;
    m.add_function(wrap_pyfunction!(files::store_gc, m)?)?;
    m.add_function(wrap_pyfunction!(files::repo_publish, m)?)?;
    m.add_function(wrap_pyfunction!(files::repo_versions, m)?)?;
    m.add_function(wrap_pyfunction!(files::read_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(files::read_keys, m)?)?;
    m.add_function(wrap_pyfunction!(files::store_attach, m)?)?;
    m.add_function(wrap_pyfunction!(files::store_read_attachment, m)?)?;
    m.add_function(wrap_pyfunction!(writer::table_layout, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_generate_table, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_write, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_open, m)?)?;
    m.add_function(wrap_pyfunction!(trace::trace_profile, m)?)?;
    m.add_function(wrap_pyfunction!(trace::colocation_order, m)?)?;
    m.add_function(wrap_pyfunction!(writer::copy_store_ordered, m)?)?;
    m.add_function(wrap_pyfunction!(error::panic_at_the_boundary, m)?)?;
    m.add_function(wrap_pyfunction!(error::error_kinds, m)?)?;
    Ok(())
}
