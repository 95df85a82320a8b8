//! Rust errors → the Python exception tree of `nearrec.errors` (classes defined in Python so they
//! can inherit from both `NearrecError` and the matching builtin).

use nearrec_engine::EngineError;
use nearrec_format::FormatError;
use nearrec_io::IoError;
use pyo3::prelude::*;

/// Builds `nearrec.errors.<class>(message, table=..., position=...)`.
pub(crate) fn raise(
    py: Python<'_>,
    class: &str,
    message: String,
    table: Option<&str>,
    position: Option<usize>,
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let cls = py.import("nearrec.errors")?.getattr(class)?;
        let exc = cls.call1((message.clone(), table, position))?;
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|e| e)
}

/// `IndexOutOfRange` at the first negative id, if any (row ids of traces and cache studies).
pub(crate) fn check_non_negative(py: Python<'_>, ids: &[i64]) -> PyResult<()> {
    match ids.iter().position(|&i| i < 0) {
        Some(p) => Err(raise(
            py,
            "IndexOutOfRange",
            format!("index {} at position {p} is negative", ids[p]),
            None,
            Some(p),
        )),
        None => Ok(()),
    }
}

pub(crate) fn format_err(py: Python<'_>, e: FormatError) -> PyErr {
    let msg = e.to_string();
    match &e {
        FormatError::NotFound { .. } => raise(py, "StoreNotFound", msg, None, None),
        FormatError::AlreadyExists { .. } => raise(py, "StoreExists", msg, None, None),
        FormatError::Io { .. } => raise(py, "StoreIOError", msg, None, None),
        FormatError::OutOfMemory { .. } => raise(py, "InsufficientMemory", msg, None, None),
        FormatError::Corrupted { .. } => raise(py, "StoreCorrupted", msg, None, None),
        FormatError::UnsupportedVersion { .. } => raise(py, "UnsupportedVersion", msg, None, None),
        FormatError::InvalidTable { table, .. } | FormatError::RowCount { table, .. } => {
            raise(py, "InvalidRequest", msg, Some(table.as_str()), None)
        }
        _ => raise(py, "InvalidRequest", msg, None, None),
    }
}

pub(crate) fn engine_err(py: Python<'_>, e: EngineError) -> PyErr {
    let msg = e.to_string();
    match e {
        EngineError::Format(f) => format_err(py, f),
        EngineError::InsufficientMemory(_) => raise(py, "InsufficientMemory", msg, None, None),
        EngineError::UnknownTable { name, .. } => raise(py, "UnknownTable", msg, Some(&name), None),
        EngineError::IndexOutOfRange {
            table, position, ..
        } => raise(py, "IndexOutOfRange", msg, Some(&table), Some(position)),
        EngineError::Corrupted { table, .. } => {
            raise(py, "StoreCorrupted", msg, Some(&table), None)
        }
        EngineError::InvalidRequest { table, .. } => {
            raise(py, "InvalidRequest", msg, Some(&table), None)
        }
        EngineError::Io(io) => io_err(py, io),
        _ => raise(py, "InvalidRequest", msg, None, None),
    }
}

/// A failed read (or a disk probe that cannot measure) as the matching `nearrec.errors` class.
pub(crate) fn io_err(py: Python<'_>, e: IoError) -> PyErr {
    let msg = e.to_string();
    match e {
        // a malformed read is a bug of ours, not the device's
        IoError::InvalidRead { .. } => raise(py, "InternalError", msg, None, None),
        IoError::Threads { .. } => raise(py, "ResourceExhausted", msg, None, None),
        IoError::Probe { .. } => raise(py, "InvalidRequest", msg, None, None),
        _ => raise(py, "StoreIOError", msg, None, None),
    }
}

/// `py.detach(f)` (the GIL released while `f` runs), with a panic inside `f` answered as
/// `nearrec.errors.InternalError`: a panic crossing into Python would be a `PanicException`, a
/// `BaseException` that `except Exception` does not catch.
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)))
        .map_err(|payload| {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".into());
            raise(
                py,
                "InternalError",
                format!("internal error (a bug in nearrec; please report it): {what}"),
                None,
                None,
            )
        })
}

/// Panics inside [`detach`], so that tests can see a panic arrive as `InternalError`.
#[pyfunction]
pub(crate) fn panic_at_the_boundary(py: Python<'_>, message: String) -> PyResult<()> {
    detach(py, || -> () { panic!("{message}") })
}
