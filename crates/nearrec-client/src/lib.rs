//! A client of the storage node (`nearrec-server`) with the local store's shape: the same
//! batches in, the same [`nearrec::Pooled`] and [`nearrec::Rows`] out, errors as the node named
//! them ([`RemoteError`]: the [`nearrec::ErrorKind`] with its table and position, or the node's
//! own refusal by its code). Calls block the caller; they run on a small runtime of the
//! client's own, over one HTTP/2 connection that concurrent calls share (Python's
//! `nearrec.connect` is this client).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nearrec::{AsBatch, Batch, Pooled, RowWrite, Rows};
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
    conn: Arc<Mutex<Arc<Conn>>>,
}

/// The runtime and channel of one process.
#[derive(Debug)]
struct Conn {
    pid: u32,
    runtime: Arc<tokio::runtime::Runtime>,
    node: NodeClient<Channel>,
}

/// A call the client could not make: no connection, a bad address.
fn unavailable(message: String) -> RemoteError {
    RemoteError {
        code: Code::Unavailable,
        kind: None,
        message,
        table: None,
        position: None,
    }
}

fn local(e: nearrec::Error) -> RemoteError {
    RemoteError {
        code: nearrec_wire::status::code_of(e.kind()),
        kind: Some(e.kind()),
        message: e.to_string(),
        table: e.table().map(str::to_owned),
        position: e.position(),
    }
}

/// A status as the node's error. A call whose connection failed (a TLS handshake refused, a
/// reset) never got an answer from the node: tonic makes it `UNKNOWN` or, from an HTTP/2 error,
/// `INTERNAL` — both with the transport's error as their source, which a status the node sent
/// never has. It is `UNAVAILABLE`, with the transport's reasons, so that it is retried or
/// reported as a connection problem.
fn remote(s: &Status) -> RemoteError {
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
    e
}

/// An answer and the version of the store it read.
pub type Versioned<T> = (T, u64);

