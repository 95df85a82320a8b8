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
#[pyo3(signature = (specs, config, listen, insecure, max_in_flight, max_queued, max_message_bytes, drain_timeout, coalesce_bags, coalesce_window_us, acl = None, metrics_listen = None, tls = None, swap_root = None, max_connections = None, handshake_timeout = None, idle_timeout = None, max_streams_per_connection = None, max_unsent_bytes = None, max_unsent_bytes_per_connection = None))]
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
    max_connections: Option<usize>,
    handshake_timeout: Option<f64>,
    idle_timeout: Option<f64>,
    max_streams_per_connection: Option<u32>,
    max_unsent_bytes: Option<usize>,
    max_unsent_bytes_per_connection: Option<usize>,
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
    let d = NodeConfig::default();
    let seconds = |s: Option<f64>, default: Duration, flag: &str| match s {
        None => Ok(default),
        Some(s) if s > 0.0 => Duration::try_from_secs_f64(s)
            .map_err(|e| invalid(format!("{flag} {s} is not a number of seconds: {e}"))),
        Some(s) => Err(invalid(format!(
            "{flag} is a positive number of seconds, not {s}"
        ))),
    };
    let handshake_timeout = seconds(
        handshake_timeout,
        d.handshake_timeout,
        "--handshake-timeout",
    )?;
    let idle_timeout = seconds(idle_timeout, d.idle_timeout, "--idle-timeout")?;
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
        max_connections: max_connections.unwrap_or(d.max_connections).max(1),
        handshake_timeout,
        idle_timeout,
        max_streams_per_connection: max_streams_per_connection
            .unwrap_or(d.max_streams_per_connection)
            .max(1),
        max_unsent_bytes: max_unsent_bytes.unwrap_or(d.max_unsent_bytes),
        max_unsent_bytes_per_connection: max_unsent_bytes_per_connection
            .unwrap_or(d.max_unsent_bytes_per_connection),
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
    out.set_item("max_connections", d.max_connections)?;
    out.set_item("handshake_timeout", d.handshake_timeout.as_secs_f64())?;
    out.set_item("idle_timeout", d.idle_timeout.as_secs_f64())?;
    out.set_item("max_streams_per_connection", d.max_streams_per_connection)?;
    out.set_item("max_unsent_bytes", d.max_unsent_bytes)?;
    out.set_item(
        "max_unsent_bytes_per_connection",
        d.max_unsent_bytes_per_connection,
    )?;
    Ok(out)
}
