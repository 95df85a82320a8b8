//! A live store as a participant of a cross-shard write: two-phase commit (`docs/distributed.md`,
//! "Writes"), each step a record of the write-ahead log, group-committed with the writes.
//!
//! - [`Live::prepare_write`] checks and encodes the call as a write would, reserves its room in the
//!   delta, and logs it held ([`Op::Prepare`]) — nothing of it is served. It is refused while
//!   another prepared transaction holds one of its rows (no waiting: the coordinator aborts and
//!   tries again, so two coordinators never wait on each other). A keyed table's rows are named
//!   by key, held by key, and decided as the commit logs them, as a write's are; under a cap
//!   that does not evict, the prepare makes room for its new keys ([`super::keys::keys_fit`]), so that no
//!   commit is refused.
//! - [`Live::decide`] with commit logs the decision and the rows as one record
//!   ([`Op::Decide`] and the rows, applied as a write's are): the outcome is durable exactly
//!   when the rows are. Kept when asked (the deciding shard's), as applied.
//! - Abort logs the decision and frees the room; asked to keep the outcome, it stays
//!   `aborted`, so that the same transaction's prepare arriving late is refused.
//! - [`Live::forget`] drops a kept outcome (not logged: only the deciding replica keeps one, and
//!   one a crash brings back is forgotten again by the next router that settles);
//!   [`Live::transactions`] lists what the store holds.
//! - A transaction decided here — committed or aborted, its outcome kept or not — is remembered
//!   for [`REMEMBERED`] after (in memory: a restart forgets what it did not keep), so that a
//!   prepare of its id, replayed or duplicated, is refused rather than prepared again.
//! - What the store holds of its transactions is checkpointed in `txn/`, one file each, and
//!   `txn/CHECKPOINT` naming the record of the log they hold up to ([`Live::checkpoint_txns`]):
//!   before a compaction moves the tables' base past the records, on open and on close. On
//!   open the files are read, then the log's steps after the checkpoint replayed over them in
//!   order (each says where its transaction stands from then on). A forget is not logged: one
//!   a crash keeps from a checkpoint comes back as a kept outcome, which the next router that
//!   settles forgets again. A store of an older build may hold `committed` files (decided,
//!   rows not yet logged): their rows are logged on open.
//!
//! The shard that decides a transaction keeps its outcome until the coordinator has told every
//! other shard; a coordinator that finds a transaction left prepared by one that died asks the
//! deciding shard and settles it (`nearrec-cluster`'s `txn/`).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime};

use nearrec_format::wal::{
    Op, Record, TXN_DIR, TxState, Wal, WalConfig, read_checkpoint, read_txns, remove_tx,
    txn_log_dir, write_checkpoint, write_tx,
};

use super::keys::keys_fit;
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
    /// Its prepare is a record of the transactions' log; a deciding replica's is not (held in
    /// memory, and logged whole by its commit: [`Live::prepare_write`]).
    logged: bool,
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

