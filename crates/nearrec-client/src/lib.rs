//! A client of the storage node (`nearrec-server`): an implementation of the store's contract,
//! [`nearrec::StoreApi`] — the same batches in, the same [`nearrec::Pooled`] and
//! [`nearrec::Rows`] out, errors as the node named them ([`nearrec::Error::Remote`]: the
//! [`nearrec::ErrorKind`] with its table and position, or the node's own refusal by its code).
//! Calls block the caller; they run on a small runtime of the client's own, over one HTTP/2
//! connection that concurrent calls share (Python's `nearrec.connect` is this client).
//!
//! [`Client::connect`] takes [`ClientOptions`]: a bearer token and a deadline (`grpc-timeout`)
//! sent with every call, TLS ([`ClientTls`]: a CA, a domain, a client certificate), message and
//! connect limits, [`Retry`] and keepalive. A forked child makes its own connection on its first
//! call. A call whose connection failed (a refused handshake, a reset) is `UNAVAILABLE`, saying
//! what failed (`failure.rs`): a connection problem to retry, not an answer of the node's. Calls
//! whose verb allows it (`nearrec_wire::verbs`, the table the node reads too) are made again
//! after `UNAVAILABLE` or `Overloaded`, within their deadline; writes never. Several addresses
//! (comma-separated) are tried in order, and a call that finds its node gone moves the client
//! to the next.
//! Each verb it implements is one call to the node, built and read by `nearrec-wire`'s `convert`;
//! `submit` puts a call in flight and returns a [`Pending`].
//!
//! `tests/contract.rs` runs the store's conformance suite (`nearrec`'s `tests/suite/`) through
//! this client against a node on loopback, so a node's store answers as an embedded one does.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nearrec::{
    Batch, ErrorKind, PendingLookup, Pooled, Read, Rows, Stats, Submitted, SwapTo, TierReport,
    Versioned,
};
use nearrec_wire::v1 as pb;
use nearrec_wire::v1::node_client::NodeClient;
use nearrec_wire::v1::transaction_request::Step;
use nearrec_wire::verbs::Call;
use nearrec_wire::{RemoteError, convert};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Response, Status};

mod contract;
mod failure;

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
    /// How calls that change nothing are made again after a transient refusal.
    pub retry: Retry,
    /// An HTTP/2 ping every this long, idle or not; a node that does not answer one within
    /// `connect_timeout` is taken as gone and the call fails at once instead of waiting for
    /// its deadline (`None`: no pings).
    pub keepalive: Option<Duration>,
    /// The plan id and shard the store must be (a router's replica): sent with every call
    /// ([`nearrec_wire::SHARD_HEADER`]), and a node whose store is another refuses each but
    /// `Info` as `Unavailable` rather than answering as the replica.
    pub shard: Option<(String, usize)>,
}

/// Retries of the calls whose verb says they may be made again (`nearrec_wire::verbs`: lookups,
/// inference, info, stats, digests, a transaction's decision): made again after `UNAVAILABLE`
/// (no connection, a node stopping) or the node's own `RESOURCE_EXHAUSTED` (a full queue:
/// `Overloaded`), after a pause drawn at random below `backoff` × 2^(try − 1), at most
/// `max_backoff` (full jitter, so that clients refused together do not come back together),
/// never past the call's deadline. A write, a table created or dropped, a swap or a compaction
/// is never made again: a call whose connection failed may have been applied, and nothing in
/// it says so.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retry {
    /// Tries in all, the first included (1: none again).
    pub attempts: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            attempts: 4,
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl Retry {
    /// The pause before try `after + 1`, `after` ≥ 1 tries having failed.
    fn pause(&self, after: u32) -> Duration {
        let ceiling = self
            .backoff
            .saturating_mul(1 << (after - 1).min(20))
            .min(self.max_backoff);
        ceiling.mul_f64(fastrand::f64())
    }
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
            retry: Retry::default(),
            keepalive: Some(Duration::from_secs(30)),
            shard: None,
        }
    }
}

