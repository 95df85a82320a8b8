//! A sharded store's reads: a batch split over its shards, each share read on one replica of
//! its shard (hedged and failed over: `shard.rs`), at one cluster version (`versions.rs`), the
//! answers checked against each other for writes across shards seen in part, and merged.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::TryFutureExt;
use futures::future::try_join_all;
use nearrec::{Batch, Error, ErrorKind, Pooled, Read, Rows, Versioned, WRITERS_KEPT};
use nearrec_client::{Answered, Client, Started};
use nearrec_plan::shards::ShardedTable;

use super::Inner;
use crate::split::Split;
use crate::txn::{self, Note};
use crate::versions;

/// How a read of one shard's share begins on a replica's client (at a version of its
/// repository, when one is given; expecting transactions, when read again).
type Start<T> = fn(
    &Client,
    &Batch<'_>,
    Option<u64>,
    Option<Instant>,
    &[u128],
) -> nearrec::Result<Started<Answered<T>>>;

/// How many times a read of several shards is read at most until its answers agree.
const READS: usize = 8;

/// What one shard's answer showed: the transactions that last wrote the rows it read (with the
/// shards each wrote), and those it was asked to show.
#[derive(Debug, Default)]
struct Shown {
    shard: usize,
    writers: HashSet<u128>,
    notes: Vec<(u128, Vec<usize>)>,
    expected: Vec<u128>,
}

impl Shown {
    fn new(shard: usize) -> Self {
        Self {
            shard,
            ..Self::default()
        }
    }

    fn shows(&self, tx: u128) -> bool {
        self.writers.contains(&tx) || self.expected.contains(&tx)
    }
}

/// The answers (by position) to read again, each with what it is to show: every transaction
/// another answer shows as a row's last writer that wrote its shard too, and that it does not
/// show (a writer of a row it read) nor was asked to show before (it waited for those).
fn missing(shown: &[Shown]) -> Vec<(usize, Vec<u128>)> {
    let mut again = Vec::new();
    for (k, this) in shown.iter().enumerate() {
        let mut expect: Vec<u128> = (shown.iter())
            .filter(|other| other.shard != this.shard)
            .flat_map(|other| &other.notes)
            .filter(|(tx, shards)| shards.contains(&this.shard) && !this.shows(*tx))
            .map(|(tx, _)| *tx)
            .collect();
        if !expect.is_empty() {
            expect.extend(&this.expected);
            expect.sort_unstable();
            expect.dedup();
            again.push((k, expect));
        }
    }
    again
}

impl Inner {
    /// The version a read of `answered` shards (shard, version) saw: each shard's version as it
    /// answered, the others' as last seen.
    pub(super) fn version_of(&self, answered: &[(usize, u64)]) -> u64 {
        (self.shards.iter())
            .map(|s| {
                answered
                    .iter()
                    .find(|(k, _)| *k == s.index)
                    .map_or_else(|| s.seen.load(), |a| a.1)
            })
            .sum()
    }

    /// `read` at the cluster version: at the router's pin — moved to the version the shards
    /// serve now, and `read` again, when a shard no longer holds it (another router switched
    /// them), within the call's deadline — or at `at` when the caller names one.
    pub(super) fn pinned<T>(
        &self,
        at: Option<u64>,
        read: impl Fn(u64) -> nearrec::Result<T>,
    ) -> nearrec::Result<T> {
        if let Some(at) = at {
            return read(at);
        }
        let deadline = self.deadline();
        let mut tries = 0;
        loop {
            let pin = self.pin.load(Ordering::Acquire);
            let e = match read(pin) {
                Err(e) if pin > 0 && e.kind() == ErrorKind::VersionNotServed => e,
                done => return done,
            };
            tries += 1;
            let now = versions::served(&self.shards);
            if now != pin {
                let moved =
                    self.pin
                        .compare_exchange(pin, now, Ordering::AcqRel, Ordering::Acquire);
                if moved.is_ok() {
                    for s in self.shards.iter() {
                        s.seen.repin(now, 0);
                    }
                }
                continue;
            }
            // the shards are between two versions: wait for the switch to end
            let pause = std::time::Duration::from_millis(20);
            let late = match deadline {
                Some(d) => Instant::now() + pause >= d,
                None => tries >= 50,
            };
            if late {
                return Err(e);
            }
            std::thread::sleep(pause);
        }
    }

