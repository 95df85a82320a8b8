//! One shard: its replicas, each a storage node's store through a [`Client`], and how a read
//! reaches one of them within the call's deadline.
//!
//! A read goes to the next replica in turn that is not held out. With hedging on, if it has not
//! answered after the hedge delay (the shard's observed p95, or a fixed delay), the same
//! sub-request goes to another replica too: the first answer wins and the other call is
//! dropped, which cancels it on its node (Dean and Barroso, *The Tail at Scale*). A replica that
//! fails a call it could not serve (no connection, overloaded, out of time) is held out for a
//! while and the sub-request goes to the next. When every replica missed, the read waits (50 ms,
//! doubling to 1 s) and tries the replicas there are then — a node that was restarted
//! elsewhere is in the set again once its new address is given ([`Shard::set_replicas`]) —
//! while the deadline allows; past it, or at once without a deadline, the call fails with
//! [`nearrec::Error::Shard`] naming the shard, never with a partial answer.
//!
//! Writes are the router's (`store/writes.rs`, and `txn/` where a shard has several replicas): a
//! replica that failed a write the others took is stale, held out of reads and writes for good
//! (until it is copied again and given anew).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use nearrec::{Error, ErrorKind, StoreApi};
use nearrec_client::{Client, Started};

use crate::committing::Committing;
use crate::etcd::ShardMap;

/// How long a replica that failed a read is held out of reads.
const HOLD_OUT: Duration = Duration::from_secs(1);
/// The sub-request latencies a shard keeps for its hedge delay.
const WINDOW: usize = 512;
/// Reads observed between two computations of the hedge delay's quantile.
const REQUANTILE: usize = 16;

/// When a read is sent to a second replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Hedge {
    Off,
    /// After a fixed delay.
    After(Duration),
    /// After the shard's observed latency at this quantile (`0.95`), at least `min`; until
    /// enough reads are seen, not at all.
    Quantile {
        q: f64,
        min: Duration,
    },
}

impl Hedge {
    /// The least a percentile's hedge waits.
    pub const MIN: Duration = Duration::from_micros(500);

    /// `"off"`, or `"pNN"`: after the shard's observed NN-th percentile (NN in 1 ..= 99), at
    /// least [`Hedge::MIN`].
    pub fn named(name: &str) -> Result<Self, String> {
        if name == "off" {
            return Ok(Hedge::Off);
        }
        match name.strip_prefix('p').and_then(|p| p.parse::<u8>().ok()) {
            Some(p) if (1..100).contains(&p) => Ok(Hedge::Quantile {
                q: f64::from(p) / 100.0,
                min: Self::MIN,
            }),
            _ => Err(format!(
                "hedge {name:?} is not \"off\", \"pNN\" (a percentile) or seconds"
            )),
        }
    }

    /// After a fixed delay of `seconds` (≥ 0).
    pub fn after(seconds: f64) -> Result<Self, String> {
        if seconds >= 0.0 && seconds.is_finite() {
            Ok(Hedge::After(Duration::from_secs_f64(seconds)))
        } else {
            Err(format!("hedge is a delay of seconds ≥ 0, not {seconds}"))
        }
    }
}

/// A shard's counters, as the sharded store reports them.
#[derive(Debug, Default)]
pub struct Counters {
    pub reads: AtomicU64,
    pub hedges: AtomicU64,
    pub hedge_wins: AtomicU64,
    pub retries: AtomicU64,
    pub failures: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct Replica {
    pub client: Client,
    pub addr: String,
    held_out_until: Mutex<Option<Instant>>,
    /// Missed a write the others took, or is no member of the shard: serves no reads.
    stale: AtomicBool,
    /// The shard's epoch when it missed a write, if it did: stale until an epoch past it names
    /// it a member again (it caught up).
    missed_at: Mutex<Option<u64>>,
    /// The last epoch this router learned that named it no member, while it has not been live
    /// since (0: none): an epoch past it that names it is a catch-up's admission.
    out_at: AtomicU64,
    /// Its id in the shard's membership (`members/`; 0 until learned).
    pub id: AtomicU64,
}

impl Replica {
    pub fn new(client: Client, addr: String) -> Self {
        Replica {
            client,
            addr,
            held_out_until: Mutex::new(None),
            stale: AtomicBool::new(false),
            missed_at: Mutex::new(None),
            out_at: AtomicU64::new(0),
            id: AtomicU64::new(0),
        }
    }

