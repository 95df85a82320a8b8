//! The `send` stage of `nearrec_request_seconds`: a unary answer timed from the moment its
//! handler returned it (the [`Answered`] mark `NodeService::observed` puts on it) until the last
//! frame of its body was handed to the connection — encoding the message and waiting for
//! HTTP/2 flow control. A layer over the whole server; answers without the mark (streams,
//! health, reflection) pass untouched.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http_body::{Frame, SizeHint};
use tonic::body::Body;
use tonic::codegen::{Bytes, http};
use tower::util::MapResponseLayer;

use crate::metrics::Metrics;

/// A unary call's answer, ready at `at`.
#[derive(Debug, Clone, Copy)]
pub struct Answered {
    pub call: &'static str,
    pub at: Instant,
}

/// The layer that times marked answers into `metrics`.
pub fn layer(
    metrics: Metrics,
) -> MapResponseLayer<impl Fn(http::Response<Body>) -> http::Response<Body> + Clone> {
    MapResponseLayer::new(move |response: http::Response<Body>| {
        let Some(answered) = response.extensions().get::<Answered>().copied() else {
            return response;
        };
        let metrics = metrics.clone();
        response.map(|body| {
            Body::new(Timed {
                body,
                answered: Some(answered),
                metrics,
            })
        })
    })
}

/// A body that observes its answer's `send` stage when its last frame is taken.
struct Timed {
    body: Body,
    answered: Option<Answered>,
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
        if last && let Some(a) = self.answered.take() {
            self.metrics
                .stage(a.call, "send", a.at.elapsed().as_secs_f64());
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
