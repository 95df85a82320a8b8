//! A live store as a participant of a cross-shard write: two-phase commit (`docs/distributed.md`,
//! "Writes").
//!
//! - [`Live::prepare_write`] checks and encodes the call as a write would, reserves its room in the
//!   delta, and makes it durable in `txn/<id>.prepared` — nothing of it is served. It is refused
//!   while another prepared transaction holds one of its rows (no waiting: the coordinator
//!   aborts and tries again, so two coordinators never wait on each other). A keyed table's
//!   rows are named by key, held by key, and decided as the commit logs them, as a write's
//!   are; under a cap that does not evict, the prepare makes room for its new keys
//!   ([`keys_fit`]), so that no commit is refused.
//! - [`Live::decide`] with commit moves the file to `committed` (the decision, durable), then
//!   logs and applies the rows as one record with the log to itself, and moves the file to
//!   `applied` when asked to keep the outcome, else removes it. A crash between the two finds
//!   `committed` on open and logs the rows again: nothing was logged after them, so the second
//!   record writes what the first did.
//! - Abort removes the prepared file and frees its room; asked to keep the outcome, it leaves
//!   `aborted`, so that the same transaction's prepare arriving late is refused.
//! - [`Live::forget`] drops a kept outcome; [`Live::transactions`] lists what the store holds.
//! - A transaction decided here — committed or aborted, its outcome kept or not — is remembered
//!   for [`REMEMBERED`] after (in memory: a restart forgets what it did not keep), so that a
//!   prepare of its id, replayed or duplicated, is refused rather than prepared again.
//!
//! The shard that decides a transaction keeps its outcome until the coordinator has told every
//! other shard; a coordinator that finds a transaction left prepared by one that died asks the
//! deciding shard and settles it (`nearrec-cluster`'s `txn.rs`).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime};

use nearrec_engine::{Engine, Evict};
use nearrec_format::wal::{Op, TxState, move_tx, read_txns, remove_tx, write_tx};

use super::keys::KeyBook;
use super::{FeedCursor, Live, RowWrite, WriteOptions, Writer, lock};
use crate::error::{Error, Result};
use crate::membership::now_ms;

/// What a store holds of one transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Transaction {
    pub tx: u128,
    pub state: TxState,
    /// The coordinator's note (which shard decides it, which shards take part).
    pub note: String,
    /// How long it has been in this state.
    pub age: Duration,
}

/// A transaction's outcome, as its coordinator (or one settling it) decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Commit,
    Abort,
}

/// The transactions of a writable store: prepared, and the outcomes it keeps.
pub(super) type Txns = std::sync::Mutex<BTreeMap<u128, Held>>;

/// How long a transaction decided here is remembered: twenty times the age at which a router
/// settles one its coordinator left (`nearrec-cluster`'s `SETTLE_AFTER`, 30 s), past which no
/// coordinator still sends its prepare.
pub const REMEMBERED: Duration = Duration::from_secs(600);

/// The transactions decided here within [`REMEMBERED`]: each id's outcome, oldest first.
#[derive(Debug, Default)]
pub(super) struct Finished {
    outcomes: HashMap<u128, (TxState, Instant)>,
    order: VecDeque<(Instant, u128)>,
}

impl Finished {
    /// `tx` decided as `state` now; what is older than [`REMEMBERED`] is let go of.
    fn note(&mut self, tx: u128, state: TxState) {
        let now = Instant::now();
        while let Some(&(at, old)) = self.order.front()
            && now.duration_since(at) > REMEMBERED
        {
            self.order.pop_front();
            if self.outcomes.get(&old).is_some_and(|(_, t)| *t == at) {
                self.outcomes.remove(&old);
            }
        }
        self.outcomes.insert(tx, (state, now));
        self.order.push_back((now, tx));
    }

    /// How `tx` ended here and how long ago, if within [`REMEMBERED`].
    fn get(&self, tx: u128) -> Option<(TxState, Duration)> {
        let (state, at) = self.outcomes.get(&tx)?;
        Some((*state, at.elapsed())).filter(|(_, age)| *age <= REMEMBERED)
    }
}

#[derive(Debug)]
pub(super) struct Held {
    state: TxState,
    note: String,
    since: SystemTime,
    /// The rows, while prepared or committed and not yet logged.
    ops: Vec<Op>,
    /// The room reserved in the delta for them.
    need: u64,
}

impl Held {
    /// Whether it holds rows against other transactions (and lookups of them wait).
    pub(super) fn holds(&self) -> bool {
        matches!(self.state, TxState::Prepared | TxState::Committed)
    }

