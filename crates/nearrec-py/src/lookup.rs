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
use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList, PyString, PyTuple};

use crate::error::raise;
use crate::raw::Raw;
use crate::tensor::{self, Want};

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
        let t = t.to_string();
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
        let Some(mode) = mode.extract::<&str>().ok().and_then(PoolingMode::from_name) else {
            return Err(invalid(format!(
                "table {t:?}: mode must be 'sum', 'mean' or 'max', not {}",
                repr(mode)
            )));
        };
        let include_last_offset = real_bool(include_last_offset).ok_or_else(|| {
            invalid(format!(
                "table {t:?}: include_last_offset must be True or False, not {}",
                repr(include_last_offset)
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
        })
    }
}

impl AsBatch for HeldBatch {
    fn as_batch(&self) -> Batch<'_> {
        Batch::new(self.lookups.iter().map(|l| l.get().view()).collect())
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "object".into(), |n| n.to_string())
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| type_name(obj), |r| r.to_string())
}

/// `True` / `False` (also numpy's), nothing else: `"no"` is neither.
fn real_bool(obj: &Bound<'_, PyAny>) -> Option<bool> {
    if let Ok(b) = obj.cast::<PyBool>() {
        return Some(b.is_true());
    }
    let np_bool = obj.py().import("numpy").ok()?.getattr("bool_").ok()?;
    if obj.is_instance(&np_bool).ok()? {
        return obj.is_truthy().ok();
    }
    None
}

/// `padding_idx` as an integer (not a bool: `True` is not row 1) that fits int64.
fn padding(py: Python<'_>, p: &Bound<'_, PyAny>, t: &str) -> PyResult<i64> {
    let invalid = |msg: String| raise(py, "InvalidRequest", msg, Some(t), None);
    if real_bool(p).is_some() {
        return Err(invalid(format!(
            "table {t:?}: padding_idx must be an integer row or None, not the bool {}",
            repr(p)
        )));
    }
    let index = p.call_method0("__index__").map_err(|_| {
        invalid(format!(
            "table {t:?}: padding_idx must be an integer row or None, not {} {}",
            type_name(p),
            repr(p)
        ))
    })?;
    index.extract::<i64>().map_err(|_| {
        invalid(format!(
            "table {t:?}: padding_idx {} is out of range",
            repr(p)
        ))
    })
}

/// `x` (an array, a CPU or GPU tensor, a list) as a numpy array, zero-copy where it can be.
fn as_array<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    what: &str,
    t: &str,
) -> PyResult<Bound<'py, PyAny>> {
    if x.cast::<PyUntypedArray>().is_ok() {
        return Ok(x.clone());
    }
    // a CPU tensor without grad: its numpy view in one call (whatever else answers `numpy()`
    // is checked like any array; what does not takes the general path below)
    if let Ok(view) = x.call_method0("numpy")
        && view.cast::<PyUntypedArray>().is_ok()
    {
        return Ok(view);
    }
    let convert = || -> PyResult<Bound<'py, PyAny>> {
        let mut x = x.clone();
        if x.hasattr("detach")? && x.hasattr("cpu")? {
            // a torch tensor: zero-copy on CPU
            x = x.call_method0("detach")?;
            if x.getattr("device")?.getattr("type")?.extract::<String>()? != "cpu" {
                x = x.call_method0("cpu")?;
            }
            x = x.call_method0("numpy")?;
        }
        py.import("numpy")?.call_method1("asarray", (x,))
    };
    convert().map_err(|e| {
        if e.is_instance_of::<PyTypeError>(py)
            || e.is_instance_of::<pyo3::exceptions::PyValueError>(py)
            || e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py)
            || e.is_instance_of::<pyo3::exceptions::PyRuntimeError>(py)
        {
            raise(
                py,
                "InvalidRequest",
                format!("table {t:?}: {what} is not an array: {}", e.value(py)),
                Some(t),
                None,
            )
        } else {
            e
        }
    })
}

/// `x` as a contiguous int32 / int64 array (any number of dimensions) and its data. Arrays of
/// other dtypes (floats, bools, unsigned or narrower integers) are refused rather than cast;
/// Python lists of integers become int64, an empty list an empty int64 array; a value of such a
/// list past int64 is an `IndexOutOfRange` at its position.
fn index_array(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    t: &str,
    what: &str,
) -> PyResult<(Py<PyAny>, Raw)> {
    if let Some(done) = contiguous(x) {
        return Ok(done);
    }
    let a = as_array(py, x, what, t)?;
    // a tensor's numpy view, a list of ints: what numpy made of it is already right
    if let Some(done) = contiguous(&a) {
        return Ok(done);
    }
    let np = py.import("numpy")?;
    let arr = a.cast::<PyUntypedArray>()?;
    let dtype = arr.dtype();
    let (kind, size) = (dtype.kind(), arr.len());
    let is_seq = x.cast::<PyList>().is_ok()
        || x.cast::<PyTuple>().is_ok()
        || x.is_instance(&py.import("builtins")?.getattr("range")?)?;
    let a = if (dtype.is_equiv_to(&numpy::dtype::<i64>(py))
        || dtype.is_equiv_to(&numpy::dtype::<i32>(py)))
        && kind == b'i'
    {
        a
    } else if size == 0 && kind == b'f' {
        np.call_method1("zeros", (arr.shape().to_vec(), np.getattr("int64")?))?
    } else if is_seq && (kind == b'i' || kind == b'u') {
        if dtype.is_equiv_to(&numpy::dtype::<u64>(py)) && size > 0 {
            let big = a.call_method1("__gt__", (i64::MAX,))?;
            if big.call_method0("any")?.is_truthy()? {
                let pos: usize = np.call_method1("argmax", (&big,))?.extract()?;
                let value = a.getattr("flat")?.get_item(pos)?;
                return Err(raise(
                    py,
                    "IndexOutOfRange",
                    format!("table {t:?}: {what}[{pos}] = {value} does not fit int64"),
                    Some(t),
                    Some(pos),
                ));
            }
        }
        a.call_method1("astype", (np.getattr("int64")?,))?
    } else {
        let kind = if kind == b'O' {
            "Python objects (mixed, or integers past 64 bits)".to_owned()
        } else {
            a.getattr("dtype")?.str()?.to_string()
        };
        return Err(raise(
            py,
            "InvalidRequest",
            format!("table {t:?}: {what} must be int32 or int64, got {kind}"),
            Some(t),
            None,
        ));
    };
    // (a 0-d array stays 0-d, for the caller to refuse: ascontiguousarray would make it 1-D)
    let a = if a.cast::<PyUntypedArray>()?.is_c_contiguous() {
        a
    } else {
        np.call_method1("ascontiguousarray", (a,))?
    };
    Ok(contiguous(&a).expect("a contiguous int32 / int64 array"))
}

