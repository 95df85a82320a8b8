//! Tail latency by design: a request waits for one of `max_in_flight` engine slots in a queue of
//! at most `max_queued`; past that it is refused at once (`RESOURCE_EXHAUSTED`), never queued
//! without bound. A request whose deadline (the client's `grpc-timeout`) passes while it waits
//! is dropped before it costs a device read (`DEADLINE_EXCEEDED`). A request keeps its place in
//! the queue until its answer has left the node, not only until it is computed, and reserves its
//! answer's bytes from its connection's budget and the node's ([`Admission::reserve`]) before
//! it runs: answers a client does not read pin at most those budgets. The engine slots, and the
//! CPU turns of large DRAM-resident work, go to waiting requests in fair order between principals
//! (`crate::fair`), each weighted by its ACL weight and charged by its request's cost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nearrec_wire::verbs::VERBS;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use crate::conns::BUDGET_UNIT;
use crate::fair::{FairQueue, Ticket, Turn};
use crate::metrics::Metrics;

/// The node's admission: queue slots and engine slots, with what each refused.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    /// The engine slots (`max_in_flight`).
    running: Arc<FairQueue>,
    /// The CPU turns of large DRAM-resident work (`crate::fair`).
    cpu: Arc<FairQueue>,
    max_in_flight: usize,
    max_queued: usize,
    /// Requests refused because the queue was full.
    pub overloaded: AtomicU64,
    /// Requests whose deadline passed before they reached the engine.
    pub expired: AtomicU64,
    /// The node's budget of unsent answer bytes, in [`BUDGET_UNIT`]s.
    unsent: Arc<Semaphore>,
    unsent_bytes: usize,
    /// Requests refused because their answer's bytes were not free.
    pub unsent_full: AtomicU64,
}

/// An answer's bytes reserved from the node's budget and its connection's, given back when
/// dropped (once the answer has left).
#[derive(Debug)]
pub struct Reserved {
    _node: OwnedSemaphorePermit,
    _conn: Option<OwnedSemaphorePermit>,
}

/// What a request holds until its answer has left the node: its place in the queue, its
/// answer's bytes.
#[derive(Debug, Default)]
pub struct Held {
    pub slot: Option<Slot>,
    pub bytes: Option<Reserved>,
}

impl From<Slot> for Held {
    fn from(slot: Slot) -> Self {
        Self {
            slot: Some(slot),
            bytes: None,
        }
    }
}

/// Held while a request runs: its queue slot, its engine slot and, for DRAM-resident work,
/// its CPU turn.
#[derive(Debug)]
pub struct Permit {
    slot: Slot,
    _run: Turn,
    _cpu: Option<Turn>,
}

impl Permit {
    /// Gives the engine slot back and keeps the place in the node, until the answer leaves.
    pub fn ran(self) -> Slot {
        self.slot
    }
}

/// A request's place in the node, held from its admission to its answer.
#[derive(Debug)]
pub struct Slot {
    _held: OwnedSemaphorePermit,
}

