//! A CPU torch tensor's data read in place, from its `data_ptr()`, without making its numpy view
//! (`tensor.numpy()` costs about as much as pooling a small batch). Only what `numpy()` itself
//! would accept is read here — a strided, contiguous, 1-D CPU tensor of the wanted dtype with no
//! negative bit; anything else (a GPU or sparse tensor, a fake tensor under tracing, a view with
//! strides) answers `None` and takes the general path, which converts or refuses it.
//!
//! torch is imported from here only to make a tensor: a tensor to read exists only once its
//! caller has imported torch.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};

use crate::raw::Raw;

/// The dtype a caller wants.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// int32 or int64.
    Index,
    /// float32.
    F32,
}

/// torch's objects the fast path compares with, looked up once.
struct Torch {
    tensor: Py<PyType>,
    strided: Py<PyAny>,
    int64: Py<PyAny>,
    int32: Py<PyAny>,
    float32: Py<PyAny>,
    from_numpy: Py<PyAny>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

/// torch's objects, when torch is already imported (`None` before that, without caching it).
fn torch(py: Python<'_>) -> Option<&Torch> {
    if let Some(t) = TORCH.get(py) {
        return Some(t);
    }
    let modules = py.import("sys").ok()?.getattr("modules").ok()?;
    let torch = modules.get_item("torch").ok()?;
    let get = |name: &str| torch.getattr(name).ok().map(Bound::unbind);
    let t = Torch {
        tensor: torch
            .getattr("Tensor")
            .ok()?
            .cast_into::<PyType>()
            .ok()?
            .unbind(),
        strided: get("strided")?,
        int64: get("int64")?,
        int32: get("int32")?,
        float32: get("float32")?,
        from_numpy: get("from_numpy")?,
    };
    Some(TORCH.get_or_init(py, || t))
}

/// `x`'s data when it is a contiguous 1-D CPU tensor of the wanted dtype (the tensor itself is
/// returned to be held while the data is read); `None` for anything else, errors included: the
/// general path says what is wrong with it.
pub(crate) fn cpu_vector<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    want: Want,
) -> Option<(Py<PyAny>, Raw)> {
    let t = torch(py)?;
    if !x.is_instance(t.tensor.bind(py)).ok()? {
        return None;
    }
    let py_true = |v: Bound<'py, PyAny>| v.is_truthy().ok();
    let call = |method: &Bound<'py, PyString>| x.call_method0(method).ok();
    if !py_true(x.getattr(intern!(py, "is_cpu")).ok()?)?
        || !x
            .getattr(intern!(py, "layout"))
            .ok()?
            .is(t.strided.bind(py))
        || !py_true(call(intern!(py, "is_contiguous"))?)?
        || py_true(call(intern!(py, "is_neg"))?)?
    {
        return None;
    }
    let [n]: [usize; 1] = x.getattr(intern!(py, "shape")).ok()?.extract().ok()?;
    let dtype = x.getattr(intern!(py, "dtype")).ok()?;
    let ptr: usize = call(intern!(py, "data_ptr"))?.extract().ok()?;
    let raw = match want {
        Want::Index if dtype.is(t.int64.bind(py)) => Raw::I64(ptr as *const i64, n),
        Want::Index if dtype.is(t.int32.bind(py)) => Raw::I32(ptr as *const i32, n),
        Want::F32 if dtype.is(t.float32.bind(py)) => Raw::F32(ptr as *const f32, n),
        _ => return None,
    };
    Some((x.clone().unbind(), raw))
}

/// Whether `x` lives in host memory: anything but an object whose `is_cpu` says no (a GPU
/// tensor).
pub(crate) fn is_cpu(py: Python<'_>, x: &Bound<'_, PyAny>) -> bool {
    x.getattr(intern!(py, "is_cpu"))
        .and_then(|c| c.is_truthy())
        .unwrap_or(true)
}

/// `torch.from_numpy(array)`: a tensor sharing the array's memory.
pub(crate) fn from_numpy<'py>(
    py: Python<'py>,
    array: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    match torch(py) {
        Some(t) => t.from_numpy.bind(py).call1((array,)),
        None => py.import("torch")?.getattr("from_numpy")?.call1((array,)),
    }
}