    /// Its rows, while it holds them.
    pub(super) fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The first row it writes: its table and id.
    pub(super) fn first_row(&self) -> Option<(String, u64)> {
        self.ops.iter().find_map(|op| match op {
            Op::Write { table, ids, .. } | Op::Remove { table, ids } => {
                Some((table.clone(), *ids.first()?))
            }
            _ => None,
        })
    }
}

/// The transactions `w` holds prepared.
pub(super) fn prepared(w: &Writer) -> Vec<u128> {
    (lock(&w.txns).iter())
        .filter(|(_, h)| h.state == TxState::Prepared)
        .map(|(&tx, _)| tx)
        .collect()
}

fn txn_error(tx: u128, reason: impl Into<String>) -> Error {
    Error::Transaction {
        tx,
        reason: reason.into(),
    }
}

/// The rows `ops` write or remove, by table.
pub(super) fn rows_of(ops: &[Op]) -> HashMap<&str, HashSet<u64>> {
    let mut rows: HashMap<&str, HashSet<u64>> = HashMap::new();
    for op in ops {
        if let Op::Write { table, ids, .. } | Op::Remove { table, ids } = op {
            rows.entry(table).or_default().extend(ids);
        }
    }
    rows
}

/// The first row of `mine` (a call's [`rows_of`]) that `other` holds too: its table and id.
fn overlap(mine: &HashMap<&str, HashSet<u64>>, other: &[Op]) -> Option<(String, u64)> {
    other.iter().find_map(|op| match op {
        Op::Write { table, ids, .. } | Op::Remove { table, ids } => {
            let rows = mine.get(table.as_str())?;
            ids.iter()
                .find(|id| rows.contains(id))
                .map(|&id| (table.clone(), id))
        }
        _ => None,
    })
}

/// Refuses a prepare ([`Error::KeysFull`]) whose new keys of a keyed table that does not evict
/// would take it past its cap, counting the new keys of every transaction held before it:
/// each commits without asking again (a commit cannot fail on it), so the prepare makes room.
fn keys_fit(
    engine: &Engine,
    books: &HashMap<String, KeyBook>,
    ops: &[Op],
    held: &BTreeMap<u128, Held>,
) -> Result<()> {
    for op in ops {
        let Op::Write { table, ids, .. } = op else {
            continue;
        };
        let (Some(book), Ok(id)) = (books.get(table), engine.table_id(table)) else {
            continue;
        };
        if engine
            .key_life(id)
            .is_some_and(|l| l.limits.evict != Evict::Off)
        {
            continue;
        }
        let new = |ids: &[u64]| -> HashSet<u64> {
            (ids.iter().copied())
                .filter(|&key| book.row_of(engine, id, key).is_none())
                .collect()
        };
        let mut taken: HashSet<u64> = HashSet::new();
        for h in held.values().filter(|h| h.holds()) {
            for other in &h.ops {
                if let Op::Write { table: t, ids, .. } = other
                    && t == table
                {
                    taken.extend(new(ids));
                }
            }
        }
        let cap = engine.key_cap(id);
        let mut count = book.held() + taken.len() as u64;
        for (position, &key) in ids.iter().enumerate() {
            if book.row_of(engine, id, key).is_none() && taken.insert(key) {
                count += 1;
                if count > cap {
                    return Err(Error::KeysFull {
                        table: table.clone(),
                        position,
                        key,
                        cap,
                    });
                }
            }
        }
    }
    Ok(())
}

