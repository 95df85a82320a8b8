//! `NativeStore`'s verbs, each through the contract: tables, lookups, inference, writes,
//! versions and swaps, stats.

use super::*;

#[pymethods]
impl NativeStore {
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
        run(py, || {
            self.api
                .able(self.api.schema(), "create_table")?
                .create_table(&table)
        })
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
        let done = run(py, || {
            self.api
                .able(self.api.writes(), "sync_table")?
                .sync_table(table, values, tolerance)
        })?;
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
        run(py, || {
            self.api
                .able(self.api.versions(), "swap")?
                .swap(&to, warm, force)
        })
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
        run(py, || {
            self.api
                .able(self.api.inference(), "update_model")?
                .update_model(&tensors)
        })
    }

    /// Drops a table (EMB_REMOVE of a table).
    fn drop_table(&self, py: Python<'_>, name: &str) -> PyResult<u64> {
        run(py, || {
            self.api
                .able(self.api.schema(), "drop_table")?
                .drop_table(name)
        })
    }

    /// The config the store was opened with, as TOML.
    fn config_toml(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.local(py, "config")?.config().to_toml())
    }

    /// Pools a batch (a list of `TableLookup`): the `[batch, Σ dim]` float32 output, each value
    /// as `out_dtype` (a name; None: fp32) gives it back. With `sub_batch`, the bags flow
    /// through in sub-batches of that many, two at a time (an embedded store's).
    #[pyo3(signature = (lookups, sub_batch = None, out_dtype = None))]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        lookups: &Bound<'py, PyAny>,
        sub_batch: Option<usize>,
        out_dtype: Option<&str>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let held = HeldBatch::extract(lookups)?.with_out(crate::convert::out_dtype(py, out_dtype)?);
        let batch = held.as_batch();
        if let Some(sub) = sub_batch {
            let store = self.local(py, "lookup_many(sub_batch=)")?;
            let pooled = run(py, || store.lookup_split(&batch, sub))?;
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
        let (rows, version) = run(py, || self.api.lookup_rows(&held.as_batch()))?;
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

    /// Starts a lookup in the background, answered in `out_dtype`; returns its handle at once.
    #[pyo3(signature = (lookups, out_dtype = None))]
    fn submit(
        &self,
        py: Python<'_>,
        lookups: &Bound<'_, PyAny>,
        out_dtype: Option<&str>,
    ) -> PyResult<NativePending> {
        let held = HeldBatch::extract(lookups)?.with_out(crate::convert::out_dtype(py, out_dtype)?);
        let pending = self.api.submit(Box::new(held)).map_err(|e| err(py, e))?;
        Ok(NativePending::new(pending))
    }

    /// The results of `batches` (an iterable of lists of `TableLookup`) in order, `depth` of them
    /// in flight, answered in `out_dtype`.
    #[pyo3(signature = (batches, depth, out_dtype = None))]
    fn stream(
        &self,
        batches: &Bound<'_, PyAny>,
        depth: usize,
        out_dtype: Option<&str>,
    ) -> PyResult<NativeStream> {
        Ok(NativeStream {
            store: self.api.clone(),
            out: crate::convert::out_dtype(batches.py(), out_dtype)?,
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

    /// The model kept with the store, read and checked, not built: its configuration as JSON
    /// (its `tables` named) and its dense weights, from any store that keeps one (a node's and
    /// a sharded store's through the `Model` verb).
    fn saved_model<'py>(&self, py: Python<'py>) -> PyResult<crate::model::SavedPy<'py>> {
        let saved = run(py, || {
            (self.api)
                .able(self.api.inference(), "saved_model")?
                .saved_model()
        })?;
        crate::model::saved_to_py(py, &saved)
    }

    /// The model kept with the store: its name, its inputs' names (features, or tables) and the
    /// table each input reads, in input order.
    #[allow(clippy::type_complexity)]
    fn model_inputs(&self, py: Python<'_>) -> PyResult<(String, Vec<String>, Vec<String>)> {
        let store = self.local(py, "model_inputs")?;
        let model = run(py, || store.model())?;
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
        run(py, || {
            self.api
                .able(self.api.writes(), "write")?
                .write_many(&slices, options)
        })
    }

    /// The newest version the store's writer has logged, served from now on.
    fn refresh(&self, py: Python<'_>) -> PyResult<u64> {
        run(py, || self.api.refresh())
    }

    /// Folds the deltas into new table files: (version, tables, rows, bytes, seconds).
    fn compact(&self, py: Python<'_>) -> PyResult<(u64, usize, u64, u64, f64)> {
        let c = run(py, || {
            self.api.able(self.api.writes(), "compact")?.compact()
        })?;
        Ok((c.version, c.tables, c.rows, c.bytes, c.seconds))
    }

    /// Each delta feed the store has applied, with the last file it applied: (name, sequence,
    /// step, wall_time_ms, applied_ms, rows).
    #[allow(clippy::type_complexity)]
    fn feed_status(
        &self,
        py: Python<'_>,
    ) -> PyResult<Vec<(String, u64, Option<u64>, Option<u64>, u64, u64)>> {
        let feeds = run(py, || {
            self.api
                .able(self.api.writes(), "feed_status")?
                .feed_status()
        })?;
        Ok(feeds
            .into_iter()
            .map(|(name, c)| {
                (
                    name,
                    c.sequence,
                    c.step,
                    c.wall_time_ms,
                    c.applied_ms,
                    c.rows,
                )
            })
            .collect())
    }

    /// Applies the deltas of directory `dir` (of `format`: `nearrec::feed::dir_source`) after
    /// the store's cursor of feed `name` (from sequence `start` when the store holds none), in
    /// order, each once (`nearrec::feed`), in calls of at most `part_bytes` (None: the
    /// feeder's default): per file (sequence, rows, calls, version, applied, lag in seconds or
    /// None).
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    #[pyo3(signature = (dir, name, start=None, allow_nonfinite=false, part_bytes=None,
                        format="nearrec", prefix=None, tables=None))]
    fn feed_dir(
        &self,
        py: Python<'_>,
        dir: std::path::PathBuf,
        name: String,
        start: Option<u64>,
        allow_nonfinite: bool,
        part_bytes: Option<usize>,
        format: &str,
        prefix: Option<String>,
        tables: Option<std::collections::BTreeMap<String, String>>,
    ) -> PyResult<Vec<(u64, u64, usize, u64, bool, Option<f64>)>> {
        let defaults = nearrec::feed::FeedOptions::default();
        let options = nearrec::feed::FeedOptions {
            name,
            from: start,
            write: nearrec::WriteOptions { allow_nonfinite },
            part_bytes: part_bytes.unwrap_or(defaults.part_bytes),
        };
        let done = run(py, || {
            let source = nearrec::feed::dir_source(
                dir,
                format,
                prefix.as_deref(),
                tables.unwrap_or_default(),
            )?;
            nearrec::feed::Feeder::new(&*self.api, source, options)?.apply_pending(&mut |_| {})
        })?;
        Ok(done
            .iter()
            .map(|a| {
                let lag = a.lag.map(|l| l.as_secs_f64());
                (a.sequence, a.rows, a.calls, a.version, a.applied, lag)
            })
            .collect())
    }

    fn version(&self, py: Python<'_>) -> PyResult<u64> {
        run(py, || self.api.version())
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

    /// One scrub pass where the store's data lies (a node's: on the node's disk; a sharded
    /// store's: every replica's, each check naming its node): `[(table, bytes, error or None)]`.
    fn scrub(&self, py: Python<'_>, rate: u64) -> PyResult<Vec<(String, u64, Option<String>)>> {
        let checks = run(py, || self.api.scrub(rate))?;
        Ok(checks
            .into_iter()
            .map(|c| (c.table, c.bytes, c.error))
            .collect())
    }

    /// Every counter: the device's kind (`dram` for a DRAM-resident store), whether reads are
    /// direct and its block size, the SSD tier's counters and latency percentiles (µs), the
    /// DRAM tiers' totals and the live store's counters.
    fn stats(&self, py: Python<'_>) -> PyResult<Vec<(String, PyStat)>> {
        let stats = run(py, || self.api.stats())?;
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
        let report = run(py, || self.api.tier_report())?;
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
        let dim = run(py, || self.api.table(name))?.dim as usize;
        let rows = i64_vector(py, rows, name, "rows")?.readonly();
        let rows = rows.as_slice().map_err(|_| contiguous(py, "rows", name))?;
        let out = PyArray2::<f32>::zeros(py, [rows.len(), dim], false);
        {
            let mut rw = out.readwrite();
            let slice = rw.as_slice_mut().expect("new arrays are contiguous");
            run(py, || self.api.read_rows(name, rows, slice))?;
        }
        Ok(out)
    }

    /// The row each of keyed table `name`'s `keys` holds now, −1 where it holds none (an
    /// embedded store's; nothing sighted or counted).
    fn key_rows<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let store = self.local(py, "key_rows")?;
        let keys = i64_vector(py, keys, name, "keys")?.readonly();
        let keys = keys.as_slice().map_err(|_| contiguous(py, "keys", name))?;
        let keys: Vec<u64> = keys.iter().map(|&k| k as u64).collect();
        let rows = run(py, || store.key_rows(name, &keys))?;
        Ok(PyArray1::from_vec(
            py,
            rows.into_iter().map(|r| r.map_or(-1, i64::from)).collect(),
        ))
    }

    /// Lets go of the writer lock or the connection now; later calls fail.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        run(py, || self.api.close())
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
            Ok(nearrec::RowWrite {
                table,
                ids,
                values: values.map(nearrec::RowValues::F32),
            })
        })
        .collect()
}

/// One value of `stats()`.
#[derive(IntoPyObject)]
pub(crate) enum PyStat {
    Owned(String),
    Flag(bool),
    Number(f64),
}
