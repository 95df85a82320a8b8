//! Machine limits for the benchmark harness (measured in the same run as the systems).

use std::collections::HashMap;
use std::path::PathBuf;

use nearrec_bench::Limit;
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1};
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

/// The naive SSD baseline: per-row synchronous `O_DIRECT` preads + host sum pooling, on
/// `threads` threads; returns the `[batch, Σ dim]` output.
#[pyfunction]
pub(crate) fn naive_sls<'py>(
    py: Python<'py>,
    store: PathBuf,
    indices: Vec<PyReadonlyArray1<'py, i64>>,
    bag_size: usize,
    threads: usize,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let slices = indices
        .iter()
        .map(|a| a.as_slice())
        .collect::<Result<Vec<_>, _>>()?;
    let out = py.detach(|| nearrec_bench::pread_sls(&store, &slices, bag_size, threads))?;
    let batch = slices.first().map_or(0, |s| s.len() / bag_size.max(1));
    let width = out.len().checked_div(batch).unwrap_or(0);
    PyArray1::from_vec(py, out).reshape([batch, width])
}

/// RM-SSD's SSD-S baseline over a store: tables mapped, rows faulted in through the page cache,
/// pooled on the host (`nearrec_bench::MappedStore`).
#[pyclass(module = "nearrec_bench._native", frozen)]
pub(crate) struct MappedStore {
    inner: nearrec_bench::MappedStore,
}

#[pymethods]
impl MappedStore {
    #[new]
    #[pyo3(signature = (path, random = true))]
    fn new(py: Python<'_>, path: PathBuf, random: bool) -> PyResult<Self> {
        let inner = py.detach(|| nearrec_bench::MappedStore::open(&path, random))?;
        Ok(Self { inner })
    }

    /// Sum-pools `[(table id, indices, offsets of batch + 1)]` into `[batch, Σ dim]`.
    fn pool<'py>(
        &self,
        py: Python<'py>,
        requests: Vec<(
            usize,
            PyReadonlyArray1<'py, i64>,
            PyReadonlyArray1<'py, i64>,
        )>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let bounds: Vec<Vec<usize>> = requests
            .iter()
            .map(|(_, _, o)| Ok(o.as_slice()?.iter().map(|&v| v.max(0) as usize).collect()))
            .collect::<PyResult<_>>()?;
        let batch = bounds.first().map_or(0, |b| b.len().saturating_sub(1));
        let bags = requests
            .iter()
            .zip(&bounds)
            .map(|((t, i, _), b)| {
                Ok(nearrec_bench::MappedBags {
                    table: *t,
                    indices: i.as_slice()?,
                    bounds: b,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let out = py.detach(|| self.inner.pool(&bags, batch))?;
        let width = out.len() / batch.max(1);
        PyArray1::from_vec(py, out).reshape([batch, width])
    }
}