impl Admission {
    /// `unsent_bytes`: the most bytes of answers the node holds computed and not yet sent;
    /// `cpu_turns`: large DRAM-resident jobs run at once (0: one per core the node may run on).
    pub fn new(
        max_in_flight: usize,
        max_queued: usize,
        unsent_bytes: usize,
        cpu_turns: usize,
    ) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpu_turns = if cpu_turns == 0 { cores } else { cpu_turns };
        Self {
            unsent: Arc::new(Semaphore::new(unsent_bytes / BUDGET_UNIT)),
            unsent_bytes,
            unsent_full: AtomicU64::new(0),
            slots: Arc::new(Semaphore::new(max_in_flight + max_queued)),
            running: FairQueue::new(max_in_flight),
            cpu: FairQueue::new(cpu_turns),
            max_in_flight,
            max_queued,
            overloaded: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// Waits for an engine slot and, for DRAM-resident work (`cpu`), a CPU turn — each in fair
    /// order between principals, `ticket` saying whose and what it costs — until `deadline`;
    /// or refuses at once when the queue is full.
    pub async fn admit(
        &self,
        deadline: Option<Instant>,
        ticket: &Ticket,
        cpu: bool,
    ) -> Result<Permit, Status> {
        let slot = self.enter()?;
        let turns = async {
            let run = self.engine(ticket).await;
            let cpu = match cpu {
                true => Some(self.cpu.turn(ticket).await),
                false => None,
            };
            (run, cpu)
        };
        let (run, cpu) = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), turns)
                .await
                .map_err(|_| self.expire())?,
            None => turns.await,
        };
        Ok(Permit {
            slot,
            _run: run,
            _cpu: cpu,
        })
    }

    /// Reserves `bytes` of answer from the node's budget and from `conn`'s (the connection's,
    /// where the request came over one the node accepted), or refuses at once
    /// (`RESOURCE_EXHAUSTED`, retryable): answers computed earlier have not been read.
    pub fn reserve(&self, bytes: usize, conn: Option<&Arc<Semaphore>>) -> Result<Reserved, Status> {
        let units = u32::try_from(bytes.div_ceil(BUDGET_UNIT).max(1)).unwrap_or(u32::MAX);
        let full = |whose: &str, budget: usize| {
            self.unsent_full.fetch_add(1, Ordering::Relaxed);
            Status::resource_exhausted(format!(
                "{whose} holds its most bytes of answers not yet read by their clients \
                 ({budget}); this answer of {bytes} bytes waits for them: read the answers, \
                 then retry"
            ))
        };
        let conn = match conn {
            Some(c) => Some(c.clone().try_acquire_many_owned(units).map_err(|_| {
                full(
                    "this connection",
                    c.available_permits() * BUDGET_UNIT, // a lower bound: what was free
                )
            })?),
            None => None,
        };
        let node = self
            .unsent
            .clone()
            .try_acquire_many_owned(units)
            .map_err(|_| full("the node", self.unsent_bytes))?;
        Ok(Reserved {
            _node: node,
            _conn: conn,
        })
    }

    /// A place in the node, or `RESOURCE_EXHAUSTED` at once when every one is taken.
    pub fn enter(&self) -> Result<Slot, Status> {
        match self.slots.clone().try_acquire_owned() {
            Ok(held) => Ok(Slot { _held: held }),
            Err(_) => {
                self.overloaded.fetch_add(1, Ordering::Relaxed);
                Err(Status::resource_exhausted(format!(
                    "the node is full: {} requests running and {} waiting; retry later",
                    self.max_in_flight, self.max_queued
                )))
            }
        }
    }

    /// One of the `max_in_flight` engine slots, in its turn.
    pub async fn engine(&self, ticket: &Ticket) -> Turn {
        self.running.turn(ticket).await
    }

    /// Counts a request dropped at its deadline and answers it.
    pub fn expire(&self) -> Status {
        self.expired.fetch_add(1, Ordering::Relaxed);
        Status::deadline_exceeded("the request's deadline passed before the node could serve it")
    }

    /// Requests running or waiting now.
    pub fn in_flight(&self) -> usize {
        self.max_in_flight + self.max_queued - self.slots.available_permits()
    }
}

/// The deadline a request's `grpc-timeout` header sets, from `start` (the gRPC spec: at most 8
/// digits and a unit, `H` `M` `S` `m` `u` `n`). A malformed header is ignored, as grpc-go does.
pub fn deadline(metadata: &tonic::metadata::MetadataMap, start: Instant) -> Option<Instant> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    start.checked_add(timeout(value)?)
}

/// A `grpc-timeout` value's duration.
fn timeout(value: &str) -> Option<std::time::Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let d = match unit {
        "H" => std::time::Duration::from_secs(n.checked_mul(3600)?),
        "M" => std::time::Duration::from_secs(n.checked_mul(60)?),
        "S" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_millis(n),
        "u" => std::time::Duration::from_micros(n),
        "n" => std::time::Duration::from_nanos(n),
        _ => return None,
    };
    Some(d)
}

/// The resolution of tokio's timers, to which tonic rounds a call's `grpc-timeout` up.
const TIMER_RESOLUTION: Duration = Duration::from_millis(1);

/// The layer of [`Expired`].
#[derive(Debug, Clone)]
pub struct ExpiredLayer(pub Arc<Admission>, pub Metrics);

impl<S> tower::Layer<S> for ExpiredLayer {
    type Service = Expired<S>;

    fn layer(&self, inner: S) -> Expired<S> {
        Expired {
            inner,
            admission: self.0.clone(),
            metrics: self.1.clone(),
        }
    }
}

