//! Binding of the store's contract: `nearrec.Store` over any implementation of
//! [`StoreApi`] — the embedded `nearrec::Store` (`nearrec.open`) or a node's store through its
//! client (`nearrec.connect`), one class for both. Lookups take native `TableLookup`s (or a
//! KeyedJaggedTensor's own buffers) and release the GIL. What only an embedded store has (its
//! tables' memory, its config, the simulated drive, sub-batches, a caller's model) answers
//! `Unsupported` on another implementation, naming the call.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use nearrec::{AsBatch, Batch, Located, NewTable, Pooled, Store, StoreApi, Submitted, SwapTo};
use nearrec_client::{Client, ClientOptions, ClientTls, Retry};
use nearrec_cluster::{Endpoint, Hedge, ShardedOptions, ShardedStore};
use nearrec_format::{DType, ProgressFn, Publish, Repository, StoreReader, TableCheck};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyMapping, PyString, PyTuple};

use crate::config::NativeConfig;
use crate::convert::{dense_features, float_rows, i64_vector, type_name};
use crate::error::{detach, err, format_err, raise};
use crate::lookup::HeldBatch;
use crate::model::NativeModel;
use crate::progress;

/// One replica's catch-up: shard, address, what it did, why it failed.
type CatchUpTuple = (usize, String, Option<(u64, u64, u64, u64)>, Option<String>);

/// Seconds per named part of a call.
pub(crate) type Seconds = Vec<(&'static str, f64)>;

/// A store's description: `(name, [(table, rows, dim, dtype)], version, tier, writable, model,
/// stores, (path, served version, versions))`.
type InfoTuple = (
    String,
    Vec<(String, u64, u32, String, Option<u64>)>,
    u64,
    String,
    bool,
    bool,
    Vec<String>,
    (String, Option<u64>, Vec<u64>),
);

/// An open store, whatever serves it: every verb through the contract; what only an embedded
/// store or a router has (not store verbs) through the implementation itself
/// (`StoreApi::concrete`).
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativeStore {
    api: Arc<dyn StoreApi>,
}

/// A finished batch's output as a `[batch, width]` numpy array (the vector moves in, no copy).
fn array(py: Python<'_>, p: Pooled) -> PyResult<Bound<'_, PyArray2<f32>>> {
    let width = p.width();
    PyArray1::from_vec(py, p.values).reshape([p.batch, width])
}

fn contiguous(py: Python<'_>, what: &str, table: &str) -> PyErr {
    raise(
        py,
        "InvalidRequest",
        format!("{what} must be contiguous"),
        Some(table),
        None,
    )
}

/// A sharded store's hedge as Python gives it: `"off"`, `"pNN"`, or seconds.
#[derive(FromPyObject)]
enum HedgeArg {
    Named(String),
    Seconds(f64),
}

/// A client's options from `NativeStore.connect`'s arguments.
#[allow(clippy::type_complexity)]
fn client_options(
    token: Option<String>,
    timeout: Option<f64>,
    tls: Option<(Option<Vec<u8>>, Option<String>, Option<(Vec<u8>, Vec<u8>)>)>,
    attempts: u32,
) -> ClientOptions {
    ClientOptions {
        token,
        timeout: timeout.map(Duration::from_secs_f64),
        retry: Retry {
            attempts,
            ..Retry::default()
        },
        tls: tls.map(|(ca, domain, identity)| ClientTls {
            ca,
            domain,
            identity,
        }),
        ..ClientOptions::default()
    }
}

impl NativeStore {
    /// The implementation, if it is a `T`.
    fn concrete<T: 'static>(&self) -> Option<&T> {
        self.api.concrete()?.downcast_ref()
    }

    /// The sharded store's router, or `Unsupported` naming `verb`.
    fn router(&self, py: Python<'_>, verb: &'static str) -> PyResult<&ShardedStore> {
        let router = self.concrete::<ShardedStore>();
        self.api.able(router, verb).map_err(|e| err(py, e))
    }

    /// The embedded store, or `Unsupported` naming `verb`.
    fn local(&self, py: Python<'_>, verb: &'static str) -> PyResult<&Store> {
        let store = self.concrete::<Store>();
        self.api.able(store, verb).map_err(|e| err(py, e))
    }

    /// Pools `batch` into a new numpy array, the GIL released meanwhile. Through the contract,
    /// a store gives its answer, which the array takes without a copy. The one fast path: an
    /// embedded store prepares the batch's shape, then pools straight into the array (no
    /// answer vector to allocate); `tests/test_contract.py`'s submitted lookups (the
    /// contract's `submit`) are held equal to it on the DRAM and SSD tiers.
    pub(crate) fn pool<'py>(
        &self,
        py: Python<'py>,
        batch: &Batch<'_>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let Some(store) = self.concrete::<Store>() else {
            let (pooled, _) = detach(py, || self.api.lookup(batch))?.map_err(|e| err(py, e))?;
            return array(py, pooled);
        };
        let prepared = store.prepare(batch).map_err(|e| err(py, e))?;
        let out = PyArray2::<f32>::zeros(py, [prepared.batch(), prepared.width()], false);
        {
            let mut rw = out.readwrite();
            let slice = rw.as_slice_mut().expect("new arrays are contiguous");
            detach(py, || store.execute(batch, &prepared, slice))?.map_err(|e| err(py, e))?;
        }
        Ok(out)
    }

    /// [`Self::infer`] on a batch already made (the collection's, from a KeyedJaggedTensor).
    pub(crate) fn infer_batch<'py>(
        &self,
        py: Python<'py>,
        model: Option<&NativeModel>,
        dense: &[f32],
        batch: &Batch<'_>,
        in_order: bool,
    ) -> PyResult<(Bound<'py, PyArray2<f32>>, Seconds)> {
        let out = match model {
            Some(m) => {
                let store = self.local(py, "infer(model=)")?;
                let m = &m.model;
                detach(py, || {
                    if in_order {
                        store.infer_with(&m.dense, dense, batch)
                    } else {
                        store.infer_with(&m.dense, dense, &m.arrange(batch)?)
                    }
                })?
            }
            None => detach(py, || {
                self.api
                    .able(self.api.inference(), "infer")?
                    .infer(dense, batch)
            })?,
        }
        .map_err(|e| err(py, e))?;
        let t = out.times;
        let array = PyArray1::from_vec(py, out.outputs).reshape([out.batch, out.width])?;
        let times = vec![
            ("total", t.total.as_secs_f64()),
            ("embeddings", t.embeddings.as_secs_f64()),
            ("dense", t.dense.as_secs_f64()),
            ("blocks", t.blocks.as_secs_f64()),
            ("finish", t.finish.as_secs_f64()),
            ("route", t.stages.route.as_secs_f64()),
            ("io_wait", t.stages.io_wait.as_secs_f64()),
            ("pool", t.stages.pool.as_secs_f64()),
        ];
        Ok((array, times))
    }
}

