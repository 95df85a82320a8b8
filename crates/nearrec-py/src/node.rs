//! The storage node in this process: `NodeConfig` (the node's one config object, as
//! `nearrec-server` reads it) and `serve`, which runs it until SIGTERM or SIGINT with the GIL
//! released. `nearrec serve` builds its flags from `node_flags()`, the node's own list.

use std::io::Write;
use std::path::PathBuf;

use nearrec_server::{FLAGS, FlagKind, NodeConfig, listening, run};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyString};

use crate::config::NativeConfig;
use crate::error::{detach, err, raise};

/// A checked node config.
#[pyclass(module = "nearrec._native", name = "NodeConfig", frozen)]
pub(crate) struct NativeNodeConfig {
    config: NodeConfig,
}

/// A Python value as the config's: a bool, an int, a float, a str or a list of str.
fn value(py: Python<'_>, key: &str, v: &Bound<'_, PyAny>) -> PyResult<toml::Value> {
    if v.is_instance_of::<PyBool>() {
        return Ok(toml::Value::Boolean(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(toml::Value::Integer(v.extract()?));
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(toml::Value::Float(v.extract()?));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(toml::Value::String(v.extract()?));
    }
    if let Ok(list) = v.cast::<PyList>() {
        let items = list
            .iter()
            .map(|x| value(py, key, &x))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(toml::Value::Array(items));
    }
    Err(raise(
        py,
        "InvalidRequest",
        format!(
            "config: {key}: a {} is not a config value",
            v.get_type().name()?
        ),
        None,
        None,
    ))
}

#[pymethods]
impl NativeNodeConfig {
    /// The config in `path` (a TOML file; `None`: the defaults) with `overrides` set: each a
    /// key of the file (dotted for a table's: `store.tier`, `tls.cert`) and its value; `store`
    /// replaces the `[store]` table first. An unknown key or a bad value is an
    /// `InvalidRequest` naming it.
    #[new]
    #[pyo3(signature = (path = None, overrides = Vec::new(), store = None))]
    fn new(
        py: Python<'_>,
        path: Option<PathBuf>,
        overrides: Vec<(String, Bound<'_, PyAny>)>,
        store: Option<&NativeConfig>,
    ) -> PyResult<Self> {
        let mut config = match path {
            Some(p) => NodeConfig::from_file(&p).map_err(|e| err(py, e))?,
            None => NodeConfig::default(),
        };
        if let Some(store) = store {
            config.store = store.config.clone();
        }
        let values = overrides
            .iter()
            .map(|(k, v)| Ok((k.as_str(), value(py, k, v)?)))
            .collect::<PyResult<Vec<_>>>()?;
        let config = config.with_overrides(&values).map_err(|e| err(py, e))?;
        Ok(Self { config })
    }

    #[staticmethod]
    fn from_toml(py: Python<'_>, text: &str) -> PyResult<Self> {
        NodeConfig::from_toml(text)
            .map(|config| Self { config })
            .map_err(|e| err(py, e))
    }

    fn to_toml(&self) -> String {
        self.config.to_toml()
    }
}

/// Serves the node `config` describes; prints `listening on ADDR` once ready and returns after
/// a drain.
#[pyfunction]
pub(crate) fn serve(py: Python<'_>, config: &NativeNodeConfig) -> PyResult<()> {
    let config = config.config.clone();
    detach(py, || {
        run(config, |listeners, stores| {
            println!("nearrec serve: {}", listening(listeners, stores));
            let _ = std::io::stdout().flush();
        })
    })?
    .map_err(|m| raise(py, "NearrecError", m, None, None))
}

/// The node's flags, `(name, key, kind, metavar, help, default)` each: what `nearrec serve`
/// builds its flags from (`kind`: `switch`, `int`, `float` or `text`; `default`: as shown,
/// empty for none).
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn node_flags() -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    String,
)> {
    FLAGS
        .iter()
        .map(|f| {
            let kind = match f.kind {
                FlagKind::Switch => "switch",
                FlagKind::Int => "int",
                FlagKind::Float => "float",
                FlagKind::Text => "text",
                FlagKind::List => "list",
            };
            (f.name, f.key, kind, f.metavar, f.help, f.default_shown())
        })
        .collect()
}
