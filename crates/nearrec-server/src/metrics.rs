//! What the node did, for Prometheus: served as Prometheus text on a separate admin address
//! (`--metrics-listen`, `GET /metrics`), so that scrapes never queue behind lookups.
//!
//! Counted as calls happen (prometheus-client's families):
//! - `nearrec_requests_total{call, code}` — calls by method and gRPC status;
//! - `nearrec_request_seconds{call, stage}` — latency histograms per stage: `queue` (waiting for
//!   an engine slot), `engine` (the facade's call: route, reads, pooling or the model), and
//!   within it, for each answered lookup or inference, `route` (validation, de-duplication, read
//!   planning), `io` (waiting for the device; zero on DRAM) and `pool`, and `infer` (the
//!   model's time after its last embedding, the rest being overlapped with the reads); `total`
//!   (from the handler's start to its answer) and after it `send` (a unary answer from ready to
//!   its last byte handed to the connection: encoding it and HTTP/2 flow control; timed by
//!   [`crate::send`]);
//! - `nearrec_batch_requests` — requests per engine batch where small lookups coalesce;
//! - `nearrec_received_bytes_total{call}`, `nearrec_sent_bytes_total{call}` — message bytes.
//!
//! What is read at each scrape instead (the node's and its stores' state) is `crate::scrape`.

use std::sync::Arc;

use nearrec::Stages;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallCode {
    pub call: &'static str,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallStage {
    pub call: &'static str,
    pub stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Call {
    pub call: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreTable {
    pub store: String,
    pub table: String,
}

fn histogram() -> Histogram {
    // 1 µs to ~67 s: a DRAM lookup's stages take microseconds
    Histogram::new(exponential_buckets(1e-6, 2.0, 27))
}

/// The families calls update.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub requests: Family<CallCode, Counter>,
    pub seconds: Family<CallStage, Histogram, fn() -> Histogram>,
    pub received: Family<Call, Counter>,
    pub sent: Family<Call, Counter>,
    /// Requests per engine batch of the coalescing path (`crate::coalesce`).
    pub batch_requests: Histogram,
    /// Per store and table, the lookups answered that named it, and their ids.
    pub table_lookups: Family<StoreTable, Counter>,
    pub table_rows: Family<StoreTable, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            seconds: Family::new_with_constructor(histogram),
            received: Family::default(),
            sent: Family::default(),
            batch_requests: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            table_lookups: Family::default(),
            table_rows: Family::default(),
        }
    }
}

impl Metrics {
    /// A lookup answered, naming `table` of `store` with `rows` ids.
    pub fn table(&self, store: &str, table: &str, rows: u64) {
        let labels = StoreTable {
            store: store.to_owned(),
            table: table.to_owned(),
        };
        self.table_lookups.get_or_create(&labels).inc();
        self.table_rows.get_or_create(&labels).inc_by(rows);
    }

    /// A finished call: its status and total seconds, its bytes.
    pub fn call(
        &self,
        call: &'static str,
        code: tonic::Code,
        seconds: f64,
        bytes_in: usize,
        bytes_out: usize,
    ) {
        self.requests
            .get_or_create(&CallCode {
                call,
                code: format!("{code:?}"),
            })
            .inc();
        self.stage(call, "total", seconds);
        self.received
            .get_or_create(&Call { call })
            .inc_by(bytes_in as u64);
        self.sent
            .get_or_create(&Call { call })
            .inc_by(bytes_out as u64);
    }

    pub fn stage(&self, call: &'static str, stage: &'static str, seconds: f64) {
        self.seconds
            .get_or_create(&CallStage { call, stage })
            .observe(seconds);
    }

    /// The engine's stages of one answered batch (`route`, `io`, `pool`).
    pub fn stages(&self, call: &'static str, stages: &Stages) {
        self.stage(call, "route", stages.route.as_secs_f64());
        self.stage(call, "io", stages.io_wait.as_secs_f64());
        self.stage(call, "pool", stages.pool.as_secs_f64());
    }
}

/// Serves on `listener`, until `shutdown` resolves: `GET /metrics` (Prometheus text),
/// `GET /healthz` (200 while the process answers: a liveness probe) and `GET /readyz` (200
/// while `ready` — the node's stores open and warmed, its drain not begun — else 503: a
/// readiness probe, which a load balancer or Kubernetes stops sending traffic on).
pub async fn serve_metrics(
    registry: Registry,
    listener: tokio::net::TcpListener,
    ready: Arc<std::sync::atomic::AtomicBool>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::StatusCode;
    use axum::http::header::CONTENT_TYPE;
    let registry = Arc::new(registry);
    const TEXT: [(&str, &str); 1] = [("content-type", "text/plain; charset=utf-8")];
    let readyz = move || {
        let ok = ready.load(std::sync::atomic::Ordering::Acquire);
        async move {
            if ok {
                (StatusCode::OK, TEXT, "ready\n")
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    TEXT,
                    "not ready: starting or draining\n",
                )
            }
        }
    };
    let app = axum::Router::new()
        .route(
            "/healthz",
            axum::routing::get(|| async { (StatusCode::OK, TEXT, "ok\n") }),
        )
        .route("/readyz", axum::routing::get(readyz))
        .route(
            "/metrics",
            axum::routing::get(move || {
                let registry = registry.clone();
                async move {
                    let mut text = String::new();
                    match prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)
                    {
                        Ok(()) => (
                            axum::http::StatusCode::OK,
                            [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                            text,
                        ),
                        Err(_) => (
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                            [(CONTENT_TYPE, "text/plain; charset=utf-8")],
                            "the metrics could not be encoded\n".to_owned(),
                        ),
                    }
                }
            }),
        );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