/// The call a request's path names (`/nearrec.v1.Node/Lookup` → `Lookup`, one of the table of
/// verbs' RPCs, or the health service's `Check`), `"other"` for one the node does not serve.
fn call_of(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or("");
    let rpcs = VERBS.iter().map(|v| v.rpc).chain(["Check"]);
    rpcs.into_iter().find(|c| *c == name).unwrap_or("other")
}

/// Answers a call whose `grpc-timeout` has passed when it arrives, or will within the timers'
/// resolution (`0n`, `1n`, `0m`), with `DEADLINE_EXCEEDED` at once, before its body is read
/// (counted as [`Admission::expire`] counts). Without it tonic's own timer — outside every
/// layer of the node's — fires first on such a call and answers `CANCELLED`, while `0S` came
/// back `DEADLINE_EXCEEDED`: one deadline, two codes.
#[derive(Debug, Clone)]
pub struct Expired<S> {
    inner: S,
    admission: Arc<Admission>,
    metrics: Metrics,
}

type HttpResponse = tonic::codegen::http::Response<tonic::body::Body>;

impl<S, B> tower::Service<tonic::codegen::http::Request<B>> for Expired<S>
where
    S: tower::Service<tonic::codegen::http::Request<B>, Response = HttpResponse>,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = tower::BoxError;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<HttpResponse, tower::BoxError>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let left = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(timeout);
        if left.is_some_and(|d| d <= TIMER_RESOLUTION) {
            let call = call_of(req.uri().path());
            let code = tonic::Code::DeadlineExceeded;
            self.metrics.call(call, code, 0.0, 0, 0);
            let answer = self.admission.expire().into_http();
            return Box::pin(std::future::ready(Ok(answer)));
        }
        let call = self.inner.call(req);
        Box::pin(async move { call.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;

    fn with(v: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("grpc-timeout", v.parse().unwrap());
        m
    }

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        let t = Instant::now();
        assert_eq!(
            deadline(&with("250m"), t),
            Some(t + Duration::from_millis(250))
        );
        assert_eq!(deadline(&with("3S"), t), Some(t + Duration::from_secs(3)));
        assert_eq!(
            deadline(&with("1H"), t),
            Some(t + Duration::from_secs(3600))
        );
        assert_eq!(
            deadline(&with("99999999u"), t),
            Some(t + Duration::from_micros(99_999_999))
        );
        for bad in ["", "m", "123456789m", "12x", "-1m", "1.5S"] {
            let m = if bad.is_empty() {
                MetadataMap::new()
            } else {
                with(bad)
            };
            assert_eq!(deadline(&m, t), None, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_a_waiting_request_expires() {
        let a = Admission::new(1, 1, 1 << 20, 1);
        let t = Ticket::new("p".into(), 1.0, 1.0);
        let running = a.admit(None, &t, false).await.unwrap();
        // one waits (and expires at its deadline), the next finds the queue full
        let soon = Instant::now() + Duration::from_millis(30);
        let (waiting, refused) = tokio::join!(a.admit(Some(soon), &t, false), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            a.admit(None, &t, false).await
        });
        assert_eq!(waiting.unwrap_err().code(), tonic::Code::DeadlineExceeded);
        assert_eq!(refused.unwrap_err().code(), tonic::Code::ResourceExhausted);
        assert_eq!(a.expired.load(Ordering::Relaxed), 1);
        assert_eq!(a.overloaded.load(Ordering::Relaxed), 1);
        assert_eq!(a.in_flight(), 1);
        drop(running);
        assert!(a.admit(None, &t, true).await.is_ok());
    }

    #[test]
    fn unsent_answers_are_bounded_per_connection_and_per_node() {
        let a = Admission::new(1, 1, 4 << 20, 0);
        let conn = Arc::new(Semaphore::new((3 << 20) / BUDGET_UNIT));
        let first = a.reserve(2 << 20, Some(&conn)).unwrap();
        let refused = a.reserve(2 << 20, Some(&conn)).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("this connection"),
            "{}",
            refused.message()
        );
        // another connection meets the node's bound
        let other = a.reserve(2 << 20, None).unwrap();
        let refused = a.reserve(1, None).unwrap_err();
        assert!(
            refused.message().contains("the node"),
            "{}",
            refused.message()
        );
        assert_eq!(a.unsent_full.load(Ordering::Relaxed), 2);
        drop((first, other));
        assert!(a.reserve(3 << 20, Some(&conn)).is_ok());
    }
}
