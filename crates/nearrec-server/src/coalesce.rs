//! Concurrent small pooled lookups on one store, run as one engine batch (`nearrec::coalesce`):
//! one route, one fan-out to the workers and one set of device reads for all of them. Only
//! lookups that read a device coalesce (`crate::stores::inline`: a DRAM-resident lookup costs
//! its transport, not the engine, and runs at once; measured in `nearrec bench serve`).
//!
//! A request of fewer than `coalesce_bags` bags takes its place in the node (the same queue
//! slots as every request, so a full node still refuses it) and joins its store's gatherer. The
//! gatherer waits for an engine slot — requests pile up meanwhile — then takes every request
//! already waiting and, until `coalesce_window` after the first arrived, those that come, up to
//! `coalesce_bags` bags, and runs them on a blocking thread as one batch per [`Shape`]. Each
//! request keeps its own deadline and answer: one whose deadline passed or whose client left is
//! dropped before the batch runs, and a batch that fails runs its requests alone, so that each
//! error names its own table and positions. Requests pinned to a version of the store's
//! repository (a sharded store's sub-requests) run together only with requests pinned to the
//! same version, and at it.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nearrec::{AsBatch, OwnedBatch, Pooled, Shape, Stages, StoreApi, coalesce};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use crate::admission::{Admission, Slot};
use crate::metrics::Metrics;
use crate::stores::pooled;

/// A pooled answer and the store version it was read at.
pub type Answer = Result<(Pooled, u64), Status>;

/// One store's gatherer; started by the first request that joins it.
#[derive(Debug)]
pub struct Coalescer {
    store: Arc<dyn StoreApi>,
    admission: Arc<Admission>,
    metrics: Metrics,
    bags: usize,
    window: Duration,
    tx: OnceLock<mpsc::UnboundedSender<Waiting>>,
}

/// A request waiting in a gatherer.
struct Waiting {
    call: &'static str,
    batch: OwnedBatch,
    /// The version it is pinned to (`Versions::lookup_version`).
    at: Option<u64>,
    bags: usize,
    deadline: Option<Instant>,
    arrived: Instant,
    reply: oneshot::Sender<Answer>,
    _slot: Slot,
}

impl Coalescer {
    /// `bags` 0: nothing coalesces.
    pub fn new(
        store: Arc<dyn StoreApi>,
        admission: Arc<Admission>,
        metrics: Metrics,
        bags: usize,
        window: Duration,
    ) -> Self {
        Self {
            store,
            admission,
            metrics,
            bags,
            window,
            tx: OnceLock::new(),
        }
    }

    /// Whether a request of `bags` bags joins the gatherer (larger ones run alone).
    pub fn takes(&self, bags: usize) -> bool {
        bags < self.bags
    }

    /// `batch` pooled with whatever joins it, at version `at` of the store's repository when
    /// one is given; `DEADLINE_EXCEEDED` once `deadline` passes.
    pub async fn lookup(
        &self,
        call: &'static str,
        (batch, at): (OwnedBatch, Option<u64>),
        bags: usize,
        deadline: Option<Instant>,
    ) -> Answer {
        let slot = self.admission.enter()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(self.admission.expire());
        }
        let (reply, answer) = oneshot::channel();
        let waiting = Waiting {
            call,
            batch,
            at,
            bags,
            deadline,
            arrived: Instant::now(),
            reply,
            _slot: slot,
        };
        if self.sender().send(waiting).is_err() {
            return Err(Status::unavailable("the node is stopping"));
        }
        let answer = match deadline {
            Some(d) => match tokio::time::timeout_at(d.into(), answer).await {
                Ok(a) => a,
                Err(_) => return Err(self.admission.expire()),
            },
            None => answer.await,
        };
        // a request the gatherer dropped had passed its deadline
        answer.unwrap_or_else(|_| match deadline {
            Some(d) if Instant::now() >= d => Err(self.admission.expire()),
            _ => Err(Status::internal("a coalesced batch was dropped")),
        })
    }

    fn sender(&self) -> &mpsc::UnboundedSender<Waiting> {
        self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(gather(
                rx,
                self.store.clone(),
                self.admission.clone(),
                self.metrics.clone(),
                self.bags,
                self.window,
            ));
            tx
        })
    }
}

