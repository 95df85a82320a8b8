//! The storage node's load generator (`nearrec-loadgen`) for `nearrec bench serve`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use nearrec::{OwnedBatch, Store, StoreConfig};
use nearrec_loadgen::{CachedTable, ClientCache, Mode, run};
use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A store opened in this process for the embedded mode, kept across runs.
#[pyclass(module = "nearrec_bench._native", frozen)]
pub(crate) struct EmbeddedStore {
    store: Arc<Store>,
    slots: Arc<tokio::sync::Semaphore>,
    /// Whose blocking threads run the store's calls, each pinned to the CPUs the store was
    /// opened on (the load generator's own threads may be elsewhere: see `new`).
    runtime: tokio::runtime::Runtime,
}

#[pymethods]
impl EmbeddedStore {
    /// The store at `path` opened with `config` (TOML); at most `in_flight` calls at once (the
    /// node's `--max-in-flight`). Its calls run on threads pinned to the CPUs of the thread
    /// that opens it, as the node's run on the CPUs the node was started on: a caller that
    /// opens it on CPU 1 and then moves to CPU 0 to generate load gives the store CPU 1 alone.
    #[new]
    #[pyo3(signature = (path, config, in_flight = 8))]
    fn new(py: Python<'_>, path: PathBuf, config: &str, in_flight: usize) -> PyResult<Self> {
        let config =
            StoreConfig::from_toml(config).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let cpus = affinity().map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(in_flight.max(1))
            .on_thread_start(move || {
                // a thread made by a caller on other CPUs moves to the store's before it runs
                // anything; a failure leaves it where it was (the run still measures)
                let _ = set_affinity(&cpus);
            })
            .thread_name("embedded-store")
            .build()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let store = py
            .detach(|| Store::open(&path, &config))
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok(Self {
            store: Arc::new(store),
            slots: Arc::new(tokio::sync::Semaphore::new(in_flight.max(1))),
            runtime,
        })
    }
}

/// The CPUs this thread may run on.
fn affinity() -> std::io::Result<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call writes at most its size
    unsafe {
        let mut set = std::mem::zeroed::<libc::cpu_set_t>();
        match libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) {
            0 => Ok(set),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

/// Moves this thread to the CPUs of `set`.
fn set_affinity(set: &libc::cpu_set_t) -> std::io::Result<()> {
    // SAFETY: `set` is a valid cpu_set_t of the size given
    match unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), set) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

type Table<'py> = (
    String,
    PyReadonlyArray1<'py, i64>,
    PyReadonlyArray1<'py, i64>,
);
/// A client cache from Python: table → (ids, `[n, dim]` rows).
type Cached<'py> = HashMap<String, (PyReadonlyArray1<'py, i64>, PyReadonlyArray2<'py, f32>)>;

/// Runs `batches` (lists of `(table, ids, lengths)`) open-loop at `rate` requests/s for
/// `seconds`: `mode` "pooled", "raw" or "raw_cached" against the node at `target` (store
/// `store`, `connections` connections; `cache`: table → (ids, rows) the client holds),
/// "redis" against the Redis server at `target` (`dims`: table → width), or "embedded" on the
/// `embedded` store (opened once, so that its DRAM tiers stay warm from run to run, as the
/// node's do). Pooled answers come in `out_dtype` (`fp32`, `fp16`, `bf16`, `int8`). Returns
/// latencies (µs, from each intended send time), counts, wire bytes and the first request's
/// output.
#[pyfunction]
#[pyo3(signature = (mode, batches, rate, seconds, target = None, store = None, connections = 1, seed = 0, cache = None, embedded = None, dims = None, out_dtype = "fp32"))]
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
    embedded: Option<&EmbeddedStore>,
    dims: Option<HashMap<String, usize>>,
    out_dtype: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let out = nearrec::OutDtype::parse(out_dtype)
        .ok_or_else(|| PyValueError::new_err(format!("out_dtype {out_dtype:?}")))?;
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
        .map(|b| OwnedBatch { out, ..b })
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
                let ids: Vec<i64> = ids.as_array().iter().copied().collect();
                if ids.len() != rows.nrows() {
                    return Err(PyValueError::new_err(format!(
                        "cache of {table}: {} ids for {} rows",
                        ids.len(),
                        rows.nrows()
                    )));
                }
                let values = rows.iter().copied().collect();
                c.tables
                    .insert(table, CachedTable::new(rows.ncols(), &ids, values));
            }
            Mode::RawCached(Arc::new(c))
        }
        "embedded" => {
            let e = embedded.ok_or_else(|| PyValueError::new_err("embedded needs a store"))?;
            Mode::Embedded(e.store.clone(), e.slots.clone(), e.runtime.handle().clone())
        }
        "redis" => Mode::Redis(Arc::new(dims.unwrap_or_default())),
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

/// Loads `tables` (name → `[rows, dim]` float32) into the Redis server at `target`, row `i` of
/// table `t` as the value `t:i`.
#[pyfunction]
pub(crate) fn redis_load(
    py: Python<'_>,
    target: String,
    tables: HashMap<String, PyReadonlyArray2<'_, f32>>,
) -> PyResult<()> {
    let views = tables
        .iter()
        .map(|(name, a)| {
            let dim = a.as_array().ncols();
            a.as_slice()
                .map(|s| (name.clone(), dim, s))
                .map_err(|_| PyValueError::new_err(format!("table {name}: not contiguous")))
        })
        .collect::<PyResult<Vec<_>>>()?;
    py.detach(|| nearrec_loadgen::load_redis(&target, &views))
        .map_err(PyRuntimeError::new_err)
}
