//! `nearrec._native`: the private extension module. Each file binds one core concept; the typed
//! public API lives in the pure-Python package `nearrec` above it.

mod cache;
mod collection;
mod config;
mod device;
mod error;
mod keyed;
mod lookup;
mod model;
mod node;
mod plan;
mod progress;
mod raw;
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
    m.add_function(wrap_pyfunction!(node::serve, m)?)?;
    m.add_function(wrap_pyfunction!(node::node_flags, m)?)?;
    m.add_class::<node::NativeNodeConfig>()?;
    m.add_class::<store::NativePending>()?;
    m.add_class::<store::NativeStream>()?;
    m.add_class::<collection::NativeCollection>()?;
    m.add_class::<config::NativeConfig>()?;
    m.add_class::<lookup::PyTableLookup>()?;
    m.add_function(wrap_pyfunction!(config::parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(model::model_save, m)?)?;
    m.add_class::<plan::NativePlan>()?;
    m.add_function(wrap_pyfunction!(plan::plan_make, m)?)?;
    m.add_function(wrap_pyfunction!(plan::plan_check_trace, m)?)?;
    m.add_function(wrap_pyfunction!(plan::plan_load, m)?)?;
    m.add_class::<writer::NativeStoreWriter>()?;
    m.add_class::<keyed::NativeKeyedTable>()?;
    m.add_class::<model::NativeModel>()?;
    m.add_function(wrap_pyfunction!(cache::cache_simulate, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_simulate, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_preset, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_fit, m)?)?;
    m.add_function(wrap_pyfunction!(device::device_read_rate, m)?)?;
    m.add_function(wrap_pyfunction!(device::disk_read_rate, m)?)?;
    m.add_function(wrap_pyfunction!(store::verify_store, m)?)?;
    m.add_function(wrap_pyfunction!(store::store_gc, m)?)?;
    m.add_function(wrap_pyfunction!(store::read_manifest, m)?)?;
    m.add_function(wrap_pyfunction!(store::store_attach, m)?)?;
    m.add_function(wrap_pyfunction!(store::store_read_attachment, m)?)?;
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
