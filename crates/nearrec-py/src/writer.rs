//! Binding of the streaming store writer. Python feeds rows chunk by chunk (from `.npy` memory
//! maps or tensors) or asks for seeded random rows; memory stays bounded either way. Also the
//! co-located copy of a store (rows re-ordered in their files).

use std::path::PathBuf;
use std::sync::Mutex;

use indicatif::ProgressBar;
use nearrec_format::{
    DType, RowOrder, StoreOptions, StoreReader, StoreWriter, TableSpec, TableWriter, UniformInit,
    copy_ordered,
};
use numpy::{PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::error::{detach, format_err, raise};
use crate::progress;

struct State {
    store: Option<StoreWriter>,
    table: Option<TableWriter>,
    bar: Option<ProgressBar>,
}

/// The free-form creation parameters a manifest records, from JSON.
fn params(py: Python<'_>, json: &str) -> PyResult<serde_json::Value> {
    serde_json::from_str(json).map_err(|e| {
        raise(
            py,
            "InvalidRequest",
            format!("params are not valid JSON: {e}"),
            None,
            None,
        )
    })
}

/// Writes a store into a hidden temporary directory; `commit` makes it visible atomically and a
/// writer dropped without `commit` leaves nothing behind.
#[pyclass(module = "nearrec._native")]
pub(crate) struct NativeStoreWriter {
    state: Mutex<State>,
}

fn dtype(py: Python<'_>, s: &str) -> PyResult<DType> {
    s.parse::<DType>().map_err(|e| format_err(py, e))
}

impl NativeStoreWriter {
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut State) -> PyResult<R>) -> PyResult<R> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.store.is_none() {
            return Err(raise(
                py,
                "InvalidRequest",
                "store writer is already committed or aborted".into(),
                None,
                None,
            ));
        }
        f(&mut st)
    }

    fn table<'a>(py: Python<'_>, st: &'a mut State) -> PyResult<&'a mut TableWriter> {
        st.table.as_mut().ok_or_else(|| {
            raise(
                py,
                "InvalidRequest",
                "no table is being written; call begin_table first".into(),
                None,
                None,
            )
        })
    }
}

/// The rows of `array`, a C-contiguous 2-D array given to table `name`, which must have
/// `width` columns (`wrong(name, columns)` says so when it has not).
fn rows_of<'a, T: numpy::Element>(
    py: Python<'_>,
    name: &str,
    array: &'a PyReadonlyArray2<'_, T>,
    width: u64,
    wrong: impl FnOnce(&str, usize) -> String,
) -> PyResult<&'a [T]> {
    let invalid = |reason: String| raise(py, "InvalidRequest", reason, Some(name), None);
    let [_, cols] = array.shape() else {
        unreachable!("2-D")
    };
    if *cols as u64 != width {
        return Err(invalid(wrong(name, *cols)));
    }
    array
        .as_slice()
        .map_err(|_| invalid("rows must be C-contiguous".into()))
}

