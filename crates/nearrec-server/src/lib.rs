//! The nearrec storage node: stores served over gRPC (`nearrec.v1.Node`, `docs/protocol.md`),
//! and as models over the Open Inference Protocol (`inference.GRPCInferenceService`, which
//! Triton's and KServe's clients speak), next to the standard `grpc.health.v1.Health` service
//! and server reflection, so that stock tools (grpcurl, grpcio's health stub) work against it.
//!
//! A thin surface over the store's contract: `nearrec-wire` decodes each call into the facade's
//! request, [`admission`] bounds what waits and drops what expired before it reads the device,
//! [`service`] runs the call on the store's `Arc<dyn nearrec::StoreApi>` — an embedded store,
//! or any other implementation — and answers. [`serve`] runs a node until its shutdown future
//! resolves, then drains: it stops accepting, finishes what is in flight, and returns; [`run`]
//! is that until SIGTERM or SIGINT, for the `nearrec-server` binary (`main.rs`) and Python's
//! `nearrec serve` alike.
//!
//! Modules:
//! - [`config`]: [`NodeConfig`], the node's one config object (serde, TOML, unknown keys refused,
//!   `validate()`, its stores' `[store]` config inside), and [`FLAGS`], the one list both
//!   commands build their flags from, each an override of the file; `TlsFiles`;
//! - [`stores`]: the stores a node serves by name, any implementation of the contract; a store
//!   the caller holds no grant on is one the node does not serve; `inline`, whether a lookup runs
//!   on the async worker (never waiting on a device) or on a blocking thread;
//! - [`service`]: `nearrec.v1.Node` and `inference.GRPCInferenceService` — each call's row of
//!   the table of verbs (`nearrec_wire::verbs`: its grant, audit, admission, limits) applied
//!   once around its handler, which decodes, runs and answers; a lookup stream runs up to 4 requests at once
//!   and answers in order;
//! - [`admission`]: at most `max_in_flight` engine calls and `max_queued` waiting, refused past
//!   that (`RESOURCE_EXHAUSTED`); the client's `grpc-timeout` as a deadline checked before the
//!   engine; each answer's bytes reserved from its connection's and the node's budgets;
//! - [`fair`]: the engine slots and the CPU turns of large DRAM-resident work handed out in
//!   start-time fair order between principals, by each request's cost over its ACL weight;
//! - [`coalesce`]: per store, concurrent small pooled lookups that read a device run as one
//!   engine batch (`nearrec::coalesce`), each keeping its queue place, deadline and error;
//! - [`conns`]: connections bounded — the descriptor limit raised and a cap under it, deadlines
//!   for the HTTP/2 preface and for silence, accept errors backed off, each connection's budget
//!   of unsent bytes;
//! - [`limits`]: what one request may carry (tables, bags, indices), one principal may hold
//!   (calls open, connections) and one slow client may take (a unary request due whole within
//!   `request_timeout`);
//! - [`send`]: a layer timing each unary answer until its last frame is written (the `send`
//!   stage), holding its queue place and reserved bytes until then;
//! - [`acl`]: bearer tokens → principals through an ACL file of token hashes, `read` / `write` /
//!   `admin` grants on `STORE/TABLE` patterns, reloaded whole on SIGHUP;
//! - [`audit`]: the audit log, a JSON line for every call that changes what the node serves and
//!   every refused token or grant (`--audit-log`; `--audit-required` refuses a change whose line
//!   cannot be written);
//! - [`swap`]: where a `Swap` may take a store from (its repository's versions, its swap root,
//!   never another served store's directory) and the grants what it exposes needs;
//! - [`metrics`] + [`scrape`] + [`process`]: the families calls update and what a scrape
//!   reads then (the stores, the process), on `/metrics` at an address of its own;
//! - [`node`]: [`Shared`], what every call of a node shares.
//!
//! `tests/node.rs` holds the node on loopback to the embedded store; `tests/probes.rs` tries it
//! as adversarial probing did (a window-0 client, silent and half-open connections, a flood
//! under a 1,024-descriptor limit, a token revoked under an open stream, swaps outside the
//! root), in process or against the binary; `tests/common/` is what both share. The store's
//! conformance suite runs over a node in `nearrec-client`'s `tests/contract.rs`.

