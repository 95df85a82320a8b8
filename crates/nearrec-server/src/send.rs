//! The `send` stage of `nearrec_request_seconds`: a unary answer timed from the moment its
//! handler returned it (the [`Answered`] mark `NodeService::observed` puts on it) until the last
//! frame of its body was handed to the connection — encoding the message and waiting for
//! HTTP/2 flow control. The same layer keeps what a request [`Hold`]s — its place in the node's
//! queue, its answer's reserved bytes (`crate::admission`) — until that last frame is taken or
//! the answer is dropped (its client gone). A layer over the whole server; answers with
//! neither (streams, health, reflection) pass untouched.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http_body::{Frame, SizeHint};
use tonic::body::Body;
use tonic::codegen::{Bytes, http};
use tower::util::MapResponseLayer;

use crate::admission::Held;
use crate::metrics::Metrics;

/// A unary call's answer, ready at `at`.
#[derive(Debug, Clone, Copy)]
pub struct Answered {
    pub call: &'static str,
    pub at: Instant,
}

/// What an answer holds until it has left, put in its extensions by the call that made it (an
/// extension must be `Clone`: the layer takes what it holds out once).
#[derive(Debug, Clone)]
pub struct Hold(Arc<Mutex<Option<Held>>>);

impl Hold {
    pub fn new(held: Held) -> Self {
        Self(Arc::new(Mutex::new(Some(held))))
    }

    fn take(&self) -> Option<Held> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// The layer that times marked answers into `metrics` and keeps what they hold until sent.
pub fn layer(
    metrics: Metrics,
) -> MapResponseLayer<impl Fn(http::Response<Body>) -> http::Response<Body> + Clone> {
    MapResponseLayer::new(move |response: http::Response<Body>| {
        let answered = response.extensions().get::<Answered>().copied();
        let held = response.extensions().get::<Hold>().and_then(Hold::take);
        if answered.is_none() && held.is_none() {
            return response;
        }
        let metrics = metrics.clone();
        response.map(|body| {
            Body::new(Timed {
                body,
                answered,
                held,
                metrics,
            })
        })
    })
}

/// A body that observes its answer's `send` stage when its last frame is taken, and lets go
/// of what it holds then (or when it is dropped).
struct Timed {
    body: Body,
    answered: Option<Answered>,
    held: Option<Held>,
    metrics: Metrics,
}

impl http_body::Body for Timed {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        // a unary answer ends with its trailers (grpc-status)
        let last = match &frame {
            Some(Ok(f)) => f.is_trailers() || self.body.is_end_stream(),
            Some(Err(_)) | None => true,
        };
        if last {
            if let Some(a) = self.answered.take() {
                self.metrics
                    .stage(a.call, "send", a.at.elapsed().as_secs_f64());
            }
            self.held = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
