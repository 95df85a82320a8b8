//! Writes across shards, or to a shard's several replicas: two-phase commit, the router the
//! coordinator and one replica the place the outcome is decided (`docs/distributed.md`,
//! "Writes"). A prepared write holds its rows, so two routers' writes to one row reach every
//! replica in one order.
//!
//! 1. Every replica (not stale) of every shard the call touches prepares its share under one
//!    transaction id: checked, durable, not served ([`nearrec::Replica::prepare_write`]). The
//!    note kept with it names the deciding replica — the first live replica of the lowest
//!    shard — and the shards that take part. The decider only holds its share, unlogged
//!    ([`nearrec::Replica::hold_write`]): its commit logs it whole.
//! 2. If a shard has no replica that prepared, every prepared share is aborted and the call
//!    fails with what the shard answered; a replica that failed where another of its shard
//!    prepared is stale from then on (it missed the write), as for a one-shard write.
//! 3. The deciding replica commits, keeping the outcome: from that moment the call is
//!    committed, and it returns. Every other replica's commit is sent after, and then the
//!    decider forgets the outcome (`commits.rs`).
//!
//! A router that dies between the phases, or before the commits after the answer land, leaves
//! shares prepared: they hold their rows against
//! other transactions (a later prepare on one of them is refused, `StoreLocked`). [`settle`]
//! finds them — every replica lists what it holds — and asks the decider: a transaction it
//! committed commits everywhere; one it never committed is aborted there first (kept, so that
//! the dead router's commit, were it still on its way, is refused), then everywhere. The
//! decider serializes the two, so a router that was only slow and a router settling its
//! transaction can never decide it both ways. A write refused because a row is held settles
//! transactions older than the call's deadline (their router is gone: no call of it runs
//! longer) and tries again while its deadline allows.
//!
//! What readers see: each replica serves its share from its commit on, and each shard's read
//! floor at this router is raised to the versions its commits made once all of them landed. A
//! lookup, through any router,
//! sees the write whole or not at all: a replica's lookup waits for the transactions prepared
//! there before it came that hold its rows, and the answers of one read of several shards are
//! checked against each other, a shard that has not shown a transaction another shows read
//! again (`crate::store`'s `reads.rs`; `docs/distributed.md`, "Reads while writes go on").

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nearrec::{
    Decision, Error, ErrorKind, FeedCursor, Replica as _, RowWrite, Transaction, TxState,
    WriteOptions,
};

use crate::members;
use crate::shard::{Replica, Shard, on_each};

mod commits;

pub(crate) use commits::COMMITS_AWAITED;
use commits::Rest;

/// A replica of the plan: shard and place in the shard's replica list.
pub(crate) type At = (usize, usize);

/// What a coordinator keeps with its transaction on every replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Note {
    pub decider: At,
    pub shards: Vec<usize>,
}

impl Note {
    pub fn parse(s: &str) -> Option<Self> {
        let mut decider = None;
        let mut shards = None;
        for part in s.split_whitespace() {
            match part.split_once('=')? {
                ("decider", v) => {
                    let (k, r) = v.split_once('/')?;
                    decider = Some((k.parse().ok()?, r.parse().ok()?));
                }
                ("shards", v) => {
                    shards = Some(
                        v.split(',')
                            .map(str::parse)
                            .collect::<Result<_, _>>()
                            .ok()?,
                    );
                }
                _ => {}
            }
        }
        Some(Note {
            decider: decider?,
            shards: shards?,
        })
    }
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shards: Vec<String> = self.shards.iter().map(usize::to_string).collect();
        write!(
            f,
            "decider={}/{} shards={}",
            self.decider.0,
            self.decider.1,
            shards.join(",")
        )
    }
}

/// How old a transaction left prepared is when a router without a call deadline settles it.
pub(crate) const SETTLE_AFTER: Duration = Duration::from_secs(30);

/// One share of a transaction: a replica and its shard's calls.
struct Share<'a> {
    at: At,
    replica: Arc<Replica>,
    calls: &'a [RowWrite<'a>],
    /// The shard's membership epoch, as the router knows it.
    epoch: u64,
}

