//! Fair shares of the node's work between principals: start-time fair queueing (SFQ, Goyal, Vin
//! and Cheng, SIGCOMM 1996) of a pool of turns, each request tagged by its cost over its
//! principal's weight.
//!
//! A request of principal `p` and cost `c` (its ids, [`cost`]) starts at `S = max(V, F[p])` and
//! finishes at `F[p] = S + c / w[p]`, where `V` is the start tag of the request served last and
//! `w[p]` the principal's weight (the ACL's `weight`, 1 by default). A free turn goes to the
//! waiting request of the lowest start tag. So each principal with requests waiting gets its
//! weight's share of the turns' work, whatever it sends; a principal that sends little finds
//! its requests tagged ahead of a greedy one's backlog, and waits for the requests running and
//! at most one of each other principal's; an idle principal banks no credit (its tag restarts
//! at `V`).
//!
//! The node keeps two pools ([`crate::admission::Admission`]): its engine slots
//! (`max_in_flight`), which every call takes, and the CPU turns that large DRAM-resident
//! lookups and inferences take — as many as the node's cores — so that the jobs that run at
//! once on those cores are chosen fairly, rather than time-sliced by the kernel among every
//! principal's threads; small lookups run at once on the async worker that decoded them.
//! A turn is given back when dropped; a request given up while it waits (its deadline, a
//! cancelled call) never holds one.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::sync::oneshot;

/// A request's cost before its ids: what decoding, admitting and answering any call costs, as
/// ids of pooling (measured on the DRAM tier: a call of 1,024 ids spends about as long outside
/// the pooling as in it).
pub const CALL_COST: u64 = 1024;

/// A request's cost: [`CALL_COST`] and its ids (a lookup's, or a write's rows).
pub fn cost(ids: u64) -> f64 {
    (CALL_COST + ids) as f64
}

/// Who a request is charged to and how much.
#[derive(Debug, Clone)]
pub struct Ticket {
    /// The principal (without an ACL, the client's address).
    pub who: Arc<str>,
    /// Its share: work is split between principals with requests waiting in proportion.
    pub weight: f64,
    /// The request's cost ([`cost`]).
    pub cost: f64,
}

impl Ticket {
    /// A request of `who` (share `weight`) that costs `cost`.
    pub fn new(who: Arc<str>, weight: f64, cost: f64) -> Self {
        Self { who, weight, cost }
    }
}

/// A pool of turns handed out in start-tag order (see the module's doc).
#[derive(Debug)]
pub struct FairQueue {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    /// The start tag of the request given a turn last (SFQ's virtual time).
    now: f64,
    /// Each principal's last finish tag.
    finish: HashMap<Arc<str>, f64>,
    waiting: BinaryHeap<Reverse<Waiter>>,
    /// Ties between equal tags go to the earlier request.
    seq: u64,
}

#[derive(Debug)]
struct Waiter {
    start: f64,
    seq: u64,
    given: oneshot::Sender<()>,
}

impl PartialEq for Waiter {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Waiter {}

impl PartialOrd for Waiter {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiter {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.start.total_cmp(&other.start)).then(self.seq.cmp(&other.seq))
    }
}

/// Principals' finish tags are swept of the idle ones (tag behind the virtual time: they would
/// restart at it anyway) past this many.
const SWEEP_AT: usize = 256;

impl FairQueue {
    /// A pool of `turns` turns (at least one).
    pub fn new(turns: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: turns.max(1),
                now: 0.0,
                finish: HashMap::new(),
                waiting: BinaryHeap::new(),
                seq: 0,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A turn for `ticket`'s request: at once if one is free and no request waits, else once
    /// the turns free before it go to the requests tagged ahead of it.
    pub fn turn(self: &Arc<Self>, ticket: &Ticket) -> Waiting {
        let mut s = self.lock();
        if s.finish.len() >= SWEEP_AT {
            let now = s.now;
            s.finish.retain(|_, f| *f > now);
        }
        let last = s.finish.get(&ticket.who).copied().unwrap_or(0.0);
        let start = s.now.max(last);
        let finish = start + ticket.cost / ticket.weight;
        s.finish.insert(ticket.who.clone(), finish);
        if s.free > 0 && s.waiting.is_empty() {
            s.free -= 1;
            s.now = start;
            return Waiting {
                queue: self.clone(),
                given: None,
            };
        }
        let (given, rx) = oneshot::channel();
        let seq = s.seq;
        s.seq += 1;
        s.waiting.push(Reverse(Waiter { start, seq, given }));
        Waiting {
            queue: self.clone(),
            given: Some(rx),
        }
    }

    /// A turn given back: to the waiting request of the lowest start tag that still waits.
    fn release(&self) {
        let mut s = self.lock();
        while let Some(Reverse(w)) = s.waiting.pop() {
            if w.given.send(()).is_ok() {
                s.now = s.now.max(w.start);
                return;
            }
        }
        s.free += 1;
    }

    /// Requests waiting for a turn now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }
}

/// A request waiting for its turn (a future of [`Turn`]); dropped before its turn comes, it
/// leaves the queue, and a turn given to it meanwhile goes on to the next.
#[derive(Debug)]
pub struct Waiting {
    queue: Arc<FairQueue>,
    /// `None`: the turn is this request's already.
    given: Option<oneshot::Receiver<()>>,
}

impl Future for Waiting {
    type Output = Turn;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Turn> {
        if let Some(rx) = &mut self.given {
            match Pin::new(rx).poll(cx) {
                Poll::Pending => return Poll::Pending,
                // the queue never drops a sender it has not sent on
                Poll::Ready(_) => self.given = None,
            }
        }
        Poll::Ready(Turn {
            queue: Some(self.queue.clone()),
        })
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut rx) = self.given.take() {
            rx.close();
            // given a turn between its last poll and now: it goes on to the next request
            if rx.try_recv().is_ok() {
                self.queue.release();
            }
        }
    }
}