/// A connection to one store on one node — or on the first of several nodes serving it that
/// answers, moving to the next when that one stops answering. A forked child process makes
/// its own on its first call (the parent's runtime threads do not exist in it, and its socket
/// is the parent's).
#[derive(Debug, Clone)]
pub struct Client {
    /// Every address the store is served at, in the order they are tried.
    addrs: Vec<String>,
    store: String,
    options: ClientOptions,
    /// `None` once closed.
    conn: Arc<Mutex<Option<Arc<Conn>>>>,
    /// The shard sent with every call: `options.shard`, its plan moved on by
    /// [`Client::set_shard_plan`].
    shard: Arc<std::sync::RwLock<Option<(String, usize)>>>,
}

/// A client's runtime, let go on a thread of its own when its last holder goes inside an async
/// context (a router's call, a caller's own runtime), where tokio refuses to drop a runtime.
#[derive(Debug)]
struct Runtime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for Runtime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("held until dropped")
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                std::thread::spawn(move || drop(runtime));
            } else {
                drop(runtime);
            }
        }
    }
}

/// The runtime and channel of one process, to one of the addresses.
#[derive(Debug)]
struct Conn {
    pid: u32,
    runtime: Arc<Runtime>,
    node: NodeClient<Channel>,
    /// Which of the client's addresses it is connected to.
    at: usize,
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

/// A status from the node at `addr` as the node's error. A call whose connection failed (a TLS
/// handshake refused, a reset) never got an answer from the node: tonic makes it `UNKNOWN`,
/// `UNAVAILABLE` or, from an HTTP/2 error, `INTERNAL` — with the transport's error as its
/// source, which a status the node sent never has. It is `UNAVAILABLE`, saying what failed
/// ([`failure::describe`]), so that it is retried or reported as a connection problem.
fn remote(s: &Status, addr: &str, tls: bool) -> RemoteError {
    let mut e = RemoteError::from(s);
    if matches!(s.code(), Code::Unknown | Code::Internal | Code::Unavailable)
        && e.kind.is_none()
        && let Some(source) = std::error::Error::source(s)
    {
        e.code = Code::Unavailable;
        e.message = failure::describe(addr, tls, source);
    }
    e
}

/// Whether a call refused with `e` may be made again: no connection, a node stopping, a full
/// queue — the node's own refusals, or those it passed on from a store it reaches over the
/// network — never a store's error of the same code (a full delta, memory).
fn transient(e: &RemoteError) -> bool {
    matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Overloaded)
}

impl Conn {
    /// A connection to the first of `addrs` (from `from` on, round the list) that takes one;
    /// else `UNAVAILABLE` saying why each did not.
    fn open(addrs: &[String], from: usize, options: &ClientOptions) -> nearrec::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nearrec-client")
            .enable_all()
            .build()
            .map_err(|e| unavailable(format!("cannot start the client's runtime: {e}")))?;
        let runtime = Arc::new(Runtime(Some(runtime)));
        let mut failed = Vec::new();
        for k in 0..addrs.len() {
            let at = (from + k) % addrs.len();
            match Self::channel(&runtime, &addrs[at], options) {
                Ok(channel) => {
                    let node = NodeClient::new(channel)
                        .max_decoding_message_size(options.max_message_bytes)
                        .max_encoding_message_size(options.max_message_bytes);
                    return Ok(Self {
                        pid: std::process::id(),
                        runtime,
                        node,
                        at,
                    });
                }
                Err(why) => failed.push(why),
            }
        }
        Err(unavailable(if failed.len() == 1 {
            failed.remove(0)
        } else {
            format!(
                "no node of {} answered: {}",
                addrs.join(", "),
                failed.join("; ")
            )
        }))
    }

    /// A channel to `addr`, connected; why not otherwise.
    fn channel(
        runtime: &tokio::runtime::Runtime,
        addr: &str,
        options: &ClientOptions,
    ) -> Result<Channel, String> {
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
            .map_err(|e| format!("{addr:?} is not a node's address: {e}"))?
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(nearrec_wire::STREAM_WINDOW)
            .initial_connection_window_size(nearrec_wire::CONNECTION_WINDOW)
            .max_frame_size(nearrec_wire::MAX_FRAME);
        if let Some(every) = options.keepalive {
            endpoint = endpoint
                .http2_keep_alive_interval(every)
                .keep_alive_timeout(options.connect_timeout)
                .keep_alive_while_idle(true);
        }
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
                .map_err(|e| format!("TLS settings for {addr}: {e}"))?;
        }
        runtime
            .block_on(endpoint.connect())
            .map_err(|e| failure::describe(addr, options.tls.is_some(), &e))
    }
}

