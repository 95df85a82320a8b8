//! What the node's tests share: a small store, a node on a free loopback port (in this
//! process), requests.

#![allow(dead_code)] // each test file uses its part

use std::path::{Path, PathBuf};

use nearrec::{AsBatch, OwnedBatch, Store, StoreConfig};
use nearrec_format::DType;
use nearrec_server::{Listeners, NodeConfig, Stores, serve};
use nearrec_wire::convert;
use nearrec_wire::v1 as pb;
use nearrec_wire::v1::node_client::NodeClient;
use tonic::transport::Channel;

pub const ROWS: u64 = 400;
pub const DIM: u32 = 8;

/// A store of two tables, `t0` (fp32) and `t1` (fp16), `ROWS` × `DIM`.
pub fn build(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let tables = [
        ("t0", ROWS, DIM, DType::Fp32),
        ("t1", ROWS, DIM, DType::Fp16),
    ];
    nearrec_testkit::write_store(dir.join("store"), &tables, nearrec_testkit::pattern)
}

pub fn open(path: &Path, toml: &str) -> Store {
    Store::open(path, &StoreConfig::from_toml(toml).unwrap()).unwrap()
}

/// A node serving `stores` in this process, with its metrics endpoint; stopped (drained) when
/// dropped.
pub struct Node {
    pub addr: std::net::SocketAddr,
    pub metrics: std::net::SocketAddr,
    pub runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
}

impl Node {
    pub fn start(stores: Stores, config: NodeConfig) -> Self {
        Self::start_at("127.0.0.1:0".parse().unwrap(), stores, config)
    }

    /// [`Node::start`] listening at `addr` (one another node left, say).
    pub fn start_at(addr: std::net::SocketAddr, stores: Stores, config: NodeConfig) -> Self {
        Self::start_with(addr, 2, stores, config)
    }

    /// [`Node::start_at`] on a runtime of `workers` async workers.
    pub fn start_with(
        addr: std::net::SocketAddr,
        workers: usize,
        stores: Stores,
        config: NodeConfig,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap();
        Self::start_on(runtime, addr, stores, config)
    }

    /// [`Node::start_at`] on `runtime` (one whose threads a test marks, say).
    pub fn start_on(
        runtime: tokio::runtime::Runtime,
        addr: std::net::SocketAddr,
        stores: Stores,
        config: NodeConfig,
    ) -> Self {
        let bind =
            |at: std::net::SocketAddr| runtime.block_on(tokio::net::TcpListener::bind(at)).unwrap();
        let listeners = Listeners {
            grpc: bind(addr),
            metrics: Some(bind("127.0.0.1:0".parse().unwrap())),
        };
        let addr = listeners.grpc.local_addr().unwrap();
        let metrics = listeners.metrics.as_ref().unwrap().local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let done = runtime.spawn(async move {
            serve(stores, config, listeners, async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        Self {
            addr,
            metrics,
            runtime,
            stop: Some(tx),
            done: Some(done),
        }
    }

    /// SIGTERM, as far as the node sees it: it stops taking connections and drains.
    pub fn begin_drain(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }

    /// `GET /metrics`, as a scraper does it.
    pub fn scrape(&self) -> String {
        scrape(self.metrics)
    }

    pub fn client(&self) -> NodeClient<Channel> {
        let url = format!("http://{}", self.addr);
        self.runtime
            .block_on(NodeClient::connect(url))
            .unwrap()
            .max_decoding_message_size(64 << 20)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(done) = self.done.take() {
            let _ = self.runtime.block_on(done);
        }
    }
}

/// `GET /metrics` of the node whose metrics endpoint is `addr`, as a scraper does it.
pub fn scrape(addr: std::net::SocketAddr) -> String {
    let (status, out) = get(addr, "/metrics");
    assert_eq!(status, 200, "{out}");
    out
}

/// `GET path` of the node's metrics endpoint at `addr`: the status and the whole answer.
pub fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(c, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, out)
}

pub fn request(store: &str, batch: &OwnedBatch, raw: bool, id: u64) -> pb::LookupRequest {
    pb::LookupRequest {
        store: store.into(),
        tables: convert::tables(&batch.as_batch()),
        raw,
        id,
        at_version: 0,
        expect: Vec::new(),
        out_dtype: convert::out_dtype(batch.out).into(),
    }
}

pub fn authorized<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}
