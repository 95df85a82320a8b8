//! `nearrec_bench._native`: the private extension of the benchmark distribution (`bench/`). It
//! binds `nearrec-bench` (machine limits and naive baselines) and the SSD tier's CPU cost per
//! read on a zero-latency device (`cost.rs`) for the harnesses in
//! `nearrec_bench`; the product extension, `nearrec._native`, does not link it.
//!
//! - `limits.rs`: memory and disk limits; `baselines.rs`: naive pread SLS and SSD-S's
//!   `MappedStore`;
//! - `cost.rs`: `read_cost`, the engine's SSD tier on the table files held in memory
//!   (`nearrec_io::MemDevice`, a zero-latency device on the same `BlockDevice` path) or on the
//!   disk: CPU time per device read;
//! - `kernels.rs`: `kernel_cost`, the fast pooling kernel against its scalar twin on one table
//!   (EMB-SSD Figs. 9(b) and 10);
//! - `load.rs`: `nearrec-loadgen` for `nearrec bench serve` — `load_run`, `redis_load`, and
//!   `EmbeddedStore` (the store in this process, the floor);
//! - `error.rs`: how its errors reach Python.

mod baselines;
mod cost;
mod error;
mod kernels;
mod limits;
mod load;

use pyo3::prelude::*;

// Nothing here leans on the GIL for exclusion: every shared state is behind its own lock or
// atomic, and calls release the GIL while they run; free-threaded Python may load it as is.
#[pymodule(gil_used = false)]
#[pyo3(name = "_native")]
fn nearrec_bench_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<baselines::MappedStore>()?;
    m.add_function(wrap_pyfunction!(baselines::naive_sls, m)?)?;
    m.add_function(wrap_pyfunction!(limits::stream_read, m)?)?;
    m.add_function(wrap_pyfunction!(limits::gather_rows, m)?)?;
    m.add_function(wrap_pyfunction!(limits::sequential_write, m)?)?;
    m.add_function(wrap_pyfunction!(limits::random_read, m)?)?;
    m.add_function(wrap_pyfunction!(cost::read_cost, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::kernel_cost, m)?)?;
    m.add_class::<load::EmbeddedStore>()?;
    m.add_function(wrap_pyfunction!(load::load_run, m)?)?;
    m.add_function(wrap_pyfunction!(load::redis_load, m)?)?;
    Ok(())
}
