//! `nearrec.TableLookup`, a native type: one table's bags of a batched lookup, its arrays
//! converted once, at construction, into what the engine reads (contiguous int32 / int64 indices,
//! offsets or lengths; float32 weights), without any unsafe cast. A lookup is then a view of
//! those arrays ([`PyTableLookup::view`]): no copy, no second check — the engine validates the
//! values (bags against indices, rows against tables) once.
//!
//! What is refused here is the conversion: a float or bool array as indices, a string as a mode,
//! a 3-D array. Each error is an `InvalidRequest` naming the table.

use std::sync::Arc;

use nearrec::{AsBatch, Bags, Batch, PoolingMode, TableLookup};
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::convert::{index_array, padding, real_bool, type_name, vector, weights_array};
use crate::error::raise;
use crate::raw::Raw;

/// The bags of one table in a batched lookup (`torch.nn.EmbeddingBag`'s arguments). Give
/// `offsets` (with `include_last_offset`), or `lengths`, or a 2-D `indices` `[batch, bag_size]`
/// with neither.
#[pyclass(module = "nearrec._native", name = "TableLookup", frozen, subclass)]
pub(crate) struct PyTableLookup {
    #[pyo3(get)]
    table: String,
    /// The converted arrays, as the caller sees them.
    #[pyo3(get)]
    indices: Py<PyAny>,
    #[pyo3(get)]
    offsets: Option<Py<PyAny>>,
    #[pyo3(get)]
    lengths: Option<Py<PyAny>>,
    #[pyo3(get)]
    per_sample_weights: Option<Py<PyAny>>,
    mode: PoolingMode,
    #[pyo3(get)]
    include_last_offset: bool,
    #[pyo3(get)]
    padding_idx: Option<i64>,
    /// The engine's view of the arrays.
    raw_indices: Raw,
    raw_bags: RawBags,
    raw_weights: Option<Raw>,
}

#[derive(Clone, Copy)]
enum RawBags {
    Offsets(Raw),
    Lengths(Raw),
    Fixed { batch: usize, bag_size: usize },
}

#[pymethods]
impl PyTableLookup {
    #[new]
    #[pyo3(signature = (table, indices, offsets, lengths, per_sample_weights, mode, include_last_offset, padding_idx))]
    #[allow(clippy::too_many_arguments)] // torch.nn.EmbeddingBag's arguments
    fn new(
        py: Python<'_>,
        table: &Bound<'_, PyAny>,
        indices: &Bound<'_, PyAny>,
        offsets: Option<&Bound<'_, PyAny>>,
        lengths: Option<&Bound<'_, PyAny>>,
        per_sample_weights: Option<&Bound<'_, PyAny>>,
        mode: &Bound<'_, PyAny>,
        include_last_offset: &Bound<'_, PyAny>,
        padding_idx: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        fn none<'a, 'py>(o: Option<&'a Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
            o.filter(|o| !o.is_none())
        }
        let Ok(t) = table.cast::<PyString>() else {
            return Err(raise(
                py,
                "InvalidRequest",
                format!(
                    "the table name must be a str, not {} {}",
                    type_name(table),
                    table.repr().map_or_else(|_| "?".into(), |r| r.to_string())
                ),
                None,
                None,
            ));
        };
        // not `to_string`: its `Display` writes a failure (a KeyboardInterrupt pending as the
        // name is read) as unraisable and goes on with "<unprintable str object>" as the name
        let t = t.to_cow()?.into_owned();
        let invalid = |msg: String| raise(py, "InvalidRequest", msg, Some(&t), None);
        let (indices, raw_indices) = index_array(py, indices, &t, "indices")?;
        let ndim = indices.bind(py).cast::<PyUntypedArray>()?.ndim();
        let (offsets, lengths) = (none(offsets), none(lengths));
        let (mut off, mut len) = (None, None);
        let raw_bags = match ndim {
            2 => {
                if offsets.is_some() || lengths.is_some() {
                    return Err(invalid(format!(
                        "table {t:?}: 2-D indices [batch, bag_size] take no offsets or lengths"
                    )));
                }
                let shape = indices.bind(py).cast::<PyUntypedArray>()?.shape().to_vec();
                RawBags::Fixed {
                    batch: shape[0],
                    bag_size: shape[1],
                }
            }
            1 => match (offsets, lengths) {
                (None, None) => {
                    return Err(invalid(format!(
                        "table {t:?}: 1-D indices need offsets or lengths (or pass 2-D indices)"
                    )));
                }
                (Some(_), Some(_)) => {
                    return Err(invalid(format!(
                        "table {t:?}: give offsets or lengths, not both"
                    )));
                }
                (Some(o), None) => {
                    let (a, raw) = vector(py, o, &t, "offsets")?;
                    off = Some(a);
                    RawBags::Offsets(raw)
                }
                (None, Some(l)) => {
                    let (a, raw) = vector(py, l, &t, "lengths")?;
                    len = Some(a);
                    RawBags::Lengths(raw)
                }
            },
            n => {
                return Err(invalid(format!(
                    "table {t:?}: indices must be 1-D (with offsets) or 2-D, got {n}-D"
                )));
            }
        };
        let (weights, raw_weights) = match none(per_sample_weights) {
            None => (None, None),
            Some(w) => {
                let (a, raw) = weights_array(py, w, &t, indices.bind(py))?;
                (Some(a), Some(raw))
            }
        };
        let mode = crate::convert::mode(py, mode, Some(&t), "mode")?;
        let include_last_offset = real_bool(include_last_offset).ok_or_else(|| {
            invalid(format!(
                "table {t:?}: include_last_offset must be True or False, not {}",
                crate::convert::repr(include_last_offset)
            ))
        })?;
        let padding_idx = match none(padding_idx) {
            None => None,
            Some(p) => Some(padding(py, p, &t)?),
        };
        Ok(Self {
            table: t,
            indices,
            offsets: off,
            lengths: len,
            per_sample_weights: weights,
            mode,
            include_last_offset,
            padding_idx,
            raw_indices,
            raw_bags,
            raw_weights,
        })
    }

