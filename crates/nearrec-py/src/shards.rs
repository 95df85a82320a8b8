//! Binding of sharding (`nearrec.distributed`): a store's shard plan made and its shards cut
//! (`nearrec::shard`), the plan file read; plans cross as the JSON their file holds, so Python
//! reads them as the router does.

use std::path::{Path, PathBuf};

use nearrec::plan::shards::ShardPlan;
use nearrec::plan::{Scheme, ShardOptions};
use pyo3::prelude::*;

use crate::error::{detach, err, plan_error, run};

fn options(
    shards: usize,
    replicas: usize,
    scheme: &str,
    replicate_hot: u64,
) -> nearrec::Result<ShardOptions> {
    Ok(ShardOptions {
        shards,
        replicas,
        scheme: Scheme::parse(scheme)?,
        replicate_hot,
    })
}

/// The shard plan of the store at `store` (a trace file `trace` to balance by), as JSON.
#[pyfunction]
#[pyo3(signature = (store, shards, replicas, scheme, replicate_hot, trace = None))]
pub(crate) fn shard_plan(
    py: Python<'_>,
    store: PathBuf,
    shards: usize,
    replicas: usize,
    scheme: &str,
    replicate_hot: u64,
    trace: Option<PathBuf>,
) -> PyResult<String> {
    let options = options(shards, replicas, scheme, replicate_hot).map_err(|e| err(py, e))?;
    let plan = run(py, || {
        nearrec::shard::plan_store(&store, trace.as_deref(), &options)
    })?;
    Ok(plan.to_json())
}

/// Plans the shards of the store at `store` and cuts them under `out` (the store opened once);
/// the plan, as JSON.
#[pyfunction]
#[pyo3(signature = (store, out, overwrite, shards, replicas, scheme, replicate_hot, trace = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn shard_store(
    py: Python<'_>,
    store: PathBuf,
    out: PathBuf,
    overwrite: bool,
    shards: usize,
    replicas: usize,
    scheme: &str,
    replicate_hot: u64,
    trace: Option<PathBuf>,
) -> PyResult<String> {
    let options = options(shards, replicas, scheme, replicate_hot).map_err(|e| err(py, e))?;
    let plan = run(py, || {
        nearrec::shard::shard_store(&store, trace.as_deref(), &options, &out, overwrite)
    })?;
    Ok(plan.to_json())
}

/// Cuts the store at `store` into the shards of the plan `plan` (JSON) under `out`.
#[pyfunction]
pub(crate) fn shard_write(
    py: Python<'_>,
    store: PathBuf,
    plan: &str,
    out: PathBuf,
    overwrite: bool,
) -> PyResult<()> {
    let plan = ShardPlan::parse(plan.as_bytes(), Path::new("the plan given"))
        .map_err(|e| plan_error(py, e))?;
    run(py, || {
        nearrec::shard::cut_store(&store, &plan, &out, overwrite)
    })
}

/// Cuts the store at `store` by the plan of the sharded store at `dir` and publishes it as the
/// next version of every shard; returns the version.
#[pyfunction]
pub(crate) fn shard_publish(py: Python<'_>, store: PathBuf, dir: PathBuf) -> PyResult<u64> {
    run(py, || nearrec::shard::publish_cut(&store, &dir))
}

/// The plan in `dir` (`shards.json`), checked, as JSON.
#[pyfunction]
pub(crate) fn shard_plan_read(py: Python<'_>, dir: PathBuf) -> PyResult<String> {
    let plan = detach(py, || ShardPlan::read(&dir))?.map_err(|e| plan_error(py, e))?;
    Ok(plan.to_json())
}
