//! Rust errors → the Python exception tree of `nearrec.errors` (classes defined in Python so they
//! can inherit from both `NearrecError` and the matching builtin).

use nearrec_engine::EngineError;
use nearrec_format::FormatError;
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

/// A failed read (or a disk probe that cannot measure) as its Python exception.
pub(crate) fn io_err(py: Python<'_>, e: nearrec_io::IoError) -> PyErr {
    err(py, nearrec::Error::Engine(EngineError::Io(e)))
}

/// A planner / trace error as its Python exception.
pub(crate) fn plan_error(py: Python<'_>, e: nearrec_plan::PlanError) -> PyErr {
    err(py, nearrec::Error::Plan(e))
}

/// A facade error as its Python exception: the class the facade's [`nearrec::ErrorKind`] names
/// (one table for every surface), with the table and position the error names.
pub(crate) fn err(py: Python<'_>, e: nearrec::Error) -> PyErr {
    raise(py, e.kind().name(), e.to_string(), e.table(), e.position())
}

pub(crate) fn format_err(py: Python<'_>, e: FormatError) -> PyErr {
    err(py, nearrec::Error::Format(e))
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

/// [`detach`] over a call of the facade, its error raised as its Python class.
pub(crate) fn run<T: Send>(
    py: Python<'_>,
    f: impl Send + FnOnce() -> nearrec::Result<T>,
) -> PyResult<T> {
    detach(py, f)?.map_err(|e| err(py, e))
}

/// Panics inside [`detach`], so that tests can see a panic arrive as `InternalError`.
#[pyfunction]
pub(crate) fn panic_at_the_boundary(py: Python<'_>, message: String) -> PyResult<()> {
    detach(py, || -> () { panic!("{message}") })
}

/// The names of the facade's error kinds: every one must be a class of `nearrec.errors` (a test
/// holds them together, so a new kind cannot reach Python as an `AttributeError`).
#[pyfunction]
pub(crate) fn error_kinds() -> Vec<&'static str> {
    nearrec::ErrorKind::ALL.iter().map(|k| k.name()).collect()
}
