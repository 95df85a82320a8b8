//! Machine limits for the benchmark harness (measured in the same run as the systems).

use std::collections::HashMap;
use std::path::PathBuf;

use nearrec_bench::Limit;
use pyo3::prelude::*;

use crate::error::io_err;

fn as_dict(l: Limit) -> HashMap<&'static str, f64> {
    HashMap::from([
        ("bytes_per_s", l.bytes_per_s),
        ("items_per_s", l.items_per_s),
        ("seconds", l.seconds),
    ])
}

/// Streaming-read bandwidth of memory (best of `passes`).
#[pyfunction]
#[pyo3(signature = (bytes, passes = 3, threads = 2))]
pub(crate) fn stream_read(
    py: Python<'_>,
    bytes: usize,
    passes: usize,
    threads: usize,
) -> HashMap<&'static str, f64> {
    as_dict(py.detach(|| nearrec_bench::stream_read(bytes, passes, threads)))
}

/// Random row-gather limit of memory (best of `passes`).
#[pyfunction]
#[pyo3(signature = (table_bytes, row_bytes, gathers, passes = 3, threads = 2))]
pub(crate) fn gather_rows(
    py: Python<'_>,
    table_bytes: usize,
    row_bytes: usize,
    gathers: usize,
    passes: usize,
    threads: usize,
) -> HashMap<&'static str, f64> {
    as_dict(
        py.detach(|| nearrec_bench::gather_rows(table_bytes, row_bytes, gathers, passes, threads)),
    )
}

/// Sequential-write bandwidth of the disk under `dir` (buffered writes + fsync).
#[pyfunction]
pub(crate) fn sequential_write(
    py: Python<'_>,
    dir: PathBuf,
    bytes: u64,
) -> PyResult<HashMap<&'static str, f64>> {
    Ok(as_dict(
        py.detach(|| nearrec_bench::sequential_write(&dir, bytes))?,
    ))
}

/// The disk's random-read limit: `reads` direct block reads over `paths` at `queue_depth`, at
/// blocks chosen by `seed` (the product's probe, `nearrec_io::measure_read_rate`).
#[pyfunction]
#[pyo3(signature = (paths, reads, queue_depth, seed = 7))]
pub(crate) fn random_read(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    reads: usize,
    queue_depth: u32,
    seed: u64,
) -> PyResult<HashMap<&'static str, f64>> {
    py.detach(|| nearrec_bench::random_read(&paths, reads, queue_depth, seed))
        .map(as_dict)
        .map_err(io_err)
}