#[pymethods]
impl NativeStore {
    /// Opens the store at `path` in this process.
    #[new]
    #[pyo3(signature = (path, config, progress = false))]
    fn new(py: Python<'_>, path: PathBuf, config: &NativeConfig, progress: bool) -> PyResult<Self> {
        let located = detach(py, || Located::open(&path))?.map_err(|e| err(py, e))?;
        let total = located.reader.tables().iter().map(|t| t.data_bytes).sum();
        let bar = progress::bar(progress, total, "loading");
        let cb = progress::callback(&bar);
        let store = detach(py, || {
            Store::from_located(located, &config.config, cb.as_ref())
        })?
        .map_err(|e| err(py, e))?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        Ok(Self {
            api: Arc::new(store),
        })
    }

    /// Connects to the node at `addr` (several: comma-separated, the first that answers) for
    /// its store `store` ("": its only one); calls that change nothing are tried up to
    /// `attempts` times.
    #[staticmethod]
    #[pyo3(signature = (addr, store, token = None, timeout = None, tls = None, attempts = 4))]
    #[allow(clippy::type_complexity)]
    fn connect(
        py: Python<'_>,
        addr: &str,
        store: &str,
        token: Option<String>,
        timeout: Option<f64>,
        tls: Option<(Option<Vec<u8>>, Option<String>, Option<(Vec<u8>, Vec<u8>)>)>,
        attempts: u32,
    ) -> PyResult<Self> {
        let options = client_options(token, timeout, tls, attempts);
        let client =
            detach(py, || Client::connect(addr, store, options))?.map_err(|e| err(py, e))?;
        Ok(Self {
            api: Arc::new(client),
        })
    }

    /// Connects to a sharded store: its plan `plan` (JSON; read from `location`, if given),
    /// shard `k` served by the nodes `replicas[k]` (each `ADDR` or `ADDR/STORE`); `hedge` is
    /// `"off"`, `"pNN"` or a delay in seconds (`nearrec_cluster::Hedge`).
    #[staticmethod]
    #[pyo3(signature = (plan, location, replicas, hedge, token = None, timeout = None, tls = None, catch_up_every = Some(2.0)))]
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn connect_sharded(
        py: Python<'_>,
        plan: &str,
        location: Option<PathBuf>,
        replicas: Vec<Vec<String>>,
        hedge: HedgeArg,
        token: Option<String>,
        timeout: Option<f64>,
        tls: Option<(Option<Vec<u8>>, Option<String>, Option<(Vec<u8>, Vec<u8>)>)>,
        catch_up_every: Option<f64>,
    ) -> PyResult<Self> {
        let origin = location
            .clone()
            .unwrap_or_else(|| PathBuf::from("the plan given"));
        let plan = nearrec::plan::shards::ShardPlan::parse(plan.as_bytes(), &origin)
            .map_err(|e| crate::error::plan_error(py, e))?;
        let hedge = match hedge {
            HedgeArg::Named(name) => Hedge::named(&name),
            HedgeArg::Seconds(s) => Hedge::after(s),
        }
        .map_err(|m| raise(py, "InvalidRequest", m, None, None))?;
        let catch_up_every = match catch_up_every {
            Some(s) if !(s > 0.0 && s.is_finite()) => {
                let m = format!("catch_up_every must be seconds > 0 or None (off), not {s}");
                return Err(raise(py, "InvalidRequest", m, None, None));
            }
            s => s.map(std::time::Duration::from_secs_f64),
        };
        let options = ShardedOptions {
            client: client_options(token, timeout, tls, 1),
            hedge,
            catch_up_every,
        };
        let endpoints: Vec<Vec<Endpoint>> = (replicas.iter())
            .map(|shard| shard.iter().map(|a| Endpoint::parse(a)).collect())
            .collect();
        let store = detach(py, || {
            ShardedStore::connect(plan, location, &endpoints, options)
        })?
        .map_err(|e| err(py, e))?;
        Ok(Self {
            api: Arc::new(store),
        })
    }

    /// A sharded store's replicas: each shard's nodes' addresses, as served now.
    fn shard_replicas(&self, py: Python<'_>) -> PyResult<Vec<Vec<String>>> {
        Ok(self.router(py, "shard_replicas")?.replicas())
    }

