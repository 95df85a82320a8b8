//! The node's connections, bounded: what a flood of idle or slow clients cannot take from the
//! clients already served.
//!
//! - **Descriptors.** [`raise_nofile`] lifts the soft `RLIMIT_NOFILE` to the hard one at start
//!   (the common soft limit, 1,024, is what a thousand idle connections exhaust); where even
//!   the hard limit is low, the connection cap comes down to fit under it ([`RESERVED_FDS`]
//!   kept for the rest), so that accepting never runs out of descriptors.
//! - **A cap.** At most `max_connections` are open; one past it is accepted and closed at once,
//!   so that its client fails fast instead of waiting in the kernel's backlog (counted).
//! - **Accept errors back off.** `EMFILE` and kin are retried after 5 ms, doubling to 1 s, not
//!   at once (tonic's own loop retries them hot: 14.5 s of CPU in 12 s under the probe).
//! - **Deadlines.** A plaintext connection has `handshake_timeout` to send the HTTP/2 preface
//!   (TLS: the TLS handshake has it, enforced by tonic); after that, one that sends nothing for
//!   `idle_timeout` is closed. The node pings (HTTP/2 keepalive, half the idle timeout), so a
//!   live client answers and stays; a dead one, or one stuck halfway through a frame — which
//!   cannot answer a ping — goes.
//! - **Unsent answers.** Each connection carries a budget of answer bytes ([`ConnInfo`]); the
//!   service reserves an answer's bytes from it and from the node's before computing it, and
//!   gives them back once the answer has left (`crate::send`): a client that stops reading
//!   (an HTTP/2 window of 0) pins at most its budget, never the node's memory.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Bytes of the HTTP/2 client preface (RFC 9113 §3.4).
const PREFACE_BYTES: usize = 24;
/// The first and the longest wait after a failed `accept`.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));
/// How often a repeated refusal or accept error is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// Descriptors kept for what is not a connection (the stores' files, io_uring, the metrics
/// endpoint, logs) when the limit on open descriptors caps the connections.
pub const RESERVED_FDS: usize = 128;
/// The unit answer budgets are counted in (a semaphore's permits).
pub const BUDGET_UNIT: usize = 1024;

/// What bounds the node's connections (`crate::NodeConfig` holds them).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
    /// Bytes of answers one connection may have computed and not yet sent.
    pub unsent_bytes_per_connection: usize,
    /// Whether tonic runs TLS over these connections (it then times the handshake).
    pub tls: bool,
}

/// What the node's connections did, for `/metrics`.
#[derive(Debug, Default)]
pub struct ConnStats {
    pub open: AtomicU64,
    pub accepted: AtomicU64,
    /// Closed at once: the node had `max_connections` open.
    pub refused: AtomicU64,
    /// Closed for silence: no preface within the handshake timeout, nothing within the idle one.
    pub timed_out: AtomicU64,
    pub accept_errors: AtomicU64,
}

/// Lifts the soft limit on open descriptors to the hard one; returns the soft limit now.
pub fn raise_nofile() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit / setrlimit write and read the one struct passed
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: as above
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
    }
    Ok(lim.rlim_cur)
}

/// The connections a listener accepts, within [`Limits`]: the stream a tonic server serves.
#[derive(Debug)]
pub struct Incoming {
    listener: TcpListener,
    limits: Limits,
    slots: Arc<Semaphore>,
    stats: Arc<ConnStats>,
    backoff: Option<Pin<Box<Sleep>>>,
    delay: Duration,
    logged: Option<Instant>,
}

impl Incoming {
    pub fn new(listener: TcpListener, limits: Limits, stats: Arc<ConnStats>) -> Self {
        Self {
            listener,
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            stats,
            backoff: None,
            delay: BACKOFF.0,
            logged: None,
        }
    }

    /// Whether a repeated event should be logged now (at most once per [`LOG_EVERY`]).
    fn log_now(&mut self) -> bool {
        let now = Instant::now();
        let due = self.logged.is_none_or(|t| now >= t + LOG_EVERY);
        if due {
            self.logged = Some(now);
        }
        due
    }
}

