//! The naive baselines that are not another project's code: per-row pread SLS and RM-SSD's
//! SSD-S (tables memory-mapped, pooled on the host).

use std::path::PathBuf;

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;

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