    /// Serves shard `shard` of a sharded store from the nodes `replicas` from the next call
    /// on (a node restarted at another address), each new one checked against the plan.
    fn set_shard_replicas(
        &self,
        py: Python<'_>,
        shard: usize,
        replicas: Vec<String>,
    ) -> PyResult<()> {
        let router = self.router(py, "set_shard_replicas")?;
        let endpoints: Vec<Endpoint> = replicas.iter().map(|a| Endpoint::parse(a)).collect();
        detach(py, || router.set_replicas(shard, &endpoints))?.map_err(|e| err(py, e))
    }

    /// Catches up a sharded store's replicas that are stale but answer, each from a member of
    /// its shard, the members fenced for at most `lease` seconds: per replica `(shard, address,
    /// (rows copied before the fence, under it, count of writes, epoch) or None, error or
    /// None)`.
    fn catch_up(&self, py: Python<'_>, lease: f64) -> PyResult<Vec<CatchUpTuple>> {
        let router = self.router(py, "catch_up")?;
        let lease = Duration::try_from_secs_f64(lease)
            .map_err(|_| pyo3::exceptions::PyValueError::new_err(format!("lease {lease} s")))?;
        let done = detach(py, || router.catch_up(lease))?;
        Ok(done
            .into_iter()
            .map(|(k, addr, r)| match r {
                Ok(c) => (
                    k,
                    addr,
                    Some((c.rows_before_fence, c.rows_fenced, c.version, c.epoch)),
                    None,
                ),
                Err(e) => (k, addr, None, Some(e.to_string())),
            })
            .collect())
    }

    /// What serves the store, in words.
    #[getter]
    fn describe(&self) -> String {
        self.api.describe()
    }

