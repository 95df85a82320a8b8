//! `NativeRemote`: a storage node's store, through `nearrec-client` (`nearrec.connect` wraps it
//! in a `RemoteStore`). The same `TableLookup` batches as a local store's, held and sent without
//! the GIL; errors raised as the node named them (`nearrec::Error::Remote`'s kind is the
//! class). Each call is the store contract's ([`StoreApi`]), as the client implements it.

use std::sync::Mutex;
use std::time::Duration;

use nearrec::{AsBatch, NewTable, StoreApi, Submitted, WriteOptions};
use nearrec_client::{Client, ClientOptions, ClientTls};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;

use crate::error::{detach, err, raise};
use crate::lookup::{HeldBatch, dense_features};
use crate::store::{PyWrites, row_writes};

fn array<'py>(
    py: Python<'py>,
    values: Vec<f32>,
    rows: usize,
    width: usize,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    PyArray1::from_vec(py, values).reshape([rows, width])
}

#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativeRemote {
    client: Client,
}

#[pymethods]
impl NativeRemote {
    /// Connects to the node at `addr` for its store `store` ("" : its only one).
    #[new]
    #[pyo3(signature = (addr, store, token = None, timeout = None, tls = None))]
    #[allow(clippy::type_complexity)]
    fn new(
        py: Python<'_>,
        addr: &str,
        store: &str,
        token: Option<String>,
        timeout: Option<f64>,
        tls: Option<(Option<Vec<u8>>, Option<String>, Option<(Vec<u8>, Vec<u8>)>)>,
    ) -> PyResult<Self> {
        let options = ClientOptions {
            token,
            timeout: timeout.map(Duration::from_secs_f64),
            tls: tls.map(|(ca, domain, identity)| ClientTls {
                ca,
                domain,
                identity,
            }),
            ..ClientOptions::default()
        };
        let client =
            detach(py, || Client::connect(addr, store, options))?.map_err(|e| err(py, e))?;
        Ok(Self { client })
    }

