//! Binding of an open store (the engine over its tables, wherever they are served from).

use std::path::PathBuf;

use nearrec_cache::{CacheConfig, PolicyParseError};
use std::sync::Arc;

use nearrec_device::FlashDevice;
use nearrec_engine::{Engine, EngineConfig, Tier, TierReport};
use nearrec_format::{DType, StoreReader};
use nearrec_io::MemDevice;
use nearrec_plan::Placement;
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::error::{detach, engine_err, format_err, raise};
use crate::lookup::TableArgs;
use crate::model::NativeModel;
use crate::progress;

/// Seconds per named part of a call.
type Seconds = Vec<(&'static str, f64)>;

/// An open store: the engine over its tables, in DRAM or on SSD behind DRAM tiers.
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativeStore {
    engine: Engine,
    /// The simulated drive the SSD tier reads through, when opened on one.
    flash: Option<Arc<FlashDevice<MemDevice>>>,
    path: PathBuf,
    manifest_json: String,
}

#[pymethods]
impl NativeStore {
    #[new]
    #[pyo3(signature = (path, threads = 0, verify_checksums = true, progress = false, tier = "auto", dram_budget_bytes = None, direct_io = true, io_queue_depth = 128, merge_gap_bytes = 0, dedup = true, merge = true, io_rings = 2, pread_threads = 16, cache_policy = "lfu_pa", admission_probability = 0.5, cache_ways = 16, placement_json = None, flash_json = None, verify_reads = true))]
    #[allow(clippy::too_many_arguments)] // mirrors nearrec.open's keyword arguments
    fn new(
        py: Python<'_>,
        path: PathBuf,
        threads: usize,
        verify_checksums: bool,
        progress: bool,
        tier: &str,
        dram_budget_bytes: Option<u64>,
        direct_io: bool,
        io_queue_depth: u32,
        merge_gap_bytes: u64,
        dedup: bool,
        merge: bool,
        io_rings: usize,
        pread_threads: usize,
        cache_policy: &str,
        admission_probability: f64,
        cache_ways: usize,
        placement_json: Option<&str>,
        flash_json: Option<&str>,
        verify_reads: bool,
    ) -> PyResult<Self> {
        let invalid = |msg: String| raise(py, "InvalidRequest", msg, None, None);
        let policy = cache_policy
            .parse()
            .map_err(|e: PolicyParseError| invalid(e.to_string()))?;
        let placement = placement_json
            .map(serde_json::from_str::<Placement>)
            .transpose()
            .map_err(|e| invalid(format!("placement: {e}")))?;
        let tier = match tier {
            "dram" => Tier::Dram,
            "ssd" => Tier::Ssd,
            "auto" => Tier::Auto,
            other => {
                return Err(raise(
                    py,
                    "InvalidRequest",
                    format!("tier must be 'auto', 'dram' or 'ssd', not {other:?}"),
                    None,
                    None,
                ));
            }
        };
        let config = EngineConfig {
            tier,
            dram_budget_bytes,
            direct_io,
            io_queue_depth,
            merge_gap_bytes,
            dedup,
            merge,
            io_rings,
            pread_threads,
            cache: CacheConfig {
                policy,
                admission_probability,
                ways: cache_ways,
                ..CacheConfig::default()
            },
            placement,
            verify_reads,
            ..EngineConfig::default()
        }
        .with_threads(threads)
        .with_verify_checksums(verify_checksums);
        let reader = detach(py, || StoreReader::open(&path))?.map_err(|e| format_err(py, e))?;
        let manifest_json = manifest_json(&reader);
        let total = reader.tables().iter().map(|t| t.data_bytes).sum();
        let bar = progress::bar(progress, total, "loading");
        let cb = progress::callback(&bar);
        let flash = match flash_json {
            None => None,
            Some(json) => {
                let cfg = crate::device::parse_device(py, json)?;
                let files = detach(py, || {
                    reader
                        .tables()
                        .iter()
                        .map(|t| {
                            let path = reader.path().join(&t.file);
                            nearrec_format::files::read_regular(
                                &path,
                                nearrec_format::files::IN_STORE,
                            )
                        })
                        .collect::<std::io::Result<Vec<_>>>()
                })?
                .map_err(|e| raise(py, "StoreIOError", e.to_string(), None, None))?;
                Some(Arc::new(FlashDevice::new(MemDevice::new(files, 512), cfg)))
            }
        };
        let engine = detach(py, || match &flash {
            None => Engine::from_reader(&reader, config, cb.as_ref()),
            Some(dev) => Engine::with_device(&reader, config, Box::new(dev.clone())),
        })?
        .map_err(|e| engine_err(py, e))?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        Ok(Self {
            engine,
            flash,
            path,
            manifest_json,
        })
    }

    /// What the simulated drive has done (JSON of `nearrec_device::FlashStats`), or None when the
    /// store is not on one.
    fn flash_stats(&self) -> Option<String> {
        let st = self.flash.as_ref()?.stats();
        serde_json::to_string(&st).ok()
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    #[getter]
    fn threads(&self) -> usize {
        self.engine.threads()
    }

    /// `"dram"` or `"ssd"`.
    #[getter]
    fn tier(&self) -> &'static str {
        self.engine.config().tier.name()
    }

    /// The SSD tier's counters and latency percentiles (µs), with the device's kind, whether
    /// reads are direct and its block size; `{}` for DRAM-resident stores.
    fn stats(&self) -> Vec<(String, PyStat)> {
        let (Some(stats), Some(dev)) = (self.engine.io_stats(), self.engine.device()) else {
            return Vec::new();
        };
        let mut out: Vec<(String, PyStat)> = vec![
            ("device".into(), PyStat::Text(dev.kind())),
            ("direct_io".into(), PyStat::Flag(dev.direct())),
            (
                "block_bytes".into(),
                PyStat::Number(dev.block_size() as f64),
            ),
        ];
        out.extend(
            stats
                .snapshot()
                .into_iter()
                .map(|(k, v)| (k, PyStat::Number(v))),
        );
        let reports = self.engine.tier_report();
        let sum = |f: fn(&TierReport) -> u64| reports.iter().map(f).sum::<u64>() as f64;
        let lookups = sum(|r| r.lookups_resident + r.lookups_hot + r.lookups_cache + r.lookups_ssd);
        let dram = sum(|r| r.lookups_resident + r.lookups_hot + r.lookups_cache);
        for (k, v) in [
            ("dram_tier_bytes", sum(|r| r.bytes)),
            ("lookups_resident", sum(|r| r.lookups_resident)),
            ("lookups_hot", sum(|r| r.lookups_hot)),
            ("lookups_cache", sum(|r| r.lookups_cache)),
            ("lookups_ssd", sum(|r| r.lookups_ssd)),
            (
                "dram_hit_ratio",
                if lookups > 0.0 { dram / lookups } else { 0.0 },
            ),
            ("cache_admissions", sum(|r| r.cache.admissions)),
            ("cache_rejections", sum(|r| r.cache.rejections)),
            ("cache_evictions", sum(|r| r.cache.evictions)),
            (
                "unprotected_tables",
                self.engine.unprotected_tables() as f64,
            ),
        ] {
            out.push((k.into(), PyStat::Number(v)));
        }
        out
    }

    /// Per table: what its DRAM tiers hold (`resident`, `hot_rows`, `cache_rows`, `bytes`) and
    /// the lookups each tier served, with the row cache's counters; `[]` for DRAM-resident stores.
    fn tier_report(&self) -> Vec<Vec<(&'static str, PyStat)>> {
        self.engine
            .tier_report()
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
            .collect()
    }

    /// The manifest as JSON (tables, creation parameters).
    #[getter]
    fn manifest_json(&self) -> &str {
        &self.manifest_json
    }

    /// Pools a batch: `tables` is a list of per-table argument tuples (see `nearrec.store`).
    /// Returns the `[batch, Σ dim]` float32 output. The GIL is released while pooling.
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        tables: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let args = TableArgs::extract_list(tables)?;
        let req = TableArgs::requests(py, &args)?;
        let prepared = self.engine.prepare(&req).map_err(|e| engine_err(py, e))?;
        let out = PyArray2::<f32>::zeros(py, [prepared.batch(), prepared.width()], false);
        {
            let mut rw = out.readwrite();
            let slice = rw.as_slice_mut().expect("new arrays are contiguous");
            detach(py, || self.engine.execute(&req, &prepared, slice))?
                .map_err(|e| engine_err(py, e))?;
        }
        Ok(out)
    }

    /// Runs `model` (whole-model offload) on one batch: `dense` is `[batch, dense_width]`
    /// float32 (`None` for models without dense features), `tables` one argument tuple per model
    /// input, in order. Returns the `[batch, outputs]` float32 output and the seconds spent per
    /// part (`total`, `embeddings`, `dense`, `blocks`, `finish`). The GIL is released meanwhile.
    fn infer<'py>(
        &self,
        py: Python<'py>,
        model: &NativeModel,
        dense: Option<PyReadonlyArray2<'py, f32>>,
        tables: &Bound<'py, PyList>,
    ) -> PyResult<(Bound<'py, PyArray2<f32>>, Seconds)> {
        let args = TableArgs::extract_list(tables)?;
        let req = TableArgs::requests(py, &args)?;
        let dense = match &dense {
            Some(d) => d.as_slice().map_err(|_| {
                raise(
                    py,
                    "InvalidRequest",
                    "dense features must be a contiguous float32 array".into(),
                    None,
                    None,
                )
            })?,
            None => &[],
        };
        let (out, times) = detach(py, || self.engine.infer(&model.model, dense, &req))?
            .map_err(|e| engine_err(py, e))?;
        let n = model.model.outputs();
        let batch = out.len() / n;
        let array = PyArray1::from_vec(py, out).reshape([batch, n])?;
        let times = vec![
            ("total", times.total.as_secs_f64()),
            ("embeddings", times.embeddings.as_secs_f64()),
            ("dense", times.dense.as_secs_f64()),
            ("blocks", times.blocks.as_secs_f64()),
            ("finish", times.finish.as_secs_f64()),
        ];
        Ok((array, times))
    }

    /// Decodes the given rows of a table to a `[n, dim]` float32 array.
    fn read_rows<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        rows: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let id = self.engine.table_id(name).map_err(|e| engine_err(py, e))?;
        let dim = self.engine.tables()[id].dim as usize;
        let rows = rows.as_slice().map_err(|_| {
            raise(
                py,
                "InvalidRequest",
                "rows must be contiguous".into(),
                Some(name),
                None,
            )
        })?;
        let out = PyArray2::<f32>::zeros(py, [rows.len(), dim], false);
        {
            let mut rw = out.readwrite();
            let slice = rw.as_slice_mut().expect("new arrays are contiguous");
            detach(py, || self.engine.read_rows(id, rows, slice))?
                .map_err(|e| engine_err(py, e))?;
        }
        Ok(out)
    }

    /// A zero-copy read-only `[rows, dim]` float32 view of a dense fp32 table (for peers and
    /// tests); other layouts raise.
    fn table_array<'py>(slf: Bound<'py, Self>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let id = this.engine.table_id(name).map_err(|e| engine_err(py, e))?;
        let meta = &this.engine.tables()[id];
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
        let Some(data) = this.engine.table_data(id) else {
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
        // SAFETY: the buffer is 4 KiB-aligned, dense fp32 rows are 4-byte values, and it lives as
        // long as `slf`, which the array keeps alive as its base object.
        let arr = unsafe {
            let view = numpy::ndarray::ArrayView2::from_shape_ptr(
                (meta.rows as usize, meta.dim as usize),
                data.as_ptr().cast::<f32>(),
            );
            debug_assert!(floats * 4 <= data.len());
            PyArray2::borrow_from_array(&view, slf.clone().into_any())
        };
        arr.readwrite().make_nonwriteable();
        Ok(arr.into_any())
    }
}

/// One value of `stats()`.
#[derive(IntoPyObject)]
pub(crate) enum PyStat {
    Text(&'static str),
    Owned(String),
    Flag(bool),
    Number(f64),
}

/// Checks every data byte of a store; returns `[(table, bytes, error or None)]`.
#[pyfunction]
#[pyo3(signature = (path, progress = false))]
pub(crate) fn verify_store(
    py: Python<'_>,
    path: PathBuf,
    progress: bool,
) -> PyResult<Vec<(String, u64, Option<String>)>> {
    let reader = StoreReader::open(&path).map_err(|e| format_err(py, e))?;
    let total = reader.tables().iter().map(|t| t.data_bytes).sum();
    let bar = progress::bar(progress, total, "verifying");
    let cb = progress::callback(&bar);
    let checks = detach(py, || reader.verify(cb.as_ref()))?;
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

/// Opens and validates a store's manifest and table headers; returns the manifest as JSON.
#[pyfunction]
pub(crate) fn read_manifest(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let reader = StoreReader::open(&path).map_err(|e| format_err(py, e))?;
    Ok(manifest_json(&reader))
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