    /// Each shard's share of `split` asked at once at cluster version `at` (0: what each
    /// serves; `start` begins one on a replica's client): the answers by shard (`None` for a
    /// shard not asked), and the version the read saw.
    ///
    /// The answers are checked against each other (`docs/distributed.md`, "Reads while writes
    /// go on"): a shard whose answer does not show a transaction that another's shows as the
    /// last writer of a row it read, and that wrote this shard too, is read again, expecting
    /// it — until the answers agree, at most [`READS`] times.
    fn fan_out<T: Send>(
        &self,
        (split, tables): (&Split, &[ShardedTable]),
        batch: &Batch<'_>,
        at: u64,
        start: Start<T>,
    ) -> nearrec::Result<(Vec<Option<T>>, u64)> {
        let deadline = self.deadline();
        let version = (at > 0).then_some(at);
        let read = |s: usize, expect: Vec<u128>| {
            let sub = split.batch_for(s, batch, tables);
            (self.shards[s])
                .read(
                    &self.name,
                    (self.options.hedge, at),
                    deadline,
                    move |c| start(c, &sub, version, deadline, &expect),
                    |a| a.version,
                )
                .map_err(move |e| split.caller_error(s, e, tables))
        };
        let asked: Vec<usize> = split.shards().collect();
        let mut shown: Vec<Shown> = asked.iter().map(|&shard| Shown::new(shard)).collect();
        let mut got: Vec<Option<Answered<T>>> = asked.iter().map(|_| None).collect();
        // the shards read again, with what each is to show
        let mut again: Vec<(usize, Vec<u128>)> =
            (0..asked.len()).map(|k| (k, Vec::new())).collect();
        let mut begun = Instant::now();
        let mut settled = false;
        for round in 1.. {
            let reads = again
                .iter()
                .map(|(k, expect)| read(asked[*k], expect.clone()));
            let answers = match self.runtime.block_on(try_join_all(reads)) {
                // a row held by a transaction whose router is gone (or cut off): settled
                // once it is older than a call's deadline, as a write that meets it does, and
                // read again, once
                Err(e) if e.kind() == ErrorKind::StoreLocked && !settled => {
                    settled = true;
                    let timeout = self.options.client.timeout;
                    txn::settle(&self.shards, timeout.unwrap_or(txn::SETTLE_AFTER));
                    continue;
                }
                answers => answers?,
            };
            for ((k, expect), answer) in again.iter().zip(answers) {
                shown[*k].writers = answer.writers.iter().map(|w| w.tx).collect();
                shown[*k].notes = (answer.writers.iter())
                    .map(|w| {
                        (
                            w.tx,
                            Note::parse(&w.note).map_or_else(Vec::new, |n| n.shards),
                        )
                    })
                    .collect();
                shown[*k].expected = expect.clone();
                got[*k] = Some(answer);
            }
            if asked.len() == 1 {
                break;
            }
            // a writer applied at one shard before another's answer was read is kept there
            // for WRITERS_KEPT: a read longer than half of it is read again whole
            if begun.elapsed() > WRITERS_KEPT / 2 {
                again = (0..asked.len()).map(|k| (k, Vec::new())).collect();
                begun = Instant::now();
            } else {
                again = missing(&shown);
                if again.is_empty() {
                    break;
                }
            }
            if round == READS {
                return Err(Error::Remote {
                    kind: ErrorKind::Unavailable,
                    code: 14,
                    message: format!(
                        "{}: a read of shards {asked:?} was read {READS} times, and its \
                         shards' answers still showed different writes across shards (rows \
                         written without pause): try again",
                        self.describe()
                    ),
                    table: None,
                    position: None,
                });
            }
            self.reads_again
                .fetch_add(again.len() as u64, Ordering::Relaxed);
        }
        let mut answers: Vec<Option<T>> = (0..self.shards.len()).map(|_| None).collect();
        let mut versions = Vec::with_capacity(asked.len());
        for (&s, answer) in asked.iter().zip(got) {
            let answer = answer.expect("every shard asked answered");
            answers[s] = Some(answer.value);
            versions.push((s, answer.version));
        }
        Ok((answers, self.version_of(&versions)))
    }

