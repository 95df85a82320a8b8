//! Errors of the bench extension. `std::io::Error` becomes the matching `OSError` subclass through
//! PyO3; a failed random-read probe is an `OSError` with the io layer's one-line message. (A panic
//! in a baseline is a bug of the harness and surfaces as PyO3's `PanicException`, stopping the
//! run.)

use pyo3::PyErr;
use pyo3::exceptions::PyOSError;

pub(crate) fn io_err(e: nearrec_io::IoError) -> PyErr {
    PyOSError::new_err(e.to_string())
}