    /// Held out of reads at `now`, after a read it could not serve.
    fn held_out(&self, now: Instant) -> bool {
        (self.held_out_until.lock().unwrap()).is_some_and(|until| now < until)
    }

    fn hold_out(&self) {
        *self.held_out_until.lock().unwrap() = Some(Instant::now() + HOLD_OUT);
    }

    /// Missed a write the others took at the shard's membership epoch `epoch`: serves no
    /// reads and takes no writes until an epoch past it names it a member again.
    pub fn mark_stale(&self, epoch: u64) {
        let mut missed = self.missed_at.lock().unwrap();
        *missed = Some(missed.map_or(epoch, |e| e.max(epoch)));
        self.set_stale(true);
    }

    /// Whether it missed a write at epoch `epoch` or later (`mark_stale`).
    pub fn missed_since(&self, epoch: u64) -> bool {
        self.missed_at.lock().unwrap().is_some_and(|e| e >= epoch)
    }

    /// Named no member at `epoch` (as this router learned the shard's membership).
    pub fn left_out_at(&self, epoch: u64) {
        self.out_at.fetch_max(epoch, Ordering::Relaxed);
    }

    /// Named a member at `epoch` after this router learned it was none, and not live since:
    /// only a catch-up names a replica again, once it made the replica's count of writes its
    /// members' under their fence (`members/`).
    pub fn admitted_at(&self, epoch: u64) -> bool {
        let out = self.out_at.load(Ordering::Relaxed);
        out != 0 && out < epoch
    }

    /// Stale (no reads, no writes), or not: as the shard's membership says (`members/`).
    pub fn set_stale(&self, stale: bool) {
        if !stale {
            *self.missed_at.lock().unwrap() = None;
            self.out_at.store(0, Ordering::Relaxed);
        }
        self.stale.store(stale, Ordering::Relaxed);
    }

    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }
}

/// A shard's last [`WINDOW`] sub-request latencies, in a ring, and the quantile the hedge delay
/// is, computed again every [`REQUANTILE`] reads rather than on every read.
#[derive(Debug, Default)]
struct Latencies {
    ring: Vec<Duration>,
    /// Where the next one goes, once the ring is full.
    next: usize,
    /// Reads since `cached` was computed.
    fresh: usize,
    /// The last quantile computed: `q` and its latency (`None` before 32 reads).
    cached: Option<(f64, Option<Duration>)>,
}

impl Latencies {
    fn push(&mut self, took: Duration) {
        if self.ring.len() < WINDOW {
            self.ring.push(took);
        } else {
            self.ring[self.next] = took;
            self.next = (self.next + 1) % WINDOW;
        }
        self.fresh += 1;
    }

    /// The latency at quantile `q` of the window (none before 32 reads). A read the hedge won
    /// is [`Duration::MAX`]: past every delay. When more than `1 − q` of the window is, the
    /// quantile is the longest known latency, so that hedges go on and their answers are
    /// learned from.
    fn quantile(&mut self, q: f64) -> Option<Duration> {
        if let Some((at, delay)) = self.cached
            && at == q
            && self.fresh < REQUANTILE
        {
            return delay;
        }
        let delay = (self.ring.len() >= 32).then(|| {
            let mut sorted = self.ring.clone();
            let known = sorted.iter().filter(|&&d| d < Duration::MAX).count();
            let at = (((sorted.len() - 1) as f64 * q).round() as usize).min(known.checked_sub(1)?);
            Some(*sorted.select_nth_unstable(at).1)
        });
        let delay = delay.flatten();
        (self.cached, self.fresh) = (Some((q, delay)), 0);
        delay
    }
}