impl Client {
    /// Connects to the node at `addr` (`host:port`, or an `http://` URL) for its store `store`
    /// (empty: the node's only store). Several nodes serving the store are given as one
    /// comma-separated `addr`: the client connects to the first that answers, and moves to
    /// the next when a call finds its node gone.
    pub fn connect(addr: &str, store: &str, options: ClientOptions) -> nearrec::Result<Self> {
        let addrs: Vec<String> = addr
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        if addrs.is_empty() {
            return Err(unavailable(format!("{addr:?} names no node's address")));
        }
        let conn = Conn::open(&addrs, 0, &options)?;
        Ok(Self {
            addrs,
            store: store.to_owned(),
            shard: Arc::new(std::sync::RwLock::new(options.shard.clone())),
            options,
            conn: Arc::new(Mutex::new(Some(Arc::new(conn)))),
        })
    }

    /// Sends plan `plan` with every call from now on, for the shard it named (a router whose
    /// plan moved on: a change of the sharded store's tables); nothing where it names none.
    pub fn set_shard_plan(&self, plan: &str) {
        let mut shard = self.shard.write().unwrap_or_else(|p| p.into_inner());
        if let Some((at, _)) = shard.as_mut() {
            *at = plan.to_owned();
        }
    }

    /// The address of the node the client is connected to now.
    pub fn address(&self) -> String {
        let held = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let at = held.as_ref().map_or(0, |c| c.at);
        self.addrs[at].clone()
    }

    /// After `broken` (this process's connection) found its node gone: the next address that
    /// answers, when there are several (one address: its channel reconnects by itself).
    fn fail_over(&self, broken: &Arc<Conn>) {
        if self.addrs.len() < 2 {
            return;
        }
        let mut held = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let Some(conn) = held.as_mut() else { return };
        if !Arc::ptr_eq(conn, broken) {
            return; // another call moved it already
        }
        if let Ok(next) = Conn::open(&self.addrs, broken.at + 1, &self.options) {
            // the old runtime may be inside this very call's stack: let it go on its own
            let old = std::mem::replace(conn, Arc::new(next));
            std::thread::spawn(move || drop(old));
        }
    }

