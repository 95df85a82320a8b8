//! Traces: generation, the trace file and stack-distance profiles (`nearrec-plan`).

use std::path::PathBuf;

use nearrec_plan::{
    Colocation, PlanError, Profile, TableData, TableSpec, TraceFile, colocate, table_seed,
    write_trace,
};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::error::{check_non_negative, detach, raise};

pub(crate) fn plan_err(py: Python<'_>, e: PlanError) -> PyErr {
    crate::error::plan_error(py, e)
}

fn spec(py: Python<'_>, json: &str) -> PyResult<TableSpec> {
    serde_json::from_str(json)
        .map_err(|e| raise(py, "InvalidRequest", format!("table spec: {e}"), None, None))
}

type Csr<'py> = (
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Option<f64>,
);

/// Generates table `table` (its position in the trace, which picks its seed) of a trace seeded
/// with `seed`: `(offsets, indices, first_reference_share)`.
#[pyfunction]
pub(crate) fn trace_generate_table<'py>(
    py: Python<'py>,
    spec_json: &str,
    bags: u64,
    seed: u64,
    table: usize,
) -> PyResult<Csr<'py>> {
    let spec = spec(py, spec_json)?;
    let t = detach(py, || spec.generate(bags, table_seed(seed, table)))?
        .map_err(|e| plan_err(py, e))?;
    Ok((
        PyArray1::from_vec(py, t.offsets),
        PyArray1::from_vec(py, t.indices),
        t.first_reference_share,
    ))
}

/// Writes a trace file from `(entry_json, offsets, indices)` per table, where the entry gives
/// name, rows, pooling, generator, first_reference_share and keys (the indices are keys). Returns the header as JSON.
#[pyfunction]
pub(crate) fn trace_write(
    py: Python<'_>,
    path: PathBuf,
    batch_size: u32,
    seed: u64,
    tables: Vec<(String, PyReadonlyArray1<'_, i64>, PyReadonlyArray1<'_, i64>)>,
    overwrite: bool,
) -> PyResult<String> {
    #[derive(serde::Deserialize)]
    struct Entry {
        name: String,
        rows: u64,
        pooling: u32,
        generator: Option<nearrec_plan::Generator>,
        first_reference_share: Option<f64>,
        #[serde(default)]
        keys: bool,
    }
    let entries = tables
        .iter()
        .map(|(json, _, _)| {
            serde_json::from_str::<Entry>(json).map_err(|e| {
                raise(
                    py,
                    "InvalidRequest",
                    format!("table entry: {e}"),
                    None,
                    None,
                )
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let slices = tables
        .iter()
        .map(|(_, o, i)| Ok((o.as_slice()?, i.as_slice()?)))
        .collect::<PyResult<Vec<_>>>()?;
    let data: Vec<TableData<'_>> = entries
        .iter()
        .zip(&slices)
        .map(|(e, &(offsets, indices))| TableData {
            name: &e.name,
            rows: e.rows,
            pooling: e.pooling,
            generator: e.generator.clone(),
            first_reference_share: e.first_reference_share,
            keys: e.keys,
            offsets,
            indices,
        })
        .collect();
    let header = detach(py, || {
        write_trace(&path, batch_size, seed, &data, overwrite)
    })?
    .map_err(|e| plan_err(py, e))?;
    Ok(serde_json::to_string(&header).expect("serialisable"))
}

/// Reads and validates a trace file: `(header JSON, verified, the file's bytes)`, the arrays at
/// the header's offsets in the bytes. With `mapped`, the file is validated through a memory map
/// and no bytes are returned (Python maps the arrays itself).
#[pyfunction]
#[pyo3(signature = (path, mapped = false))]
pub(crate) fn trace_open<'py>(
    py: Python<'py>,
    path: PathBuf,
    mapped: bool,
) -> PyResult<(String, bool, Option<Bound<'py, pyo3::types::PyBytes>>)> {
    let file = detach(py, || {
        if mapped {
            TraceFile::map(&path)
        } else {
            TraceFile::open(&path)
        }
    })?
    .map_err(|e| plan_err(py, e))?;
    let header = serde_json::to_string(file.header()).expect("serialisable");
    let bytes = (!mapped).then(|| pyo3::types::PyBytes::new(py, file.bytes()));
    Ok((header, file.verified(), bytes))
}

type ProfileArrays<'py> = (
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u64>>,
);

/// The stack-distance profile of `indices`: `(unique ids in first-use order, distances, counts)`.
#[pyfunction]
pub(crate) fn trace_profile<'py>(
    py: Python<'py>,
    indices: PyReadonlyArray1<'py, i64>,
) -> PyResult<ProfileArrays<'py>> {
    let ids = indices.as_slice()?;
    check_non_negative(py, ids)?;
    let p = detach(py, || Profile::of(ids.iter().map(|&i| i as u64)))?;
    Ok((
        PyArray1::from_vec(py, p.unique),
        PyArray1::from_vec(py, p.distances),
        PyArray1::from_vec(py, p.counts),
    ))
}

/// The rows of table `table` (`rows` rows) in the slot order co-location `how` derives from the
/// trace `indices`: entry `s` is the row to store at slot `s`.
#[pyfunction]
pub(crate) fn colocation_order<'py>(
    py: Python<'py>,
    table: &str,
    rows: u64,
    indices: PyReadonlyArray1<'py, i64>,
    how: &str,
) -> PyResult<Bound<'py, PyArray1<u32>>> {
    let how: Colocation = how
        .parse()
        .map_err(|e: String| raise(py, "InvalidRequest", e, Some(table), None))?;
    let ids = indices.as_slice()?;
    let order = detach(py, || colocate(table, rows, ids, how))?.map_err(|e| plan_err(py, e))?;
    Ok(PyArray1::from_vec(py, order))
}
