//! How a node runs: where it listens and the limits that keep its tail short.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A node's settings (the `nearrec-server` / `nearrec serve` flags).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Where the node listens: loopback unless asked otherwise.
    pub listen: SocketAddr,
    /// Engine calls running at once; more wait in the queue.
    pub max_in_flight: usize,
    /// Requests waiting for an engine slot; past them a request is refused
    /// (`RESOURCE_EXHAUSTED`).
    pub max_queued: usize,
    /// The largest request or answer, in bytes.
    pub max_message_bytes: usize,
    /// Pooled lookups of fewer bags than this that read a device (not DRAM-resident) are
    /// coalesced with others on the same store into engine batches of up to this many bags
    /// (`crate::coalesce`); 0: never.
    pub coalesce_bags: usize,
    /// How long the first request of an engine batch waits for others to join it (besides the
    /// wait for an engine slot, during which they gather anyway).
    pub coalesce_window: Duration,
    /// How long a drain (SIGTERM) waits for requests in flight before it stops anyway.
    pub drain_timeout: Duration,
    /// The ACL file (`crate::acl`); `None`: every call is allowed. Reloaded on SIGHUP.
    pub acl: Option<PathBuf>,
    /// Where `GET /metrics` (Prometheus text) is served; `None`: nowhere.
    pub metrics_listen: Option<SocketAddr>,
    /// TLS (rustls); `None`: plaintext.
    pub tls: Option<TlsFiles>,
    /// Connections open at once; past them a new one is closed at once (`crate::conns`).
    pub max_connections: usize,
    /// How long a new connection has to send the HTTP/2 preface (or finish its TLS handshake).
    pub handshake_timeout: Duration,
    /// How long a connection may send nothing before it is closed (the node pings each at half
    /// of it, so a live client always answers in time).
    pub idle_timeout: Duration,
    /// Requests one connection may have open at once (HTTP/2 `MAX_CONCURRENT_STREAMS`).
    pub max_streams_per_connection: u32,
    /// Bytes of answers the node holds computed but not yet taken by their clients; past them
    /// a request is refused (`RESOURCE_EXHAUSTED`). At least `max_message_bytes`.
    pub max_unsent_bytes: usize,
    /// The same, for one connection.
    pub max_unsent_bytes_per_connection: usize,
    /// The directory `Swap` may take stores from (`crate::swap`); `None`: the directory
    /// holding the store served.
    pub swap_root: Option<PathBuf>,
}

/// The node's certificate and key (PEM), and the CA its clients' certificates must chain to
/// (`None`: clients present none).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// tonic's server TLS settings, the files read and checked now.
    pub fn server_config(&self) -> Result<tonic::transport::ServerTlsConfig, String> {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let read = |p: &PathBuf, what: &str| {
            std::fs::read(p).map_err(|e| format!("cannot read the TLS {what} {}: {e}", p.display()))
        };
        let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(
            read(&self.cert, "certificate")?,
            read(&self.key, "key")?,
        ));
        if let Some(ca) = &self.client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(read(ca, "client CA")?));
        }
        Ok(tls)
    }
}

impl NodeConfig {
    /// The node's budget of unsent answer bytes and one connection's, each room for at least
    /// one answer of the largest size.
    pub fn unsent_budgets(&self) -> (usize, usize) {
        let at_least_one = |bytes: usize| bytes.max(self.max_message_bytes);
        (
            at_least_one(self.max_unsent_bytes),
            at_least_one(self.max_unsent_bytes_per_connection),
        )
    }

    /// The connection limits ([`crate::conns`]).
    pub fn limits(&self) -> crate::conns::Limits {
        crate::conns::Limits {
            max_connections: self.max_connections.max(1),
            handshake_timeout: self.handshake_timeout,
            idle_timeout: self.idle_timeout,
            unsent_bytes_per_connection: self.unsent_budgets().1,
            tls: self.tls.is_some(),
        }
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            max_in_flight: 8,
            max_queued: 256,
            max_message_bytes: 64 << 20,
            // measured (`nearrec bench serve`, SSD tier, bench/results/serve.md): batches of up
            // to 256 bags gained 1.29×, 0.89×, 1.36× and 1.18× the uncoalesced node's
            // throughput for requests of 1, 4, 16 and 64 bags (up to 64 bags: 0.98–1.01×);
            // waiting 200 µs for company cost latency at moderate load: nothing waits
            coalesce_bags: 256,
            coalesce_window: Duration::ZERO,
            drain_timeout: Duration::from_secs(30),
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_streams_per_connection: 256,
            max_unsent_bytes: 1 << 30,
            max_unsent_bytes_per_connection: 256 << 20,
            acl: None,
            metrics_listen: None,
            tls: None,
            swap_root: None,
        }
    }
}
