//! Binding of `nearrec::StoreConfig`: the one config object that crosses into Rust. Python's
//! `nearrec.StoreConfig` (typed fields, defaults read from here) hands it over as JSON; TOML
//! files are read and written here too, so Python, the CLI and Rust read the same file.

use std::path::PathBuf;

use nearrec::StoreConfig;
use pyo3::prelude::*;

use crate::error::err;

/// A checked store config.
#[pyclass(module = "nearrec._native", name = "StoreConfig", frozen)]
pub(crate) struct NativeConfig {
    pub(crate) config: StoreConfig,
}

#[pymethods]
impl NativeConfig {
    /// The defaults.
    #[new]
    fn new() -> Self {
        Self {
            config: StoreConfig::default(),
        }
    }

    /// From JSON (an unknown key or a bad value is an `InvalidRequest` naming the field).
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &str) -> PyResult<Self> {
        StoreConfig::from_json(text)
            .map(|config| Self { config })
            .map_err(|e| err(py, e))
    }

    #[staticmethod]
    fn from_toml(py: Python<'_>, text: &str) -> PyResult<Self> {
        StoreConfig::from_toml(text)
            .map(|config| Self { config })
            .map_err(|e| err(py, e))
    }

    #[staticmethod]
    fn from_file(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        StoreConfig::from_file(&path)
            .map(|config| Self { config })
            .map_err(|e| err(py, e))
    }

    fn to_json(&self) -> String {
        self.config.to_json()
    }

    fn to_toml(&self) -> String {
        self.config.to_toml()
    }
}

/// `"16GiB"` → bytes (`nearrec_plan::parse_size`; an `InvalidRequest` when it is not a size).
#[pyfunction]
pub(crate) fn parse_size(py: Python<'_>, text: &str) -> PyResult<u64> {
    nearrec::plan::parse_size(text)
        .map_err(|e| crate::error::raise(py, "InvalidRequest", e.to_string(), None, None))
}
