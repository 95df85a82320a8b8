//! A client of the storage node (`nearrec-server`): an implementation of the store's contract,
//! [`nearrec::StoreApi`] — the same batches in, the same [`nearrec::Pooled`] and
//! [`nearrec::Rows`] out, errors as the node named them ([`nearrec::Error::Remote`]: the
//! [`nearrec::ErrorKind`] with its table and position, or the node's own refusal by its code).
//! Calls block the caller; they run on a small runtime of the client's own, over one HTTP/2
//! connection that concurrent calls share (Python's `nearrec.connect` is this client).
//!
//! [`Client::connect`] takes [`ClientOptions`]: a bearer token and a deadline (`grpc-timeout`)
//! sent with every call, TLS ([`ClientTls`]: a CA, a domain, a client certificate), message and
//! connect limits. A forked child makes its own connection on its first call. A call whose
//! connection failed (a refused handshake, a reset) is `UNAVAILABLE`: a connection problem to
//! retry, not an answer of the node's.
//! Each verb it implements is one call to the node, built and read by `nearrec-wire`'s `convert`;
//! `submit` puts a call in flight and returns a [`Pending`].
//!
//! `tests/contract.rs` runs the store's conformance suite (`nearrec`'s `tests/suite/`) through
//! this client against a node on loopback, so a node's store answers as an embedded one does.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nearrec::{
    AsBatch, Batch, Compaction, Inferred, Info, NewTable, PendingLookup, Pooled, Read, RowWrite,
    Rows, Stats, StoreApi, Submitted, SwapTo, TierReport, Versioned, WriteOptions,
};
use nearrec_wire::arrays::{decode, encode_slice};
use nearrec_wire::v1 as pb;
use nearrec_wire::v1::node_client::NodeClient;
use nearrec_wire::{RemoteError, convert};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Response, Status};

/// How a client talks to its node.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Sent as `authorization: Bearer TOKEN` with every call.
    pub token: Option<String>,
    /// Each call's deadline (`grpc-timeout`): the node drops a call still waiting at it.
    pub timeout: Option<Duration>,
    /// The largest answer or request, in bytes.
    pub max_message_bytes: usize,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// TLS; `None`: plaintext (unless the address is `https://`, then the system's roots).
    pub tls: Option<ClientTls>,
}

/// How the client checks the node and shows itself: PEM bytes.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// The CA the node's certificate must chain to.
    pub ca: Option<Vec<u8>>,
    /// The name the node's certificate must carry (default: the address's host).
    pub domain: Option<String>,
    /// A client certificate and key, for nodes that ask for one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            token: None,
            timeout: None,
            max_message_bytes: 64 << 20,
            connect_timeout: Duration::from_secs(10),
            tls: None,
        }
    }
}

/// A connection to one store on one node. A forked child process makes its own on its first
/// call (the parent's runtime threads do not exist in it, and its socket is the parent's).
#[derive(Debug, Clone)]
pub struct Client {
    addr: String,
    store: String,
    options: ClientOptions,
    /// `None` once closed.
    conn: Arc<Mutex<Option<Arc<Conn>>>>,
}

/// The runtime and channel of one process.
#[derive(Debug)]
struct Conn {
    pid: u32,
    runtime: Arc<tokio::runtime::Runtime>,
    node: NodeClient<Channel>,
}

/// A call the client could not make: no connection, a bad address.
fn unavailable(message: String) -> nearrec::Error {
    RemoteError {
        code: Code::Unavailable,
        kind: None,
        message,
        table: None,
        position: None,
    }
    .into()
}

/// A status as the node's error. A call whose connection failed (a TLS handshake refused, a
/// reset) never got an answer from the node: tonic makes it `UNKNOWN` or, from an HTTP/2 error,
/// `INTERNAL` — both with the transport's error as their source, which a status the node sent
/// never has. It is `UNAVAILABLE`, with the transport's reasons, so that it is retried or
/// reported as a connection problem.
fn remote(s: &Status) -> nearrec::Error {
    let mut e = RemoteError::from(s);
    if matches!(s.code(), Code::Unknown | Code::Internal) && e.kind.is_none() {
        let mut source = std::error::Error::source(s);
        if source.is_some() {
            let mut why = vec![s.message().to_owned()];
            while let Some(cause) = source {
                why.push(cause.to_string());
                source = cause.source();
            }
            e.code = Code::Unavailable;
            e.message = format!("the connection to the node failed: {}", why.join(": "));
        }
    }
    e.into()
}