    /// This process's connection: made again in a forked child; `Unavailable` once closed.
    fn conn(&self) -> nearrec::Result<Arc<Conn>> {
        let mut held = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let Some(conn) = held.as_mut() else {
            // (not `describe`: it takes this lock)
            return Err(unavailable(format!(
                "this client of the node at {} was closed",
                self.addrs.join(", ")
            )));
        };
        if conn.pid != std::process::id() {
            let fresh = Arc::new(Conn::open(&self.addrs, conn.at, &self.options)?);
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

    /// `message` with the token and what is left of the call's deadline.
    fn request<T>(&self, message: T, deadline: Option<Instant>) -> Request<T> {
        let mut r = Request::new(message);
        if let Some(d) = deadline {
            // at least a millisecond: a zero grpc-timeout is refused as passed, which it is
            r.set_timeout(
                d.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            );
        }
        if let Some(token) = &self.options.token
            && let Ok(v) = format!("Bearer {token}").parse()
        {
            r.metadata_mut().insert("authorization", v);
        }
        if let Some((plan, shard)) = &*self.shard.read().unwrap_or_else(|p| p.into_inner())
            && let Ok(v) = nearrec_wire::shard_header(plan, *shard).parse()
        {
            r.metadata_mut().insert(nearrec_wire::SHARD_HEADER, v);
        }
        r
    }

    /// A transaction's request of `step`, with nothing else set.
    fn transaction(&self, tx: u128, step: Step) -> pb::TransactionRequest {
        pb::TransactionRequest {
            store: self.store.clone(),
            tx: convert::tx(tx),
            step: step as i32,
            ..Default::default()
        }
    }

    /// One call of `message`'s RPC on this process's connection. A call its verb says may be
    /// made again (`nearrec_wire::verbs`: it changes nothing, or done twice it is done once) is
    /// made again after a transient refusal, as [`Retry`] says, within the deadline the first
    /// try set; a connection found gone moves the client to its next address, if it has several.
    fn call<M: Call>(&self, message: M) -> nearrec::Result<M::Reply> {
        let deadline = self.options.timeout.map(|t| Instant::now() + t);
        let again = message.verb().retry;
        let mut tries = 0;
        loop {
            let conn = self.conn()?;
            let request = self.request(message.clone(), deadline);
            let status = match conn.runtime.block_on(M::send(conn.node.clone(), request)) {
                Ok(answer) => return Ok(answer.into_inner()),
                Err(s) => s,
            };
            let e = remote(&status, &self.addrs[conn.at], self.options.tls.is_some());
            tries += 1;
            if e.code == Code::Unavailable {
                self.fail_over(&conn);
            }
            if !again || !transient(&e) || tries >= self.options.retry.attempts {
                return Err(e.into());
            }
            let pause = self.options.retry.pause(tries);
            if deadline.is_some_and(|d| Instant::now() + pause >= d) {
                return Err(e.into());
            }
            std::thread::sleep(pause);
        }
    }

    /// A lookup of `batch` (its rows when `raw`), at version `at` of the store's repository
    /// when one is given.
    fn lookup_request(&self, batch: &Batch<'_>, raw: bool, at: Option<u64>) -> pb::LookupRequest {
        pb::LookupRequest {
            store: self.store.clone(),
            tables: convert::tables(batch),
            raw,
            id: 0,
            at_version: at.unwrap_or(0),
            expect: Vec::new(),
            out_dtype: convert::out_dtype(batch.out).into(),
        }
    }

    /// Starts a lookup of `batch` on the client's runtime, made once: a future of its pooled
    /// answer, the version it was read at and its rows' last writers. Dropping it cancels the
    /// call (the node sees the stream reset). What a router awaits many of at once, hedging
    /// and failing over itself. With `at`, the node answers as that version of its repository
    /// does, or refuses (`Versions::lookup_version`); `expect`: transactions the answer must
    /// include (a replica holding one prepared waits for it).
    pub fn start_lookup(
        &self,
        batch: &Batch<'_>,
        at: Option<u64>,
        deadline: Option<Instant>,
        expect: &[u128],
    ) -> nearrec::Result<Started<Answered<Pooled>>> {
        let conn = self.conn()?;
        let req = pb::LookupRequest {
            expect: expect.iter().map(|&t| convert::tx(t)).collect(),
            ..self.lookup_request(batch, false, at)
        };
        Ok(self.start(&conn, req, deadline, |a| {
            Answered::of(a, convert::unpooled(a)?)
        }))
    }

    /// [`Client::start_lookup`] of each table's distinct rows (`StoreApi::lookup_rows`).
    pub fn start_lookup_rows(
        &self,
        batch: &Batch<'_>,
        at: Option<u64>,
        deadline: Option<Instant>,
        expect: &[u128],
    ) -> nearrec::Result<Started<Answered<Vec<Rows>>>> {
        let conn = self.conn()?;
        let req = pb::LookupRequest {
            expect: expect.iter().map(|&t| convert::tx(t)).collect(),
            ..self.lookup_request(batch, true, at)
        };
        Ok(self.start(&conn, req, deadline, |a| {
            Answered::of(a, convert::unraw(a)?)
        }))
    }

    fn start<T: 'static>(
        &self,
        conn: &Conn,
        req: pb::LookupRequest,
        deadline: Option<Instant>,
        answer: fn(&pb::LookupResponse) -> nearrec::Result<T>,
    ) -> Started<T> {
        let req = self.request(req, deadline);
        let mut node = conn.node.clone();
        Started {
            task: conn.runtime.spawn(async move { node.lookup(req).await }),
            addr: self.addrs[conn.at].clone(),
            tls: self.options.tls.is_some(),
            answer,
        }
    }

    /// A swap's call, or a stage's.
    fn swap_call(
        &self,
        to: &SwapTo,
        warm: bool,
        force: bool,
        stage: bool,
    ) -> nearrec::Result<pb::SwapResponse> {
        let mut req = pb::SwapRequest {
            store: self.store.clone(),
            warm,
            force,
            stage,
            ..Default::default()
        };
        match to {
            SwapTo::Path(p) => req.path = p.clone(),
            SwapTo::Version(v) => req.version = *v,
            SwapTo::Previous => req.rollback = true,
        }
        self.call(req)
    }

    /// A pooled lookup's call.
    fn pooled(&self, req: pb::LookupRequest) -> nearrec::Result<(Pooled, Read)> {
        let answer = self.call(req)?;
        let read = Read {
            version: answer.version,
            ..Read::default()
        };
        Ok((convert::unpooled(&answer)?, read))
    }

    /// A raw lookup's call.
    fn rows(&self, req: pb::LookupRequest) -> nearrec::Result<Versioned<Vec<Rows>>> {
        let answer = self.call(req)?;
        Ok((convert::unraw(&answer)?, answer.version))
    }

    fn stats_and_tiers(&self) -> nearrec::Result<(Stats, Vec<TierReport>)> {
        let req = pb::StatsRequest {
            store: self.store.clone(),
        };
        let answer = self.call(req)?;
        Ok(convert::unstats(answer))
    }
}

/// A node's answer to a lookup started on a client ([`Client::start_lookup`]).
#[derive(Debug)]
pub struct Answered<T> {
    pub value: T,
    /// The store's version it was read at.
    pub version: u64,
    /// The transactions that last wrote the rows read, lately (a replica whose shard writes in
    /// two phases; `nearrec::WRITERS_KEPT`).
    pub writers: Vec<nearrec::LastWriter>,
}

impl<T> Answered<T> {
    fn of(answer: &pb::LookupResponse, value: T) -> nearrec::Result<Self> {
        Ok(Self {
            value,
            version: answer.version,
            writers: convert::unwriters(answer)?,
        })
    }
}

/// A lookup under way on a client's runtime ([`Client::start_lookup`]): a future of its answer,
/// the call cancelled when it is dropped unfinished.
pub struct Started<T> {
    task: tokio::task::JoinHandle<Result<Response<pb::LookupResponse>, Status>>,
    /// The node it went to, and whether over TLS, to say what failed.
    addr: String,
    tls: bool,
    answer: fn(&pb::LookupResponse) -> nearrec::Result<T>,
}

impl<T> std::fmt::Debug for Started<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Started").field("addr", &self.addr).finish()
    }
}

