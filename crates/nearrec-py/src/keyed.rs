//! Keyed tables (`nearrec_cache::KeyedTable`): rows by unbounded 64-bit keys, in DRAM.

use std::borrow::Cow;

use nearrec::{Indices, PoolingMode};
use nearrec_cache::{KeyedConfig, KeyedError, KeyedTable, Unknown};
use numpy::{
    PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::{detach, err, raise};
use crate::lookup::PyTableLookup;

fn keyed_err(py: Python<'_>, e: KeyedError) -> PyErr {
    let msg = e.to_string();
    match e {
        KeyedError::UnknownKey {
            table, position, ..
        } => raise(py, "UnknownKey", msg, Some(&table), Some(position)),
        KeyedError::Full { table, .. } => raise(py, "TableFull", msg, Some(&table), None),
        KeyedError::Invalid { table, .. } => raise(py, "InvalidRequest", msg, Some(&table), None),
        KeyedError::OutOfMemory { table, .. } => {
            raise(py, "InsufficientMemory", msg, Some(&table), None)
        }
        KeyedError::InsufficientMemory(_) => raise(py, "InsufficientMemory", msg, None, None),
    }
}

/// A keyed table; safe to use from many threads (the GIL is released around every call).
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativeKeyedTable {
    table: KeyedTable,
}

impl NativeKeyedTable {
    fn invalid(&self, py: Python<'_>, m: String) -> PyErr {
        raise(py, "InvalidRequest", m, Some(self.table.name()), None)
    }
}

/// A new `[bags, dim]` array that `fill` pools into, the GIL released meanwhile.
fn pooled<'py>(
    py: Python<'py>,
    bags: usize,
    dim: usize,
    fill: impl FnOnce(&mut [f32]) -> Result<(), KeyedError> + Send,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let out = PyArray2::<f32>::zeros(py, [bags, dim], false);
    {
        let mut rw = out.readwrite();
        let slice = rw.as_slice_mut().expect("new arrays are contiguous");
        detach(py, || fill(slice))?.map_err(|e| keyed_err(py, e))?;
    }
    Ok(out)
}

/// What a table pools of a [`PyTableLookup`] (built over this table's keys or row indices): its
/// ids as 64-bit values, its bags' bounds as the engine checks a store's, its weights and mode.
struct Bags<'a> {
    ids: Cow<'a, [i64]>,
    bounds: Vec<usize>,
    weights: Option<&'a [f32]>,
    mode: PoolingMode,
}

impl<'a> Bags<'a> {
    fn of(py: Python<'_>, lookup: &'a PyTableLookup) -> PyResult<Self> {
        let view = lookup.view();
        let bounds = (view.bag_bounds()).map_err(|e| err(py, nearrec::Error::from(e)))?;
        let ids = match view.indices {
            Indices::I64(ids) => Cow::Borrowed(ids),
            Indices::I32(ids) => Cow::Owned(ids.iter().map(|&i| i64::from(i)).collect()),
        };
        Ok(Bags {
            ids,
            bounds,
            weights: view.per_sample_weights,
            mode: view.mode,
        })
    }

    fn batch(&self) -> usize {
        self.bounds.len() - 1
    }
}

#[pymethods]
impl NativeKeyedTable {
    #[new]
    #[pyo3(signature = (name, dim, capacity, unknown = "error", init_scale = 0.01, seed = 0))]
    fn new(
        py: Python<'_>,
        name: &str,
        dim: usize,
        capacity: u64,
        unknown: &str,
        init_scale: f32,
        seed: u64,
    ) -> PyResult<Self> {
        let unknown: Unknown = unknown
            .parse()
            .map_err(|e: String| raise(py, "InvalidRequest", e, Some(name), None))?;
        let config = KeyedConfig {
            dim,
            capacity,
            unknown,
            init_scale,
            seed,
        };
        let table = KeyedTable::new(name, config).map_err(|e| keyed_err(py, e))?;
        Ok(Self { table })
    }

    /// Bytes a table of this shape takes.
    #[staticmethod]
    fn bytes_for(capacity: u64, dim: usize) -> u64 {
        KeyedTable::bytes_for(capacity, dim)
    }

    #[getter]
    fn name(&self) -> String {
        self.table.name().to_owned()
    }

    #[getter]
    fn dim(&self) -> usize {
        self.table.config().dim
    }

    #[getter]
    fn capacity(&self) -> u64 {
        self.table.config().capacity
    }

    fn __len__(&self) -> usize {
        self.table.len() as usize
    }