    /// The capabilities the store has beyond its core (`nearrec::StoreApi`'s): `writes`,
    /// `schema`, `versions`, `replica`, `inference`.
    #[getter]
    fn capabilities(&self) -> Vec<&'static str> {
        self.api.capabilities()
    }

    /// Whether the store is embedded in this process (`nearrec.open`).
    #[getter]
    fn embedded(&self) -> bool {
        self.concrete::<Store>().is_some()
    }

    /// The store's directory on this machine (`None`: not on this machine).
    #[getter]
    fn path(&self) -> Option<PathBuf> {
        self.api.location()
    }

    /// `(name, [(table, rows, dim, dtype)], version, tier, writable, model, stores)`.
    fn info(&self, py: Python<'_>) -> PyResult<InfoTuple> {
        let i = detach(py, || self.api.info())?.map_err(|e| err(py, e))?;
        let tables = i
            .tables
            .into_iter()
            .map(|t| (t.name, t.rows, t.dim, t.dtype.name().to_owned(), t.keys))
            .collect();
        Ok((
            i.name,
            tables,
            i.version,
            i.tier,
            i.writable,
            i.model,
            i.stores,
            (i.path, i.served_version, i.versions),
        ))
    }

    #[getter]
    fn threads(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.local(py, "threads")?.threads())
    }

    /// The manifest as JSON (tables as served now, creation parameters).
    #[getter]
    fn manifest_json(&self, py: Python<'_>) -> PyResult<String> {
        let manifest = self.local(py, "info")?.manifest();
        Ok(serde_json::to_string(&manifest).expect("manifest serialises"))
    }

    /// A new table (RM_create_table): uniform values drawn with `uniform_seed`, or zeros
    /// (`None`).
    fn create_table(
        &self,
        py: Python<'_>,
        name: &str,
        rows: u64,
        dim: u32,
        dtype: &str,
        uniform_seed: Option<u64>,
    ) -> PyResult<u64> {
        let dtype = dtype.parse::<DType>().map_err(|e| format_err(py, e))?;
        let init =
            uniform_seed.map_or(nearrec::Init::Zeros, |seed| nearrec::Init::Uniform { seed });
        let table = NewTable {
            name,
            rows,
            dim,
            dtype,
            init,
        };
        detach(py, || {
            self.api
                .able(self.api.schema(), "create_table")?
                .create_table(&table)
        })?
        .map_err(|e| err(py, e))
    }

    /// What changed since `version`: (version, base, engine id, per table the rows written or
    /// removed since as int64 arrays, or None when it cannot be told).
    #[allow(clippy::type_complexity)]
    fn changes_since<'py>(
        &self,
        py: Python<'py>,
        version: u64,
    ) -> PyResult<(
        u64,
        u64,
        u64,
        Option<Vec<(String, Bound<'py, PyArray1<i64>>)>>,
    )> {
        let c = self.local(py, "changes_since")?.changes_since(version);
        let rows = c.rows.map(|rows| {
            rows.into_iter()
                .map(|(t, r)| {
                    let ids: Vec<i64> = r.into_iter().map(|x| x as i64).collect();
                    (t, PyArray1::from_vec(py, ids))
                })
                .collect()
        });
        Ok((c.version, c.base, c.engine, rows))
    }

    /// Writes the rows of a table that differ from `values` (the whole table, `[rows, dim]`
    /// floats) by more than `tolerance` (a number): (compared, written, calls, version).
    fn sync_table(
        &self,
        py: Python<'_>,
        table: &str,
        values: &Bound<'_, PyAny>,
        tolerance: &Bound<'_, PyAny>,
    ) -> PyResult<(u64, u64, u64, u64)> {
        let values = float_rows(py, values, table, false)?;
        let number = tolerance.cast::<pyo3::types::PyBool>().is_err();
        let tolerance = (tolerance.extract::<f32>().ok())
            .filter(|_| number)
            .ok_or_else(|| {
                let what = crate::convert::repr(tolerance);
                raise(
                    py,
                    "InvalidRequest",
                    format!("tolerance is a number, not {what}"),
                    None,
                    None,
                )
            })?;
        let values = values.readonly();
        let values = values
            .as_slice()
            .map_err(|_| contiguous(py, "values", table))?;
        let done = detach(py, || {
            self.api
                .able(self.api.writes(), "sync_table")?
                .sync_table(table, values, tolerance)
        })?
        .map_err(|e| err(py, e))?;
        Ok((done.compared, done.written, done.calls, done.version))
    }

    /// Serves the store at `path` (on the serving side's file system), version `version` of
    /// the repository the store is served from, or (`rollback`) the version served before,
    /// from the next call on; returns the new store's version.
    #[pyo3(signature = (path, version, rollback, warm, force = false))]
    fn swap(
        &self,
        py: Python<'_>,
        path: Option<PathBuf>,
        version: Option<u64>,
        rollback: bool,
        warm: bool,
        force: bool,
    ) -> PyResult<u64> {
        let to = match (path, version, rollback) {
            (Some(p), None, false) => SwapTo::Path(p.to_string_lossy().into_owned()),
            (None, Some(v), false) => SwapTo::Version(v),
            (None, None, true) => SwapTo::Previous,
            _ => {
                let why = "swap to one of a path, a version and the previous version (rollback)";
                return Err(raise(py, "InvalidRequest", why.into(), None, None));
            }
        };
        detach(py, || {
            self.api
                .able(self.api.versions(), "swap")?
                .swap(&to, warm, force)
        })?
        .map_err(|e| err(py, e))
    }

    /// Replaces dense weights of the model kept with the store, `(name, float32 array)` each
    /// (`StoreApi::update_model`).
    fn update_model(
        &self,
        py: Python<'_>,
        weights: Vec<(String, numpy::PyReadonlyArrayDyn<'_, f32>)>,
    ) -> PyResult<()> {
        let arrays = crate::model::weight_arrays(py, &weights)?;
        let tensors = crate::model::tensors(&arrays);
        detach(py, || {
            self.api
                .able(self.api.inference(), "update_model")?
                .update_model(&tensors)
        })?
        .map_err(|e| err(py, e))
    }

    /// Drops a table (EMB_REMOVE of a table).
    fn drop_table(&self, py: Python<'_>, name: &str) -> PyResult<u64> {
        detach(py, || {
            self.api
                .able(self.api.schema(), "drop_table")?
                .drop_table(name)
        })?
        .map_err(|e| err(py, e))
    }

    /// The config the store was opened with, as TOML.
    fn config_toml(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.local(py, "config")?.config().to_toml())
    }

    /// Pools a batch (a list of `TableLookup`): the `[batch, Σ dim]` float32 output. With
    /// `sub_batch`, the bags flow through in sub-batches of that many, two at a time (an
    /// embedded store's).
    #[pyo3(signature = (lookups, sub_batch = None))]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        lookups: &Bound<'py, PyAny>,
        sub_batch: Option<usize>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let held = HeldBatch::extract(lookups)?;
        let batch = held.as_batch();
        if let Some(sub) = sub_batch {
            let store = self.local(py, "lookup_many(sub_batch=)")?;
            let pooled = detach(py, || store.lookup_split(&batch, sub))?.map_err(|e| err(py, e))?;
            return array(py, pooled);
        }
        self.pool(py, &batch)
    }

    /// Each table's distinct rows a batch reads: `([(table, ids, rows)], version)`.
    #[allow(clippy::type_complexity)]
    fn lookup_rows<'py>(
        &self,
        py: Python<'py>,
        lookups: &Bound<'py, PyAny>,
    ) -> PyResult<(
        Vec<(String, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray2<f32>>)>,
        u64,
    )> {
        let held = HeldBatch::extract(lookups)?;
        let (rows, version) =
            detach(py, || self.api.lookup_rows(&held.as_batch()))?.map_err(|e| err(py, e))?;
        let rows = rows
            .into_iter()
            .map(|r| {
                let n = r.ids.len();
                let values = PyArray1::from_vec(py, r.values).reshape([n, r.dim])?;
                Ok((r.table, PyArray1::from_vec(py, r.ids), values))
            })
            .collect::<PyResult<_>>()?;
        Ok((rows, version))
    }

    /// Starts a lookup in the background; returns its handle at once.
    fn submit(&self, py: Python<'_>, lookups: &Bound<'_, PyAny>) -> PyResult<NativePending> {
        let held = HeldBatch::extract(lookups)?;
        let pending = self.api.submit(Box::new(held)).map_err(|e| err(py, e))?;
        Ok(NativePending::new(pending))
    }

    /// The results of `batches` (an iterable of lists of `TableLookup`) in order, `depth` of them
    /// in flight.
    fn stream(&self, batches: &Bound<'_, PyAny>, depth: usize) -> PyResult<NativeStream> {
        Ok(NativeStream {
            store: self.api.clone(),
            batches: batches.try_iter()?.unbind(),
            depth: depth.max(1),
            window: Mutex::new(VecDeque::new()),
        })
    }

    /// Runs a model on one batch (whole-model offload): `model` (None: the one kept with the
    /// store; else, on an embedded store, a `NativeModel`), `dense` `[batch, dense_width]`
    /// float32 or None, `lookups` matched to the model's inputs by name (`StoredModel::arrange`),
    /// or taken in its input order as they are with `in_order`. Returns the `[batch, outputs]`
    /// output and the seconds per part (`total`, `embeddings`, `dense`, `blocks`, `finish`, and
    /// the embeddings' `route`, `io_wait`, `pool`: zeros where the store runs elsewhere).
    #[pyo3(signature = (model, dense, lookups, in_order = false))]
    fn infer<'py>(
        &self,
        py: Python<'py>,
        model: Option<&NativeModel>,
        dense: Option<PyReadonlyArray2<'py, f32>>,
        lookups: &Bound<'py, PyAny>,
        in_order: bool,
    ) -> PyResult<(Bound<'py, PyArray2<f32>>, Seconds)> {
        let held = HeldBatch::extract(lookups)?;
        let dense = dense_features(py, dense.as_ref())?;
        self.infer_batch(py, model, dense, &held.as_batch(), in_order)
    }

    /// The model kept with the store: its name, its inputs' names (features, or tables) and the
    /// table each input reads, in input order.
    #[allow(clippy::type_complexity)]
    fn model_inputs(&self, py: Python<'_>) -> PyResult<(String, Vec<String>, Vec<String>)> {
        let store = self.local(py, "model_inputs")?;
        let model = detach(py, || store.model())?.map_err(|e| err(py, e))?;
        Ok((
            model.name.clone(),
            model.inputs.clone(),
            model.tables.clone(),
        ))
    }

    /// What the simulated drive has done (JSON of `nearrec_device::FlashStats`), or None when the
    /// store is not on one (or not in this process).
    fn flash_stats(&self) -> Option<String> {
        let st = self.concrete::<Store>()?.flash_stats()?;
        serde_json::to_string(&st).ok()
    }

    /// One atomic, durable write call: `{table: (ids, rows)}`, ids as a lookup's indices are
    /// given and rows `[len(ids), dim]` floats (`float_rows`), or `None` rows to remove the ids.
    /// Returns the version.
    #[pyo3(signature = (writes, allow_nonfinite = false))]
    fn write_many(
        &self,
        py: Python<'_>,
        writes: &Bound<'_, PyAny>,
        allow_nonfinite: bool,
    ) -> PyResult<u64> {
        let writes = py_writes(writes, allow_nonfinite)?;
        let slices = row_writes(py, &writes)?;
        let options = nearrec::WriteOptions { allow_nonfinite };
        detach(py, || {
            self.api
                .able(self.api.writes(), "write")?
                .write_many(&slices, options)
        })?
        .map_err(|e| err(py, e))
    }

    /// The newest version the store's writer has logged, served from now on.
    fn refresh(&self, py: Python<'_>) -> PyResult<u64> {
        detach(py, || self.api.refresh())?.map_err(|e| err(py, e))
    }

    /// Folds the deltas into new table files: (version, tables, rows, bytes, seconds).
    fn compact(&self, py: Python<'_>) -> PyResult<(u64, usize, u64, u64, f64)> {
        let c = detach(py, || {
            self.api.able(self.api.writes(), "compact")?.compact()
        })?
        .map_err(|e| err(py, e))?;
        Ok((c.version, c.tables, c.rows, c.bytes, c.seconds))
    }

    fn version(&self, py: Python<'_>) -> PyResult<u64> {
        detach(py, || self.api.version())?.map_err(|e| err(py, e))
    }

    /// Moves a manual clock `seconds` ahead (an embedded store opened with `manual_clock`);
    /// the Unix time it reads now.
    fn advance_clock(&self, py: Python<'_>, seconds: u64) -> PyResult<u64> {
        self.local(py, "advance_clock")?
            .advance_clock(seconds)
            .map_err(|e| err(py, e))
    }

    /// The log's and the deltas' counters (an embedded store's; a node's are in `stats`).
    fn live_stats(&self, py: Python<'_>) -> PyResult<Vec<(&'static str, f64)>> {
        Ok(self.local(py, "live_stats")?.live_stats())
    }

    /// Every counter: the device's kind (`dram` for a DRAM-resident store), whether reads are
    /// direct and its block size, the SSD tier's counters and latency percentiles (µs), the
    /// DRAM tiers' totals and the live store's counters.
    fn stats(&self, py: Python<'_>) -> PyResult<Vec<(String, PyStat)>> {
        let stats = detach(py, || self.api.stats())?.map_err(|e| err(py, e))?;
        let mut out: Vec<(String, PyStat)> = vec![
            ("device".into(), PyStat::Owned(stats.device)),
            ("direct_io".into(), PyStat::Flag(stats.direct_io)),
            (
                "block_bytes".into(),
                PyStat::Number(stats.block_bytes as f64),
            ),
        ];
        out.extend(
            stats
                .values
                .into_iter()
                .map(|(k, v)| (k, PyStat::Number(v))),
        );
        Ok(out)
    }

    /// Per table: what its DRAM tiers hold (`resident`, `hot_rows`, `cache_rows`, `bytes`) and
    /// the lookups each tier served, with the row cache's counters; `[]` for DRAM-resident stores.
    fn tier_report(&self, py: Python<'_>) -> PyResult<Vec<Vec<(&'static str, PyStat)>>> {
        let report = detach(py, || self.api.tier_report())?.map_err(|e| err(py, e))?;
        Ok(report
            .into_iter()
            .map(|r| {
                let n = |v: u64| PyStat::Number(v as f64);
                vec![
                    ("table", PyStat::Owned(r.table)),
                    ("resident", PyStat::Flag(r.resident)),
                    ("hot_rows", n(r.hot_rows)),
                    ("cache_rows", n(r.cache_rows)),
                    ("bytes", n(r.bytes)),
                    ("lookups_resident", n(r.lookups_resident)),
                    ("lookups_hot", n(r.lookups_hot)),
                    ("lookups_cache", n(r.lookups_cache)),
                    ("lookups_ssd", n(r.lookups_ssd)),
                    ("cache_hits", n(r.cache.hits)),
                    ("cache_misses", n(r.cache.misses)),
                    ("cache_admissions", n(r.cache.admissions)),
                    ("cache_rejections", n(r.cache.rejections)),
                    ("cache_evictions", n(r.cache.evictions)),
                ]
            })
            .collect())
    }

    /// Decodes the given rows of a table to a `[n, dim]` float32 array.
    fn read_rows<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        rows: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let dim = detach(py, || self.api.table(name))?
            .map_err(|e| err(py, e))?
            .dim as usize;
        let rows = i64_vector(py, rows, name, "rows")?.readonly();
        let rows = rows.as_slice().map_err(|_| contiguous(py, "rows", name))?;
        let out = PyArray2::<f32>::zeros(py, [rows.len(), dim], false);
        {
            let mut rw = out.readwrite();
            let slice = rw.as_slice_mut().expect("new arrays are contiguous");
            detach(py, || self.api.read_rows(name, rows, slice))?.map_err(|e| err(py, e))?;
        }
        Ok(out)
    }

    /// Lets go of the writer lock or the connection now; later calls fail.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        detach(py, || self.api.close())?.map_err(|e| err(py, e))
    }

    /// A zero-copy read-only `[rows, dim]` float32 view of a dense fp32 table (for peers and
    /// tests); other layouts raise.
    fn table_array<'py>(slf: Bound<'py, Self>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let store = this.local(py, "table_array")?;
        let meta = store.table_meta(name).map_err(|e| err(py, e))?;
        if meta.dtype != DType::Fp32 || !meta.layout().is_dense() {
            return Err(raise(
                py,
                "InvalidRequest",
                format!(
                    "table {name:?} is {} with a padded layout; only dense fp32 tables have an array view",
                    meta.dtype
                ),
                Some(name),
                None,
            ));
        }
        let Some(data) = store.table_data(name).map_err(|e| err(py, e))? else {
            return Err(raise(
                py,
                "InvalidRequest",
                format!(
                    "table {name:?} is served from SSD; only DRAM-resident tables have an array view"
                ),
                Some(name),
                None,
            ));
        };
        let floats = (meta.rows * u64::from(meta.dim)) as usize;
        let ptr = data.as_ptr();
        debug_assert!(floats * 4 <= data.len());
        let holder = Bound::new(py, HeldTable { _table: data })?;
        // SAFETY: the buffer is 4 KiB-aligned, dense fp32 rows are 4-byte values, and it lives as
        // long as the engine `holder` keeps, which the array keeps alive as its base object.
        let arr = unsafe {
            let view = numpy::ndarray::ArrayView2::from_shape_ptr(
                (meta.rows as usize, meta.dim as usize),
                ptr.cast::<f32>(),
            );
            PyArray2::borrow_from_array(&view, holder.into_any())
        };
        arr.readwrite().make_nonwriteable();
        Ok(arr.into_any())
    }
}