/// The floor of a shard's reads: the highest count of writes an answer or a write of the
/// shard carried, at one cluster version (a repository version every shard serves; 0 for a
/// sharded store not served from repositories). Counts of two versions are not comparable (a
/// new version counts its own writes): a count seen at another version than the one read now
/// is no floor, and an answer read at a version the router has moved past raises none.
#[derive(Debug, Default)]
pub(crate) struct Seen(Mutex<(u64, u64)>);

impl Seen {
    /// The least count a read at cluster version `at` may answer.
    pub fn floor(&self, at: u64) -> u64 {
        let (pin, count) = *self.0.lock().unwrap();
        if pin == at { count } else { 0 }
    }

    /// An answer at cluster version `at` carried `count`.
    pub fn saw(&self, at: u64, count: u64) {
        let mut seen = self.0.lock().unwrap();
        if seen.0 == at {
            seen.1 = seen.1.max(count);
        }
    }

    /// A write (of the version served now) made `count`.
    pub fn raise(&self, count: u64) {
        let mut seen = self.0.lock().unwrap();
        seen.1 = seen.1.max(count);
    }

    /// The highest count seen.
    pub fn load(&self) -> u64 {
        self.0.lock().unwrap().1
    }

    /// Reads move to cluster version `at`, whose counts start over, at `count`.
    pub fn repin(&self, at: u64, count: u64) {
        *self.0.lock().unwrap() = (at, count);
    }
}

#[derive(Debug)]
pub(crate) struct Shard {
    pub index: usize,
    /// Replaced whole when a replica moves ([`Shard::set_replicas`]); a call keeps the set it
    /// began with.
    replicas: ArcSwap<Vec<Arc<Replica>>>,
    next: AtomicU64,
    latencies: Mutex<Latencies>,
    pub counters: Counters,
    /// The highest version (count of writes) an answer of this shard carried, at the
    /// cluster version the router reads now.
    pub seen: Seen,
    /// Held by this router's two-phase writes to the shard, taken in shard order.
    writing: Mutex<()>,
    /// This router's commits on their way to the shard after their writes answered.
    pub committing: Committing,
    /// The shard's membership as this router last learned it: the epoch its writes are sent
    /// at, and the members by id (`members/`).
    pub membership: Mutex<(u64, Vec<u64>)>,
    /// Where the membership is decided, when it is kept in etcd (`etcd/`).
    pub etcd: Option<ShardMap>,
}

/// Whether another replica may serve what `e` refused.
fn transient(e: &Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Unavailable | ErrorKind::Overloaded | ErrorKind::DeadlineExceeded
    )
}

impl Shard {
    pub fn new(index: usize, replicas: Vec<Replica>, etcd: Option<ShardMap>) -> Self {
        Shard {
            index,
            replicas: ArcSwap::from_pointee(replicas.into_iter().map(Arc::new).collect()),
            next: AtomicU64::new(0),
            latencies: Mutex::default(),
            counters: Counters::default(),
            seen: Seen::default(),
            writing: Mutex::new(()),
            committing: Committing::default(),
            membership: Mutex::default(),
            etcd,
        }
    }

    /// Serves the shard from `replicas` from the next call on (a replica restarted at another
    /// address, one added).
    pub fn set_replicas(&self, replicas: Vec<Arc<Replica>>) {
        self.replicas.store(Arc::new(replicas));
    }

    /// The replica at `addr`, as it is (held out, stale).
    pub fn replica(&self, addr: &str) -> Option<Arc<Replica>> {
        self.replicas
            .load()
            .iter()
            .find(|r| r.addr == addr)
            .cloned()
    }

    /// Every replica, in order (stale ones too).
    pub fn all_replicas(&self) -> Arc<Vec<Arc<Replica>>> {
        self.replicas.load_full()
    }

    /// The replicas that take writes (not stale), with their places in the list.
    pub fn live_replicas(&self) -> Vec<(usize, Arc<Replica>)> {
        (self.replicas.load().iter().enumerate())
            .filter(|(_, r)| !r.stale.load(Ordering::Relaxed))
            .map(|(k, r)| (k, r.clone()))
            .collect()
    }

