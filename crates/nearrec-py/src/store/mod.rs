//! Binding of the store's contract: `nearrec.Store` over any implementation of
//! [`StoreApi`] — the embedded `nearrec::Store` (`nearrec.open`) or a node's store through its
//! client (`nearrec.connect`), one class for both. Lookups take native `TableLookup`s (or a
//! KeyedJaggedTensor's own buffers) and release the GIL. What only an embedded store has (its
//! tables' memory, its config, the simulated drive, sub-batches, a caller's model) answers
//! `Unsupported` on another implementation, naming the call.
//!
//! `mod.rs`: the class, opening and connecting, what a store is; `verbs.rs`: its verbs (tables,
//! lookups, writes, versions, stats); `pending.rs`: a submitted batch and a stream of them.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use nearrec::{AsBatch, Batch, Located, NewTable, Pooled, Store, StoreApi, Submitted, SwapTo};
use nearrec_client::{Client, ClientOptions, ClientTls, Retry};
use nearrec_cluster::etcd::EtcdOptions;
use nearrec_cluster::{Endpoint, Hedge, ShardedOptions, ShardedStore};
use nearrec_format::DType;
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyMapping, PyString, PyTuple};

use crate::config::NativeConfig;
use crate::convert::{dense_features, float_rows, i64_vector, type_name};
use crate::error::{detach, err, format_err, raise, run};
use crate::lookup::HeldBatch;
use crate::model::NativeModel;
use crate::progress;

mod pending;
mod verbs;

pub(crate) use pending::{NativePending, NativeStream};

/// One replica's catch-up: shard, address, what it did, why it failed.
type CatchUpTuple = (
    usize,
    String,
    Option<(u64, u64, u64, u64, f64)>,
    Option<String>,
);

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
            let (pooled, _) = run(py, || self.api.lookup(batch))?;
            return array(py, pooled);
        };
        let prepared = store.prepare(batch).map_err(|e| err(py, e))?;
        let out = PyArray2::<f32>::zeros(py, [prepared.batch(), prepared.width()], false);
        {
            let mut rw = out.readwrite();
            let slice = rw.as_slice_mut().expect("new arrays are contiguous");
            run(py, || store.execute(batch, &prepared, slice))?;
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
            Some(m) => detach(py, || {
                self.api.infer_model(&m.model, dense, batch, in_order)
            })?,
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
        let located = run(py, || Located::open(&path))?;
        let total = located.reader.tables().iter().map(|t| t.data_bytes).sum();
        let bar = progress::bar(progress, total, "loading");
        let cb = progress::callback(&bar);
        let store = run(py, || {
            Store::from_located(located, &config.config, cb.as_ref())
        })?;
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
        let client = run(py, || Client::connect(addr, store, options))?;
        Ok(Self {
            api: Arc::new(client),
        })
    }

    /// Connects to a sharded store: its plan `plan` (JSON; read from `location`, if given),
    /// shard `k` served by the nodes `replicas[k]` (each `ADDR` or `ADDR/STORE`); `hedge` is
    /// `"off"`, `"pNN"` or a delay in seconds (`nearrec_cluster::Hedge`); `etcd`: the
    /// endpoints of the etcd the shards' membership is kept in, the prefix of its keys and
    /// the hold time in seconds (`nearrec_cluster::etcd`).
    #[staticmethod]
    #[pyo3(signature = (plan, location, replicas, hedge, token = None, timeout = None, tls = None, catch_up_every = Some(2.0), etcd = None))]
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
        etcd: Option<(Vec<String>, Option<String>, f64)>,
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
        let etcd = match etcd {
            Some((_, _, hold)) if !(hold >= 0.1 && hold.is_finite()) => {
                let m = format!("etcd_hold must be seconds ≥ 0.1, not {hold}");
                return Err(raise(py, "InvalidRequest", m, None, None));
            }
            Some((endpoints, prefix, hold)) => Some(EtcdOptions {
                prefix,
                hold: std::time::Duration::from_secs_f64(hold),
                ..EtcdOptions::new(endpoints)
            }),
            None => None,
        };
        let options = ShardedOptions {
            client: client_options(token, timeout, tls, 1),
            hedge,
            catch_up_every,
            etcd,
        };
        let endpoints: Vec<Vec<Endpoint>> = (replicas.iter())
            .map(|shard| shard.iter().map(|a| Endpoint::parse(a)).collect())
            .collect();
        let store = run(py, || {
            ShardedStore::connect(plan, location, &endpoints, options)
        })?;
        Ok(Self {
            api: Arc::new(store),
        })
    }

    /// The sharded store in `directory`: its plan, and its shards' nodes and the way to reach
    /// them as its `replicas.toml` names them (`ShardedStore::open_dir`).
    #[staticmethod]
    fn open_sharded(py: Python<'_>, directory: PathBuf) -> PyResult<Self> {
        let store = run(py, || ShardedStore::open_dir(&directory))?;
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
        run(py, || router.set_replicas(shard, &endpoints))
    }

    /// Catches up a sharded store's replicas that are stale but answer, each from a member of
    /// its shard, the members fenced for at most `lease` seconds: per replica `(shard, address,
    /// (rows copied before the fence, under it, count of writes, epoch, seconds fenced) or
    /// None, error or None)`.
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
                    Some((
                        c.rows_before_fence,
                        c.rows_fenced,
                        c.version,
                        c.epoch,
                        c.fenced.as_secs_f64(),
                    )),
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
        let i = run(py, || self.api.info())?;
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
}
