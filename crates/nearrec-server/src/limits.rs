//! What one request, one principal and one slow client may take of the node, beside the
//! connection bounds (`crate::conns`) and the engine's queue (`crate::admission`):
//!
//! - **A request's shape** ([`Shape`]): tables, bags and indices (rows, for a write) in one
//!   request, each within `max_*_per_request`; past one, the request is refused before it is
//!   admitted (`INVALID_ARGUMENT`, naming the table where the count went past the limit).
//! - **A principal's share** ([`Quotas`]): calls open at once (a stream is one call, for as
//!   long as it is open) and connections held, each within `max_*_per_principal`, so that one
//!   client — a retry storm, a leak of connections — cannot take the queue or the connections
//!   from the others. Past one, the call is refused `RESOURCE_EXHAUSTED`, naming the principal
//!   and the limit; the client's retries back off as for a full queue. A principal is the
//!   ACL's; without an ACL, the client's IP address.
//! - **A slow client** ([`slow_requests`]): a unary call's request must arrive whole within
//!   `request_timeout` from its headers; one that trickles in is answered `DEADLINE_EXCEEDED`
//!   and its stream let go. Until its request is whole a call holds no engine slot and no
//!   answer budget, only its own stream; the timeout gives that back too.
//!
//! Each refusal is counted on `/metrics` (`nearrec_refused_total`, reasons `request_shape`,
//! `principal_calls`, `principal_connections`, `slow_request`).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http_body::Frame;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Bytes, http};
use tower::util::MapRequestLayer;

/// How many tables, bags and indices one request may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub tables: usize,
    pub bags: usize,
    pub indices: usize,
}

