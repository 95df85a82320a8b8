//! `nearrec-server`: the storage node as a standalone binary, for hosts without Python
//! (`nearrec serve` is the same server).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use nearrec::StoreConfig;
use nearrec_server::{Listeners, NodeConfig, Stores, TlsFiles, listening, run};

/// Serves nearrec stores over gRPC (nearrec.v1.Node, grpc.health.v1, reflection).
#[derive(Debug, Parser)]
#[command(name = "nearrec-server", version)]
struct Args {
    /// Stores to serve, each PATH or PATH=NAME (the name defaults to the directory's).
    #[arg(required = true, value_name = "STORE[=NAME]")]
    stores: Vec<String>,
    /// Address to listen on; port 0 picks a free one (printed once ready).
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// A store config (TOML, as `nearrec --config`) every store is opened with.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Open the stores for writing (Write, Remove, CreateTable, DropTable).
    #[arg(long)]
    writable: bool,
    /// The ACL (TOML: principals, their tokens' SHA-256, their read / write / admin grants);
    /// reloaded on SIGHUP. Without one every call is allowed.
    #[arg(long, value_name = "FILE")]
    acl: Option<PathBuf>,
    /// Where to serve Prometheus metrics (`GET /metrics`); port 0 picks a free one.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Serve TLS with this certificate (PEM; with --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Ask clients for certificates that chain to this CA (PEM): mutual TLS.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// The directory `Swap` may take stores from (default: the one holding each served store).
    #[arg(long, value_name = "DIR")]
    swap_root: Option<PathBuf>,
    /// Listen on an address other than loopback without an ACL.
    #[arg(long)]
    insecure: bool,
    /// Engine calls running at once.
    #[arg(long, default_value_t = NodeConfig::default().max_in_flight)]
    max_in_flight: usize,
    /// Requests waiting for an engine call; past them requests are refused.
    #[arg(long, default_value_t = NodeConfig::default().max_queued)]
    max_queued: usize,
    /// The largest request or answer, in bytes.
    #[arg(long, default_value_t = NodeConfig::default().max_message_bytes)]
    max_message_bytes: usize,
    /// Pooled lookups of fewer bags that read a device (not DRAM-resident) are coalesced into
    /// engine batches of up to this many bags (0: never).
    #[arg(long, default_value_t = NodeConfig::default().coalesce_bags)]
    coalesce_bags: usize,
    /// Microseconds the first request of a coalesced batch waits for others.
    #[arg(long, default_value_t = NodeConfig::default().coalesce_window.as_micros() as u64)]
    coalesce_window_us: u64,
    /// Connections open at once; past them a new one is closed at once.
    #[arg(long, default_value_t = NodeConfig::default().max_connections)]
    max_connections: usize,
    /// Seconds a new connection has to send the HTTP/2 preface (or finish its TLS handshake).
    #[arg(long, default_value_t = NodeConfig::default().handshake_timeout.as_secs_f64())]
    handshake_timeout: f64,
    /// Seconds a connection may send nothing before it is closed (live clients answer the
    /// node's pings, sent at half of it).
    #[arg(long, default_value_t = NodeConfig::default().idle_timeout.as_secs_f64())]
    idle_timeout: f64,
    /// Requests one connection may have open at once (HTTP/2 MAX_CONCURRENT_STREAMS).
    #[arg(long, default_value_t = NodeConfig::default().max_streams_per_connection)]
    max_streams_per_connection: u32,
    /// Bytes of answers computed but not yet read by their clients that the node holds; past
    /// them requests are refused (RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = NodeConfig::default().max_unsent_bytes)]
    max_unsent_bytes: usize,
    /// The same, for one connection.
    #[arg(long, default_value_t = NodeConfig::default().max_unsent_bytes_per_connection)]
    max_unsent_bytes_per_connection: usize,
    /// Seconds a drain (SIGTERM) waits for requests in flight.
    #[arg(long, default_value_t = 30.0)]
    drain_timeout: f64,
}

fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("nearrec-server: {message}");
    std::process::exit(2)
}

/// A positive number of seconds from a flag (at least a millisecond).
fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.001))
        .unwrap_or_else(|_| fail(format!("{s} is not a number of seconds")))
}

fn main() {
    let args = Args::parse();
    let mut store_config = match &args.config {
        Some(p) => StoreConfig::from_file(p).unwrap_or_else(|e| fail(e)),
        None => StoreConfig::default(),
    };
    store_config.writable |= args.writable;
    let stores = Stores::open(&args.stores, &store_config).unwrap_or_else(|e| fail(e));
    let config = NodeConfig {
        listen: args.listen,
        max_in_flight: args.max_in_flight.max(1),
        max_queued: args.max_queued,
        max_message_bytes: args.max_message_bytes,
        coalesce_bags: args.coalesce_bags,
        coalesce_window: Duration::from_micros(args.coalesce_window_us),
        drain_timeout: Duration::try_from_secs_f64(args.drain_timeout.max(0.0))
            .unwrap_or_else(|_| fail("--drain-timeout is not a number of seconds")),
        acl: args.acl,
        metrics_listen: args.metrics_listen,
        swap_root: args.swap_root,
        max_connections: args.max_connections,
        handshake_timeout: seconds(args.handshake_timeout),
        idle_timeout: seconds(args.idle_timeout),
        max_streams_per_connection: args.max_streams_per_connection.max(1),
        max_unsent_bytes: args.max_unsent_bytes,
        max_unsent_bytes_per_connection: args.max_unsent_bytes_per_connection,
        tls: args.tls_cert.zip(args.tls_key).map(|(cert, key)| TlsFiles {
            cert,
            key,
            client_ca: args.tls_client_ca,
        }),
    };
    let ready = |listeners: &Listeners, stores: &Stores| {
        println!("nearrec-server {}", listening(listeners, stores));
        let _ = std::io::stdout().flush();
    };
    if let Err(e) = run(stores, config, args.insecure, ready) {
        fail(e);
    }
}