/// The base object of a table's array view: it keeps the engine holding the rows.
#[pyclass(frozen)]
struct HeldTable {
    _table: nearrec::TableData,
}

/// A write call's arrays from Python: per table `(name, ids, rows or None)`.
pub(crate) type PyWrites<'py> = Vec<(
    String,
    PyReadonlyArray1<'py, i64>,
    Option<PyReadonlyArray2<'py, f32>>,
)>;

/// A write call's `{table: (ids, rows or None)}` converted (a table name that is not a str, a
/// write that is not a pair, ids or rows that cannot be converted: an `InvalidRequest`).
pub(crate) fn py_writes<'py>(
    writes: &Bound<'py, PyAny>,
    allow_nonfinite: bool,
) -> PyResult<PyWrites<'py>> {
    let py = writes.py();
    let invalid = |msg: String, table: Option<&str>| raise(py, "InvalidRequest", msg, table, None);
    let Ok(map) = writes.cast::<PyMapping>() else {
        let msg = format!(
            "writes is a mapping from table to (ids, rows), not {}",
            type_name(writes)
        );
        return Err(invalid(msg, None));
    };
    map.items()?
        .iter()
        .map(|item| {
            let (table, pair) = item.extract::<(Bound<'py, PyAny>, Bound<'py, PyAny>)>()?;
            let Ok(table) = table.cast::<PyString>() else {
                let msg = format!("a table name is a str, not {}", type_name(&table));
                return Err(invalid(msg, None));
            };
            let t = table.to_str()?.to_owned();
            let pair: Vec<Bound<'py, PyAny>> = match pair.cast::<PyTuple>() {
                Ok(p) => p.iter().collect(),
                Err(_) => match pair.cast::<PyList>() {
                    Ok(p) => p.iter().collect(),
                    Err(_) => Vec::new(),
                },
            };
            let [ids, rows] = &pair[..] else {
                let msg = format!("table {t:?}: a write is an (ids, rows) pair");
                return Err(invalid(msg, Some(&t)));
            };
            let ids = i64_vector(py, ids, &t, "ids")?.readonly();
            let rows = if rows.is_none() {
                None
            } else {
                Some(float_rows(py, rows, &t, allow_nonfinite)?.readonly())
            };
            Ok((t, ids, rows))
        })
        .collect()
}

