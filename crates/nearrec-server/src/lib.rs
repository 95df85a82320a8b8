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