    /// Upserts the rows of `keys` (`[n, dim]` values), each replaced atomically, the call
    /// checked whole first; returns how many keys were inserted.
    fn write(
        &self,
        py: Python<'_>,
        keys: PyReadonlyArray1<'_, i64>,
        values: PyReadonlyArray2<'_, f32>,
        allow_nonfinite: bool,
    ) -> PyResult<u64> {
        let (keys, dim) = (keys.as_slice()?, self.table.config().dim);
        if values.shape() != [keys.len(), dim] {
            return Err(self.invalid(
                py,
                format!(
                    "values are {:?}, expected [{}, {dim}] (one row per key)",
                    values.shape(),
                    keys.len()
                ),
            ));
        }
        let values = values.as_slice()?;
        detach(py, || self.table.write(keys, values, allow_nonfinite))?
            .map_err(|e| keyed_err(py, e))
    }

    /// Calls that changed rows so far.
    #[getter]
    fn version(&self) -> u64 {
        self.table.version()
    }

    /// Removes `keys` (deleted until written again); returns how many were held.
    fn remove(&self, py: Python<'_>, keys: PyReadonlyArray1<'_, i64>) -> PyResult<u64> {
        let keys = keys.as_slice()?;
        detach(py, || self.table.remove(keys))
    }

    /// Pools the bags of `lookup`, a `TableLookup` of keys, into `[batch, dim]`.
    fn pool<'py>(
        &self,
        py: Python<'py>,
        lookup: PyRef<'py, PyTableLookup>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let bags = Bags::of(py, &lookup)?;
        pooled(py, bags.batch(), self.dim(), |out| {
            (self.table).pool(&bags.ids, &bags.bounds, bags.weights, bags.mode, out)
        })
    }

    /// The row index of each key as the unknown-key policy has it (-1: a zero row). Row indices
    /// stay valid for the table's life: keys are never removed.
    fn resolve<'py>(
        &self,
        py: Python<'py>,
        keys: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let keys = keys.as_slice()?;
        let rows = detach(py, || self.table.resolve(keys))?.map_err(|e| keyed_err(py, e))?;
        let rows = rows.into_iter().map(|r| r.map_or(-1, i64::from)).collect();
        Ok(PyArray1::from_vec(py, rows))
    }

    /// Pools the bags of `lookup`, a `TableLookup` of row indices (as [`Self::resolve`] gives
    /// them; -1: a zero row).
    fn pool_rows<'py>(
        &self,
        py: Python<'py>,
        lookup: PyRef<'py, PyTableLookup>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let bags = Bags::of(py, &lookup)?;
        let rows: Vec<Option<u32>> = bags.ids.iter().map(|&r| u32::try_from(r).ok()).collect();
        pooled(py, bags.batch(), self.dim(), |out| {
            (self.table).pool_rows(&rows, &bags.bounds, bags.weights, bags.mode, out)
        })
    }

    /// The rows of `keys` as `[n, dim]`, unknown keys handled by the table's policy.
    fn read<'py>(
        &self,
        py: Python<'py>,
        keys: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let keys = keys.as_slice()?;
        let bounds: Vec<usize> = (0..=keys.len()).collect();
        pooled(py, keys.len(), self.dim(), |out| {
            self.table.pool(keys, &bounds, None, PoolingMode::Sum, out)
        })
    }

    /// Whether each key is held (no policy applied, nothing counted).
    fn contains<'py>(
        &self,
        py: Python<'py>,
        keys: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Bound<'py, PyArray1<bool>>> {
        let keys = keys.as_slice()?;
        let held: Vec<bool> = detach(py, || {
            keys.iter().map(|&k| self.table.find(k).is_some()).collect()
        })?;
        Ok(PyArray1::from_vec(py, held))
    }

    /// Every key held and its row: `(keys [n], values [n, dim])`, keys in no particular order.
    fn export<'py>(&self, py: Python<'py>) -> PyResult<KeysAndRows<'py>> {
        let dim = self.table.config().dim;
        let (keys, values) = detach(py, || {
            let entries = self.table.entries();
            let mut values = vec![0f32; entries.len() * dim];
            for ((_, row), out) in entries.iter().zip(values.chunks_exact_mut(dim)) {
                self.table.read_row(*row, out);
            }
            (entries.into_iter().map(|e| e.0).collect::<Vec<_>>(), values)
        })?;
        let n = keys.len();
        let values = PyArray1::from_vec(py, values)
            .reshape([n, dim])
            .expect("n * dim values");
        Ok((PyArray1::from_vec(py, keys), values))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.table.stats();
        let d = PyDict::new(py);
        d.set_item("keys", s.keys)?;
        d.set_item("capacity", s.capacity)?;
        d.set_item("hits", s.hits)?;
        d.set_item("unknown_errors", s.unknown_errors)?;
        d.set_item("unknown_zero", s.unknown_zero)?;
        d.set_item("initialised", s.initialised)?;
        Ok(d)
    }
}

/// Keys `[n]` and their rows `[n, dim]`.
type KeysAndRows<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray2<f32>>);

/// DRAM the index of a keyed store table of `keys` keys takes (`nearrec_cache::KeyIndex`).
#[pyfunction]
pub(crate) fn key_index_bytes(keys: u64) -> u64 {
    nearrec_cache::KeyIndex::bytes_for(keys)
}