#[pymethods]
impl NativeStoreWriter {
    #[new]
    #[pyo3(signature = (path, overwrite = false, params_json = "null", total_bytes = 0, progress = false))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        overwrite: bool,
        params_json: &str,
        total_bytes: u64,
        progress: bool,
    ) -> PyResult<Self> {
        let params = params(py, params_json)?;
        let bar = progress::bar(progress, total_bytes, "building");
        let mut store = StoreWriter::create(&path, StoreOptions { overwrite, params })
            .map_err(|e| format_err(py, e))?;
        if let Some(cb) = progress::callback(&bar) {
            store = store.with_progress(cb);
        }
        Ok(Self {
            state: Mutex::new(State {
                store: Some(store),
                table: None,
                bar,
            }),
        })
    }

    /// Starts a table of `rows` rows of `dim` values stored as `dtype`; a keyed one (`spare`
    /// given: rows of zeros after its keys', room for new keys of a live store; `default_row`:
    /// its row 0, what unknown keys pool as under the `default` policy, else zeros) is
    /// finished with its keys, one per row.
    #[pyo3(signature = (name, rows, dim, dtype_name = "fp32", block_bytes = 4096, spare = None,
                        default_row = None))]
    #[allow(clippy::too_many_arguments)]
    fn begin_table(
        &self,
        py: Python<'_>,
        name: String,
        rows: u64,
        dim: u32,
        dtype_name: &str,
        block_bytes: u32,
        spare: Option<u64>,
        default_row: Option<PyReadonlyArray1<'_, f32>>,
    ) -> PyResult<()> {
        let default_row = default_row
            .map(|d| d.as_slice().map(<[f32]>::to_vec))
            .transpose()
            .map_err(|e| raise(py, "InvalidRequest", e.to_string(), Some(&name), None))?;
        let dtype = dtype(py, dtype_name)?;
        self.with(py, |st| {
            if st.table.is_some() {
                return Err(raise(
                    py,
                    "InvalidRequest",
                    "finish the current table first".into(),
                    Some(&name),
                    None,
                ));
            }
            let spec = TableSpec {
                name,
                rows,
                dim,
                dtype,
                block_bytes,
            };
            let store = st.store.as_mut().expect("checked in with()");
            let table = if let Some(spare) = spare {
                store.keyed_table_with_default(spec, spare, default_row.as_deref())
            } else {
                store.table(spec)
            };
            st.table = Some(table.map_err(|e| format_err(py, e))?);
            Ok(())
        })
    }

    /// Appends rows from a C-contiguous `[n, dim]` float32 array (encoded to the table's dtype).
    fn write_f32(&self, py: Python<'_>, values: PyReadonlyArray2<'_, f32>) -> PyResult<()> {
        self.with(py, |st| {
            let t = Self::table(py, st)?;
            let dim = t.spec().dim;
            let rows = rows_of(py, &t.spec().name, &values, u64::from(dim), |name, cols| {
                format!("table {name:?}: rows have {cols} columns, the table's dim is {dim}")
            })?;
            detach(py, || t.write_f32(rows))?.map_err(|e| format_err(py, e))
        })
    }

    /// Appends rows already encoded in the table's dtype, from a C-contiguous `[n, row_bytes]`
    /// uint8 array (a quantised model's bytes, taken as they are).
    fn write_encoded(&self, py: Python<'_>, rows: PyReadonlyArray2<'_, u8>) -> PyResult<()> {
        self.with(py, |st| {
            let t = Self::table(py, st)?;
            let (dtype, dim) = (t.spec().dtype, t.spec().dim);
            let rb = dtype.row_bytes(dim);
            let rows = rows_of(py, &t.spec().name, &rows, rb, |name, cols| {
                format!(
                    "table {name:?}: encoded rows have {cols} bytes, a {dtype} row of dim {dim} \
                     has {rb}"
                )
            })?;
            detach(py, || t.write_encoded(rows))?.map_err(|e| format_err(py, e))
        })
    }

    /// Fills the rest of the current table with seeded U(−√(1/rows), √(1/rows)) values.
    fn write_random(&self, py: Python<'_>, seed: u64, table_index: u64) -> PyResult<()> {
        self.with(py, |st| {
            let t = Self::table(py, st)?;
            let init = UniformInit::new(seed, table_index, t.spec().rows);
            let left = t.spec().rows - t.rows_written();
            detach(py, || t.write_with(left, |row, out| init.fill(row, out)))?
                .map_err(|e| format_err(py, e))
        })
    }

    /// Seals the current table: all its rows must have been written; a keyed table's `keys`
    /// (int64 bits, one per row, distinct) are given here.
    #[pyo3(signature = (keys = None))]
    fn finish_table(
        &self,
        py: Python<'_>,
        keys: Option<PyReadonlyArray1<'_, i64>>,
    ) -> PyResult<()> {
        self.with(py, |st| {
            let t = st.table.take().ok_or_else(|| {
                raise(
                    py,
                    "InvalidRequest",
                    "no table to finish".into(),
                    None,
                    None,
                )
            })?;
            let store = st.store.as_mut().expect("checked in with()");
            let keys: Option<Vec<u64>> =
                keys.map(|k| k.as_array().iter().map(|&k| k as u64).collect());
            detach(py, || match &keys {
                Some(keys) => store.finish_table_keyed(t, keys),
                None => store.finish_table(t),
            })?
            .map_err(|e| format_err(py, e))
        })
    }

    /// Writes the manifest and publishes the store; returns the manifest as JSON.
    fn commit(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |st| {
            if let Some(t) = &st.table {
                let name = t.spec().name.clone();
                return Err(raise(
                    py,
                    "InvalidRequest",
                    format!("table {name:?} was not finished"),
                    Some(&name),
                    None,
                ));
            }
            let store = st.store.take().expect("checked in with()");
            let manifest = detach(py, || store.commit())?.map_err(|e| format_err(py, e))?;
            if let Some(bar) = st.bar.take() {
                bar.finish_and_clear();
            }
            Ok(serde_json::to_string(&manifest).expect("manifest serialises"))
        })
    }

    /// Discards everything written; the target is left as it was.
    fn abort(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.table = None;
        st.store = None;
        if let Some(bar) = st.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// `(row_bytes, data_bytes, rows_per_block, padding_ratio)` of a table of this shape (a
/// shape it cannot have is refused naming table `name`).
#[pyfunction]
#[pyo3(signature = (rows, dim, dtype_name = "fp32", block_bytes = 4096, name = "-"))]
pub(crate) fn table_layout(
    py: Python<'_>,
    rows: u64,
    dim: u32,
    dtype_name: &str,
    block_bytes: u32,
    name: &str,
) -> PyResult<(u64, u64, u64, f64)> {
    let spec = TableSpec {
        name: name.into(),
        rows,
        dim,
        dtype: dtype(py, dtype_name)?,
        block_bytes,
    };
    spec.validate().map_err(|e| format_err(py, e))?;
    let l = spec.layout();
    Ok((
        l.row_bytes,
        l.data_bytes(),
        l.rows_per_span(),
        l.padding_ratio(),
    ))
}

/// Copies the store at `src` to `dst` with table `i`'s rows stored in the order `orders[i]` gives
/// (the row at each slot; `None`: as in the source). Returns the new manifest as JSON.
#[pyfunction]
#[pyo3(signature = (src, dst, orders, overwrite = false, params_json = "null", progress = false))]
pub(crate) fn copy_store_ordered(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    orders: Vec<Option<PyReadonlyArray1<'_, u32>>>,
    overwrite: bool,
    params_json: &str,
    progress: bool,
) -> PyResult<String> {
    let reader = StoreReader::open(&src).map_err(|e| format_err(py, e))?;
    let params = params(py, params_json)?;
    let orders = orders
        .iter()
        .zip(reader.tables())
        .map(|(o, meta)| {
            o.as_ref()
                .map(|a| {
                    RowOrder::from_rows_by_slot(a.as_slice()?).map_err(|reason| {
                        raise(
                            py,
                            "InvalidRequest",
                            format!("table {:?} row order: {reason}", meta.name),
                            Some(&meta.name),
                            None,
                        )
                    })
                })
                .transpose()
        })
        .collect::<PyResult<Vec<_>>>()?;
    if orders.len() != reader.tables().len() {
        return Err(raise(
            py,
            "InvalidRequest",
            format!(
                "{} row orders for {} tables",
                orders.len(),
                reader.tables().len()
            ),
            None,
            None,
        ));
    }
    let total = reader.tables().iter().map(|t| t.data_bytes).sum();
    let bar = progress::bar(progress, total, "co-locating");
    let manifest = detach(py, || {
        copy_ordered(
            &reader,
            &dst,
            &orders,
            StoreOptions { overwrite, params },
            progress::callback(&bar),
        )
    })?
    .map_err(|e| format_err(py, e))?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(serde_json::to_string(&manifest).expect("manifest serialises"))
}