    /// `"sum"`, `"mean"` or `"max"`.
    #[getter]
    fn mode(&self) -> &'static str {
        self.mode.name()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let shape = self
            .indices
            .bind(py)
            .cast::<PyUntypedArray>()
            .map(|a| format!("{:?}", a.shape()))
            .unwrap_or_default();
        let bags = match self.raw_bags {
            RawBags::Offsets(_) => "offsets",
            RawBags::Lengths(_) => "lengths",
            RawBags::Fixed { .. } => "2-D",
        };
        format!(
            "TableLookup({:?}, indices{shape}, {bags}, mode={:?})",
            self.table,
            self.mode.name()
        )
    }
}

impl PyTableLookup {
    /// The engine's view of this lookup's arrays (valid while `self` lives).
    pub(crate) fn view(&self) -> TableLookup<'_> {
        // SAFETY: self holds the arrays the pointers are into, for as long as the view borrows
        // self
        unsafe {
            TableLookup {
                table: &self.table,
                indices: self.raw_indices.indices(),
                bags: match self.raw_bags {
                    RawBags::Offsets(o) => Bags::Offsets {
                        offsets: o.indices(),
                        include_last_offset: self.include_last_offset,
                    },
                    RawBags::Lengths(l) => Bags::Lengths(l.indices()),
                    RawBags::Fixed { batch, bag_size } => Bags::Fixed { batch, bag_size },
                },
                per_sample_weights: self.raw_weights.map(|w| w.floats()),
                mode: self.mode,
                padding_idx: self.padding_idx,
            }
        }
    }
}

/// A batch of lookups the binding holds on to, so that it can run without the GIL, in the
/// background as well ([`nearrec::Store::submit`]).
#[derive(Clone)]
pub(crate) struct HeldBatch {
    lookups: Arc<[Py<PyTableLookup>]>,
    out: nearrec::OutDtype,
}

impl HeldBatch {
    /// The lookups of `items`: a list or tuple of `TableLookup` (anything else is named).
    pub(crate) fn extract(items: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = items.py();
        let list: Vec<Bound<'_, PyAny>> = if let Ok(l) = items.cast::<PyList>() {
            l.iter().collect()
        } else if let Ok(t) = items.cast::<PyTuple>() {
            t.iter().collect()
        } else {
            return Err(raise(
                py,
                "InvalidRequest",
                format!(
                    "a batch is a sequence of TableLookup, not {}",
                    type_name(items)
                ),
                None,
                None,
            ));
        };
        let lookups = list
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.cast::<PyTableLookup>()
                    .map(|b| b.clone().unbind())
                    .map_err(|_| {
                        raise(
                            py,
                            "InvalidRequest",
                            format!(
                                "a lookup takes TableLookup items, got {} (request {i})",
                                type_name(item)
                            ),
                            None,
                            Some(i),
                        )
                    })
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Self {
            lookups: lookups.into(),
            out: nearrec::OutDtype::F32,
        })
    }

    /// The batch answered in `out`.
    pub(crate) fn with_out(self, out: nearrec::OutDtype) -> Self {
        Self { out, ..self }
    }
}

impl AsBatch for HeldBatch {
    fn as_batch(&self) -> Batch<'_> {
        Batch::new(self.lookups.iter().map(|l| l.get().view()).collect()).with_out(self.out)
    }
}
