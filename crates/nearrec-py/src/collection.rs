//! The native half of `nearrec.torch.EmbeddingBagCollection` over store tables: one call takes a
//! KeyedJaggedTensor (nearrec's or TorchRec's, through its public `keys()`, `values()`,
//! `lengths()` and `weights_or_none()`), slices it into one `Batch` from its own buffers
//! (`nearrec::jagged`; CPU tensors read in place), pools it and returns the `[batch, Σ dim]`
//! tensor. Everything the Python module would otherwise do per batch happens here, so that the
//! module costs what `Store.lookup_many` costs. Whole-model offload reads its batches the same
//! way (`infer`).

use std::sync::{Arc, Mutex};

use nearrec::{Batch, JaggedBlock, PoolingMode};
use numpy::{PyArray2, PyReadonlyArray2};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use crate::convert::{self, dense_features, index_view, weights_view};
use crate::error::{err, raise};
use crate::model::NativeModel;
use crate::store::{NativeStore, Seconds};
use crate::tensor;

/// A collection's store tables, in output order.
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativeCollection {
    store: Py<NativeStore>,
    /// Per output block: the table, the feature (KJT key) it reads, its pooling.
    tables: Vec<(String, String, PoolingMode)>,
    /// The dtype its answers come in.
    out: nearrec::OutDtype,
    /// The layout of the last key order seen: a model sends the same keys batch after batch.
    last: Mutex<Option<Arc<Layout>>>,
}

/// Where each table's feature sits among one key order.
struct Layout {
    keys: Vec<Py<PyString>>,
    /// Per table, the position of its feature among `keys`.
    position: Vec<usize>,
}

impl Layout {
    /// Whether `keys` is this key order (the same strings, usually the same objects).
    fn matches(&self, keys: &Bound<'_, PyList>) -> bool {
        keys.len() == self.keys.len()
            && self.keys.iter().zip(keys.iter()).all(|(a, b)| {
                let a = a.bind(keys.py());
                a.is(&b) || a.as_any().eq(&b).unwrap_or(false)
            })
    }
}

impl NativeCollection {
    /// The layout of `keys`, the cached one when the order has not changed.
    fn layout(&self, keys: &Bound<'_, PyAny>) -> PyResult<Arc<Layout>> {
        let py = keys.py();
        let list = match keys.cast::<PyList>() {
            Ok(l) => l.clone(),
            Err(_) => PyList::new(py, keys.try_iter()?.collect::<PyResult<Vec<_>>>()?)?,
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = last.as_ref().filter(|l| l.matches(&list)) {
            return Ok(l.clone());
        }
        let keys = list
            .iter()
            .map(|k| {
                k.cast_into::<PyString>().map(Bound::unbind).map_err(|k| {
                    let msg = format!("KeyedJaggedTensor keys are str, not {}", k.into_inner());
                    raise(py, "InvalidRequest", msg, None, None)
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let names = keys
            .iter()
            .map(|k| k.bind(py).to_str().map(str::to_owned))
            .collect::<PyResult<Vec<_>>>()?;
        let position = self
            .tables
            .iter()
            .map(|(table, feature, _)| {
                names.iter().position(|k| k == feature).ok_or_else(|| {
                    let msg = format!("features have no key '{feature}' for table '{table}'");
                    raise(py, "InvalidRequest", msg, Some(table), None)
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let layout = Arc::new(Layout { keys, position });
        *last = Some(layout.clone());
        Ok(layout)
    }

    /// `f` on `features` sliced into one batch of this collection's tables, read from the
    /// KeyedJaggedTensor's own buffers (held meanwhile); with its values tensor.
    fn with_batch<'py, T>(
        &self,
        features: &Bound<'py, PyAny>,
        f: impl FnOnce(&Batch<'_>) -> PyResult<T>,
    ) -> PyResult<(T, Bound<'py, PyAny>)> {
        let py = features.py();
        let keys = features.call_method0(intern!(py, "keys"))?;
        let values = features.call_method0(intern!(py, "values"))?;
        let lengths = features.call_method0(intern!(py, "lengths"))?;
        let weights = match features.getattr(intern!(py, "weights_or_none")) {
            Ok(f) => Some(f.call0()?).filter(|w| !w.is_none()),
            Err(_) => None,
        };
        let layout = self.layout(&keys)?;
        let (_held_values, ids) = index_view(py, &values, "values")?;
        let (_held_lengths, lens) = index_view(py, &lengths, "lengths")?;
        let held_weights = weights.map(|w| weights_view(py, &w)).transpose()?;
        // SAFETY: the arrays are held (`_held_*`) for the rest of this call
        let (ids, lens) = unsafe { (ids.indices(), lens.indices()) };
        // SAFETY: as above
        let w = held_weights.as_ref().map(|w| unsafe { w.1.floats() });
        let blocks = self
            .tables
            .iter()
            .zip(&layout.position)
            .map(|((table, _, mode), &key)| JaggedBlock {
                table,
                key,
                mode: *mode,
            })
            .collect::<Vec<_>>();
        let batch =
            nearrec::jagged(&blocks, layout.keys.len(), ids, lens, w).map_err(|e| err(py, e))?;
        Ok((f(&batch)?, values))
    }
}

#[pymethods]
impl NativeCollection {
    /// `tables`: per output block `(table, feature, mode)`; `out_dtype`: the answer's (a name;
    /// None: fp32).
    #[new]
    #[pyo3(signature = (store, tables, out_dtype = None))]
    fn new(
        py: Python<'_>,
        store: Py<NativeStore>,
        tables: Vec<(String, String, String)>,
        out_dtype: Option<&str>,
    ) -> PyResult<Self> {
        let out = convert::out_dtype(py, out_dtype)?;
        let tables = tables
            .into_iter()
            .map(
                |(table, feature, mode)| match PoolingMode::from_name(&mode) {
                    Some(m) => Ok((table, feature, m)),
                    None => {
                        let msg = format!("table {table:?}: mode {mode:?}");
                        Err(raise(py, "InvalidRequest", msg, Some(&table), None))
                    }
                },
            )
            .collect::<PyResult<_>>()?;
        Ok(Self {
            store,
            tables,
            out,
            last: Mutex::new(None),
        })
    }

    /// Pools `features` into a `[batch, Σ dim]` float32 tensor on the device of its values.
    fn forward<'py>(&self, features: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = features.py();
        let (out, values) = self.with_batch(features, |batch| {
            self.store.get().pool(py, &batch.clone().with_out(self.out))
        })?;
        let out = tensor::from_numpy(py, out.into_any())?;
        if tensor::is_cpu(py, &values) {
            Ok(out)
        } else {
            out.call_method1(intern!(py, "to"), (values.getattr(intern!(py, "device"))?,))
        }
    }

    /// Whole-model offload of one batch: `model` on `dense` (`[batch, dense_width]` float32, or
    /// None) and `features`, whose tables are the model's inputs in order. Returns what
    /// `NativeStore.infer` returns.
    fn infer<'py>(
        &self,
        model: &NativeModel,
        dense: Option<PyReadonlyArray2<'py, f32>>,
        features: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyArray2<f32>>, Seconds)> {
        let py = features.py();
        let dense = dense_features(py, dense.as_ref())?;
        let store = self.store.get();
        let (out, _) = self.with_batch(features, |batch| {
            store.infer_batch(py, Some(model), dense, batch, true)
        })?;
        Ok(out)
    }
}
