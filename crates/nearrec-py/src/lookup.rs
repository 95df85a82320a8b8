//! Turning Python arguments (numpy arrays) into an engine [`Batch`] without copying them.

use nearrec_engine::{Bags, Batch, Indices, PoolingMode, TableLookup};
use numpy::{PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::error::raise;

/// A borrowed numpy index array of either width.
pub(crate) enum IndexArray<'py> {
    I32(PyReadonlyArray1<'py, i32>),
    I64(PyReadonlyArray1<'py, i64>),
}

impl<'py> IndexArray<'py> {
    pub(crate) fn extract(obj: &Bound<'py, PyAny>, table: &str, what: &str) -> PyResult<Self> {
        if let Ok(a) = obj.extract::<PyReadonlyArray1<'py, i64>>() {
            return Ok(Self::I64(a));
        }
        if let Ok(a) = obj.extract::<PyReadonlyArray1<'py, i32>>() {
            return Ok(Self::I32(a));
        }
        Err(raise(
            obj.py(),
            "InvalidRequest",
            format!(
                "table {table:?}: {what} must be a 1-D int32 or int64 array, got {}",
                describe(obj)
            ),
            Some(table),
            None,
        ))
    }

    pub(crate) fn indices(&self, py: Python<'_>, table: &str, what: &str) -> PyResult<Indices<'_>> {
        let not_contiguous = || {
            raise(
                py,
                "InvalidRequest",
                format!("table {table:?}: {what} must be contiguous"),
                Some(table),
                None,
            )
        };
        Ok(match self {
            Self::I32(a) => Indices::I32(a.as_slice().map_err(|_| not_contiguous())?),
            Self::I64(a) => Indices::I64(a.as_slice().map_err(|_| not_contiguous())?),
        })
    }
}

fn describe(obj: &Bound<'_, PyAny>) -> String {
    match obj.cast::<numpy::PyUntypedArray>() {
        Ok(a) => format!("a {}-D array of {}", a.ndim(), a.dtype()),
        Err(_) => obj
            .get_type()
            .name()
            .map_or_else(|_| "an unknown object".into(), |n| n.to_string()),
    }
}

/// One table's arguments as the Python layer passes them:
/// `(table, indices, offsets, lengths, shape, include_last_offset, weights, mode, padding_idx)`,
/// `shape` being `(batch, bag_size)` for 2-D input.
pub(crate) struct TableArgs<'py> {
    table: String,
    indices: IndexArray<'py>,
    offsets: Option<IndexArray<'py>>,
    lengths: Option<IndexArray<'py>>,
    shape: Option<(usize, usize)>,
    include_last_offset: bool,
    weights: Option<PyReadonlyArray1<'py, f32>>,
    mode: PoolingMode,
    padding_idx: Option<i64>,
}

type RawArgs<'py> = (
    String,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
    Option<(usize, usize)>,
    bool,
    Option<Bound<'py, PyAny>>,
    String,
    Option<i64>,
);

impl<'py> TableArgs<'py> {
    pub(crate) fn extract(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        let (
            table,
            indices,
            offsets,
            lengths,
            shape,
            include_last_offset,
            weights,
            mode,
            padding_idx,
        ): RawArgs<'py> = obj.extract()?;
        let t = table.as_str();
        let mode = match mode.as_str() {
            "sum" => PoolingMode::Sum,
            "mean" => PoolingMode::Mean,
            "max" => PoolingMode::Max,
            other => {
                return Err(raise(
                    py,
                    "InvalidRequest",
                    format!("table {t:?}: mode must be 'sum', 'mean' or 'max', not {other:?}"),
                    Some(t),
                    None,
                ));
            }
        };
        let weights = weights
            .map(|w| {
                w.extract::<PyReadonlyArray1<'py, f32>>().map_err(|_| {
                    raise(
                        py,
                        "InvalidRequest",
                        format!(
                            "table {t:?}: per_sample_weights must be a 1-D float32 array, got {}",
                            describe(&w)
                        ),
                        Some(t),
                        None,
                    )
                })
            })
            .transpose()?;
        Ok(Self {
            indices: IndexArray::extract(&indices, t, "indices")?,
            offsets: offsets
                .map(|o| IndexArray::extract(&o, t, "offsets"))
                .transpose()?,
            lengths: lengths
                .map(|l| IndexArray::extract(&l, t, "lengths"))
                .transpose()?,
            table,
            shape,
            include_last_offset,
            weights,
            mode,
            padding_idx,
        })
    }

    /// Every table's arguments of a list.
    pub(crate) fn extract_list(tables: &Bound<'py, PyList>) -> PyResult<Vec<Self>> {
        tables.iter().map(|t| Self::extract(&t)).collect()
    }

    /// The engine's request for a list's arguments (borrows their arrays).
    pub(crate) fn requests<'a>(py: Python<'_>, args: &'a [Self]) -> PyResult<Batch<'a>> {
        Ok(Batch::new(
            args.iter()
                .map(|a| a.request(py))
                .collect::<PyResult<Vec<_>>>()?,
        ))
    }

    /// The engine's view of these arguments (borrows the arrays).
    pub(crate) fn request(&self, py: Python<'_>) -> PyResult<TableLookup<'_>> {
        let t = self.table.as_str();
        let bags = match (&self.offsets, &self.lengths, self.shape) {
            (Some(o), None, None) => Bags::Offsets {
                offsets: o.indices(py, t, "offsets")?,
                include_last_offset: self.include_last_offset,
            },
            (None, Some(l), None) => Bags::Lengths(l.indices(py, t, "lengths")?),
            (None, None, Some((batch, bag_size))) => Bags::Fixed { batch, bag_size },
            _ => {
                return Err(raise(
                    py,
                    "InvalidRequest",
                    format!("table {t:?}: give exactly one of offsets, lengths or a 2-D input"),
                    Some(t),
                    None,
                ));
            }
        };
        let weights = match &self.weights {
            Some(w) => Some(w.as_slice().map_err(|_| {
                raise(
                    py,
                    "InvalidRequest",
                    format!("table {t:?}: per_sample_weights must be contiguous"),
                    Some(t),
                    None,
                )
            })?),
            None => None,
        };
        Ok(TableLookup {
            table: t,
            indices: self.indices.indices(py, t, "indices")?,
            bags,
            per_sample_weights: weights,
            mode: self.mode,
            padding_idx: self.padding_idx,
        })
    }
}
