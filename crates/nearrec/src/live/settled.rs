//! What a lookup of a replica in a cluster that writes in two phases waits for, and what it
//! says of the rows it read (`docs/distributed.md`, "Reads while writes go on").
//!
//! - A lookup first waits until every transaction prepared here *before it came* that holds one
//!   of its rows is decided ([`Live::awaited`], [`Live::settle`]): a transaction is decided
//!   only once every replica has prepared it, so a read that comes after the decision — after
//!   another read saw it anywhere — sees it here too. Those prepared after the lookup came are
//!   concurrent with it and not waited for: a row written without pause never starves a reader.
//! - Its answer names the transaction that last wrote each row it read, within
//!   [`WRITERS_KEPT`] ([`Live::writers`]), with the coordinator's note (the shards it wrote):
//!   a router reading several shards checks the answers against each other and reads again a
//!   shard that has not shown a transaction another shard's answer shows, naming it
//!   (`expect`: waited for as if it held a row read).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nearrec_format::wal::Op;

use super::{Live, lock};
use crate::batch::Batch;
use crate::error::{Error, Result};

/// How long a row is remembered as last written by a transaction. A router's read of several
/// shards that takes longer than half of it is read again whole (`nearrec-cluster`).
pub const WRITERS_KEPT: Duration = Duration::from_secs(10);

/// The transaction that last wrote a row a lookup read, and its coordinator's note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastWriter {
    pub tx: u128,
    pub note: Arc<str>,
}

/// A transaction that writes more rows than this is remembered by its tables alone: a lookup
/// of any row of them names it (a delta file of a feed writes many; the memory stays bounded
/// by the transactions, not their rows, and naming a writer too many only costs a second read).
const ROWS_REMEMBERED: usize = 4096;

/// Each row's last writer among the transactions applied within [`WRITERS_KEPT`].
#[derive(Debug, Default)]
pub(super) struct LastWriters {
    /// By table, each row's last writer.
    rows: HashMap<String, HashMap<u64, u128>>,
    /// The transactions applied, oldest first.
    order: VecDeque<Applied>,
}

/// A transaction applied: when, which, and what it wrote — its rows, or past
/// [`ROWS_REMEMBERED`] its tables.
#[derive(Debug)]
struct Applied {
    at: Instant,
    writer: LastWriter,
    rows: Vec<(String, u64)>,
    tables: Vec<String>,
}

impl LastWriters {
    /// Transaction `tx` (its note, its rows) applied now.
    pub(super) fn note(&mut self, tx: u128, note: &str, ops: &[Op]) {
        self.expire();
        let written = ops.iter().filter_map(|op| match op {
            Op::Write { table, ids, .. } | Op::Remove { table, ids } => Some((table, ids)),
            _ => None,
        });
        let (mut rows, mut tables) = (Vec::new(), Vec::new());
        if written.clone().map(|(_, ids)| ids.len()).sum::<usize>() > ROWS_REMEMBERED {
            tables = written.map(|(table, _)| table.clone()).collect();
            tables.sort_unstable();
            tables.dedup();
        } else {
            for (table, ids) in written {
                let of = self.rows.entry(table.clone()).or_default();
                for &id in ids {
                    of.insert(id, tx);
                    rows.push((table.clone(), id));
                }
            }
        }
        let writer = LastWriter {
            tx,
            note: Arc::from(note),
        };
        self.order.push_back(Applied {
            at: Instant::now(),
            writer,
            rows,
            tables,
        });
    }

    fn expire(&mut self) {
        while let Some(first) = self.order.front()
            && first.at.elapsed() > WRITERS_KEPT
        {
            let gone = self.order.pop_front().expect("front");
            for (table, id) in gone.rows {
                if let Some(of) = self.rows.get_mut(&table)
                    && of.get(&id) == Some(&gone.writer.tx)
                {
                    of.remove(&id);
                }
            }
        }
        self.rows.retain(|_, of| !of.is_empty());
    }