/// A write call's arrays viewed as the facade's [`nearrec::RowWrite`]s.
pub(crate) fn row_writes<'a>(
    py: Python<'_>,
    writes: &'a PyWrites<'_>,
) -> PyResult<Vec<nearrec::RowWrite<'a>>> {
    writes
        .iter()
        .map(|(table, ids, rows)| {
            let ids = ids.as_slice().map_err(|_| contiguous(py, "ids", table))?;
            let values = rows
                .as_ref()
                .map(|r| r.as_slice())
                .transpose()
                .map_err(|_| contiguous(py, "rows", table))?;
            Ok(nearrec::RowWrite { table, ids, values })
        })
        .collect()
}

/// A submitted batch (`nearrec.Pending` wraps it).
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativePending {
    state: Mutex<State>,
    /// Signalled whenever the state leaves `Busy`.
    settled: Condvar,
}

enum State {
    Waiting(Submitted),
    Done(PyResult<Py<PyArray2<f32>>>),
    /// Taken by a waiting thread.
    Busy,
}

impl NativePending {
    fn new(p: Submitted) -> Self {
        Self {
            state: Mutex::new(State::Waiting(p)),
            settled: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Leaves `Busy` for `state` and wakes every thread waiting on the handle.
    fn settle(&self, state: State) {
        *self.lock() = state;
        self.settled.notify_all();
    }
}

#[pymethods]
impl NativePending {
    fn done(&self) -> bool {
        match &*self.lock() {
            State::Waiting(p) => p.is_done(),
            State::Done(_) => true,
            State::Busy => false,
        }
    }

    /// The batch's output (or its error); `TimeoutError` when `timeout` seconds pass first.
    #[pyo3(signature = (timeout = None))]
    fn result<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let taken = {
            let mut s = self.lock();
            match std::mem::replace(&mut *s, State::Busy) {
                State::Done(r) => {
                    let out = r
                        .as_ref()
                        .map(|a| a.clone_ref(py))
                        .map_err(|e| e.clone_ref(py));
                    *s = State::Done(r);
                    return out.map(|a| a.into_bound(py));
                }
                State::Waiting(p) => Some(p),
                State::Busy => None,
            }
        };
        let Some(pending) = taken else {
            // another thread waits on it: wait until it has the answer (or gives the handle back)
            py.detach(|| {
                let mut state = self.lock();
                while matches!(*state, State::Busy) {
                    state = self.settled.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            });
            return self.result(py, timeout);
        };
        let waited = match timeout {
            None => detach(py, || Ok(pending.wait())),
            Some(t) => detach(py, || {
                pending.wait_timeout(Duration::from_secs_f64(t.max(0.0)))
            }),
        };
        let waited = match waited {
            Ok(w) => w,
            Err(e) => {
                // (a panic while waiting: the handle answers it from now on, no one hangs)
                self.settle(State::Done(Err(e.clone_ref(py))));
                return Err(e);
            }
        };
        let result = match waited {
            Ok(r) => r,
            Err(pending) => {
                self.settle(State::Waiting(pending));
                return Err(pyo3::exceptions::PyTimeoutError::new_err(
                    "the batch is not done yet",
                ));
            }
        };
        let result = result
            .map_err(|e| err(py, e))
            .and_then(|p| array(py, p).map(Bound::unbind));
        let out = result
            .as_ref()
            .map(|a| a.clone_ref(py).into_bound(py))
            .map_err(|e| e.clone_ref(py));
        self.settle(State::Done(result));
        out
    }
}

/// Batches in flight, results in order (`Store.lookup_stream`).
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativeStream {
    store: Arc<dyn StoreApi>,
    batches: Py<pyo3::types::PyIterator>,
    depth: usize,
    window: Mutex<VecDeque<Submitted>>,
}

#[pymethods]
impl NativeStream {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray2<f32>>>> {
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        while window.len() < self.depth {
            match self.batches.bind(py).clone().next() {
                Some(item) => {
                    let held = HeldBatch::extract(&item?)?;
                    let pending = self.store.submit(Box::new(held)).map_err(|e| err(py, e))?;
                    window.push_back(pending);
                }
                None => break,
            }
        }
        let Some(front) = window.pop_front() else {
            return Ok(None);
        };
        drop(window);
        let pooled = detach(py, || front.wait())?.map_err(|e| err(py, e))?;
        array(py, pooled).map(Some)
    }
}

/// One value of `stats()`.
#[derive(IntoPyObject)]
pub(crate) enum PyStat {
    Owned(String),
    Flag(bool),
    Number(f64),
}

/// Checks every data byte of a store; returns `[(table, bytes, error or None)]`.
#[pyfunction]
#[pyo3(signature = (path, progress = false))]
pub(crate) fn verify_store(py: Python<'_>, path: PathBuf, progress: bool) -> PyResult<Checks> {
    checked(py, &path, progress, "verifying", |reader, cb| {
        reader.verify(cb)
    })
}

/// One pass of a scrub over a store (`nearrec::scrub`): every table's data read at most `rate`
/// bytes a second (0: as fast as the disk goes), each range from the device; returns
/// `[(table, bytes, error or None)]`.
#[pyfunction]
#[pyo3(signature = (path, rate = 0, progress = false))]
pub(crate) fn scrub_store(
    py: Python<'_>,
    path: PathBuf,
    rate: u64,
    progress: bool,
) -> PyResult<Checks> {
    checked(py, &path, progress, "scrubbing", |reader, cb| {
        nearrec::scrub(reader, rate, cb)
    })
}

/// Each table's check: `(table, bytes, error or None)`.
type Checks = Vec<(String, u64, Option<String>)>;

/// `check` of the store at `path`, the GIL released, behind a progress bar saying `what`.
fn checked(
    py: Python<'_>,
    path: &std::path::Path,
    progress: bool,
    what: &'static str,
    check: impl FnOnce(&StoreReader, Option<&ProgressFn>) -> Vec<TableCheck> + Send,
) -> PyResult<Checks> {
    let reader = StoreReader::open(path).map_err(|e| format_err(py, e))?;
    let total = reader.tables().iter().map(|t| t.data_bytes).sum();
    let bar = progress::bar(progress, total, what);
    let cb = progress::callback(&bar);
    let checks = detach(py, || check(&reader, cb.as_ref()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(checks
        .into_iter()
        .map(|c| (c.table, c.bytes, c.error))
        .collect())
}

/// One leftover of a killed writer: `(path, bytes, reason)`.
type Leftover = (PathBuf, u64, String);

/// Removes what killed writers left at `path` (`nearrec_format::gc`): `(removed, kept)`.
#[pyfunction]
pub(crate) fn store_gc(py: Python<'_>, path: PathBuf) -> PyResult<(Vec<Leftover>, Vec<Leftover>)> {
    let report = detach(py, || nearrec_format::gc(&path))?.map_err(|e| format_err(py, e))?;
    let rows = |v: Vec<nearrec_format::Leftover>| {
        v.into_iter()
            .map(|l| (l.path, l.bytes, l.reason))
            .collect::<Vec<_>>()
    };
    Ok((rows(report.removed), rows(report.kept)))
}

/// Adds the closed store at `store` to the repository of versions at `repository` (made if
/// missing) as its next version, copied or (`move`) renamed in; returns the version.
#[pyfunction]
#[pyo3(name = "repo_publish", signature = (repository, store, r#move = false))]
pub(crate) fn repo_publish(
    py: Python<'_>,
    repository: PathBuf,
    store: PathBuf,
    r#move: bool,
) -> PyResult<u64> {
    let how = if r#move { Publish::Move } else { Publish::Copy };
    detach(py, || {
        Repository::create(&repository).and_then(|r| r.publish(&store, how))
    })?
    .map_err(|e| format_err(py, e))
}

/// A repository's versions, the one served and those served before it.
type VersionsTuple = (Vec<u64>, u64, Vec<u64>);

/// The repository of versions at `path`: `(versions, current, history)`, or `None` if `path`
/// is not one.
#[pyfunction]
pub(crate) fn repo_versions(py: Python<'_>, path: PathBuf) -> PyResult<Option<VersionsTuple>> {
    let Some(repo) = Repository::detect(&path) else {
        return Ok(None);
    };
    let read = || -> nearrec_format::Result<_> {
        let history = repo.pointer()?.map(|p| p.history).unwrap_or_default();
        Ok((repo.versions()?, repo.current()?, history))
    };
    detach(py, read)?.map(Some).map_err(|e| format_err(py, e))
}

/// Opens and validates a store's manifest and table headers; returns the manifest as JSON.
#[pyfunction]
pub(crate) fn read_manifest(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let reader = StoreReader::open(&path).map_err(|e| format_err(py, e))?;
    Ok(manifest_json(&reader))
}

/// The keys keyed table `table` of the store at `path` holds (its keys file read and checked),
/// in the file's order, as int64 bits.
#[pyfunction]
pub(crate) fn read_keys<'py>(
    py: Python<'py>,
    path: PathBuf,
    table: &str,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let reader = StoreReader::open(&path).map_err(|e| format_err(py, e))?;
    let Some(i) = reader.manifest().table_index(table) else {
        let available: Vec<&str> = reader.tables().iter().map(|t| t.name.as_str()).collect();
        return Err(raise(
            py,
            "UnknownTable",
            format!(
                "unknown table {table:?}; the store has: {}",
                available.join(", ")
            ),
            Some(table),
            None,
        ));
    };
    let entries = detach(py, || reader.keys(i))?.map_err(|e| format_err(py, e))?;
    let Some(entries) = entries else {
        return Err(raise(
            py,
            "InvalidRequest",
            format!("table {table:?} is not keyed: its rows are addressed by position"),
            Some(table),
            None,
        ));
    };
    let keys: Vec<i64> = entries.iter().map(|&(k, _)| k as i64).collect();
    Ok(PyArray1::from_vec(py, keys))
}

/// Adds (or replaces) attachment `name` of the store at `path`; returns the manifest as JSON.
#[pyfunction]
pub(crate) fn store_attach(
    py: Python<'_>,
    path: PathBuf,
    name: &str,
    data: &[u8],
) -> PyResult<String> {
    let manifest =
        detach(py, || nearrec_format::attach(&path, name, data))?.map_err(|e| format_err(py, e))?;
    Ok(serde_json::to_string(&manifest).expect("manifest serialises"))
}

/// Attachment `name` of the store at `path`, checked (`None`: there is none of that name).
#[pyfunction]
pub(crate) fn store_read_attachment<'py>(
    py: Python<'py>,
    path: PathBuf,
    name: &str,
) -> PyResult<Option<Bound<'py, pyo3::types::PyBytes>>> {
    let bytes = detach(py, || {
        StoreReader::open(&path).and_then(|r| r.read_attachment(name))
    })?
    .map_err(|e| format_err(py, e))?;
    Ok(bytes.map(|b| pyo3::types::PyBytes::new(py, &b)))
}

fn manifest_json(reader: &StoreReader) -> String {
    serde_json::to_string(reader.manifest()).expect("manifest serialises")
}