impl<T> Started<T> {
    /// The node's address it went to.
    pub fn address(&self) -> &str {
        &self.addr
    }

    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl<T> Future for Started<T> {
    type Output = nearrec::Result<T>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.task).poll(cx).map(|joined| {
            let answer = joined
                .map_err(|e| unavailable(format!("the call's task failed: {e}")))?
                .map_err(|s| remote(&s, &self.addr, self.tls))?
                .into_inner();
            (self.answer)(&answer)
        })
    }
}

impl<T> Drop for Started<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A submitted lookup (made once: a caller keeping lookups in flight retries as it sees fit).
#[derive(Debug)]
pub struct Pending {
    runtime: Arc<Runtime>,
    started: Started<Pooled>,
}

impl PendingLookup for Pending {
    fn is_done(&self) -> bool {
        self.started.is_finished()
    }

    fn wait(mut self: Box<Self>) -> nearrec::Result<Pooled> {
        let runtime = self.runtime.clone();
        runtime.block_on(&mut self.started)
    }

    fn wait_timeout(
        mut self: Box<Self>,
        timeout: Duration,
    ) -> Result<nearrec::Result<Pooled>, Submitted> {
        let runtime = self.runtime.clone();
        // the timer needs the runtime's context: made inside it
        let started = &mut self.started;
        match runtime.block_on(async { tokio::time::timeout(timeout, started).await }) {
            Ok(answer) => Ok(answer),
            Err(_) => Err(self),
        }
    }
}