    /// The epoch this router's writes to the shard are sent at.
    pub fn epoch(&self) -> u64 {
        self.membership.lock().unwrap().0
    }

    /// The replicas a write goes to: every member of the shard at the epoch this router knows
    /// (every replica at epoch 0), with its place in the list. A member this router holds
    /// stale (it missed a write, and is being left out) is written still: while it is named a
    /// member, another router may read it.
    pub fn write_replicas(&self) -> Vec<(usize, Arc<Replica>)> {
        let (epoch, members) = self.membership.lock().unwrap().clone();
        (self.replicas.load().iter().enumerate())
            .filter(|(_, r)| epoch == 0 || members.contains(&r.id.load(Ordering::Relaxed)))
            .map(|(k, r)| (k, r.clone()))
            .collect()
    }

    /// This shard's turn for one of this router's two-phase writes (`txn/`).
    pub fn lock_writes(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The addresses of the replicas, in order.
    pub fn addresses(&self) -> Vec<String> {
        self.replicas
            .load()
            .iter()
            .map(|r| r.addr.clone())
            .collect()
    }

    /// The replicas to try, in turn from the next one: those not held out first.
    fn order(&self, replicas: &[Arc<Replica>]) -> Vec<usize> {
        let n = replicas.len();
        let from = self.next.fetch_add(1, Ordering::Relaxed) as usize % n;
        let now = Instant::now();
        let mut order: Vec<usize> = (0..n).map(|k| (from + k) % n).collect();
        order.retain(|&r| !replicas[r].stale.load(Ordering::Relaxed));
        order.sort_by_key(|&r| replicas[r].held_out(now));
        order
    }

    fn hedge_delay(&self, hedge: Hedge) -> Option<Duration> {
        match hedge {
            Hedge::Off => None,
            Hedge::After(d) => Some(d),
            Hedge::Quantile { q, min } => {
                let delay = self.latencies.lock().unwrap().quantile(q)?;
                Some(delay.max(min))
            }
        }
    }

    fn observe(&self, took: Duration) {
        self.latencies.lock().unwrap().push(took);
    }

    fn failed(&self, store: &str, why: Vec<String>, kind: ErrorKind) -> Error {
        self.counters.failures.fetch_add(1, Ordering::Relaxed);
        Error::Shard {
            store: store.to_owned(),
            shard: self.index,
            kind,
            reason: if why.is_empty() {
                "no replica is serving reads".into()
            } else {
                format!("no replica answered: {}", why.join("; "))
            },
        }
    }

    /// A read on one replica, hedged and failed over as the module says; `start` begins the
    /// call on a replica's client, `version` is the version an answer was read at. An answer
    /// older than what a read or write of this shard that finished before this read began
    /// saw comes from a replica behind the others: it is not returned (a reader never sees a
    /// write, then the state before it), and the sub-request goes to the next replica.
    ///
    /// `at` is the cluster version the read is pinned to (0: none). A replica that does not
    /// hold it is passed over; when none does, the read fails with `VersionNotServed` at once
    /// (its router moves to the version the shards serve now, and reads again).
    pub async fn read<T>(
        &self,
        store: &str,
        (hedge, at): (Hedge, u64),
        deadline: Option<Instant>,
        start: impl Fn(&Client) -> nearrec::Result<Started<T>>,
        version: impl Fn(&T) -> u64,
    ) -> nearrec::Result<T> {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        // what reads and writes finished before this one began saw: the least it may answer
        let floor = self.seen.floor(at);
        let begun = Instant::now();
        let mut why = Vec::new();
        let mut pause = Duration::from_millis(50);
        loop {
            let round = self.round(store, hedge, deadline, &start, &version, (at, floor), begun);
            match round.await {
                Ok(answer) => return Ok(answer),
                Err(Round::Failed(e)) => return Err(e),
                Err(Round::Missed(mut missed)) => why.append(&mut missed),
            }
            // every replica missed: while the deadline allows, wait for one to come back (a
            // node restarted, at the address it registers), then try them all again
            match deadline {
                Some(d) if Instant::now() + pause < d => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    why.clear();
                }
                _ => break,
            }
        }
        let kind = if deadline.is_some_and(|d| Instant::now() >= d) {
            ErrorKind::DeadlineExceeded
        } else {
            ErrorKind::Unavailable
        };
        Err(self.failed(store, why, kind))
    }