/// `x` itself when it is already a C-contiguous int32 / int64 numpy array (the fast path).
fn contiguous(x: &Bound<'_, PyAny>) -> Option<(Py<PyAny>, Raw)> {
    let arr = x.cast::<PyUntypedArray>().ok()?;
    if !arr.is_c_contiguous() {
        return None;
    }
    let n = arr.len();
    if let Ok(a) = x.cast::<numpy::PyArrayDyn<i64>>() {
        return Some((x.clone().unbind(), Raw::I64(a.data(), n)));
    }
    if let Ok(a) = x.cast::<numpy::PyArrayDyn<i32>>() {
        return Some((x.clone().unbind(), Raw::I32(a.data(), n)));
    }
    None
}

/// `x` as a 1-D contiguous int32 / int64 array.
fn vector(py: Python<'_>, x: &Bound<'_, PyAny>, t: &str, what: &str) -> PyResult<(Py<PyAny>, Raw)> {
    let (a, raw) = index_array(py, x, t, what)?;
    let arr = a.bind(py).cast::<PyUntypedArray>()?;
    if arr.ndim() != 1 {
        return Err(raise(
            py,
            "InvalidRequest",
            format!(
                "table {t:?}: {what} must be 1-D, got {}-D (shape {:?})",
                arr.ndim(),
                arr.shape()
            ),
            Some(t),
            None,
        ));
    }
    Ok((a, raw))
}

/// `per_sample_weights` as a contiguous float32 array of the indices' shape. Other dtypes are
/// refused rather than cast: a float64 weight past float32's range would become inf.
fn weights_array(
    py: Python<'_>,
    w: &Bound<'_, PyAny>,
    t: &str,
    indices: &Bound<'_, PyAny>,
) -> PyResult<(Py<PyAny>, Raw)> {
    let a = as_array(py, w, "per_sample_weights", t)?;
    let arr = a.cast::<PyUntypedArray>()?;
    if !arr.dtype().is_equiv_to(&numpy::dtype::<f32>(py)) {
        return Err(raise(
            py,
            "InvalidRequest",
            format!(
                "table {t:?}: per_sample_weights must be float32, got {}",
                a.getattr("dtype")?.str()?
            ),
            Some(t),
            None,
        ));
    }
    let ishape = indices.cast::<PyUntypedArray>()?.shape().to_vec();
    if arr.shape() != ishape.as_slice() {
        return Err(raise(
            py,
            "InvalidRequest",
            format!(
                "table {t:?}: per_sample_weights has shape {} but indices have shape {}",
                shape_str(arr.shape()),
                shape_str(&ishape)
            ),
            Some(t),
            None,
        ));
    }
    let a = if arr.is_c_contiguous() {
        a
    } else {
        py.import("numpy")?
            .call_method1("ascontiguousarray", (a,))?
    };
    let n = a.cast::<PyUntypedArray>()?.len();
    let data = a.cast::<numpy::PyArrayDyn<f32>>()?.data();
    Ok((a.unbind(), Raw::F32(data, n)))
}

/// A shape as numpy prints it: `(3,)`, `(2, 4)`.
fn shape_str(shape: &[usize]) -> String {
    match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A KeyedJaggedTensor's `values` or `lengths` (an array or a tensor) as a 1-D int32 / int64
/// view, converted as a `TableLookup`'s arrays are.
pub(crate) fn index_view(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<(Py<PyAny>, Raw)> {
    if let Some(done) = tensor::cpu_vector(py, x, Want::Index) {
        return Ok(done);
    }
    vector(py, x, "features", what)
}

/// A KeyedJaggedTensor's weights as a 1-D float32 view.
pub(crate) fn weights_view(py: Python<'_>, w: &Bound<'_, PyAny>) -> PyResult<(Py<PyAny>, Raw)> {
    if let Some(done) = tensor::cpu_vector(py, w, Want::F32) {
        return Ok(done);
    }
    let a = as_array(py, w, "weights", "features")?;
    let n = a.cast::<PyUntypedArray>()?.len();
    let ones = PyArray1::<f32>::zeros(py, [n], false).into_any();
    weights_array(py, &a, "features", &ones)
}

/// A model's dense features as the engine reads them: a contiguous `[batch, width]` float32
/// array, or none (models without dense features).
pub(crate) fn dense_features<'a>(
    py: Python<'_>,
    dense: Option<&'a numpy::PyReadonlyArray2<'_, f32>>,
) -> PyResult<&'a [f32]> {
    match dense {
        Some(d) => d.as_slice().map_err(|_| {
            raise(
                py,
                "InvalidRequest",
                "dense features must be a contiguous float32 array".into(),
                None,
                None,
            )
        }),
        None => Ok(&[]),
    }
}