/// A turn, held while a request runs; given back when dropped.
#[derive(Debug)]
pub struct Turn {
    queue: Option<Arc<FairQueue>>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(q) = self.queue.take() {
            q.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ticket(who: &str, weight: f64, ids: u64) -> Ticket {
        Ticket::new(who.into(), weight, cost(ids))
    }

    /// The order `q`'s one turn is taken in by `queued` requests queued behind a running one:
    /// each `(principal, weight, ids)`.
    async fn order_on(q: &Arc<FairQueue>, queued: &[(&str, f64, u64)]) -> Vec<String> {
        let first = q.turn(&ticket("x", 1.0, 0)).await;
        let served = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for &(who, w, ids) in queued {
            let waiting = q.turn(&ticket(who, w, ids));
            let (served, who) = (served.clone(), who.to_owned());
            tasks.push(tokio::spawn(async move {
                let turn = waiting.await;
                served.lock().unwrap().push(who);
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(turn);
            }));
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        Arc::try_unwrap(served).unwrap().into_inner().unwrap()
    }

    async fn order(queued: &[(&str, f64, u64)]) -> Vec<String> {
        order_on(&FairQueue::new(1), queued).await
    }

    #[tokio::test]
    async fn a_small_request_goes_ahead_of_a_greedy_backlog() {
        let mut queued = vec![("greedy", 1.0, 16_384); 6];
        queued.push(("good", 1.0, 1_024));
        let served = order(&queued).await;
        // behind at most the greedy request tagged at the same start, never its backlog
        let at = served.iter().position(|w| w == "good").unwrap();
        assert!(at <= 1, "{served:?}");
    }

    #[tokio::test]
    async fn turns_follow_the_weights_and_each_principal_keeps_its_order() {
        // equal costs: two of a to one of b with weights 2 and 1
        let mut queued = vec![("a", 2.0, 1_000); 8];
        queued.extend(vec![("b", 1.0, 1_000); 8]);
        let served = order(&queued).await;
        let first = &served[..9];
        let a = first.iter().filter(|w| *w == "a").count();
        assert!((5..=7).contains(&a), "{served:?}");
    }

    #[tokio::test]
    async fn a_request_given_up_while_it_waits_holds_no_turn() {
        let q = FairQueue::new(1);
        let running = q.turn(&ticket("a", 1.0, 10)).await;
        let given_up = q.turn(&ticket("b", 1.0, 10));
        let next = q.turn(&ticket("c", 1.0, 10));
        assert_eq!(q.waiting(), 2);
        drop(given_up);
        drop(running);
        let turn = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .unwrap();
        drop(turn);
        // and the pool is whole again
        let (a, b) = (q.turn(&ticket("a", 1.0, 1)), q.turn(&ticket("b", 1.0, 1)));
        let a = tokio::time::timeout(Duration::from_secs(5), a)
            .await
            .unwrap();
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), b)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn an_idle_principal_banks_no_credit() {
        let q = FairQueue::new(1);
        // b alone for a long while: its tags, and the virtual time, run far ahead
        for _ in 0..100 {
            drop(q.turn(&ticket("b", 1.0, 10_000)).await);
        }
        // then a arrives: it starts at the virtual time, not at zero, so it does not take
        // every turn until it has caught up with b's past
        let mut queued = vec![("b", 1.0, 10_000); 4];
        queued.extend(vec![("a", 1.0, 10_000); 4]);
        let served = order_on(&q, &queued).await;
        let b = served[..4].iter().filter(|w| *w == "b").count();
        assert!((1..=3).contains(&b), "{served:?}");
    }
}