    /// Pools `batch`: every shard it needs asked at once, at one cluster version (`at`, or
    /// the router's), the answers merged.
    pub(super) fn lookup(
        &self,
        batch: &Batch<'_>,
        at: Option<u64>,
    ) -> nearrec::Result<(Pooled, Read)> {
        let layout = self.layout();
        let (split, tables) = (self.split(batch, &layout)?, &layout.plan.tables);
        let (answers, version) = self.pinned(at, |at| {
            self.fan_out((&split, tables), batch, at, Client::start_lookup)
        })?;
        let read = Read {
            version,
            ..Read::default()
        };
        // the shards answer in fp32 (a table cut by rows is summed here), rounded once merged
        let mut pooled = split.merge(&answers, tables);
        pooled.round_to(batch.out);
        Ok((pooled, read))
    }

    pub(super) fn lookup_rows(
        &self,
        batch: &Batch<'_>,
        at: Option<u64>,
    ) -> nearrec::Result<Versioned<Vec<Rows>>> {
        let layout = self.layout();
        let (split, tables) = (self.split(batch, &layout)?, &layout.plan.tables);
        let (answers, version) = self.pinned(at, |at| {
            self.fan_out((&split, tables), batch, at, Client::start_lookup_rows)
        })?;
        Ok((split.merge_rows(&answers, tables), version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(shard: usize, writers: &[(u128, &[usize])], expected: &[u128]) -> Shown {
        Shown {
            shard,
            writers: writers.iter().map(|w| w.0).collect(),
            notes: writers.iter().map(|w| (w.0, w.1.to_vec())).collect(),
            expected: expected.to_vec(),
        }
    }

    #[test]
    fn a_shard_not_showing_a_write_another_shows_across_both_is_read_again() {
        // shard 0 shows tx 7, which wrote shards 0 and 1; shard 1 shows nothing of it
        let answers = [shown(0, &[(7, &[0, 1])], &[]), shown(1, &[], &[])];
        assert_eq!(missing(&answers), vec![(1, vec![7])]);
        // both show it: agreed
        let answers = [
            shown(0, &[(7, &[0, 1])], &[]),
            shown(1, &[(7, &[0, 1])], &[]),
        ];
        assert!(missing(&answers).is_empty());
        // shard 1 was asked to show it and waited for it (its row since overwritten by 8)
        let answers = [shown(0, &[(7, &[0, 1])], &[]), shown(1, &[(8, &[1])], &[7])];
        assert!(missing(&answers).is_empty());
        // a write of shard 0 alone, or of shards 0 and 2 (not read), asks nothing of shard 1
        let answers = [
            shown(0, &[(7, &[0]), (9, &[0, 2])], &[]),
            shown(1, &[], &[]),
        ];
        assert!(missing(&answers).is_empty());
        // each missing the other's: both read again; what one was asked before is asked again
        let answers = [
            shown(0, &[(7, &[0, 1])], &[3]),
            shown(1, &[(8, &[0, 1])], &[]),
        ];
        assert_eq!(missing(&answers), vec![(0, vec![3, 8]), (1, vec![7])]);
    }
}
