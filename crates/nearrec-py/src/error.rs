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

/// The Python class of each Rust error, with the table and position it names: the one table
/// every binding call maps errors through. What it does not list is the root `NearrecError`,
/// never a guess such as `InvalidRequest`.
pub(crate) fn class_of(e: &nearrec::Error) -> (&'static str, Option<&str>, Option<usize>) {
    use nearrec::Error as E;
    match e {
        E::Config { .. } => ("InvalidRequest", None, None),
        E::InvalidRequest {
            table, position, ..
        } => ("InvalidRequest", table.as_deref(), *position),
        E::NoModel { .. } => ("InvalidRequest", None, None),
        E::BadModel { .. } => ("StoreCorrupted", None, None),
        E::Internal(_) => ("InternalError", None, None),
        E::ReadOnly { .. } => ("StoreReadOnly", None, None),
        E::Locked { .. } => ("StoreLocked", None, None),
        E::DeltaFull { .. } => ("DeltaFull", None, None),
        E::Engine(e) => engine_class(e),
        E::Format(e) => format_class(e),
        E::Plan(e) => plan_class(e),
        E::Device(e) => device_class(e),
        _ => ("NearrecError", None, None),
    }
}

fn format_class(e: &FormatError) -> (&'static str, Option<&str>, Option<usize>) {
    match e {
        FormatError::NotFound { .. } => ("StoreNotFound", None, None),
        FormatError::AlreadyExists { .. } => ("StoreExists", None, None),
        FormatError::Io { .. } => ("StoreIOError", None, None),
        FormatError::OutOfMemory { .. } => ("InsufficientMemory", None, None),
        FormatError::Corrupted { .. } => ("StoreCorrupted", None, None),
        FormatError::UnsupportedVersion { .. } => ("UnsupportedVersion", None, None),
        FormatError::InvalidTable { table, .. } | FormatError::RowCount { table, .. } => {
            ("InvalidRequest", Some(table.as_str()), None)
        }
        FormatError::UnknownDType(_) => ("InvalidRequest", None, None),
        _ => ("NearrecError", None, None),
    }
}

fn io_class(e: &nearrec_io::IoError) -> (&'static str, Option<&str>, Option<usize>) {
    use nearrec_io::IoError as I;
    match e {
        // a malformed read is a bug of ours, not the device's
        I::InvalidRead { .. } => ("InternalError", None, None),
        I::Threads { .. } => ("ResourceExhausted", None, None),
        // a disk probe with nothing to measure
        I::Probe { .. } => ("InvalidRequest", None, None),
        I::Open { .. } | I::Read { .. } | I::ShortRead { .. } | I::Setup { .. } => {
            ("StoreIOError", None, None)
        }
        _ => ("NearrecError", None, None),
    }
}

fn engine_class(e: &EngineError) -> (&'static str, Option<&str>, Option<usize>) {
    match e {
        EngineError::Format(f) => format_class(f),
        EngineError::Io(io) => io_class(io),
        EngineError::InsufficientMemory(_) => ("InsufficientMemory", None, None),
        EngineError::UnknownTable { name, .. } => ("UnknownTable", Some(name.as_str()), None),
        EngineError::IndexOutOfRange {
            table, position, ..
        } => ("IndexOutOfRange", Some(table.as_str()), Some(*position)),
        EngineError::Corrupted { table, .. } => ("StoreCorrupted", Some(table.as_str()), None),
        EngineError::InvalidRequest { table, .. } => ("InvalidRequest", Some(table.as_str()), None),
        EngineError::Config(_) | EngineError::Model(_) => ("InvalidRequest", None, None),
        _ => ("NearrecError", None, None),
    }
}

pub(crate) fn plan_class(
    e: &nearrec_plan::PlanError,
) -> (&'static str, Option<&str>, Option<usize>) {
    use nearrec_plan::PlanError as P;
    match e {
        P::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            ("StoreNotFound", None, None)
        }
        P::Io { .. } => ("StoreIOError", None, None),
        P::BadTrace { .. } => ("InvalidTrace", None, None),
        P::TraceMismatch {
            table, position, ..
        } => ("TraceMismatch", Some(table.as_str()), *position),
        P::InvalidArgument { .. } => ("InvalidRequest", None, None),
        P::BadPlan { table, .. } => ("InvalidRequest", table.as_deref(), None),
        P::BadSpec { table, .. } => ("InvalidRequest", Some(table.as_str()), None),
        P::Exists { .. } => ("StoreExists", None, None),
        P::InsufficientMemory(_) => ("InsufficientMemory", None, None),
    }
}

fn device_class(e: &nearrec_device::DeviceError) -> (&'static str, Option<&str>, Option<usize>) {
    use nearrec_device::DeviceError as D;
    match e {
        D::Config(_) => ("InvalidRequest", None, None),
        D::Request { table, .. } => ("InvalidRequest", Some(table.as_str()), None),
        D::Io(io) => io_class(io),
        _ => ("NearrecError", None, None),
    }
}

/// A failed read (or a disk probe that cannot measure) as its Python exception.
pub(crate) fn io_err(py: Python<'_>, e: nearrec_io::IoError) -> PyErr {
    let (class, table, position) = io_class(&e);
    raise(py, class, e.to_string(), table, position)
}

/// A planner / trace error as its Python exception.
pub(crate) fn plan_error(py: Python<'_>, e: nearrec_plan::PlanError) -> PyErr {
    let (class, table, position) = plan_class(&e);
    raise(py, class, e.to_string(), table, position)
}

/// A facade error as its Python exception.
pub(crate) fn err(py: Python<'_>, e: nearrec::Error) -> PyErr {
    let (class, table, position) = class_of(&e);
    raise(py, class, e.to_string(), table, position)
}

pub(crate) fn format_err(py: Python<'_>, e: FormatError) -> PyErr {
    let (class, table, position) = format_class(&e);
    raise(py, class, e.to_string(), table, position)
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