impl Conn {
    fn open(addr: &str, options: &ClientOptions) -> nearrec::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nearrec-client")
            .enable_all()
            .build()
            .map_err(|e| unavailable(format!("cannot start the client's runtime: {e}")))?;
        let scheme = if options.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let url = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("{scheme}://{addr}")
        };
        let mut endpoint = Endpoint::from_shared(url)
            .map_err(|e| unavailable(format!("{addr:?} is not a node's address: {e}")))?
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(nearrec_wire::STREAM_WINDOW)
            .initial_connection_window_size(nearrec_wire::CONNECTION_WINDOW)
            .max_frame_size(nearrec_wire::MAX_FRAME);
        if let Some(tls) = &options.tls {
            let mut config = ClientTlsConfig::new();
            if let Some(ca) = &tls.ca {
                config = config.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some(domain) = &tls.domain {
                config = config.domain_name(domain.clone());
            }
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| unavailable(format!("TLS settings for {addr}: {e}")))?;
        }
        let channel = runtime
            .block_on(endpoint.connect())
            .map_err(|e| unavailable(format!("cannot connect to the node at {addr}: {e}")))?;
        let node = NodeClient::new(channel)
            .max_decoding_message_size(options.max_message_bytes)
            .max_encoding_message_size(options.max_message_bytes);
        Ok(Self {
            pid: std::process::id(),
            runtime: Arc::new(runtime),
            node,
        })
    }
}

impl Client {
    /// Connects to the node at `addr` (`host:port`, or an `http://` URL) for its store `store`
    /// (empty: the node's only store).
    pub fn connect(addr: &str, store: &str, options: ClientOptions) -> nearrec::Result<Self> {
        let conn = Conn::open(addr, &options)?;
        Ok(Self {
            addr: addr.to_owned(),
            store: store.to_owned(),
            options,
            conn: Arc::new(Mutex::new(Some(Arc::new(conn)))),
        })
    }

    /// This process's connection: made again in a forked child; `Unavailable` once closed.
    fn conn(&self) -> nearrec::Result<Arc<Conn>> {
        let mut held = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let Some(conn) = held.as_mut() else {
            return Err(unavailable(format!(
                "this client of {} was closed",
                self.describe()
            )));
        };
        if conn.pid != std::process::id() {
            let fresh = Arc::new(Conn::open(&self.addr, &self.options)?);
            // the parent's runtime would wait for threads this process does not have: its
            // memory is left as it is
            std::mem::forget(std::mem::replace(conn, fresh));
        }
        Ok(conn.clone())
    }

    /// The store's name as the client sends it.
    pub fn store(&self) -> &str {
        &self.store
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut r = Request::new(message);
        if let Some(t) = self.options.timeout {
            r.set_timeout(t);
        }
        if let Some(token) = &self.options.token
            && let Ok(v) = format!("Bearer {token}").parse()
        {
            r.metadata_mut().insert("authorization", v);
        }
        r
    }

    /// One call on this process's connection: `f` given the node's client.
    fn call<T, F, Fut>(&self, f: F) -> nearrec::Result<T>
    where
        F: FnOnce(NodeClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let conn = self.conn()?;
        conn.runtime
            .block_on(f(conn.node.clone()))
            .map(Response::into_inner)
            .map_err(|s| remote(&s))
    }

    fn lookup_request(&self, batch: &Batch<'_>, raw: bool) -> pb::LookupRequest {
        pb::LookupRequest {
            store: self.store.clone(),
            tables: convert::tables(batch),
            raw,
            id: 0,
        }
    }

    fn stats_and_tiers(&self) -> nearrec::Result<(Stats, Vec<TierReport>)> {
        let req = self.request(pb::StatsRequest {
            store: self.store.clone(),
        });
        let answer = self.call(|mut node| async move { node.stats(req).await })?;
        Ok(convert::unstats(answer))
    }
}

/// Each verb one call to the node. `refresh` reads the node's version (the node follows the
/// store's writer by itself); `sync_table` is the contract's, over `lookup` and `write_many`.
impl StoreApi for Client {
    fn describe(&self) -> String {
        let store = if self.store.is_empty() {
            "the store"
        } else {
            &self.store
        };
        format!("{store} on the node at {}", self.addr)
    }

    fn info(&self) -> nearrec::Result<Info> {
        let req = self.request(pb::InfoRequest {
            store: self.store.clone(),
        });
        convert::uninfo(self.call(|mut node| async move { node.info(req).await })?)
    }

    fn lookup(&self, batch: &Batch<'_>) -> nearrec::Result<(Pooled, Read)> {
        let req = self.request(self.lookup_request(batch, false));
        let answer = self.call(|mut node| async move { node.lookup(req).await })?;
        let read = Read {
            version: answer.version,
            ..Read::default()
        };
        Ok((convert::unpooled(&answer)?, read))
    }

    fn lookup_rows(&self, batch: &Batch<'_>) -> nearrec::Result<Versioned<Vec<Rows>>> {
        let req = self.request(self.lookup_request(batch, true));
        let answer = self.call(|mut node| async move { node.lookup(req).await })?;
        Ok((convert::unraw(&answer)?, answer.version))
    }

    fn submit(&self, batch: Box<dyn AsBatch>) -> nearrec::Result<Submitted> {
        let req = self.request(self.lookup_request(&batch.as_batch(), false));
        let conn = self.conn()?;
        let mut node = conn.node.clone();
        let task = conn.runtime.spawn(async move { node.lookup(req).await });
        Ok(Box::new(Pending {
            runtime: conn.runtime.clone(),
            task,
        }))
    }