    /// One round of a read over the replicas there are now: the answer, an error no other
    /// replica would answer otherwise, or why each replica missed.
    #[allow(clippy::too_many_arguments)]
    async fn round<T>(
        &self,
        store: &str,
        hedge: Hedge,
        deadline: Option<Instant>,
        start: &impl Fn(&Client) -> nearrec::Result<Started<T>>,
        version: &impl Fn(&T) -> u64,
        (at, floor): (u64, u64),
        begun: Instant,
    ) -> Result<T, Round> {
        let replicas = self.replicas.load_full();
        let order = self.order(&replicas);
        let (mut next, mut hedged) = (0, false);
        let mut why = Vec::new();
        // a replica that does not hold the pinned version: another may (a node restarted
        // serves only the version its repository names)
        let mut not_held = None;
        let mut inflight: Vec<(usize, Started<T>)> = Vec::with_capacity(2);
        loop {
            if inflight.is_empty() {
                if next == order.len() {
                    return Err(match not_held {
                        Some(e) => Round::Failed(e),
                        None => Round::Missed(why),
                    });
                }
                let r = order[next];
                next += 1;
                if next > 1 {
                    self.counters.retries.fetch_add(1, Ordering::Relaxed);
                }
                match start(&replicas[r].client) {
                    Ok(call) => inflight.push((r, call)),
                    Err(e) => {
                        replicas[r].hold_out();
                        why.push(format!("{}: {e}", replicas[r].addr));
                    }
                }
                continue;
            }
            // a hedge once per read, to the next replica, while only one call is out
            let delay = (self.hedge_delay(hedge))
                .filter(|_| !hedged && inflight.len() == 1 && next < order.len());
            let until = deadline.map(tokio::time::Instant::from_std);
            let done = futures::future::select_all(inflight.iter_mut().map(|(_, c)| c));
            let (answer, k) = tokio::select! {
                (answer, k, _) = done => (answer, k),
                _ = hedge_at(delay.map(|d| begun + d)) => {
                    hedged = true;
                    let r = order[next];
                    next += 1;
                    self.counters.hedges.fetch_add(1, Ordering::Relaxed);
                    if let Ok(call) = start(&replicas[r].client) {
                        inflight.push((r, call));
                    }
                    continue;
                }
                _ = sleep_or_never(until) => {
                    let e = self.failed(store, why, ErrorKind::DeadlineExceeded);
                    return Err(Round::Failed(e));
                }
            };
            let (r, _) = inflight.remove(k);
            let replica = &replicas[r];
            match answer {
                Ok(answer) => {
                    let v = version(&answer);
                    if v < floor {
                        why.push(format!(
                            "{}: behind, at version {v} of {floor}",
                            replica.addr
                        ));
                        continue;
                    }
                    self.seen.saw(at, v);
                    // the latency the hedge delay is a quantile of is the first call's: when
                    // the hedge answered first, the first call's is past the delay and not
                    // known, and it counts as past every delay (its time so far, a lower
                    // bound, pulled the quantile down and sent more hedges than it says)
                    if hedged && k > 0 {
                        self.counters.hedge_wins.fetch_add(1, Ordering::Relaxed);
                        self.observe(Duration::MAX);
                    } else {
                        self.observe(begun.elapsed());
                    }
                    return Ok(answer);
                }
                Err(e) if transient(&e) => {
                    replica.hold_out();
                    why.push(format!("{}: {e}", replica.addr));
                }
                Err(e) if e.kind() == ErrorKind::VersionNotServed => {
                    why.push(format!("{}: {e}", replica.addr));
                    not_held = Some(e);
                }
                Err(e) => return Err(Round::Failed(e)),
            }
        }
    }