    /// Pools a batch (a list of `TableLookup`) on the node: `([batch, Σ dim] float32, version)`.
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        lookups: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyArray2<f32>>, u64)> {
        let held = HeldBatch::extract(lookups)?;
        let (p, read) =
            detach(py, || self.client.lookup(&held.as_batch()))?.map_err(|e| err(py, e))?;
        let width = p.width();
        Ok((array(py, p.values, p.batch, width)?, read.version))
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
            detach(py, || self.client.lookup_rows(&held.as_batch()))?.map_err(|e| err(py, e))?;
        let rows = rows
            .into_iter()
            .map(|r| {
                let n = r.ids.len();
                Ok((
                    r.table,
                    PyArray1::from_vec(py, r.ids),
                    array(py, r.values, n, r.dim)?,
                ))
            })
            .collect::<PyResult<_>>()?;
        Ok((rows, version))
    }

    /// Starts a lookup on the node; returns its handle at once.
    fn submit(&self, py: Python<'_>, lookups: &Bound<'_, PyAny>) -> PyResult<NativeRemotePending> {
        let held = HeldBatch::extract(lookups)?;
        let pending = self.client.submit(Box::new(held)).map_err(|e| err(py, e))?;
        Ok(NativeRemotePending(Mutex::new(Some(pending))))
    }

    /// The model kept with the store, run on the node: `[batch, outputs]` float32.
    fn infer<'py>(
        &self,
        py: Python<'py>,
        dense: Option<PyReadonlyArray2<'py, f32>>,
        lookups: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let held = HeldBatch::extract(lookups)?;
        let dense = dense_features(py, dense.as_ref())?;
        let out =
            detach(py, || self.client.infer(dense, &held.as_batch()))?.map_err(|e| err(py, e))?;
        array(py, out.outputs, out.batch, out.width)
    }

    /// Rows `rows` of table `name` decoded on the node: `[len(rows), dim]` float32.
    fn read_rows<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        rows: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let ids = rows.as_slice().map_err(|_| {
            raise(
                py,
                "InvalidRequest",
                "rows must be contiguous".into(),
                Some(name),
                None,
            )
        })?;
        let dim = detach(py, || self.client.table(name))?
            .map_err(|e| err(py, e))?
            .dim as usize;
        let mut out = vec![0f32; ids.len() * dim];
        detach(py, || self.client.read_rows(name, ids, &mut out))?.map_err(|e| err(py, e))?;
        array(py, out, ids.len(), dim)
    }

    /// EMB_WRITE of `[(table, ids, rows or None)]` in one atomic call; the new version.
    fn write_many(
        &self,
        py: Python<'_>,
        writes: PyWrites<'_>,
        allow_nonfinite: bool,
    ) -> PyResult<u64> {
        let slices = row_writes(py, &writes)?;
        let options = WriteOptions { allow_nonfinite };
        detach(py, || self.client.write_many(&slices, options))?.map_err(|e| err(py, e))
    }

    #[pyo3(signature = (name, rows, dim, dtype, init, seed))]
    #[allow(clippy::too_many_arguments)]
    fn create_table(
        &self,
        py: Python<'_>,
        name: &str,
        rows: u64,
        dim: u32,
        dtype: &str,
        init: &str,
        seed: u64,
    ) -> PyResult<u64> {
        let dtype: nearrec::format::DType = dtype.parse().map_err(|_| {
            raise(
                py,
                "InvalidRequest",
                format!("dtype {dtype:?} is not fp32, fp16, bf16 or int8"),
                Some(name),
                None,
            )
        })?;
        let init = match init {
            "uniform" => nearrec::Init::Uniform { seed },
            "zeros" => nearrec::Init::Zeros,
            other => {
                return Err(raise(
                    py,
                    "InvalidRequest",
                    format!("init {other:?} is not uniform or zeros"),
                    Some(name),
                    None,
                ));
            }
        };
        let table = NewTable {
            name,
            rows,
            dim,
            dtype,
            init,
        };
        detach(py, || self.client.create_table(&table))?.map_err(|e| err(py, e))
    }

    fn drop_table(&self, py: Python<'_>, name: &str) -> PyResult<u64> {
        detach(py, || self.client.drop_table(name))?.map_err(|e| err(py, e))
    }

    /// A store directory on the node's file system served from the next request on.
    #[pyo3(signature = (path, warm, force = false))]
    fn swap(&self, py: Python<'_>, path: &str, warm: bool, force: bool) -> PyResult<u64> {
        detach(py, || self.client.swap(path, warm, force))?.map_err(|e| err(py, e))
    }

    /// `(store, [(name, rows, dim, dtype)], version, tier, writable, model, stores)`.
    #[allow(clippy::type_complexity)]
    fn info(
        &self,
        py: Python<'_>,
    ) -> PyResult<(
        String,
        Vec<(String, u64, u32, String)>,
        u64,
        String,
        bool,
        bool,
        Vec<String>,
    )> {
        let i = detach(py, || self.client.info())?.map_err(|e| err(py, e))?;
        let tables = i
            .tables
            .into_iter()
            .map(|t| (t.name, t.rows, t.dim, t.dtype.name().to_owned()))
            .collect();
        Ok((
            i.name, tables, i.version, i.tier, i.writable, i.model, i.stores,
        ))
    }

    /// The store's counters by name, and its device.
    fn stats(&self, py: Python<'_>) -> PyResult<(Vec<(String, f64)>, String)> {
        let s = detach(py, || self.client.stats())?.map_err(|e| err(py, e))?;
        Ok((s.values, s.device))
    }
}

/// A lookup submitted to the node.
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativeRemotePending(Mutex<Option<Submitted>>);

#[pymethods]
impl NativeRemotePending {
    fn done(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|p| p.is_done())
    }

    /// The batch's output (or its error); `TimeoutError` when `timeout` seconds pass first. An
    /// answer is collected once.
    #[pyo3(signature = (timeout = None))]
    fn result<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let Some(pending) = self.0.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Err(raise(
                py,
                "InvalidRequest",
                "this lookup's result was already collected".into(),
                None,
                None,
            ));
        };
        let answer = match timeout {
            None => detach(py, || pending.wait())?,
            Some(t) => match detach(py, || {
                pending.wait_timeout(Duration::from_secs_f64(t.max(0.0)))
            })? {
                Ok(answer) => answer,
                Err(pending) => {
                    *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(pending);
                    return Err(pyo3::exceptions::PyTimeoutError::new_err(format!(
                        "the lookup did not finish within {t} s"
                    )));
                }
            },
        };
        let p = answer.map_err(|e| err(py, e))?;
        let width = p.width();
        array(py, p.values, p.batch, width)
    }
}
