//! A write's commits after it answered: the other replicas' ([`Rest`], sent on a thread of the
//! router's once the decider committed), counted per shard ([`crate::committing::Committing`]) so that the
//! router's own next calls can wait for them.

use std::sync::Arc;
use std::time::Duration;

use nearrec::{Decision, ErrorKind, Replica as _};

use super::{At, Coordinator, Share, e_shard, leave_out, shard_error};
use crate::shard::{Replica, Shard, on_each};

/// A transaction its decider committed, and the other replicas that prepared it: their commits
/// are what is left. Sent after the call answered ([`Rest::send`]): the call is committed from
/// the decider's commit on, and until a replica's commit lands its lookups of the rows wait
/// for it, as for any transaction prepared before them (`docs/distributed.md`, "Reads while
/// writes go on"), so no read through any router sees the write in part or goes back.
pub(super) struct Rest {
    store: String,
    all: Arc<[Shard]>,
    pin: u64,
    tx: u128,
    decider: Arc<Replica>,
    /// The decider's shard, and the count of writes its commit made there.
    decided: (usize, u64),
    /// Every other replica that prepared it.
    ready: Vec<(At, Arc<Replica>)>,
}

impl Rest {
    /// What is left of transaction `tx` once its decider (`shares[0]`) committed, at count
    /// `decided_at` (0: not known).
    pub(super) fn new(
        by: &Coordinator<'_>,
        tx: u128,
        shares: &[Share<'_>],
        prepared: &[nearrec::Result<()>],
        decided_at: u64,
    ) -> Self {
        Rest {
            store: by.store.to_owned(),
            all: by.all.clone(),
            pin: by.pin,
            tx,
            decider: shares[0].replica.clone(),
            decided: (shares[0].at.0, decided_at),
            ready: (shares.iter().zip(prepared))
                .skip(1)
                .filter(|(_, p)| p.is_ok())
                .map(|(s, _)| (s.at, s.replica.clone()))
                .collect(),
        }
    }

    /// [`Rest::finish`] on a thread of its own, counted by the shards it commits to until it
    /// ends (a write of this router that meets one of its rows waits for it; so does closing
    /// the router).
    pub(super) fn send(self) {
        let mut shards: Vec<usize> = self.ready.iter().map(|(at, _)| at.0).collect();
        shards.dedup();
        let sending = Sending::new(self.all.clone(), shards);
        std::thread::spawn(move || {
            let _sending = sending;
            if let Err(e) = self.finish() {
                tracing::warn!(target: "nearrec::cluster", store = %self.store,
                    tx = %format!("{:032x}", self.tx), error = %e,
                    "a write's commit did not reach every replica after it answered");
            }
        });
    }

    /// Every other replica commits at once, a replica that fails it left out; then each
    /// shard's read floor at this router is raised to the counts its commits made — once all
    /// of them landed, so that no read meanwhile finds a replica whose commit is on its way
    /// behind another's (it waits for the rows the transaction holds there) — and the decider
    /// forgets (off the path: an outcome left kept, a forget lost, is dropped by the next
    /// settling pass that finds no replica holding the transaction). A shard none of whose
    /// replicas took the commit holds it prepared until settled: named in the error, the
    /// decider keeping the outcome for the settling pass.
    pub(super) fn finish(&self) -> nearrec::Result<()> {
        let tx = self.tx;
        let done = on_each(&self.ready, |(_, replica)| {
            replica.client.decide(tx, Decision::Commit, false)
        });
        let failed: Vec<(usize, Arc<Replica>)> = (self.ready.iter().zip(&done))
            .filter(|(_, d)| d.is_err())
            .map(|((at, replica), _)| (at.0, replica.clone()))
            .collect();
        self.all[self.decided.0].seen.raise(self.decided.1);
        for ((at, _), done) in self.ready.iter().zip(&done) {
            if let Ok(v) = done {
                self.all[at.0].seen.raise(*v);
            }
        }
        // a shard (other than the decider's, which has its commit) none of whose replicas took
        // it
        let untold = (self.ready.iter().map(|(at, _)| at.0))
            .filter(|&k| k != self.decided.0)
            .find(|&k| !(self.ready.iter().zip(&done)).any(|((at, _), d)| at.0 == k && d.is_ok()));
        let left_out = leave_out(&self.all, self.pin, &failed, None);
        if let Some(k) = untold {
            return Err(shard_error(
                &self.store,
                k,
                ErrorKind::Unavailable,
                format!(
                    "transaction {tx:032x} is committed, but no replica of the shard took its \
                 commit: it is served there once settled"
                ),
            ));
        }
        let _ = self.decider.client.forget(tx);
        // committed; but a replica that missed its commit and is still a member in etcd could
        // serve a read without it until settled
        left_out.map_err(|e| {
            shard_error(
                &self.store,
                e_shard(&e),
                ErrorKind::Unavailable,
                format!(
                    "transaction {tx:032x} is committed, but a replica that missed its commit \
                     could not be left out of its shard: {e}"
                ),
            )
        })
    }
}

/// How long a call of a router waits for its own commits on their way to a shard before it
/// goes on without them (`version`, `info`).
pub(crate) const COMMITS_AWAITED: Duration = Duration::from_millis(200);

/// Counts one commit on its way on each of `shards` while it lives.
struct Sending {
    all: Arc<[Shard]>,
    shards: Vec<usize>,
}

impl Sending {
    fn new(all: Arc<[Shard]>, shards: Vec<usize>) -> Self {
        for &k in &shards {
            all[k].committing.begin();
        }
        Sending { all, shards }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        for &k in &self.shards {
            self.all[k].committing.end();
        }
    }
}