    /// `f` on every replica that is not stale (compaction: what it changes is not what a
    /// replica serves); the first's answer, or the first error.
    pub fn each<T>(
        &self,
        store: &str,
        f: impl Fn(&Client) -> nearrec::Result<T>,
    ) -> nearrec::Result<T> {
        let mut first = None;
        for r in self.replicas.load().iter() {
            if !r.stale.load(Ordering::Relaxed) {
                let v = f(&r.client)?;
                first.get_or_insert(v);
            }
        }
        first.ok_or_else(|| self.failed(store, Vec::new(), ErrorKind::Unavailable))
    }

    /// A call answered by the first replica that can (info, digests, stats).
    pub fn any<T>(
        &self,
        store: &str,
        f: impl Fn(&Client) -> nearrec::Result<T>,
    ) -> nearrec::Result<T> {
        let mut why = Vec::new();
        let replicas = self.replicas.load_full();
        for r in self.order(&replicas) {
            let replica = &replicas[r];
            match f(&replica.client) {
                Ok(v) => return Ok(v),
                Err(e) if transient(&e) => {
                    replica.hold_out();
                    why.push(format!("{}: {e}", replica.addr));
                }
                Err(e) => return Err(e),
            }
        }
        Err(self.failed(store, why, ErrorKind::Unavailable))
    }

    /// Closes every replica's client.
    pub fn close(&self) {
        for r in self.replicas.load().iter() {
            let _ = r.client.close();
        }
    }
}

/// `f` on every item at once, each on its own thread; the answers in order.
pub(crate) fn on_each<I: Sync, T: Send>(items: &[I], f: impl Fn(&I) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let running: Vec<_> = items.iter().map(|i| s.spawn(move || f(i))).collect();
        running
            .into_iter()
            .map(|h| h.join().expect("a call on a replica panicked"))
            .collect()
    })
}

/// How a round of a read ended without an answer.
enum Round {
    /// An error to return as it is.
    Failed(Error),
    /// Every replica missed (no connection, out of room, behind): why each.
    Missed(Vec<String>),
}

/// Sleeps until `at` to the microsecond, or forever without one: a hedge's delay is a few
/// hundred microseconds to a few milliseconds, and tokio's timer wheel ticks in whole
/// milliseconds (it sent every hedge up to a millisecond late: `bench cluster-hedge`). A
/// timerfd where the system gives one, tokio's timer where it does not.
async fn hedge_at(at: Option<Instant>) {
    let Some(at) = at else {
        return std::future::pending().await;
    };
    match tokio_timerfd::Delay::new(at) {
        // a timer that cannot be read: the hedge goes now
        Ok(delay) => drop(delay.await),
        Err(_) => tokio::time::sleep_until(at.into()).await,
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_or_never(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quantile as the sorted window says, for every count of hedge wins.
    #[test]
    fn the_hedge_quantile_is_the_sorted_windows_and_hedge_wins_are_past_every_delay() {
        let mut l = Latencies::default();
        for k in 0..31 {
            l.push(Duration::from_micros(k));
        }
        assert_eq!(l.quantile(0.95), None, "fewer than 32 reads");
        // a window that wrapped: the last WINDOW reads, some won by hedges
        for k in 0..(WINDOW as u64 + 100) {
            let took = match k % 10 {
                9 => Duration::MAX,
                _ => Duration::from_micros((k * 7919) % 1000),
            };
            l.push(took);
        }
        let mut window = l.ring.clone();
        window.sort_unstable();
        let known = window.partition_point(|&d| d < Duration::MAX);
        for q in [0.5, 0.85, 0.95, 0.99] {
            let at = (((window.len() - 1) as f64 * q).round() as usize).min(known - 1);
            l.fresh = REQUANTILE; // computed now, not cached
            assert_eq!(l.quantile(q), Some(window[at]), "q {q}");
        }
        // cached between computations, computed again after REQUANTILE reads
        let q95 = l.quantile(0.95);
        for _ in 0..REQUANTILE - 1 {
            l.push(Duration::from_secs(1));
        }
        assert_eq!(l.quantile(0.95), q95);
        for _ in 0..WINDOW {
            l.push(Duration::from_secs(1));
        }
        assert_eq!(l.quantile(0.95), Some(Duration::from_secs(1)));
    }
}
