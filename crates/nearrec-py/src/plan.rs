//! Binding of the planner and the plan file (`nearrec-plan`): `nearrec.plan.make_plan` hands the
//! store's tables and the trace's ids over, and gets the plan back; plan files are read and
//! written only in Rust.

use std::path::PathBuf;

use nearrec_plan::{Plan, PlanTable, TraceTable, check_trace, load_plan, make_plan};
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::error::{detach, plan_error, raise};

/// A store table as the planner sees it: `(name, rows, row_bytes, data_bytes)`.
type StoreTable = (String, u64, u64, u64);
/// A trace table: `(name, rows, indices)`.
/// A trace's table as Python passes it: name, rows, ids, and whether the ids are keys.
type TraceArgs<'py> = (String, u64, PyReadonlyArray1<'py, i64>, bool);

/// One table's plan as Python reads it.
type TableTuple<'py> = (
    (String, u64, u64, u64, u64, u64, f64, &'static str),
    (bool, Bound<'py, PyArray1<u64>>, u64, f64, u64),
    (
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray1<f64>>,
    ),
);

/// A plan the planner made.
#[pyclass(module = "nearrec._native", frozen)]
pub(crate) struct NativePlan {
    plan: Plan,
}

#[pymethods]
impl NativePlan {
    #[getter]
    fn budget(&self) -> u64 {
        self.plan.budget
    }

    #[getter]
    fn bytes(&self) -> u64 {
        self.plan.bytes()
    }

    #[getter]
    fn expected_hit_ratio(&self) -> f64 {
        self.plan.expected_hit_ratio()
    }

    #[getter]
    fn trace(&self) -> &str {
        &self.plan.trace
    }

    #[getter]
    fn store(&self) -> &str {
        &self.plan.store
    }

    /// Per table: `((table, rows, row_bytes, table_bytes, lookups, working_set, locality,
    /// kind), (resident, hot_rows, cache_bytes, expected_hit_ratio, bytes), (curve bytes, hot,
    /// lru))`.
    fn tables<'py>(&self, py: Python<'py>) -> Vec<TableTuple<'py>> {
        self.plan
            .tables
            .iter()
            .map(|t| {
                (
                    (
                        t.table.clone(),
                        t.rows,
                        t.row_bytes,
                        t.table_bytes,
                        t.lookups,
                        t.working_set,
                        t.locality,
                        t.kind.name(),
                    ),
                    (
                        t.resident,
                        PyArray1::from_slice(py, &t.hot_rows),
                        t.cache_bytes,
                        t.expected_hit_ratio,
                        t.bytes(),
                    ),
                    (
                        PyArray1::from_slice(py, &t.curve.bytes),
                        PyArray1::from_slice(py, &t.curve.hot),
                        PyArray1::from_slice(py, &t.curve.lru),
                    ),
                )
            })
            .collect()
    }

    /// The per-table table, for people.
    fn text(&self) -> String {
        self.plan.text()
    }

    /// Writes the plan file (TOML, the hot rows in `<path>.hot.npz` beside it), atomically.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        detach(py, || self.plan.save(&path))?.map_err(|e| plan_error(py, e))
    }
}

fn tables(store: Vec<StoreTable>) -> Vec<PlanTable> {
    store
        .into_iter()
        .map(|(name, rows, row_bytes, data_bytes)| PlanTable {
            name,
            rows,
            row_bytes,
            data_bytes,
        })
        .collect()
}

fn slices<'a>(py: Python<'_>, trace: &'a [TraceArgs<'_>]) -> PyResult<Vec<TraceTable<'a>>> {
    trace
        .iter()
        .map(|(name, rows, ids, keys)| {
            Ok(TraceTable {
                name,
                rows: *rows,
                keys: *keys,
                indices: ids.as_slice().map_err(|_| {
                    raise(
                        py,
                        "InvalidRequest",
                        format!("trace table {name:?}: ids must be contiguous"),
                        Some(name),
                        None,
                    )
                })?,
            })
        })
        .collect()
}

/// Plans `budget` bytes of DRAM for the store's tables from the trace's (`nearrec_plan::make_plan`).
#[pyfunction]
#[pyo3(signature = (store, trace, budget, steps, trace_path = String::new(), store_path = String::new()))]
pub(crate) fn plan_make(
    py: Python<'_>,
    store: Vec<StoreTable>,
    trace: Vec<TraceArgs<'_>>,
    budget: u64,
    steps: u64,
    trace_path: String,
    store_path: String,
) -> PyResult<NativePlan> {
    let store = tables(store);
    let trace = slices(py, &trace)?;
    let mut plan =
        detach(py, || make_plan(&store, &trace, budget, steps))?.map_err(|e| plan_error(py, e))?;
    plan.trace = trace_path;
    plan.store = store_path;
    Ok(NativePlan { plan })
}

/// Checks a trace's tables against a store's (`nearrec_plan::check_trace`).
#[pyfunction]
pub(crate) fn plan_check_trace(
    py: Python<'_>,
    store: Vec<StoreTable>,
    trace: Vec<TraceArgs<'_>>,
) -> PyResult<()> {
    let store = tables(store);
    let trace = slices(py, &trace)?;
    detach(py, || check_trace(&store, &trace))?.map_err(|e| plan_error(py, e))
}

/// Reads a plan file: the placement it applies, as JSON (`nearrec_plan::load_plan`).
#[pyfunction]
pub(crate) fn plan_load(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let placement = detach(py, || load_plan(&path))?.map_err(|e| plan_error(py, e))?;
    Ok(serde_json::to_string(&placement).expect("a placement serialises"))
}
