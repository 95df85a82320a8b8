//! The nearrec storage node: stores served over gRPC (`nearrec.v1.Node`, `docs/protocol.md`),
//! next to the standard `grpc.health.v1.Health` service and server reflection, so that stock
//! tools (grpcurl, grpcio's health stub) work against it.
//!
//! A thin surface over the facade: `nearrec-wire` decodes each call into the facade's request,
//! [`admission`] bounds what waits and drops what expired before it reads the device,
//! [`service`] runs the call on a blocking thread and answers. [`serve`] runs a node until its
//! shutdown future resolves, then drains: it stops accepting, finishes what is in flight, and
//! returns.

pub mod admission;
pub mod config;
pub mod service;
pub mod stores;

use std::future::Future;
use std::sync::Arc;

use nearrec_wire::v1 as pb;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

pub use admission::Admission;
pub use config::NodeConfig;
pub use service::{NodeService, Shared};
pub use stores::Stores;

/// Serves `stores` on `listener` until `shutdown` resolves, then drains (at most
/// `config.drain_timeout`).
pub async fn serve(
    stores: Stores,
    config: NodeConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let shared = Arc::new(Shared {
        admission: Admission::new(config.max_in_flight, config.max_queued),
        stores,
        config: config.clone(),
    });
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::node_server::NodeServer<NodeService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let node = pb::node_server::NodeServer::new(NodeService(shared))
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
    let reporter = health.clone();
    let stop = async move {
        shutdown.await;
        tracing::info!("draining: no new connections; finishing the requests in flight");
        reporter
            .set_not_serving::<pb::node_server::NodeServer<NodeService>>()
            .await;
        let _ = drained_tx.send(());
    };
    let server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(node)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop);
    tokio::pin!(server);
    tokio::select! {
        done = &mut server => done?,
        _ = async {
            let _ = drained_rx.await;
            tokio::time::sleep(config.drain_timeout).await;
        } => tracing::warn!("drain timed out after {:?}; stopping", config.drain_timeout),
    }
    Ok(())
}

/// Runs a node until SIGTERM or SIGINT, then drains: the `nearrec-server` binary and
/// `nearrec serve`. `ready` gets the address once the node listens (port 0 picks a free one).
/// Refuses an address other than loopback unless `insecure` (a node reachable from other hosts
/// needs an ACL).
pub fn run(
    stores: Stores,
    config: NodeConfig,
    insecure: bool,
    ready: impl FnOnce(std::net::SocketAddr, &Stores),
) -> Result<(), String> {
    if !config.listen.ip().is_loopback() && !insecure {
        return Err(format!(
            "{} is not a loopback address: a node reachable from other hosts needs an ACL \
             (not yet supported) or --insecure",
            config.listen
        ));
    }
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| format!("cannot start the node's runtime: {e}"))?;
    runtime.block_on(async {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        ready(addr, &stores);
        let stop = stop_signal()?;
        serve(stores, config, listener, stop)
            .await
            .map_err(|e| e.to_string())
    })
}

/// SIGTERM or SIGINT, whichever comes first.
fn stop_signal() -> Result<impl Future<Output = ()> + Send, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