impl Shape {
    /// Checks a request of `tables`: each table's name, bags and indices (rows). The error
    /// names the table where a count first goes past its limit.
    pub fn check<'a>(
        &self,
        tables: impl ExactSizeIterator<Item = (&'a str, usize, usize)>,
    ) -> nearrec::Result<()> {
        let n = tables.len();
        let (mut bags, mut indices) = (0usize, 0usize);
        let over = |table: &str, what: String| nearrec::Error::InvalidRequest {
            table: Some(table.to_owned()),
            position: None,
            reason: format!("{what}; split it into several requests"),
        };
        for (k, (name, b, i)) in tables.enumerate() {
            if k == self.tables {
                return Err(over(
                    name,
                    format!(
                        "the request has {n} tables, more than the node's \
                         max_tables_per_request ({})",
                        self.tables
                    ),
                ));
            }
            bags = bags.saturating_add(b);
            indices = indices.saturating_add(i);
            if bags > self.bags {
                return Err(over(
                    name,
                    format!(
                        "the request has more than the node's max_bags_per_request ({}) bags",
                        self.bags
                    ),
                ));
            }
            if indices > self.indices {
                return Err(over(
                    name,
                    format!(
                        "the request has more than the node's max_indices_per_request ({}) \
                         indices",
                        self.indices
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What each principal holds now, and what the limits refused.
#[derive(Debug)]
pub struct Quotas {
    max_calls: usize,
    max_connections: usize,
    by: Mutex<Shares>,
    pub refused_calls: AtomicU64,
    pub refused_connections: AtomicU64,
}

/// Each principal's share, and the size past which those no longer held are swept out.
#[derive(Debug, Default)]
struct Shares {
    map: HashMap<String, Share>,
    sweep_at: usize,
}

/// Shares are swept when there are at least this many.
const SWEEP_AT: usize = 64;

/// One principal's calls open and the connections they came on (a connection is held while
/// its [`Connection`] mark lives).
#[derive(Debug, Default)]
struct Share {
    calls: usize,
    connections: Vec<Weak<()>>,
}

/// Which connection a call came on: its mark, alive while the connection is open.
pub type Connection = Weak<()>;

/// A call's place in its principal's share, given back when dropped (when the call ends).
#[derive(Debug)]
pub struct Entered {
    quotas: Arc<Quotas>,
    who: String,
}

impl Quotas {
    pub fn new(max_calls: usize, max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            max_calls,
            max_connections,
            by: Mutex::new(Shares {
                map: HashMap::new(),
                sweep_at: SWEEP_AT,
            }),
            refused_calls: AtomicU64::new(0),
            refused_connections: AtomicU64::new(0),
        })
    }

    /// A call of `who` on `conn` begins: its place, or `RESOURCE_EXHAUSTED` when `who` has
    /// `max_calls` open, or holds `max_connections` others.
    pub fn enter(
        self: &Arc<Self>,
        who: &str,
        conn: Option<&Connection>,
    ) -> Result<Entered, Status> {
        let mut by = self.by.lock().unwrap_or_else(PoisonError::into_inner);
        if by.map.len() >= by.sweep_at {
            // principals (addresses, without an ACL) with no call open and no connection left
            by.map.retain(|_, s| {
                s.connections.retain(|c| c.strong_count() > 0);
                s.calls > 0 || !s.connections.is_empty()
            });
            by.sweep_at = (2 * by.map.len()).max(SWEEP_AT);
        }
        let share = by.map.entry(who.to_owned()).or_default();
        if share.calls >= self.max_calls {
            self.refused_calls.fetch_add(1, Ordering::Relaxed);
            return Err(Status::resource_exhausted(format!(
                "{who} has {} calls open, the node's max_calls_per_principal; retry when one ends",
                share.calls
            )));
        }
        if let Some(conn) = conn
            && !share.connections.iter().any(|c| c.ptr_eq(conn))
        {
            share.connections.retain(|c| c.strong_count() > 0);
            if share.connections.len() >= self.max_connections {
                self.refused_connections.fetch_add(1, Ordering::Relaxed);
                return Err(Status::resource_exhausted(format!(
                    "{who} holds {} connections to the node, its max_connections_per_principal; \
                     send calls on those",
                    share.connections.len()
                )));
            }
            share.connections.push(conn.clone());
        }
        share.calls += 1;
        Ok(Entered {
            quotas: self.clone(),
            who: who.to_owned(),
        })
    }

    /// The calls `who` has open now.
    pub fn calls(&self, who: &str) -> usize {
        let by = self.by.lock().unwrap_or_else(PoisonError::into_inner);
        by.map.get(who).map_or(0, |s| s.calls)
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        let mut by = (self.quotas.by.lock()).unwrap_or_else(PoisonError::into_inner);
        if let Some(share) = by.map.get_mut(&self.who) {
            share.calls -= 1;
            if share.calls == 0 {
                share.connections.retain(|c| c.strong_count() > 0);
                if share.connections.is_empty() {
                    by.map.remove(&self.who);
                }
            }
        }
    }
}

/// The calls whose one request must arrive whole within `timeout`: the node's unary calls. A
/// stream's requests come as its client has them (the node's `LookupStream`, reflection's
/// sessions) and are not timed: an open stream holds only its own call.
fn timed(path: &str) -> bool {
    path.strip_prefix("/nearrec.v1.Node/")
        .is_some_and(|call| call != "LookupStream")
}

/// The layer giving each unary call's request `timeout` to arrive whole, counting in `slow`
/// each that did not.
pub fn slow_requests(
    timeout: Duration,
    slow: Arc<AtomicU64>,
) -> MapRequestLayer<impl Fn(http::Request<Body>) -> http::Request<Body> + Clone> {
    MapRequestLayer::new(move |request: http::Request<Body>| {
        if !timed(request.uri().path()) {
            return request;
        }
        let at = tokio::time::Instant::now() + timeout;
        let slow = slow.clone();
        request.map(|body| {
            Body::new(Arriving {
                body,
                at,
                timer: None,
                timeout,
                slow,
            })
        })
    })
}

/// A request's body, due whole by `at`.
struct Arriving {
    body: Body,
    at: tokio::time::Instant,
    /// Made the first time the body is not all there (most requests arrive in one frame).
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    timeout: Duration,
    slow: Arc<AtomicU64>,
}

impl http_body::Body for Arriving {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        let at = self.at;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        ready!(timer.as_mut().poll(cx));
        self.slow.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
            "the request did not arrive whole within the node's request_timeout ({:?})",
            self.timeout
        )))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shape_past_a_limit_names_the_table_it_went_past_in() {
        let shape = Shape {
            tables: 2,
            bags: 10,
            indices: 100,
        };
        let ok = [("a", 4, 50), ("b", 6, 50)];
        assert!(shape.check(ok.into_iter()).is_ok());
        type Case<'a> = (&'a [(&'a str, usize, usize)], &'a str, &'a str);
        let cases: [Case<'_>; 3] = [
            (&[("a", 1, 1), ("b", 1, 1), ("c", 1, 1)], "c", "3 tables"),
            (
                &[("a", 4, 1), ("b", 7, 1)],
                "b",
                "max_bags_per_request (10)",
            ),
            (
                &[("a", 1, 60), ("b", 1, 41)],
                "b",
                "max_indices_per_request (100)",
            ),
        ];
        for (tables, named, says) in cases {
            let e = shape.check(tables.iter().copied()).unwrap_err();
            assert_eq!(e.kind(), nearrec::ErrorKind::InvalidRequest);
            let nearrec::Error::InvalidRequest { table, reason, .. } = &e else {
                panic!("{e:?}")
            };
            assert_eq!(table.as_deref(), Some(named), "{e}");
            assert!(reason.contains(says), "{e}");
        }
    }

    #[test]
    fn a_principal_past_its_calls_or_connections_is_refused_and_others_are_not() {
        let q = Quotas::new(2, 1);
        let (c1, c2) = (Arc::new(()), Arc::new(()));
        let (w1, w2) = (Arc::downgrade(&c1), Arc::downgrade(&c2));
        let a = q.enter("alice", Some(&w1)).unwrap();
        let b = q.enter("alice", Some(&w1)).unwrap();
        let e = q.enter("alice", Some(&w1)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("2 calls open"), "{e:?}");
        assert!(q.enter("bob", Some(&w2)).is_ok());
        drop(a);
        // a second connection is one more than alice may hold, until the first closes
        let e = q.enter("alice", Some(&w2)).unwrap_err();
        assert!(e.message().contains("1 connections"), "{e:?}");
        drop((b, c1));
        let c = q.enter("alice", Some(&w2)).unwrap();
        assert_eq!(q.calls("alice"), 1);
        assert_eq!(q.refused_calls.load(Ordering::Relaxed), 1);
        assert_eq!(q.refused_connections.load(Ordering::Relaxed), 1);
        drop(c);
        assert_eq!(q.calls("alice"), 0);
        // alice still holds the connection she called on, until it closes
        let c3 = Arc::new(());
        assert!(q.enter("alice", Some(&Arc::downgrade(&c3))).is_err());
        drop(c2);
        assert!(q.enter("alice", Some(&Arc::downgrade(&c3))).is_ok());
    }

    #[test]
    fn principals_with_nothing_held_are_swept_out() {
        let q = Quotas::new(4, 4);
        for k in 0..10 * SWEEP_AT {
            let conn = Arc::new(());
            drop(
                q.enter(&format!("10.0.0.{k}"), Some(&Arc::downgrade(&conn)))
                    .unwrap(),
            );
        }
        assert!(
            q.by.lock().unwrap().map.len() <= SWEEP_AT,
            "the map kept every address"
        );
    }

    #[test]
    fn only_the_nodes_unary_calls_are_timed() {
        assert!(timed("/nearrec.v1.Node/Lookup") && timed("/nearrec.v1.Node/Write"));
        assert!(!timed("/nearrec.v1.Node/LookupStream"));
        assert!(!timed(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        ));
    }
}