/// A sharded store's shards as the coordinator of a write sees them.
pub(crate) struct Coordinator<'a> {
    /// The sharded store's name, for errors.
    pub store: &'a str,
    pub all: &'a Arc<[Shard]>,
    /// The cluster version read (replicas serving another are not asked of their membership).
    pub pin: u64,
    /// A shard's refusal of its share (by its index), as the caller's call names things: the
    /// table and position of the caller's write, not of the share.
    pub to_caller: &'a dyn Fn(usize, Error) -> Error,
}

impl Coordinator<'_> {
    /// The call's rows, `calls[k]` those of shard `shards[k]`, written atomically on every shard:
    /// all of them or none. Retried while a prepare is refused because another transaction holds
    /// a row, within the call's `timeout` (none: without end), settling each time the
    /// transactions older than it ([`SETTLE_AFTER`] without one).
    /// `feed`: the rows are that feed's delta file, its cursor committed with them on every
    /// shard of `shards`.
    ///
    /// Returns once the deciding replica committed: the other replicas' commits are on their
    /// way ([`Rest`]; a delta file's, whose cursor the caller reads back, are not). Each
    /// shard whose commit is on its way, with the least count of writes it will have.
    pub fn write(
        &self,
        shards: &[usize],
        calls: &[Vec<RowWrite<'_>>],
        options: WriteOptions,
        timeout: Option<Duration>,
        feed: Option<(&str, FeedCursor)>,
    ) -> nearrec::Result<Vec<(usize, u64)>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let settle_after = timeout.unwrap_or(SETTLE_AFTER);
        // this router's writes to these shards take their turns in shard order (no two of them
        // wait on each other)
        let _turns: Vec<_> = shards.iter().map(|&k| self.all[k].lock_writes()).collect();
        let mut pause = Duration::from_millis(5);
        let mut learned = false;
        loop {
            match self.attempt(shards, calls, options, feed) {
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::StoreLocked | ErrorKind::MembershipChanged
                    ) =>
                {
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    if left.is_some_and(|l| l <= pause) {
                        return Err(e);
                    }
                    if e.kind() == ErrorKind::MembershipChanged {
                        // another router changed a shard's replicas: learn them, go again (at
                        // once the first time)
                        for &k in shards {
                            members::learn(&self.all[k], self.pin, false);
                        }
                        if std::mem::replace(&mut learned, true) {
                            std::thread::sleep(pause);
                            pause = (pause * 2).min(Duration::from_millis(200));
                        }
                        continue;
                    }
                    // a row held by this router's last write, its commit on its way: again
                    // as soon as it lands, within the pause (one stuck on a replica that does
                    // not answer is not waited for longer)
                    if shards.iter().any(|&k| self.all[k].committing.landed(pause)) {
                        continue;
                    }
                    // a row held by a transaction its router left, or a fence its catch-up
                    // left: settled once they are old enough
                    settle(self.all, settle_after);
                    for &k in shards {
                        members::settle_fences(&self.all[k], self.pin);
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                done => return done,
            }
        }
    }

    fn attempt(
        &self,
        shards: &[usize],
        calls: &[Vec<RowWrite<'_>>],
        options: WriteOptions,
        feed: Option<(&str, FeedCursor)>,
    ) -> nearrec::Result<Vec<(usize, u64)>> {
        let tx = fastrand::u128(..);
        let mut shares = Vec::new();
        for (i, &k) in shards.iter().enumerate() {
            let epoch = self.all[k].epoch();
            for (r, replica) in self.all[k].write_replicas() {
                shares.push(Share {
                    at: (k, r),
                    replica,
                    calls: &calls[i],
                    epoch,
                });
            }
            if !shares.iter().any(|s| s.at.0 == k) {
                return Err(self.error(
                    k,
                    ErrorKind::Unavailable,
                    "no replica takes writes (none is a member)".into(),
                ));
            }
        }
        let decider = shares[0].at;
        let note = Note {
            decider,
            shards: shards.to_vec(),
        }
        .to_string();
        // phase one; the decider's share held, not logged: its commit logs it whole
        let mut prepared = on_each(&shares, |s| {
            let (client, epoch) = (&s.replica.client, Some(s.epoch));
            match s.at == decider {
                true => client.hold_write(tx, s.calls, options, &note, epoch, feed),
                false => client.prepare_write(tx, s.calls, options, &note, epoch, feed),
            }
        });
        // refused: a replica said no (a held row, a full delta), or no replica of a shard (or not
        // the decider) could answer; a replica that could not answer where another of its shard
        // prepared only missed it
        let missed = |e: &Error| {
            matches!(
                e.kind(),
                ErrorKind::Unavailable | ErrorKind::DeadlineExceeded | ErrorKind::Overloaded
            )
        };
        let said_no = (prepared.iter()).position(|p| p.as_ref().is_err_and(|e| !missed(e)));
        let refused = said_no.map(|i| (shares[i].at.0, i)).or_else(|| {
            shards.iter().find_map(|&k| {
                let mine = || (shares.iter().zip(&prepared)).filter(|(s, _)| s.at.0 == k);
                if mine().any(|(_, p)| p.is_ok()) && prepared[0].is_ok() {
                    return None;
                }
                let first =
                    (shares.iter().zip(&prepared)).position(|(s, p)| s.at.0 == k && p.is_err())?;
                Some((k, first))
            })
        });
        // the deciding replica missed it where another of its shard prepared: aborted, the
        // decider left out as any replica that missed a write, and tried again (with another)
        let decider_missed = said_no.is_none()
            && prepared[0].as_ref().is_err_and(missed)
            && (shares.iter().zip(&prepared)).any(|(s, p)| s.at.0 == decider.0 && p.is_ok());
        if decider_missed {
            on_each(&shares, |s| {
                s.replica.client.decide(tx, Decision::Abort, false)
            });
            let epochs: HashMap<usize, u64> = shares.iter().map(|s| (s.at.0, s.epoch)).collect();
            self.leave_out(&[(decider.0, shares[0].replica.clone())], Some(&epochs))?;
            return Err(Error::MembershipChanged {
                store: self.store.to_owned(),
                epoch: self.all[decider.0].epoch(),
                member: false,
                reason: format!(
                    "the deciding replica ({}) missed the prepare and is left out: tried again",
                    shares[0].replica.addr
                ),
            });
        }
        if let Some((k, first)) = refused {
            // nothing committed: every share that prepared is aborted (a prepare still on its way
            // to a replica, past its deadline, is settled as one whose router is gone)
            on_each(&shares, |s| {
                s.replica.client.decide(tx, Decision::Abort, false)
            });
            let e = std::mem::replace(&mut prepared[first], Ok(())).expect_err("refused");
            return Err(if missed(&e) {
                self.error(k, e.kind(), format!("no replica prepared the write: {e}"))
            } else {
                (self.to_caller)(k, e)
            });
        }
        let missed: Vec<(usize, Arc<Replica>)> = (shares.iter().zip(&prepared))
            .filter(|(_, p)| p.is_err())
            .map(|(s, _)| (s.at.0, s.replica.clone()))
            .collect();
        let epochs: HashMap<usize, u64> = shares.iter().map(|s| (s.at.0, s.epoch)).collect();
        if let Err(e) = self.leave_out(&missed, Some(&epochs)) {
            // kept in etcd, and not left out: committed without them, they would serve reads
            // that miss it
            on_each(&shares, |s| {
                s.replica.client.decide(tx, Decision::Abort, false)
            });
            return Err(e);
        }
        // phase two: the decision, then everyone else
        let v = match shares[0].replica.client.decide(tx, Decision::Commit, true) {
            Ok(v) => v,
            Err(e) => return self.undecided(tx, &shares, &prepared, e),
        };
        let rest = Rest::new(self, tx, &shares, &prepared, v);
        if feed.is_some() {
            // a delta file's: its cursor is read back from every shard once the call returns
            return rest.finish().map(|()| Vec::new());
        }
        // the decider's shard at the count its commit made; each other shard one past the
        // count this router last saw of it
        let mut pending = vec![(decider.0, v)];
        for &k in shards.iter().filter(|&&k| k != decider.0) {
            pending.push((k, self.all[k].seen.load() + 1));
        }
        rest.send();
        Ok(pending)
    }

    /// The decider did not answer transaction `tx`'s commit (`e`): what its state there says.
    fn undecided(
        &self,
        tx: u128,
        shares: &[Share<'_>],
        prepared: &[nearrec::Result<()>],
        e: Error,
    ) -> nearrec::Result<Vec<(usize, u64)>> {
        let decider = shares[0].at;
        match state_at(&shares[0].replica, tx) {
            Some(Some(TxState::Applied | TxState::Committed)) => {
                Rest::new(self, tx, shares, prepared, 0)
                    .finish()
                    .map(|()| Vec::new())
            }
            // aborted there (by a router settling it as abandoned): aborted everywhere
            Some(Some(TxState::Aborted)) => {
                on_each(&shares[1..], |s| {
                    s.replica.client.decide(tx, Decision::Abort, false)
                });
                Err(e)
            }
            // held no more there: decided and forgotten meanwhile (a router settling it
            // forgets it once no replica holds it), committed or aborted. An abort kept
            // there tells which: refused, it was committed (found by the partition harness:
            // a committed write was reported failed)
            Some(None) => match shares[0].replica.client.decide(tx, Decision::Abort, true) {
                Ok(_) => {
                    on_each(&shares[1..], |s| {
                        s.replica.client.decide(tx, Decision::Abort, false)
                    });
                    // refused there as not prepared: the share it held (not logged) was lost
                    // to a restart since
                    if e.kind() != ErrorKind::InvalidRequest {
                        return Err(e);
                    }
                    Err(self.error(
                        decider.0,
                        ErrorKind::Unavailable,
                        format!(
                            "transaction {tx:032x} is aborted, nothing of it applied: its \
                             deciding replica ({}) lost its share before the commit ({e})",
                            shares[0].replica.addr
                        ),
                    ))
                }
                // refused as committed there (a Transaction error)
                Err(refused) if refused.kind() == ErrorKind::InvalidRequest => Err(self.error(
                    decider.0,
                    ErrorKind::Unavailable,
                    format!(
                        "transaction {tx:032x} is committed: its deciding replica ({}) \
                         did not answer its commit ({e}), and it was settled meanwhile",
                        shares[0].replica.addr
                    ),
                )),
                Err(_) => Err(self.error(
                    decider.0,
                    ErrorKind::Unavailable,
                    format!(
                        "transaction {tx:032x} is in doubt: its deciding replica ({}) did \
                         not answer its commit ({e}), nor its abort after",
                        shares[0].replica.addr
                    ),
                )),
            },
            Some(Some(TxState::Prepared)) | None => Err(self.error(
                decider.0,
                ErrorKind::Unavailable,
                format!(
                    "transaction {tx:032x} is in doubt: its deciding replica ({}) did not \
                     answer its commit ({e}), and its outcome could not be read there; it \
                     is applied everywhere or nowhere once settled",
                    shares[0].replica.addr
                ),
            )),
        }
    }

    /// Replicas that missed a write the others of their shard took: [`leave_out`].
    fn leave_out(
        &self,
        missed: &[(usize, Arc<Replica>)],
        prepared_at: Option<&HashMap<usize, u64>>,
    ) -> nearrec::Result<()> {
        leave_out(self.all, self.pin, missed, prepared_at)
    }

    fn error(&self, shard: usize, kind: ErrorKind, reason: String) -> Error {
        shard_error(self.store, shard, kind, reason)
    }
}

/// Replicas that missed a write the others of their shard took: stale here at once, and left
/// out of their shards' membership (`members/`), so that every router learns it at its next
/// write. The first shard whose change could not be made where etcd keeps it. `prepared_at`:
/// each shard's epoch its shares were prepared at, before any commit (the change is refused if
/// the shard has moved past it since).
fn leave_out(
    all: &[Shard],
    pin: u64,
    missed: &[(usize, Arc<Replica>)],
    prepared_at: Option<&HashMap<usize, u64>>,
) -> nearrec::Result<()> {
    let mut by_shard: HashMap<usize, Vec<u64>> = HashMap::new();
    for (k, replica) in missed {
        replica.mark_stale(all[*k].epoch());
        let id = replica.id.load(std::sync::atomic::Ordering::Relaxed);
        by_shard.entry(*k).or_default().push(id);
    }
    let mut outcome = Ok(());
    for (k, gone) in by_shard {
        let at = prepared_at.and_then(|e| e.get(&k).copied());
        let done = members::exclude(&all[k], pin, &gone, at);
        if outcome.is_ok() {
            outcome = done;
        }
    }
    outcome
}

fn shard_error(store: &str, shard: usize, kind: ErrorKind, reason: String) -> Error {
    Error::Shard {
        store: store.to_owned(),
        shard,
        kind,
        reason,
    }
}

/// The shard an error names (0 when it names none).
fn e_shard(e: &Error) -> usize {
    match e {
        Error::Shard { shard, .. } => *shard,
        _ => 0,
    }
}

/// Transaction `tx`'s state on `replica`: `Some(None)` when it holds nothing of it, `None`
/// when it did not answer.
fn state_at(replica: &Replica, tx: u128) -> Option<Option<TxState>> {
    let listed = replica.client.transactions().ok()?;
    Some(listed.into_iter().find(|t| t.tx == tx).map(|t| t.state))
}

/// What settling found and did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    pub committed: usize,
    pub aborted: usize,
    /// Left as they were: their decider did not answer.
    pub in_doubt: usize,
}

/// Settles the transactions older than `older_than` that routers left on the shards' replicas
/// (see the module's documentation).
pub(crate) fn settle(all: &[Shard], older_than: Duration) -> Settled {
    let mut done = Settled::default();
    let mut outcomes: HashMap<u128, Option<Decision>> = HashMap::new();
    let mut held: Vec<(At, Arc<Replica>, Transaction, Note)> = Vec::new();
    let mut unreachable = false;
    let replicas: Vec<(At, Arc<Replica>)> = (all.iter().enumerate())
        .flat_map(|(k, shard)| {
            let all = shard.all_replicas();
            (0..all.len()).map(move |r| ((k, r), all[r].clone()))
        })
        .collect();
    // asked at once: a replica cut off costs one deadline, not one each
    let lists = on_each(&replicas, |(_, replica)| replica.client.transactions());
    for ((at, replica), listed) in replicas.into_iter().zip(lists) {
        let Ok(listed) = listed else {
            unreachable = true;
            continue;
        };
        for t in listed {
            if let Some(note) = Note::parse(&t.note) {
                held.push((at, replica.clone(), t, note));
            }
        }
    }
    let still: Vec<u128> = (held.iter())
        .filter(|(_, _, t, _)| matches!(t.state, TxState::Prepared | TxState::Committed))
        .map(|(_, _, t, _)| t.tx)
        .collect();
    for (at, replica, t, note) in &held {
        let is_decider = *at == note.decider;
        let client = &replica.client;
        match t.state {
            TxState::Prepared | TxState::Committed if t.age >= older_than => {
                let outcome = *outcomes
                    .entry(t.tx)
                    .or_insert_with(|| decide_at(all, t.tx, note.decider));
                match outcome {
                    Some(d) if client.decide(t.tx, d, is_decider).is_ok() => match d {
                        Decision::Commit => done.committed += 1,
                        Decision::Abort => done.aborted += 1,
                    },
                    _ => done.in_doubt += 1,
                }
            }
            // an outcome kept past its use: on a replica that does not decide (a crash
            // mid-commit kept it), or on the decider once no replica holds the transaction
            TxState::Applied | TxState::Aborted
                if !is_decider || (!unreachable && !still.contains(&t.tx)) =>
            {
                let _ = client.forget(t.tx);
            }
            _ => {}
        }
    }
    done
}

/// The outcome of transaction `tx` at its deciding replica `at`: committed there, or aborted
/// there now if it was not (kept); `None` when the decider does not answer.
fn decide_at(all: &[Shard], tx: u128, at: At) -> Option<Decision> {
    let replica = all.get(at.0)?.all_replicas().get(at.1)?.clone();
    for _ in 0..2 {
        match state_at(&replica, tx)? {
            Some(TxState::Applied) => return Some(Decision::Commit),
            Some(TxState::Committed) => {
                replica.client.decide(tx, Decision::Commit, true).ok()?;
                return Some(Decision::Commit);
            }
            Some(TxState::Aborted) => return Some(Decision::Abort),
            // prepared or unknown there: abort it there first; refused, it was committed
            // meanwhile, so look again
            Some(TxState::Prepared) | None => {
                if replica.client.decide(tx, Decision::Abort, true).is_ok() {
                    return Some(Decision::Abort);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_reads_back() {
        let n = Note {
            decider: (2, 1),
            shards: vec![2, 3, 5],
        };
        assert_eq!(n.to_string(), "decider=2/1 shards=2,3,5");
        assert_eq!(Note::parse(&n.to_string()), Some(n));
        assert_eq!(Note::parse("decider=x/1 shards=1"), None);
        assert_eq!(Note::parse(""), None);
    }
}