impl Live {
    /// Prepares transaction `tx`: the call checked, its room reserved and its rows durable, none
    /// of it served until it commits. Again for a transaction already prepared: nothing to do.
    /// Not `logged` (the deciding replica's share): held in memory only, its commit logging
    /// the prepare with the rows in one record — a crash before forgets it, and the decider,
    /// holding nothing of it, has it aborted (a decider that never prepared decides abort).
    pub(crate) fn prepare_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        feed: Option<(&str, FeedCursor)>,
        logged: bool,
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
        self.mark_format(w, nearrec_format::TXN_VERSION)?;
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
        let others = held.values().filter(|h| h.holds()).map(Held::ops);
        keys_fit(&engine, &lock(&w.books), &ops, others)?;
        w.reserve(need)?;
        // logged with the rows held (another prepare of one of them waits for the lock, and is
        // refused once it is held); the room stays reserved until the decision
        let record = [Op::Prepare {
            tx,
            note: note.to_owned(),
            ops,
        }];
        if logged && let Err(e) = self.txn_step(w, &record) {
            w.used.fetch_sub(need, Relaxed);
            return Err(e);
        }
        let [Op::Prepare { ops, .. }] = record else {
            unreachable!("a prepare's record")
        };
        held.insert(
            tx,
            Held {
                state: TxState::Prepared,
                note: note.to_owned(),
                since: SystemTime::now(),
                ops,
                need,
                logged,
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
        // a delta file's share is decided with the writers' gate whole, so that no record of
        // its feed is logged meanwhile (`apply_committed`); any other share as a write is
        let feed = (lock(&w.txns).get(&tx))
            .is_some_and(|h| h.ops.iter().any(|op| matches!(op, Op::Cursor { .. })));
        let (_whole, _shared);
        if feed {
            _whole = w.gate.write().unwrap_or_else(|p| p.into_inner());
        } else {
            _shared = w.gate.read().unwrap_or_else(|p| p.into_inner());
        }
        let w = self.writer()?;
        let mut held = lock(&w.txns);
        let state = held.get(&tx).map(|h| h.state);
        match (decision, state) {
            // a store of an older build: decided, its rows not yet logged
            (Decision::Commit, Some(TxState::Prepared | TxState::Committed)) => {
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
                    // the decider's refusal of a transaction a router left (`settle`): a file,
                    // not a record — no other replica logs it, and a record would put this
                    // one's count of writes ahead of theirs
                    write_tx(&self.dir, tx, TxState::Aborted, "", &[])?;
                    held.insert(
                        tx,
                        Held {
                            state: TxState::Aborted,
                            note: String::new(),
                            since: SystemTime::now(),
                            ops: Vec::new(),
                            need: 0,
                            logged: true,
                        },
                    );
                }
            }
            (Decision::Abort, Some(TxState::Prepared)) => {
                self.txn_step(
                    w,
                    &[Op::Decide {
                        tx,
                        commit: false,
                        keep,
                    }],
                )?;
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

    /// Logs a transaction's step that writes no row (a prepare, an abort) in the
    /// transactions' own log: it is no write, so it takes no number of the store's log (a
    /// replica's count of writes, which its shard's replicas compare, stays the count of the
    /// writes it took). The caller holds the transactions, so the log opens once.
    fn txn_step(&self, w: &Writer, step: &[Op]) -> Result<()> {
        w.stepped.store(true, Relaxed);
        let log = match w.txn_log.get() {
            Some(log) => log,
            None => {
                let (log, _) = Wal::open(&txn_log_dir(&self.dir, true)?, w.wal_config, 0)?;
                w.txn_log.get_or_init(|| log)
            }
        };
        log.append(step)?;
        Ok(())
    }

    /// Logs committed transaction `tx`'s decision and rows as one record and applies it (the
    /// caller holds the gate), then holds it as applied (`keep`: until forgotten); a prepare
    /// not logged goes first in the record, so that its note comes back with the outcome. A
    /// record that fails to reach the log leaves it as it was: the decision is for the caller
    /// to send again.
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
        let mut steps = Vec::with_capacity(h.ops.len() + 2);
        if !h.logged {
            steps.push(Op::Prepare {
                tx,
                note: h.note.clone(),
                ops: Vec::new(),
            });
        }
        steps.push(Op::Decide {
            tx,
            commit: true,
            keep,
        });
        if taken {
            // the decision alone: the feed logged the file's rows itself
            self.txn_step(w, &steps)?;
            w.used.fetch_sub(std::mem::take(&mut h.need), Relaxed);
        } else {
            // a keyed table's keys decided now, as a write's are (the prepare made room for
            // its new keys under a cap that does not evict)
            let mut record = steps;
            let first_row = record.len();
            w.stepped.store(true, Relaxed);
            record.append(&mut h.ops);
            let engine = self.snapshot().engine.clone();
            if let Err(e) = self.log_call(w, &engine, Cow::Borrowed(&record), h.need) {
                // the room reserved again, the rows held again: nothing was logged
                w.used.fetch_add(h.need, Relaxed);
                h.ops = record.split_off(first_row);
                return Err(e);
            }
            h.need = 0;
            lock(&w.last_writers).note(tx, &h.note, &record);
            if let Some((feed, cursor)) = stamped {
                lock(&w.cursors).insert(feed, cursor);
            }
        }
        h.ops = Vec::new();
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
                // not logged: only the decider forgets, and a record would put its count of
                // writes ahead of its shard's other replicas'; the next checkpoint drops its
                // file, and an outcome a crash brings back is forgotten again by the next
                // router that settles (`nearrec-cluster`'s `txn/`)
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

    /// On a writable open, after the log's records are applied: the transactions' files read
    /// back, the steps of `records` (the log after the base) replayed over them in order, the
    /// room of the ones still prepared reserved, and the files written anew to match. A
    /// `committed` file of an older build has its rows logged now.
    pub(super) fn recover_txns(
        &self,
        w: &Writer,
        records: &[Record],
        txn_records: &[Record],
    ) -> Result<()> {
        let mut held = lock(&w.txns);
        for f in read_txns(&self.dir)? {
            let h = Held {
                state: f.state,
                note: f.note,
                since: f.since,
                ops: f.ops,
                need: 0,
                logged: true,
            };
            held.insert(f.tx, h);
        }
        // the files hold everything up to their checkpoint; the steps after it are replayed:
        // the transactions' own log's (prepares, aborts), then the commits of the store's (a
        // transaction's commit comes after its prepare)
        let (store_at, txn_at) = read_checkpoint(&self.dir)?;
        let steps = (txn_records.iter().filter(|r| r.lsn > txn_at))
            .chain(records.iter().filter(|r| r.lsn > store_at))
            .flat_map(|r| &r.ops)
            .filter(|op| op.is_txn());
        for op in steps {
            w.stepped.store(true, Relaxed);
            replay_step(&mut held, op);
        }
        let engine = self.snapshot().engine.clone();
        for h in held.values_mut() {
            match h.state {
                TxState::Prepared | TxState::Committed => {
                    h.need = Self::room(&engine, &h.ops);
                    w.used.fetch_add(h.need, Relaxed);
                }
                TxState::Applied | TxState::Aborted => h.ops = Vec::new(),
            }
        }
        let committed: Vec<u128> = (held.iter())
            .filter(|(_, h)| h.state == TxState::Committed)
            .map(|(&tx, _)| tx)
            .collect();
        for tx in committed {
            let h = held.get_mut(&tx).expect("held");
            self.apply_committed(w, tx, h, true)?;
        }
        drop(held);
        self.checkpoint_txns(w)
    }

    /// Writes the transactions held, each in its file in `txn/`, removes the files of those no
    /// longer held, and names the log's record they hold up to: what the log's records will
    /// not hold once the tables' base moves past them (a compaction), and what a forget left
    /// out of the log (an open, a close).
    pub(super) fn checkpoint_txns(&self, w: &Writer) -> Result<()> {
        // every step is logged (and synced) with the transactions held: under their lock the
        // log's last record is one the files will hold
        let held = lock(&w.txns);
        if held.is_empty() && !w.stepped.load(Relaxed) && !self.dir.join(TXN_DIR).exists() {
            return Ok(());
        }
        let log = w.txn_log.get();
        let upto = (w.wal.next_lsn() - 1, log.map_or(0, |l| l.next_lsn() - 1));
        let files = read_txns(&self.dir)?;
        for f in &files {
            if held.get(&f.tx).is_none_or(|h| h.state != f.state) {
                remove_tx(&self.dir, f.tx, f.state)?;
            }
        }
        for (&tx, h) in held.iter() {
            if !files.iter().any(|f| f.tx == tx && f.state == h.state) {
                write_tx(&self.dir, tx, h.state, &h.note, &h.ops)?;
            }
        }
        write_checkpoint(&self.dir, upto)?;
        // what the checkpoint holds of the transactions' own log goes
        log.map_or(Ok(()), |l| l.release(upto.1))?;
        Ok(())
    }
}

/// One of the log's operations replayed over the transactions held: a step says where its
/// transaction stands from then on, whatever the files said (they may be newer than the step);
/// any other operation is not theirs.
fn replay_step(held: &mut BTreeMap<u128, Held>, op: &Op) {
    let since = SystemTime::now();
    match op {
        Op::Prepare { tx, note, ops } => {
            held.insert(
                *tx,
                Held {
                    state: TxState::Prepared,
                    note: note.clone(),
                    since,
                    ops: ops.clone(),
                    need: 0,
                    logged: true,
                },
            );
        }
        Op::Decide { tx, commit, keep } => {
            let state = if *commit {
                TxState::Applied
            } else {
                TxState::Aborted
            };
            if *keep {
                let note = held.get(tx).map(|h| h.note.clone()).unwrap_or_default();
                held.insert(
                    *tx,
                    Held {
                        state,
                        note,
                        since,
                        ops: Vec::new(),
                        need: 0,
                        logged: true,
                    },
                );
            } else {
                held.remove(tx);
            }
        }
        _ => {}
    }
}

/// Opens the transactions' own log where one exists (`txn/log`), with the steps after the
/// checkpoint's; none: nothing (it opens at the first step).
pub(super) fn open_log(
    dir: &std::path::Path,
    config: WalConfig,
) -> Result<(std::sync::OnceLock<Wal>, Vec<Record>)> {
    let at = txn_log_dir(dir, false)?;
    let log = std::sync::OnceLock::new();
    if !at.exists() {
        return Ok((log, Vec::new()));
    }
    let (_, after) = read_checkpoint(dir)?;
    let (wal, recovered) = Wal::open(&at, config, after)?;
    let _ = log.set(wal);
    Ok((log, recovered.records))
}
