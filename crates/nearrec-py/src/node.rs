//! `serve`: the storage node (`nearrec-server`) run by `nearrec serve`, in this process, until
//! SIGTERM or SIGINT; the GIL is released while it serves.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use nearrec_server::{NodeConfig, Stores, TlsFiles, listening, run};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::NativeConfig;
use crate::error::{detach, raise};

/// Serves the stores `specs` (`PATH` or `PATH=NAME`) opened with `config` on `listen`; prints
/// `listening on ADDR` once ready and returns after a drain.
#[pyfunction]
#[pyo3(signature = (specs, config, listen, insecure, max_in_flight, max_queued, max_message_bytes, drain_timeout, coalesce_bags, coalesce_window_us, acl = None, metrics_listen = None, tls = None, swap_root = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve(
    py: Python<'_>,
    specs: Vec<String>,
    config: &NativeConfig,
    listen: &str,
    insecure: bool,
    max_in_flight: usize,
    max_queued: usize,
    max_message_bytes: usize,
    drain_timeout: f64,
    coalesce_bags: usize,
    coalesce_window_us: u64,
    acl: Option<PathBuf>,
    metrics_listen: Option<&str>,
    tls: Option<(PathBuf, PathBuf, Option<PathBuf>)>,
    swap_root: Option<PathBuf>,
) -> PyResult<()> {
    let invalid = |m: String| raise(py, "InvalidRequest", m, None, None);
    let listen = listen
        .parse()
        .map_err(|e| invalid(format!("--listen {listen:?} is not HOST:PORT: {e}")))?;
    let metrics_listen = metrics_listen
        .map(|m| {
            m.parse()
                .map_err(|e| invalid(format!("--metrics-listen {m:?} is not HOST:PORT: {e}")))
        })
        .transpose()?;
    let store_config = config.config.clone();
    let node = NodeConfig {
        listen,
        max_in_flight: max_in_flight.max(1),
        max_queued,
        max_message_bytes,
        coalesce_bags,
        coalesce_window: Duration::from_micros(coalesce_window_us),
        drain_timeout: Duration::from_secs_f64(drain_timeout.max(0.0)),
        acl,
        metrics_listen,
        tls: tls.map(|(cert, key, client_ca)| TlsFiles {
            cert,
            key,
            client_ca,
        }),
        swap_root,
        ..NodeConfig::default()
    };
    detach(py, || {
        let stores = Stores::open(&specs, &store_config)?;
        run(stores, node, insecure, |listeners, stores| {
            println!("nearrec serve: {}", listening(listeners, stores));
            let _ = std::io::stdout().flush();
        })
    })?
    .map_err(|m| raise(py, "NearrecError", m, None, None))
}

/// The node's defaults (`NodeConfig::default()`), for `nearrec serve`'s flags.
#[pyfunction]
pub(crate) fn node_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = NodeConfig::default();
    let out = PyDict::new(py);
    out.set_item("max_in_flight", d.max_in_flight)?;
    out.set_item("max_queued", d.max_queued)?;
    out.set_item("max_message_bytes", d.max_message_bytes)?;
    out.set_item("drain_timeout", d.drain_timeout.as_secs_f64())?;
    out.set_item("coalesce_bags", d.coalesce_bags)?;
    out.set_item("coalesce_window_us", d.coalesce_window.as_micros() as u64)?;
    Ok(out)
}