    fn infer(&self, dense: &[f32], batch: &Batch<'_>) -> nearrec::Result<Inferred> {
        let req = self.request(pb::InferRequest {
            store: self.store.clone(),
            dense: encode_slice(dense),
            tables: convert::tables(batch),
        });
        let answer = self.call(|mut node| async move { node.infer(req).await })?;
        Ok(Inferred {
            outputs: decode(&answer.outputs, "", "outputs")?,
            batch: answer.batch as usize,
            width: answer.width as usize,
            times: Default::default(),
        })
    }

    fn write_many(&self, writes: &[RowWrite<'_>], options: WriteOptions) -> nearrec::Result<u64> {
        let req = self.request(pb::WriteRequest {
            store: self.store.clone(),
            writes: convert::writes(writes),
            allow_nonfinite: options.allow_nonfinite,
        });
        Ok(self
            .call(|mut node| async move { node.write(req).await })?
            .version)
    }

    fn create_table(&self, t: &NewTable<'_>) -> nearrec::Result<u64> {
        let (init, seed) = match t.init {
            nearrec::Init::Zeros => ("zeros", 0),
            nearrec::Init::Uniform { seed } => ("uniform", seed),
        };
        let req = self.request(pb::CreateTableRequest {
            store: self.store.clone(),
            name: t.name.to_owned(),
            rows: t.rows,
            dim: t.dim,
            dtype: t.dtype.name().to_owned(),
            init: init.to_owned(),
            seed,
        });
        Ok(self
            .call(|mut node| async move { node.create_table(req).await })?
            .version)
    }

    fn drop_table(&self, name: &str) -> nearrec::Result<u64> {
        let req = self.request(pb::DropTableRequest {
            store: self.store.clone(),
            name: name.to_owned(),
        });
        Ok(self
            .call(|mut node| async move { node.drop_table(req).await })?
            .version)
    }

    fn swap(&self, to: &SwapTo, warm: bool, force: bool) -> nearrec::Result<u64> {
        let mut req = pb::SwapRequest {
            store: self.store.clone(),
            warm,
            force,
            ..Default::default()
        };
        match to {
            SwapTo::Path(p) => req.path = p.clone(),
            SwapTo::Version(v) => req.version = *v,
            SwapTo::Previous => req.rollback = true,
        }
        let req = self.request(req);
        Ok(self
            .call(|mut node| async move { node.swap(req).await })?
            .version)
    }

    fn refresh(&self) -> nearrec::Result<u64> {
        self.version()
    }

    fn compact(&self) -> nearrec::Result<Compaction> {
        let req = self.request(pb::CompactRequest {
            store: self.store.clone(),
        });
        let answer = self.call(|mut node| async move { node.compact(req).await })?;
        Ok(convert::uncompaction(answer))
    }

    fn row_digests(&self, table: &str, first: u64, count: u64) -> nearrec::Result<Vec<u64>> {
        let req = self.request(pb::RowDigestsRequest {
            store: self.store.clone(),
            table: table.to_owned(),
            first,
            count,
        });
        let answer = self.call(|mut node| async move { node.row_digests(req).await })?;
        decode(&answer.digests, table, "digests")
    }

    fn stats(&self) -> nearrec::Result<Stats> {
        Ok(self.stats_and_tiers()?.0)
    }

    fn tier_report(&self) -> nearrec::Result<Vec<TierReport>> {
        Ok(self.stats_and_tiers()?.1)
    }

    /// Lets go of this process's connection (calls under way finish); every later call is
    /// `Unavailable`.
    fn close(&self) -> nearrec::Result<()> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).take();
        Ok(())
    }
}

/// A submitted lookup.
#[derive(Debug)]
pub struct Pending {
    runtime: Arc<tokio::runtime::Runtime>,
    task: tokio::task::JoinHandle<Result<Response<pb::LookupResponse>, Status>>,
}

impl Pending {
    fn answer(
        joined: Result<Result<Response<pb::LookupResponse>, Status>, tokio::task::JoinError>,
    ) -> nearrec::Result<Pooled> {
        let answer = joined
            .map_err(|e| unavailable(format!("the call's task failed: {e}")))?
            .map_err(|s| remote(&s))?
            .into_inner();
        convert::unpooled(&answer)
    }
}

impl PendingLookup for Pending {
    fn is_done(&self) -> bool {
        self.task.is_finished()
    }

    fn wait(self: Box<Self>) -> nearrec::Result<Pooled> {
        let answer = self.runtime.block_on(self.task);
        Self::answer(answer)
    }

    fn wait_timeout(
        mut self: Box<Self>,
        timeout: Duration,
    ) -> Result<nearrec::Result<Pooled>, Submitted> {
        let runtime = self.runtime.clone();
        // the timer needs the runtime's context: made inside it
        let task = &mut self.task;
        match runtime.block_on(async { tokio::time::timeout(timeout, task).await }) {
            Ok(answer) => Ok(Self::answer(answer)),
            Err(_) => Err(self),
        }
    }
}
