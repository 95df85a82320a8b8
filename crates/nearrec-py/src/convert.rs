//! Python arguments converted into what the engine reads, by one set of rules (Python's
//! helpers in `nearrec.request` call these, so that every message comes from here): arrays and
//! tensors as contiguous int32 / int64 ids or float32 values without any unsafe cast, pooling
//! modes, `padding_idx`, a write call's rows, a KeyedJaggedTensor's bags. What cannot be
//! converted is an `InvalidRequest` (an `IndexOutOfRange` for an id past int64) naming the
//! table and, where there is one, the position.

use nearrec::PoolingMode;
use numpy::{
    PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList, PyString, PyTuple};

use crate::error::{err, raise};
use crate::raw::Raw;
use crate::tensor::{self, Want};

/// `"table \"t\": "`, or nothing without a table.
fn at_table(t: Option<&str>) -> String {
    t.map(|t| format!("table {t:?}: ")).unwrap_or_default()
}

pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "object".into(), |n| n.to_string())
}

pub(crate) fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| type_name(obj), |r| r.to_string())
}

/// `True` / `False` (also numpy's), nothing else: `"no"` is neither.
pub(crate) fn real_bool(obj: &Bound<'_, PyAny>) -> Option<bool> {
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
pub(crate) fn padding(py: Python<'_>, p: &Bound<'_, PyAny>, t: &str) -> PyResult<i64> {
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
pub(crate) fn as_array<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    what: &str,
    t: Option<&str>,
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
                format!("{}{what} is not an array: {}", at_table(t), e.value(py)),
                t,
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
pub(crate) fn index_array(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    t: &str,
    what: &str,
) -> PyResult<(Py<PyAny>, Raw)> {
    if let Some(done) = contiguous(x) {
        return Ok(done);
    }
    let a = as_array(py, x, what, Some(t))?;
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
        // uint64 ids are not cast (one past i64::MAX would read as a negative row): a keyed
        // table's hashed keys keep their bits through a view
        let hint = if dtype.is_equiv_to(&numpy::dtype::<u64>(py)) {
            " (a keyed table's uint64 keys: pass keys.view(np.int64), which keeps their bits)"
        } else {
            ""
        };
        return Err(raise(
            py,
            "InvalidRequest",
            format!("table {t:?}: {what} must be int32 or int64, got {kind}{hint}"),
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
pub(crate) fn contiguous(x: &Bound<'_, PyAny>) -> Option<(Py<PyAny>, Raw)> {
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
pub(crate) fn vector(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    t: &str,
    what: &str,
) -> PyResult<(Py<PyAny>, Raw)> {
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
pub(crate) fn weights_array(
    py: Python<'_>,
    w: &Bound<'_, PyAny>,
    t: &str,
    indices: &Bound<'_, PyAny>,
) -> PyResult<(Py<PyAny>, Raw)> {
    let a = as_array(py, w, "per_sample_weights", Some(t))?;
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
pub(crate) fn shape_str(shape: &[usize]) -> String {
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
    let a = as_array(py, w, "weights", Some("features"))?;
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

/// `x` as a contiguous 1-D int64 array, converted as a lookup's indices are (int32 widened).
pub(crate) fn i64_vector<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    t: &str,
    what: &str,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let (a, _) = vector(py, x, t, what)?;
    let a = a.into_bound(py);
    match a.cast::<PyArray1<i64>>() {
        Ok(done) => Ok(done.clone()),
        Err(_) => Ok(a
            .call_method1(intern!(py, "astype"), (numpy::dtype::<i64>(py),))?
            .cast_into::<PyArray1<i64>>()?),
    }
}

/// A write call's `rows` as a contiguous float32 `[n, dim]` array: float32 as it is, float64
/// and float16 converted (unless `allow_nonfinite`, a float64 value past float32's range is
/// refused at its row, not made infinite); integers, bools and other dtypes are refused.
pub(crate) fn float_rows<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    t: &str,
    allow_nonfinite: bool,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let invalid = |msg: String, position| raise(py, "InvalidRequest", msg, Some(t), position);
    let a = as_array(py, x, "rows", Some(t))?;
    let arr = a.cast::<PyUntypedArray>()?;
    if arr.ndim() != 2 {
        return Err(invalid(
            format!(
                "table {t:?}: rows must be 2-D [len(ids), dim], got shape {}",
                shape_str(arr.shape())
            ),
            None,
        ));
    }
    if arr.dtype().kind() != b'f' {
        let dtype = a.getattr(intern!(py, "dtype"))?.str()?;
        return Err(invalid(
            format!("table {t:?}: rows must be floats, got {dtype}"),
            None,
        ));
    }
    if let Ok(wide) = a.cast::<numpy::PyArray2<f64>>()
        && !allow_nonfinite
    {
        let wide = wide.readonly();
        let view = wide.as_array();
        let big = view
            .indexed_iter()
            .find(|(_, v)| v.is_finite() && v.abs() > f64::from(f32::MAX));
        if let Some(((row, col), v)) = big {
            return Err(invalid(
                format!("table {t:?}: rows[{row}][{col}] = {v:?} does not fit float32"),
                Some(row),
            ));
        }
    }
    let a = py.import(intern!(py, "numpy"))?.call_method1(
        intern!(py, "ascontiguousarray"),
        (a, numpy::dtype::<f32>(py)),
    )?;
    Ok(a.cast_into::<PyArray2<f32>>()?)
}

/// A pooling mode by name: `"sum"`, `"mean"` or `"max"` (the argument's name `what` in the
/// error: `mode`, an EmbeddingBag config's `pooling`).
pub(crate) fn mode(
    py: Python<'_>,
    mode: &Bound<'_, PyAny>,
    t: Option<&str>,
    what: &str,
) -> PyResult<PoolingMode> {
    mode.extract::<&str>()
        .ok()
        .and_then(PoolingMode::from_name)
        .ok_or_else(|| {
            let msg = format!(
                "{}{what} must be 'sum', 'mean' or 'max', not {}",
                at_table(t),
                repr(mode)
            );
            raise(py, "InvalidRequest", msg, t, None)
        })
}

// ---- the converters as Python calls them ------------------------------------------------------

/// `x` (an array, a CPU or GPU tensor, a list) as a numpy array, zero-copy where it can be.
#[pyfunction]
#[pyo3(name = "as_array", signature = (x, what, table = None))]
pub(crate) fn py_as_array<'py>(
    x: &Bound<'py, PyAny>,
    what: &str,
    table: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    as_array(x.py(), x, what, table)
}

/// `x` as a contiguous 1-D int64 array (int32 / int64 arrays, tensors or lists of ints; floats,
/// bools and unsigned arrays refused, not cast).
#[pyfunction]
pub(crate) fn index_vector<'py>(
    x: &Bound<'py, PyAny>,
    table: &str,
    what: &str,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    i64_vector(x.py(), x, table, what)
}

/// `per_sample_weights` as a contiguous 1-D float32 array (other dtypes refused, not cast: a
/// float64 weight past float32's range would become inf).
#[pyfunction]
pub(crate) fn weights_vector<'py>(
    w: &Bound<'py, PyAny>,
    table: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let py = w.py();
    let a = as_array(py, w, "per_sample_weights", Some(table))?;
    let flat = a.call_method1(intern!(py, "reshape"), (-1,))?;
    Ok(weights_array(py, &flat, table, &flat)?.0.into_bound(py))
}

/// `mode` checked: `"sum"`, `"mean"` or `"max"`; `what` names the argument in the error.
#[pyfunction]
#[pyo3(signature = (mode, table = None, what = "mode"))]
pub(crate) fn pooling_mode(
    mode: &Bound<'_, PyAny>,
    table: Option<&str>,
    what: &str,
) -> PyResult<&'static str> {
    self::mode(mode.py(), mode, table, what).map(PoolingMode::name)
}

/// An answer's dtype by name (`fp32`, `fp16`, `bf16`, `int8`; `float32`, `float16`,
/// `bfloat16`); None is fp32.
pub(crate) fn out_dtype(py: Python<'_>, name: Option<&str>) -> PyResult<nearrec::OutDtype> {
    let Some(name) = name else {
        return Ok(nearrec::OutDtype::F32);
    };
    nearrec::OutDtype::parse(name).ok_or_else(|| {
        let msg = format!("out_dtype {name:?} is not one of 'fp32', 'fp16', 'bf16', 'int8'");
        raise(py, "InvalidRequest", msg, None, None)
    })
}

/// `values` (a C-contiguous `[batch, Σ widths]` float32 array) rounded in place as `out_dtype`
/// gives them back: what a store does to its answer, for answers pooled elsewhere (the GPU
/// tier's, keyed tables').
#[pyfunction]
pub(crate) fn round_out(
    values: &Bound<'_, numpy::PyArray2<f32>>,
    widths: Vec<usize>,
    out_dtype: &str,
) -> PyResult<()> {
    let py = values.py();
    let out = self::out_dtype(py, Some(out_dtype))?;
    let mut rw = values.try_readwrite()?;
    let shape = rw.shape().to_vec();
    if shape[1] != widths.iter().sum::<usize>() {
        let msg = format!(
            "round_out: {} columns, but the widths sum to {}",
            shape[1],
            widths.iter().sum::<usize>()
        );
        return Err(raise(py, "InvalidRequest", msg, None, None));
    }
    let slice = rw.as_slice_mut().map_err(|_| {
        raise(
            py,
            "InvalidRequest",
            "round_out takes a C-contiguous array".into(),
            None,
            None,
        )
    })?;
    nearrec::out::round(slice, &widths, out);
    Ok(())
}

/// `padding_idx` as an int (None stays None; a bool is not row 1).
#[pyfunction]
pub(crate) fn padding_idx(p: &Bound<'_, PyAny>, table: &str) -> PyResult<Option<i64>> {
    if p.is_none() {
        return Ok(None);
    }
    padding(p.py(), p, table).map(Some)
}

/// A KeyedJaggedTensor read once (nearrec's or TorchRec's, through `keys()`, `values()`,
/// `lengths()` and `weights_or_none()`): its keys, bags per key, values and lengths (int32 /
/// int64, zero-copy for CPU tensors), every bag's bounds in the values (`keys × batch + 1`
/// positions, int64) and its weights (float32) or None. Lengths that do not fit the keys or the
/// values are an `InvalidRequest` (`nearrec::jagged::bounds`).
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn jagged<'py>(
    features: &Bound<'py, PyAny>,
) -> PyResult<(
    Vec<String>,
    usize,
    Py<PyAny>,
    Py<PyAny>,
    Bound<'py, PyArray1<i64>>,
    Option<Py<PyAny>>,
)> {
    let py = features.py();
    let kjt = [
        intern!(py, "keys"),
        intern!(py, "values"),
        intern!(py, "lengths"),
    ];
    if !kjt.iter().all(|a| features.hasattr(a).unwrap_or(false)) {
        let msg = format!(
            "features are a KeyedJaggedTensor, not {}",
            type_name(features)
        );
        return Err(raise(py, "InvalidRequest", msg, None, None));
    }
    let keys = features
        .call_method0(intern!(py, "keys"))?
        .try_iter()?
        .map(|k| {
            let k = k?;
            let Ok(s) = k.cast::<PyString>() else {
                let msg = format!("KeyedJaggedTensor keys are str, not {}", repr(&k));
                return Err(raise(py, "InvalidRequest", msg, None, None));
            };
            // (`to_cow`, not `to_string`: a failure to read it is raised, not printed)
            Ok(s.to_cow()?.into_owned())
        })
        .collect::<PyResult<Vec<_>>>()?;
    let values = features.call_method0(intern!(py, "values"))?;
    let lengths = features.call_method0(intern!(py, "lengths"))?;
    let (values, vraw) = index_view(py, &values, "values")?;
    let (lengths, lraw) = index_view(py, &lengths, "lengths")?;
    let weights = match features.getattr(intern!(py, "weights_or_none")) {
        Ok(f) => Some(f.call0()?).filter(|w| !w.is_none()),
        Err(_) => None,
    };
    let weights = weights
        .map(|w| weights_view(py, &w).map(|(a, _)| a))
        .transpose()?;
    // SAFETY: `values` and `lengths` hold the arrays for the rest of this call
    let (vals, lens) = unsafe { (vraw.indices(), lraw.indices()) };
    let bounds = nearrec::jagged::bounds(keys.len(), lens, vals.len()).map_err(|e| err(py, e))?;
    let batch = lens.len().checked_div(keys.len()).unwrap_or(0);
    Ok((
        keys,
        batch,
        values,
        lengths,
        PyArray1::from_vec(py, bounds),
        weights,
    ))
}