pub mod acl;
pub mod admission;
pub mod audit;
pub mod coalesce;
pub mod config;
pub mod conns;
pub mod fair;
mod hold;
pub mod limits;
pub mod metrics;
pub mod node;
pub mod process;
pub mod scrape;
pub mod send;
pub mod service;
pub mod stores;
pub mod swap;

use std::future::Future;
use std::sync::Arc;

use nearrec_wire::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use nearrec_wire::v1 as pb;
use sd_notify::NotifyState::{Ready, Status, Stopping};
use tokio::net::TcpListener;

pub use acl::Acl;
pub use admission::Admission;
pub use audit::Audit;
pub use config::{FLAGS, Flag, FlagKind, LogFormat, NodeConfig, TlsFiles};
pub use node::Shared;
pub use service::NodeService;
pub use stores::Stores;

/// The listeners a node serves on: gRPC, and `/metrics` if asked for.
#[derive(Debug)]
pub struct Listeners {
    pub grpc: TcpListener,
    pub metrics: Option<TcpListener>,
}

/// Serves `stores` until `shutdown` resolves, then drains (at most `config.drain_timeout`).
pub async fn serve(
    stores: Stores,
    config: NodeConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let acl = config.acl.as_deref().map(Acl::load).transpose()?;
    // the shard replicas kept in etcd: held from before the node listens until it has drained
    let (holds_stop, holds_stopped) = tokio::sync::watch::channel(false);
    hold::start(
        &stores,
        &config,
        listeners.grpc.local_addr()?,
        &holds_stopped,
    )
    .await?;
    let audit = (config.audit_log.as_deref())
        .map(|p| Audit::open(p, config.audit_required))
        .transpose()?;
    let shared = Arc::new(Shared::new(stores, config.clone(), acl).with_audit(audit));
    if config.acl.is_some() || config.audit_log.is_some() || shared.stores.has_sharded() {
        tokio::spawn(reload_on_hangup(shared.clone(), config.acl.clone()));
    }
    let (metrics_stop, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(l) = listeners.metrics {
        let registry = scrape::registry(shared.clone());
        let ready = shared.ready.clone();
        tokio::spawn(async move {
            let stop = async {
                let _ = metrics_stopped.await;
            };
            if let Err(e) = metrics::serve_metrics(registry, l, ready, stop).await {
                tracing::error!("the metrics endpoint stopped: {e}");
            }
        });
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<pb::node_server::NodeServer<NodeService>>()
        .await;
    // the stores were opened (and their DRAM tiers warmed) before the node was made
    shared
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    let listen = listeners.grpc.local_addr()?;
    tracing::info!(%listen, "ready");
    // under systemd (Type=notify, NOTIFY_SOCKET set) the unit is started from here; elsewhere
    // this does nothing
    let status = format!(
        "serving {} store(s) on {listen}",
        shared.stores.names().count()
    );
    if let Err(e) = sd_notify::notify(false, &[Ready, Status(&status)]) {
        tracing::warn!("cannot tell the service manager the node is ready: {e}");
    }
    let readiness = shared.ready.clone();
    // reflection, as v1 and as the v1alpha that older stock clients (grpcio's, grpcurl's first
    // try) ask for
    let reflect = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = reflect().build_v1()?;
    let reflection_alpha = reflect().build_v1alpha()?;
    let metrics = shared.metrics.clone();
    let conn_stats = shared.conns.clone();
    let admission = shared.admission.clone();
    let slow = shared.slow.clone();
    let node = pb::node_server::NodeServer::new(NodeService(shared.clone()))
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    let oip = GrpcInferenceServiceServer::new(NodeService(shared))
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
    let reporter = health.clone();
    let stop = async move {
        shutdown.await;
        tracing::info!("draining: no new connections; finishing the requests in flight");
        let _ = sd_notify::notify(false, &[Stopping, Status("draining")]);
        readiness.store(false, std::sync::atomic::Ordering::Release);
        reporter
            .set_not_serving::<pb::node_server::NodeServer<NodeService>>()
            .await;
        let _ = drained_tx.send(());
    };
    let limits = config.limits();
    let incoming = conns::Incoming::new(listeners.grpc, limits, conn_stats);
    let mut builder = tonic::transport::Server::builder()
        .initial_stream_window_size(nearrec_wire::STREAM_WINDOW)
        .initial_connection_window_size(nearrec_wire::CONNECTION_WINDOW)
        .max_frame_size(nearrec_wire::MAX_FRAME)
        .max_concurrent_streams(config.max_streams_per_connection)
        // a live client answers a ping; a dead one, or one stuck inside a frame, cannot
        .http2_keepalive_interval(Some(limits.idle_timeout / 2))
        .http2_keepalive_timeout(Some(limits.handshake_timeout));
    if let Some(tls) = &config.tls {
        let tls = tls.server_config()?.timeout(limits.handshake_timeout);
        builder = builder.tls_config(tls)?;
    }
    let server = builder
        .layer(limits::slow_requests(config.request_timeout, slow))
        .layer(send::layer(metrics.clone()))
        .layer(admission::ExpiredLayer(admission, metrics))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(node)
        .add_service(oip)
        .serve_with_incoming_shutdown(incoming, stop);
    tokio::pin!(server);
    tokio::select! {
        done = &mut server => done?,
        _ = async {
            let _ = drained_rx.await;
            tokio::time::sleep(config.drain_timeout).await;
        } => tracing::warn!("drain timed out after {:?}; stopping", config.drain_timeout),
    }
    let _ = metrics_stop.send(());
    let _ = holds_stop.send(true);
    tracing::info!("drained: stopped");
    Ok(())
}

/// Log lines queued for stderr at most; past that, lines are dropped until it drains.
const LOG_QUEUE_LINES: usize = 16_384;

/// Runs the node `config` describes until SIGTERM or SIGINT, then drains: the `nearrec-server`
/// binary and `nearrec serve`. `ready` gets the listeners once the node listens (port 0 picks
/// a free port). Refuses an address other than loopback unless `config.insecure` (a node
/// reachable from other hosts needs an ACL).
pub fn run(config: NodeConfig, ready: impl FnOnce(&Listeners, &Stores)) -> Result<(), String> {
    config.validate().map_err(|e| e.to_string())?;
    // the metrics endpoint answers anyone (store and table names, traffic): it is held to the
    // same rule
    let exposed = [Some(config.listen), config.metrics_listen];
    for addr in exposed.into_iter().flatten() {
        if !addr.ip().is_loopback() && config.acl.is_none() && !config.insecure {
            return Err(format!(
                "{addr} is not a loopback address: a node reachable from other hosts needs an \
                 ACL (--acl) or --insecure"
            ));
        }
    }
    // structured logs on stderr (RUST_LOG narrows or widens them), unless the process has its
    // own subscriber already: colour only for a terminal, never into a file or a journal
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into())
    };
    // written by a thread of their own from a bounded queue: a stderr nobody reads (a full
    // pipe) drops lines instead of blocking the request that logs one; `_flush` writes what
    // is queued when the node stops
    let (stderr, _flush) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .finish(std::io::stderr());
    let logs = tracing_subscriber::fmt().with_writer(stderr);
    let _ = match config.log_format {
        config::LogFormat::Json => logs.json().with_env_filter(filter()).try_init(),
        config::LogFormat::Text => {
            use std::io::IsTerminal;
            logs.with_ansi(std::io::stderr().is_terminal())
                .with_env_filter(filter())
                .try_init()
        }
    };
    if let Some(path) = &config.acl {
        Acl::load(path)?; // a bad ACL or TLS file stops the node before it listens
    }
    if let Some(tls) = &config.tls {
        tls.server_config()?;
    }
    let mut config = config;
    match conns::raise_nofile() {
        Ok(n) if (n as usize) < config.max_connections + conns::RESERVED_FDS => {
            let fit = (n as usize).saturating_sub(conns::RESERVED_FDS).max(1);
            tracing::warn!(
                "the process may open {n} descriptors: --max-connections {} lowered to {fit}, \
                 leaving {} for the stores' files; raise the hard limit (ulimit -Hn) for more",
                config.max_connections,
                conns::RESERVED_FDS
            );
            config.max_connections = fit;
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise the limit on open descriptors: {e}"),
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %config.listen,
        stores = config.stores.len(),
        sharded = config.shards.len(),
        "starting"
    );
    let stores = config.open_stores()?;
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| format!("cannot start the node's runtime: {e}"))?;
    runtime.block_on(async {
        let bind = |addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))
        };
        let listeners = Listeners {
            grpc: bind(config.listen).await?,
            metrics: match config.metrics_listen {
                Some(a) => Some(bind(a).await?),
                None => None,
            },
        };
        // SIGTERM drains from the moment the node says it listens: the handler first (a
        // supervisor may stop a node as soon as it is ready, and the default action kills)
        let stop = stop_signal()?;
        ready(&listeners, &stores);
        let served = stores.clone();
        serve(stores, config, listeners, stop)
            .await
            .map_err(|e| e.to_string())?;
        // drained: each store lets go of its writer and keeps its hot set (`hot_set_dir`)
        for (name, store) in served.iter() {
            if let Err(e) = store.close() {
                tracing::error!(store = name, "closing the store failed: {e}");
            }
        }
        Ok(())
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

