//! The storage node's load generator (`nearrec-loadgen`) for `nearrec bench serve`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use nearrec::{OwnedBatch, Store, StoreConfig};
use nearrec_loadgen::{ClientCache, Mode, run};
use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

type Table<'py> = (
    String,
    PyReadonlyArray1<'py, i64>,
    PyReadonlyArray1<'py, i64>,
);
/// A client cache from Python: table → (ids, `[n, dim]` rows).
type Cached<'py> = HashMap<String, (PyReadonlyArray1<'py, i64>, PyReadonlyArray2<'py, f32>)>;

/// Runs `batches` (lists of `(table, ids, lengths)`) open-loop at `rate` requests/s for
/// `seconds`: `mode` "pooled", "raw" or "raw_cached" against the node at `target` (store
/// `store`, `connections` connections; `cache`: table → (ids, rows) the client holds), or
/// "embedded" on the store at `path` opened with `config` (TOML). Returns latencies (µs, from
/// each intended send time), counts, wire bytes and the first request's output.
#[pyfunction]
#[pyo3(signature = (mode, batches, rate, seconds, target = None, store = None, connections = 1, seed = 0, cache = None, path = None, config = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_run<'py>(
    py: Python<'py>,
    mode: &str,
    batches: Vec<Vec<Table<'py>>>,
    rate: f64,
    seconds: f64,
    target: Option<String>,
    store: Option<String>,
    connections: usize,
    seed: u64,
    cache: Option<Cached<'py>>,
    path: Option<PathBuf>,
    config: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let owned: Vec<OwnedBatch> = batches
        .iter()
        .map(|b| {
            OwnedBatch::new(
                b.iter()
                    .map(|(t, ids, lengths)| {
                        nearrec_loadgen::lookup(
                            t,
                            ids.as_array().to_vec(),
                            lengths.as_array().to_vec(),
                        )
                    })
                    .collect(),
            )
        })
        .collect();
    if owned.is_empty() {
        return Err(PyValueError::new_err("no batches"));
    }
    let mode = match mode {
        "pooled" => Mode::Pooled,
        "raw" => Mode::Raw,
        "raw_cached" => {
            let mut c = ClientCache::default();
            for (table, (ids, rows)) in cache.unwrap_or_default() {
                let rows = rows.as_array();
                c.dims.insert(table.clone(), rows.ncols());
                let held = ids
                    .as_array()
                    .iter()
                    .zip(rows.rows())
                    .map(|(&i, r)| (i, r.to_vec()))
                    .collect();
                c.rows.insert(table, held);
            }
            Mode::RawCached(Arc::new(c))
        }
        "embedded" => {
            let path = path.ok_or_else(|| PyValueError::new_err("embedded needs path"))?;
            let config = StoreConfig::from_toml(config.as_deref().unwrap_or(""))
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            let s = py
                .detach(|| Store::open(&path, &config))
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
            Mode::Embedded(Arc::new(s))
        }
        other => return Err(PyValueError::new_err(format!("unknown mode {other:?}"))),
    };
    let batches = Arc::new(owned);
    let (target, store) = (target.unwrap_or_default(), store.unwrap_or_default());
    let out = py
        .detach(|| {
            run(
                &target,
                &store,
                mode,
                batches,
                rate,
                seconds,
                connections,
                seed,
            )
        })
        .map_err(PyRuntimeError::new_err)?;
    let d = PyDict::new(py);
    d.set_item("latencies_us", PyArray1::from_vec(py, out.latencies_us))?;
    d.set_item("sent", out.sent)?;
    d.set_item("failed", out.failed)?;
    d.set_item("dropped", out.dropped)?;
    d.set_item("wire_bytes", out.wire_bytes)?;
    d.set_item("samples", out.samples)?;
    d.set_item("seconds", out.seconds)?;
    d.set_item("first", out.first.map(|v| PyArray1::from_vec(py, v)))?;
    Ok(d)
}