impl Stream for Incoming {
    type Item = io::Result<Connection>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(wait) = self.backoff.as_mut() {
                ready!(wait.as_mut().poll(cx));
                self.backoff = None;
            }
            match ready!(self.listener.poll_accept(cx)) {
                Ok((stream, _)) => {
                    self.delay = BACKOFF.0;
                    let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                        self.stats.refused.fetch_add(1, Ordering::Relaxed);
                        if self.log_now() {
                            tracing::warn!(
                                max = self.limits.max_connections,
                                "connections refused: the node has its most open \
                                 (--max-connections)"
                            );
                        }
                        continue; // dropped: closed at once
                    };
                    // answers leave at once: without TCP_NODELAY a small answer waits on the
                    // client's delayed ACK (~40 ms on Linux)
                    let _ = stream.set_nodelay(true);
                    self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                    let conn = Connection::new(stream, slot, self.limits, self.stats.clone());
                    return Poll::Ready(Some(Ok(conn)));
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => {
                    // out of descriptors or memory: wait for some to come back
                    self.stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                    if self.log_now() {
                        tracing::warn!("accepting connections failed, backing off: {e}");
                    }
                    let delay = self.delay;
                    self.backoff = Some(Box::pin(tokio::time::sleep(delay)));
                    self.delay = (delay * 2).min(BACKOFF.1);
                }
            }
        }
    }
}

/// What a request learns of its connection (its `ConnectInfo`, in the request's extensions).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub tcp: TcpConnectInfo,
    /// The connection's budget of unsent answer bytes, in [`BUDGET_UNIT`]s.
    pub answers: Arc<Semaphore>,
    /// Alive while the connection is open: what a principal's connections are counted by
    /// (`crate::limits`).
    pub mark: crate::limits::Connection,
}

/// One accepted connection: the socket, its place among the node's connections, its deadline.
#[derive(Debug)]
pub struct Connection {
    io: TcpStream,
    info: ConnInfo,
    /// Preface bytes still to come before the handshake deadline gives way to the idle one.
    owed: usize,
    deadline: Pin<Box<Sleep>>,
    idle: Duration,
    stats: Arc<ConnStats>,
    _slot: OwnedSemaphorePermit,
    /// [`ConnInfo::mark`]'s, held while the connection is open.
    _mark: Arc<()>,
}

impl Connection {
    fn new(
        io: TcpStream,
        slot: OwnedSemaphorePermit,
        limits: Limits,
        stats: Arc<ConnStats>,
    ) -> Self {
        let mark = Arc::new(());
        let info = ConnInfo {
            tcp: io.connect_info(),
            answers: Arc::new(Semaphore::new(
                limits.unsent_bytes_per_connection / BUDGET_UNIT,
            )),
            mark: Arc::downgrade(&mark),
        };
        // under TLS, tonic times the handshake and the preface comes inside it
        let (owed, first) = if limits.tls {
            (0, limits.idle_timeout)
        } else {
            (PREFACE_BYTES, limits.handshake_timeout)
        };
        stats.open.fetch_add(1, Ordering::Relaxed);
        Self {
            io,
            info,
            owed,
            deadline: Box::pin(tokio::time::sleep(first)),
            idle: limits.idle_timeout,
            stats,
            _slot: slot,
            _mark: mark,
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connected for Connection {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n > 0 {
                    self.owed = self.owed.saturating_sub(n);
                    if self.owed == 0 {
                        let at = tokio::time::Instant::now() + self.idle;
                        self.deadline.as_mut().reset(at);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                ready!(self.deadline.as_mut().poll(cx));
                self.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                let what = if self.owed > 0 {
                    "no HTTP/2 preface within the handshake timeout"
                } else {
                    "nothing received within the idle timeout"
                };
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
            }
            failed => failed,
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