impl Live {
    /// Prepares transaction `tx`: the call checked, its room reserved and its rows durable, none
    /// of it served until it commits. Again for a transaction already prepared: nothing to do.
    pub(crate) fn prepare_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        feed: Option<(&str, FeedCursor)>,
    ) -> Result<()> {
        let w = self.writer()?;
        let _gate = w.gate.read().unwrap_or_else(|p| p.into_inner());
        // closed while this call waited for the gate
        let w = self.writer()?;
        let engine = self.snapshot().engine.clone();
        let mut ops = Self::encode(&engine, writes, options)?;
        if let Some((feed, cursor)) = feed {
            super::feed::check_name(feed)?;
            self.mark_format(w, nearrec_format::FEEDS_VERSION)?;
            // the cursor is checked as the commit logs it (`apply_committed`): a replica that
            // caught up by copying rows holds no cursor, and takes the next one as it comes
            ops.push(Op::Cursor {
                feed: feed.to_owned(),
                cursor,
            });
        }
        let need = Self::room(&engine, &ops);
        let mut held = lock(&w.txns);
        if let Some((state, age)) = lock(&w.finished).get(tx) {
            let state = if state == TxState::Aborted {
                "aborted"
            } else {
                "committed"
            };
            return Err(txn_error(
                tx,
                format!(
                    "it was {state} here {:.0} s ago: a prepare of a finished transaction's id \
                     (replayed, or duplicated) is refused",
                    age.as_secs_f64()
                ),
            ));
        }
        match held.get(&tx).map(|h| h.state) {
            Some(TxState::Prepared) => return Ok(()),
            Some(state) => {
                return Err(txn_error(
                    tx,
                    format!("it is {} here, not to be prepared again", state.name()),
                ));
            }
            None => {}
        }
        let mine = rows_of(&ops);
        for (other, h) in held.iter().filter(|(_, h)| h.holds()) {
            if let Some((table, row)) = overlap(&mine, &h.ops) {
                return Err(Error::Held {
                    table,
                    row,
                    tx: *other,
                });
            }
        }
        keys_fit(&engine, &lock(&w.books), &ops, &held)?;
        w.reserve(need)?;
        if let Err(e) = write_tx(&self.dir, tx, TxState::Prepared, note, &ops) {
            w.used.fetch_sub(need, Relaxed);
            return Err(e.into());
        }
        held.insert(
            tx,
            Held {
                state: TxState::Prepared,
                note: note.to_owned(),
                since: SystemTime::now(),
                ops,
                need,
            },
        );
        Ok(())
    }

    /// Commits or aborts transaction `tx`; the store's version after. `keep`: the outcome is
    /// kept until [`Live::forget`] (the deciding shard's). Commit of a committed transaction
    /// and abort of an aborted or unknown one are done already; commit of an aborted or unknown
    /// one, and abort of a committed one, are refused.
    pub(crate) fn decide(&self, tx: u128, decision: Decision, keep: bool) -> Result<u64> {
        let w = self.writer()?;
        // the log to itself from the decision to the outcome: no record follows a committed
        // transaction's rows until its file says they are logged
        let _gate = w.gate.write().unwrap_or_else(|p| p.into_inner());
        let w = self.writer()?;
        let mut held = lock(&w.txns);
        let state = held.get(&tx).map(|h| h.state);
        match (decision, state) {
            (Decision::Commit, Some(TxState::Prepared)) => {
                move_tx(&self.dir, tx, TxState::Prepared, TxState::Committed)?;
                let h = held.get_mut(&tx).expect("held");
                h.state = TxState::Committed;
                self.apply_committed(w, tx, h, keep)?;
                if !keep {
                    held.remove(&tx);
                }
            }
            // a commit whose rows failed to reach the log (an I/O error): again
            (Decision::Commit, Some(TxState::Committed)) => {
                let h = held.get_mut(&tx).expect("held");
                self.apply_committed(w, tx, h, keep)?;
                if !keep {
                    held.remove(&tx);
                }
            }
            (Decision::Commit, Some(TxState::Applied))
            | (Decision::Abort, Some(TxState::Aborted)) => {}
            // decided here and forgotten since: as it was decided
            (Decision::Commit, None)
                if lock(&w.finished)
                    .get(tx)
                    .is_some_and(|(s, _)| s == TxState::Applied) => {}
            (Decision::Abort, None)
                if lock(&w.finished)
                    .get(tx)
                    .is_some_and(|(s, _)| s == TxState::Applied) =>
            {
                return Err(txn_error(
                    tx,
                    "committed here (and forgotten): it cannot abort",
                ));
            }
            (Decision::Abort, None) => {
                if keep {
                    write_tx(&self.dir, tx, TxState::Aborted, "", &[])?;
                    held.insert(
                        tx,
                        Held {
                            state: TxState::Aborted,
                            note: String::new(),
                            since: SystemTime::now(),
                            ops: Vec::new(),
                            need: 0,
                        },
                    );
                }
            }
            (Decision::Abort, Some(TxState::Prepared)) => {
                if keep {
                    move_tx(&self.dir, tx, TxState::Prepared, TxState::Aborted)?;
                } else {
                    remove_tx(&self.dir, tx, TxState::Prepared)?;
                }
                let h = held.get_mut(&tx).expect("held");
                w.used.fetch_sub(std::mem::take(&mut h.need), Relaxed);
                h.ops = Vec::new();
                h.state = TxState::Aborted;
                h.since = SystemTime::now();
                if !keep {
                    held.remove(&tx);
                }
            }
            (Decision::Commit, None) => {
                return Err(txn_error(tx, "not prepared here: nothing to commit"));
            }
            (Decision::Commit, Some(TxState::Aborted)) => {
                return Err(txn_error(tx, "aborted here: it cannot commit"));
            }
            (Decision::Abort, Some(TxState::Committed | TxState::Applied)) => {
                return Err(txn_error(tx, "committed here: it cannot abort"));
            }
        }
        let outcome = match decision {
            Decision::Commit => TxState::Applied,
            Decision::Abort => TxState::Aborted,
        };
        lock(&w.finished).note(tx, outcome);
        drop(held);
        // lookups waiting for it go on (`settled.rs`)
        w.decided.notify_all();
        Ok(self.snapshot().version())
    }

    /// Logs and applies committed transaction `tx`'s rows (the caller holds the gate), then
    /// moves its file to `applied` (`keep`) or removes it.
    fn apply_committed(&self, w: &Writer, tx: u128, h: &mut Held, keep: bool) -> Result<()> {
        // a delta file's share carries its feed's cursor: logged with it, stamped as it is
        // logged, unless the feed has taken the file since (another router's commit of it);
        // the caller holds the gate whole, so no feed's record is decided meanwhile
        let (mut stamped, mut taken) = (None, false);
        if let Some((feed, cursor)) = h.ops.iter_mut().find_map(|op| match op {
            Op::Cursor { feed, cursor } => Some((feed.as_str(), cursor)),
            _ => None,
        }) {
            taken = (lock(&w.cursors).get(feed)).is_some_and(|c| c.sequence >= cursor.sequence);
            cursor.applied_ms = now_ms();
            stamped = Some((feed.to_owned(), *cursor));
        }
        if taken {
            w.used.fetch_sub(std::mem::take(&mut h.need), Relaxed);
        } else {
            // a keyed table's keys decided now, as a write's are (the prepare made room for
            // its new keys under a cap that does not evict)
            let engine = self.snapshot().engine.clone();
            self.log_call(w, &engine, Cow::Borrowed(&h.ops), h.need)?;
            lock(&w.last_writers).note(tx, &h.note, &h.ops);
            if let Some((feed, cursor)) = stamped {
                lock(&w.cursors).insert(feed, cursor);
            }
        }
        (h.ops, h.need) = (Vec::new(), 0);
        if keep {
            move_tx(&self.dir, tx, TxState::Committed, TxState::Applied)?;
        } else {
            remove_tx(&self.dir, tx, TxState::Committed)?;
        }
        h.state = TxState::Applied;
        h.since = SystemTime::now();
        Ok(())
    }

    /// Drops the outcome kept of transaction `tx` (none kept: nothing to do); a transaction
    /// still prepared is refused.
    pub(crate) fn forget(&self, tx: u128) -> Result<()> {
        let w = self.writer()?;
        let mut held = lock(&w.txns);
        match held.get(&tx).map(|h| h.state) {
            None => Ok(()),
            Some(state @ (TxState::Applied | TxState::Aborted)) => {
                remove_tx(&self.dir, tx, state)?;
                held.remove(&tx);
                lock(&w.finished).note(tx, state);
                Ok(())
            }
            Some(state) => Err(txn_error(
                tx,
                format!("it is {} here: decide it first", state.name()),
            )),
        }
    }

    /// The transactions the store holds: prepared, and the outcomes it keeps.
    pub(crate) fn transactions(&self) -> Result<Vec<Transaction>> {
        let w = self.writer()?;
        let now = SystemTime::now();
        Ok(lock(&w.txns)
            .iter()
            .map(|(&tx, h)| Transaction {
                tx,
                state: h.state,
                note: h.note.clone(),
                age: now.duration_since(h.since).unwrap_or_default(),
            })
            .collect())
    }

    /// On a writable open, after the log's records: the transactions' files read back. A
    /// prepared one takes its room again; a committed one (a crash before it was logged, or
    /// after and before its file said so) is logged now and kept as applied.
    pub(super) fn recover_txns(&self, w: &Writer) -> Result<()> {
        let engine = self.snapshot().engine.clone();
        let mut held = lock(&w.txns);
        for f in read_txns(&self.dir)? {
            let need = Self::room(&engine, &f.ops);
            let mut h = Held {
                state: f.state,
                note: f.note,
                since: f.since,
                ops: f.ops,
                need: 0,
            };
            match f.state {
                TxState::Prepared => {
                    w.used.fetch_add(need, Relaxed);
                    h.need = need;
                }
                TxState::Committed => {
                    w.used.fetch_add(need, Relaxed);
                    h.need = need;
                    self.apply_committed(w, f.tx, &mut h, true)?;
                }
                TxState::Applied | TxState::Aborted => h.ops = Vec::new(),
            }
            held.insert(f.tx, h);
        }
        Ok(())
    }
}