/// SIGHUP: the audit log's file opened again (a log rotation), the ACL file read again and
/// swapped in whole, and each sharded store's `replicas.toml` read again
/// ([`Stores::reload_replicas`]); what does not load stays as it was (and the log says why).
async fn reload_on_hangup(shared: Arc<Shared>, acl: Option<std::path::PathBuf>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangup) = signal(SignalKind::hangup()) else {
        tracing::error!("cannot listen for SIGHUP: the ACL and replicas will not be reloaded");
        return;
    };
    while hangup.recv().await.is_some() {
        if let Some(audit) = &shared.audit {
            match audit.reopen() {
                Ok(()) => tracing::info!("audit log reopened"),
                Err(e) => tracing::error!("audit log not reopened, the old file stays: {e}"),
            }
        }
        if let Some(path) = &acl {
            match Acl::load(path) {
                Ok(acl) => {
                    tracing::info!(principals = acl.principals(), "ACL reloaded");
                    shared.acl.store(Some(Arc::new(acl)));
                }
                Err(e) => tracing::error!("ACL not reloaded, the old one stays: {e}"),
            }
        }
        // new replicas are connected and checked: off the runtime's threads
        let stores = shared.stores.clone();
        let reloaded = tokio::task::spawn_blocking(move || stores.reload_replicas()).await;
        for (store, result) in reloaded.unwrap_or_default() {
            match result {
                Ok(()) => tracing::info!(%store, "replicas reloaded"),
                Err(e) => {
                    tracing::error!(%store, "replicas not reloaded, served as they were: {e}")
                }
            }
        }
    }
}

/// What the node logs unless `RUST_LOG` says otherwise: every line the docs name — the node's
/// (`nearrec_server`), the stores' loading, warm-up and hot sets (`nearrec::store`,
/// `nearrec::warm`), a sharded store's router (`nearrec_cluster`) — at `info`.
pub const DEFAULT_LOG_FILTER: &str = "nearrec=info,nearrec_server=info,nearrec_cluster=info";

/// The line a started node prints: `listening on ADDR (stores: ...)[; metrics on ADDR]`.
pub fn listening(listeners: &Listeners, stores: &Stores) -> String {
    let addr = |l: &TcpListener| {
        l.local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string())
    };
    let names: Vec<&str> = stores.names().collect();
    let mut line = format!(
        "listening on {} (stores: {})",
        addr(&listeners.grpc),
        names.join(", ")
    );
    if let Some(m) = &listeners.metrics {
        line += &format!("; metrics on http://{}/metrics", addr(m));
    }
    line
}
