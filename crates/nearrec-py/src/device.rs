//! Binding of the flash device model: whole simulations and calibration (this disk's measured
//! random-read rate, and the model fitted to it), JSON in and out (the typed surface is
//! `nearrec.simulate`).

use std::path::PathBuf;

use nearrec_device::calibrate::{self, DiskPoint};
use nearrec_device::{DeviceConfig, DeviceError, SimSpec};
use pyo3::prelude::*;

use crate::error::{detach, io_err, raise};

pub(crate) fn device_err(py: Python<'_>, e: DeviceError) -> PyErr {
    let msg = e.to_string();
    match &e {
        DeviceError::Request { table, reason } if reason.contains("outside") => {
            let position = reason
                .split("position ")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .and_then(|s| s.parse().ok());
            raise(py, "IndexOutOfRange", msg, Some(table), position)
        }
        DeviceError::Request { table, .. } => raise(py, "InvalidRequest", msg, Some(table), None),
        _ => raise(py, "InvalidRequest", msg, None, None),
    }
}

fn json_err(py: Python<'_>, what: &str, e: serde_json::Error) -> PyErr {
    raise(py, "InvalidRequest", format!("{what}: {e}"), None, None)
}

/// Parses and checks a device configuration given as JSON.
pub(crate) fn parse_device(py: Python<'_>, json: &str) -> PyResult<DeviceConfig> {
    DeviceConfig::from_json(json).map_err(|e| device_err(py, e))
}

/// Runs one simulation (`nearrec_device::SimSpec` as JSON); returns its report as JSON.
#[pyfunction]
pub(crate) fn device_simulate(py: Python<'_>, spec_json: &str) -> PyResult<String> {
    let spec: SimSpec =
        serde_json::from_str(spec_json).map_err(|e| json_err(py, "simulation", e))?;
    spec.device.validate().map_err(|e| device_err(py, e))?;
    let report = detach(py, || nearrec_device::simulate(&spec))?.map_err(|e| device_err(py, e))?;
    serde_json::to_string(&report).map_err(|e| json_err(py, "report", e))
}

/// A shipped parameter set as JSON.
#[pyfunction]
pub(crate) fn device_preset(py: Python<'_>, name: &str) -> PyResult<String> {
    let cfg = DeviceConfig::preset(name).map_err(|e| device_err(py, e))?;
    serde_json::to_string(&cfg).map_err(|e| json_err(py, "device", e))
}

/// Fits `base` to measured points (`[{queue_depth, bytes, reads_per_s}]`); returns the fitted
/// configuration as JSON.
#[pyfunction]
pub(crate) fn device_fit(py: Python<'_>, base_json: &str, points_json: &str) -> PyResult<String> {
    let base = parse_device(py, base_json)?;
    let points: Vec<DiskPoint> =
        serde_json::from_str(points_json).map_err(|e| json_err(py, "points", e))?;
    let fitted = detach(py, || calibrate::fit(&base, &points))?;
    serde_json::to_string(&fitted).map_err(|e| json_err(py, "device", e))
}

/// The model's random-read rate at a queue depth and read size.
#[pyfunction]
pub(crate) fn device_read_rate(
    py: Python<'_>,
    device_json: &str,
    queue_depth: u32,
    bytes: u32,
) -> PyResult<f64> {
    let cfg = parse_device(py, device_json)?;
    detach(py, || {
        calibrate::predicted_rate(&cfg, queue_depth.max(1), bytes.max(1))
    })
}

/// This disk's measured random-read rate (reads/s): `reads` direct block reads over `paths` at
/// `queue_depth`, at blocks chosen by `seed` (`nearrec_io::measure_read_rate`). What
/// `nearrec.simulate.calibrate` fits the model to; `device_read_rate` is the model's answer.
#[pyfunction]
pub(crate) fn disk_read_rate(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    reads: usize,
    queue_depth: u32,
    seed: u64,
) -> PyResult<f64> {
    detach(py, || {
        nearrec_io::measure_read_rate(&paths, reads, queue_depth, seed)
    })?
    .map(|r| r.reads_per_s())
    .map_err(|e| io_err(py, e))
}
