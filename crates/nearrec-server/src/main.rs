//! `nearrec-server`: the storage node as a standalone binary, for hosts without Python
//! (`nearrec serve` is the same server).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use nearrec::{Store, StoreConfig};
use nearrec_server::{NodeConfig, Stores, serve};

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
    /// Seconds a drain (SIGTERM) waits for requests in flight.
    #[arg(long, default_value_t = 30.0)]
    drain_timeout: f64,
}

fn fail(message: impl std::fmt::Display) -> ! {
    eprintln!("nearrec-server: {message}");
    std::process::exit(2)
}

fn main() {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "nearrec_server=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if !args.listen.ip().is_loopback() && !args.insecure {
        fail(format!(
            "{} is not a loopback address: a node reachable from other hosts needs an ACL \
             (not yet supported) or --insecure",
            args.listen
        ));
    }
    let mut store_config = match &args.config {
        Some(p) => StoreConfig::from_file(p).unwrap_or_else(|e| fail(e)),
        None => StoreConfig::default(),
    };
    store_config.writable |= args.writable;
    let mut stores = Stores::new();
    for spec in &args.stores {
        let (path, name) = match spec.split_once('=') {
            Some((p, n)) => (PathBuf::from(p), n.to_owned()),
            None => {
                let p = PathBuf::from(spec);
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| fail(format!("{spec}: name the store (PATH=NAME)")));
                (p, name)
            }
        };
        let store = Store::open(&path, &store_config)
            .unwrap_or_else(|e| fail(format!("{}: {e}", path.display())));
        stores.insert(name, store).unwrap_or_else(|e| fail(e));
    }
    let config = NodeConfig {
        listen: args.listen,
        max_in_flight: args.max_in_flight.max(1),
        max_queued: args.max_queued,
        max_message_bytes: args.max_message_bytes,
        drain_timeout: Duration::from_secs_f64(args.drain_timeout.max(0.0)),
    };
    let runtime = tokio::runtime::Runtime::new().unwrap_or_else(|e| fail(e));
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .unwrap_or_else(|e| fail(format!("cannot listen on {}: {e}", config.listen)));
        let addr = listener.local_addr().unwrap_or_else(|e| fail(e));
        let names: Vec<&str> = stores.names().collect();
        println!(
            "nearrec-server listening on {addr} (stores: {})",
            names.join(", ")
        );
        let _ = std::io::stdout().flush();
        if let Err(e) = serve(stores, config, listener, stop_signal()).await {
            fail(e);
        }
    });
}

/// SIGTERM or SIGINT: the node drains and exits.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).unwrap_or_else(|e| fail(e));
    let mut int = signal(SignalKind::interrupt()).unwrap_or_else(|e| fail(e));
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