impl Conn {
    fn open(addr: &str, options: &ClientOptions) -> Result<Self, RemoteError> {
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
    pub fn connect(addr: &str, store: &str, options: ClientOptions) -> Result<Self, RemoteError> {
        let conn = Conn::open(addr, &options)?;
        Ok(Self {
            addr: addr.to_owned(),
            store: store.to_owned(),
            options,
            conn: Arc::new(Mutex::new(Arc::new(conn))),
        })
    }

    /// This process's connection: made again in a forked child.
    fn conn(&self) -> Result<Arc<Conn>, RemoteError> {
        let mut held = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if held.pid != std::process::id() {
            let fresh = Arc::new(Conn::open(&self.addr, &self.options)?);
            // the parent's runtime would wait for threads this process does not have: its
            // memory is left as it is
            std::mem::forget(std::mem::replace(&mut *held, fresh));
        }
        Ok(held.clone())
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
    fn call<T, F, Fut>(&self, f: F) -> Result<T, RemoteError>
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

    /// Pools `batch` on the node: the `[batch, Σ dim]` output and the version it read.
    pub fn lookup(&self, batch: &Batch<'_>) -> Result<Versioned<Pooled>, RemoteError> {
        let req = self.request(self.lookup_request(batch, false));
        let answer = self.call(|mut node| async move { node.lookup(req).await })?;
        Ok((convert::unpooled(&answer).map_err(local)?, answer.version))
    }

    /// Each table's distinct rows `batch` reads, and the version they were read at.
    pub fn lookup_rows(&self, batch: &Batch<'_>) -> Result<Versioned<Vec<Rows>>, RemoteError> {
        let req = self.request(self.lookup_request(batch, true));
        let answer = self.call(|mut node| async move { node.lookup(req).await })?;
        Ok((convert::unraw(&answer).map_err(local)?, answer.version))
    }

    /// Starts a lookup and returns at once; batches submitted together are in flight together
    /// on the one connection (RM_send_inputs / RM_read_outputs).
    pub fn submit<B: AsBatch>(&self, batch: B) -> Result<Pending, RemoteError> {
        let req = self.request(self.lookup_request(&batch.as_batch(), false));
        let conn = self.conn()?;
        let mut node = conn.node.clone();
        let task = conn.runtime.spawn(async move { node.lookup(req).await });
        Ok(Pending {
            runtime: conn.runtime.clone(),
            task,
        })
    }

    /// The model kept with the store, run on the node: `(outputs, batch, width)`.
    pub fn infer(
        &self,
        dense: &[f32],
        batch: &Batch<'_>,
    ) -> Result<(Vec<f32>, usize, usize), RemoteError> {
        let req = self.request(pb::InferRequest {
            store: self.store.clone(),
            dense: encode_slice(dense),
            tables: convert::tables(batch),
        });
        let answer = self.call(|mut node| async move { node.infer(req).await })?;
        let outputs: Vec<f32> = decode(&answer.outputs, "", "outputs").map_err(local)?;
        Ok((outputs, answer.batch as usize, answer.width as usize))
    }

    /// EMB_WRITE of several tables in one atomic call; the version that holds it.
    pub fn write_many(
        &self,
        writes: &[RowWrite<'_>],
        allow_nonfinite: bool,
    ) -> Result<u64, RemoteError> {
        let mut removes = writes.iter().filter(|w| w.values.is_none());
        if let Some(w) = removes.next() {
            // the protocol's removes are their own call
            if writes.len() == 1 {
                return self.remove(w.table, w.ids);
            }
            return Err(local(nearrec::Error::InvalidRequest {
                table: Some(w.table.to_owned()),
                position: None,
                reason: "a remote write_many writes rows; remove them with remove()".into(),
            }));
        }
        let req = self.request(pb::WriteRequest {
            store: self.store.clone(),
            writes: writes
                .iter()
                .map(|w| pb::TableRows {
                    table: w.table.to_owned(),
                    ids: encode_slice(w.ids),
                    rows: encode_slice(w.values.unwrap_or_default()),
                })
                .collect(),
            allow_nonfinite,
        });
        Ok(self
            .call(|mut node| async move { node.write(req).await })?
            .version)
    }

    /// EMB_REMOVE of rows; the version that holds it.
    pub fn remove(&self, table: &str, ids: &[i64]) -> Result<u64, RemoteError> {
        let req = self.request(pb::RemoveRequest {
            store: self.store.clone(),
            table: table.to_owned(),
            ids: encode_slice(ids),
        });
        Ok(self
            .call(|mut node| async move { node.remove(req).await })?
            .version)
    }

    /// RM_create_table on the node.
    pub fn create_table(
        &self,
        name: &str,
        rows: u64,
        dim: u32,
        dtype: &str,
        init: &str,
        seed: u64,
    ) -> Result<u64, RemoteError> {
        let req = self.request(pb::CreateTableRequest {
            store: self.store.clone(),
            name: name.to_owned(),
            rows,
            dim,
            dtype: dtype.to_owned(),
            init: init.to_owned(),
            seed,
        });
        Ok(self
            .call(|mut node| async move { node.create_table(req).await })?
            .version)
    }

    /// EMB_REMOVE of a table on the node.
    pub fn drop_table(&self, name: &str) -> Result<u64, RemoteError> {
        let req = self.request(pb::DropTableRequest {
            store: self.store.clone(),
            name: name.to_owned(),
        });
        Ok(self
            .call(|mut node| async move { node.drop_table(req).await })?
            .version)
    }

    /// The store at `path` on the node's file system served from the next request on.
    pub fn swap(&self, path: &str, warm: bool, force: bool) -> Result<u64, RemoteError> {
        let req = self.request(pb::SwapRequest {
            store: self.store.clone(),
            path: path.to_owned(),
            warm,
            force,
        });
        Ok(self
            .call(|mut node| async move { node.swap(req).await })?
            .version)
    }

    /// What the store holds.
    pub fn info(&self) -> Result<pb::InfoResponse, RemoteError> {
        let req = self.request(pb::InfoRequest {
            store: self.store.clone(),
        });
        self.call(|mut node| async move { node.info(req).await })
    }

    /// The store's counters.
    pub fn stats(&self) -> Result<pb::StatsResponse, RemoteError> {
        let req = self.request(pb::StatsRequest {
            store: self.store.clone(),
        });
        self.call(|mut node| async move { node.stats(req).await })
    }
}

/// A submitted lookup.
#[derive(Debug)]
pub struct Pending {
    runtime: Arc<tokio::runtime::Runtime>,
    task: tokio::task::JoinHandle<Result<Response<pb::LookupResponse>, Status>>,
}

impl Pending {
    pub fn is_done(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the answer.
    pub fn wait(self) -> Result<Versioned<Pooled>, RemoteError> {
        let answer = self.runtime.block_on(self.task);
        Self::answer(answer)
    }

    /// Waits at most `timeout` for the answer; `Err(self)` if it has not come.
    pub fn wait_timeout(
        mut self,
        timeout: Duration,
    ) -> Result<Result<Versioned<Pooled>, RemoteError>, Self> {
        let runtime = self.runtime.clone();
        // the timer needs the runtime's context: made inside it
        let task = &mut self.task;
        match runtime.block_on(async { tokio::time::timeout(timeout, task).await }) {
            Ok(answer) => Ok(Self::answer(answer)),
            Err(_) => Err(self),
        }
    }

    fn answer(
        joined: Result<Result<Response<pb::LookupResponse>, Status>, tokio::task::JoinError>,
    ) -> Result<Versioned<Pooled>, RemoteError> {
        let answer = joined
            .map_err(|e| unavailable(format!("the call's task failed: {e}")))?
            .map_err(|s| remote(&s))?
            .into_inner();
        Ok((convert::unpooled(&answer).map_err(local)?, answer.version))
    }
}