    /// The last writers of `batch`'s rows, each once (and every transaction remembered by a
    /// table it reads).
    fn of(&mut self, batch: &Batch<'_>) -> Vec<LastWriter> {
        self.expire();
        let mut txs = HashSet::new();
        for t in &batch.tables {
            let Some(of) = self.rows.get(t.table) else {
                continue;
            };
            for i in 0..t.indices.len() {
                if let Some(&tx) = of.get(&(t.indices.get(i) as u64)) {
                    txs.insert(tx);
                }
            }
        }
        let wide = |a: &Applied| {
            (a.tables.iter()).any(|table| batch.tables.iter().any(|t| t.table == table))
        };
        (self.order.iter())
            .filter(|a| txs.remove(&a.writer.tx) || wide(a))
            .map(|a| a.writer.clone())
            .collect()
    }
}

/// Whether `ops` write or remove a row `batch` reads.
fn reads_any(batch: &Batch<'_>, ops: &[Op]) -> bool {
    let rows = super::txn::rows_of(ops);
    batch.tables.iter().any(|t| {
        rows.get(t.table)
            .is_some_and(|of| (0..t.indices.len()).any(|i| of.contains(&(t.indices.get(i) as u64))))
    })
}

impl Live {
    /// The transactions a lookup of `batch` coming now waits for: those prepared here (or
    /// committed, not yet applied) that hold one of its rows, and those of `expect` held
    /// here. Nothing on a store that takes no writes.
    pub(crate) fn awaited(&self, batch: &Batch<'_>, expect: &[u128]) -> Vec<u128> {
        let Some(w) = self.open_writer() else {
            return Vec::new();
        };
        (lock(&w.txns).iter())
            .filter(|(tx, h)| h.holds() && (expect.contains(tx) || reads_any(batch, h.ops())))
            .map(|(&tx, _)| tx)
            .collect()
    }

    /// Waits until none of `txns` is held prepared here; past `until`, `StoreLocked` naming a
    /// row one still holds.
    pub(crate) fn settle(&self, txns: &[u128], until: Instant) -> Result<()> {
        let w = self.writer()?;
        let mut held = lock(&w.txns);
        loop {
            let Some((&tx, h)) =
                (txns.iter()).find_map(|tx| held.get_key_value(tx).filter(|(_, h)| h.holds()))
            else {
                return Ok(());
            };
            let now = Instant::now();
            if now >= until {
                let (table, row) = h.first_row().unwrap_or_default();
                return Err(Error::Held { table, row, tx });
            }
            held = (w.decided.wait_timeout(held, until - now))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The transactions that last wrote `batch`'s rows within [`WRITERS_KEPT`], each once.
    pub(crate) fn writers(&self, batch: &Batch<'_>) -> Vec<LastWriter> {
        match self.open_writer() {
            Some(w) => lock(&w.last_writers).of(batch),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nearrec_engine::{Bags, Indices, TableLookup};

    fn write(table: &str, ids: Vec<u64>) -> Op {
        Op::Remove {
            table: table.to_owned(),
            ids,
        }
    }

    #[test]
    fn a_row_names_its_last_writer_once_and_each_writer_once() {
        let mut w = LastWriters::default();
        w.note(1, "a", &[write("t", vec![1, 2])]);
        w.note(2, "b", &[write("t", vec![2, 3]), write("u", vec![1])]);
        let ids = [1i64, 2, 2, 3];
        let lengths = [4i64];
        let batch = Batch::new(vec![TableLookup::new(
            "t",
            Indices::I64(&ids),
            Bags::Lengths(Indices::I64(&lengths)),
        )]);
        let got: Vec<u128> = w.of(&batch).iter().map(|w| w.tx).collect();
        assert_eq!(got, vec![1, 2]);
        let only = [2i64];
        let one = [1i64];
        let batch = Batch::new(vec![TableLookup::new(
            "t",
            Indices::I64(&only),
            Bags::Lengths(Indices::I64(&one)),
        )]);
        let got = w.of(&batch);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].tx, &*got[0].note), (2, "b"));
        // a table no transaction wrote
        let batch = Batch::new(vec![TableLookup::new(
            "v",
            Indices::I64(&only),
            Bags::Lengths(Indices::I64(&one)),
        )]);
        assert!(w.of(&batch).is_empty());
        // a transaction of more rows is named by any lookup of its tables
        let many: Vec<u64> = (100..100 + ROWS_REMEMBERED as u64 + 1).collect();
        w.note(3, "c", &[write("v", many)]);
        let got: Vec<u128> = w.of(&batch).iter().map(|w| w.tx).collect();
        assert_eq!(got, vec![3]);
        assert!(
            !w.rows.contains_key("v"),
            "its rows are not kept one by one"
        );
    }
}