/// A coalesced engine batch's ticket: its own principal, charged its first request's bags.
fn coalesced(bags: usize) -> crate::fair::Ticket {
    crate::fair::Ticket::new(
        "coalesced lookups".into(),
        1.0,
        crate::fair::cost(bags as u64),
    )
}

/// The gatherer: one engine batch at a time per free engine slot, until the node drops it.
async fn gather(
    mut rx: mpsc::UnboundedReceiver<Waiting>,
    store: Arc<dyn StoreApi>,
    admission: Arc<Admission>,
    metrics: Metrics,
    max_bags: usize,
    window: Duration,
) {
    let mut next = None;
    loop {
        let first = match next.take() {
            Some(w) => w,
            None => match rx.recv().await {
                Some(w) => w,
                None => return,
            },
        };
        // a coalesced batch is many principals' small lookups: charged as one of its own
        let run = admission.engine(&coalesced(first.bags)).await;
        let until = first.arrived + window;
        let mut bags = first.bags;
        let mut group = vec![first];
        while bags < max_bags {
            let w = match rx.try_recv() {
                Ok(w) => w,
                Err(mpsc::error::TryRecvError::Empty) if Instant::now() < until => {
                    match tokio::time::timeout_at(until.into(), rx.recv()).await {
                        Ok(Some(w)) => w,
                        _ => break,
                    }
                }
                Err(_) => break,
            };
            if bags + w.bags > max_bags {
                next = Some(w);
                break;
            }
            bags += w.bags;
            group.push(w);
        }
        let (store, metrics) = (store.clone(), metrics.clone());
        tokio::task::spawn_blocking(move || {
            let _run = run;
            serve(&*store, group, &metrics);
        });
    }
}

/// What requests that run as one batch share: their shape and the version they are pinned to.
type Kind = (Shape, Option<u64>);

/// Runs a gathered group: the live requests by shape and pinned version, each as one batch.
fn serve(store: &dyn StoreApi, group: Vec<Waiting>, metrics: &Metrics) {
    let now = Instant::now();
    let mut shapes: Vec<(Kind, Vec<Waiting>)> = Vec::new();
    for w in group {
        metrics.stage(w.call, "queue", (now - w.arrived).as_secs_f64());
        // dropped unanswered: the request's own wait answers DEADLINE_EXCEEDED
        if w.reply.is_closed() || w.deadline.is_some_and(|d| now >= d) {
            continue;
        }
        let shape = (Shape::of(&w.batch), w.at);
        match shapes.iter_mut().find(|(s, _)| *s == shape) {
            Some((_, ws)) => ws.push(w),
            None => shapes.push((shape, vec![w])),
        }
    }
    for (_, ws) in shapes {
        let start = Instant::now();
        metrics.batch_requests.observe(ws.len() as f64);
        // each request of a coalesced batch spent the batch's stages
        let answers: Vec<(Answer, Stages)> = match together(store, &ws) {
            Some((answers, stages)) => answers.into_iter().map(|a| (a, stages)).collect(),
            None => ws.iter().map(|w| alone(store, &w.batch, w.at)).collect(),
        };
        let seconds = start.elapsed().as_secs_f64();
        for (w, (answer, stages)) in ws.into_iter().zip(answers) {
            metrics.stage(w.call, "engine", seconds);
            if answer.is_ok() {
                metrics.stages(w.call, &stages);
            }
            let _ = w.reply.send(answer);
        }
    }
}

/// One request's answer, run by itself, and where its time went.
fn alone(store: &dyn StoreApi, batch: &OwnedBatch, at: Option<u64>) -> (Answer, Stages) {
    match pooled(store, &batch.as_batch(), at) {
        Ok((pooled, read)) => (Ok((pooled, read.version)), read.stages),
        Err(e) => (Err(nearrec_wire::status_of(&e)), Stages::default()),
    }
}

/// The group's answers from one engine batch and where its time went; `None` when they cannot
/// run as one (or the batch fails, so that each runs alone and meets its own error).
fn together(store: &dyn StoreApi, ws: &[Waiting]) -> Option<(Vec<Answer>, Stages)> {
    let parts: Vec<&OwnedBatch> = ws.iter().map(|w| &w.batch).collect();
    let merged = coalesce(&parts)?;
    let (pooled, read) = pooled(store, &merged.batch.as_batch(), ws[0].at).ok()?;
    let answers = pooled
        .split(&merged.bags)
        .into_iter()
        .map(|p| Ok((p, read.version)))
        .collect();
    Some((answers, read.stages))
}
