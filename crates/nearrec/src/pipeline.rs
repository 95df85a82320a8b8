//! Pipelined lookups (RM-SSD's `send_inputs` / `read_outputs`): [`Store::submit`] hands a batch
//! to the store's lanes and returns a [`Pending`] at once, so one batch's reads overlap another's
//! pooling and the caller's own work (its MLPs); [`Store::stream`] keeps `depth` batches in
//! flight and yields results in order. [`Store::lookup_split`] cuts one large batch into
//! sub-batches of bags that flow through two at a time (RM-SSD's system-level pipeline), each
//! pooling straight into its rows of the one output.
//!
//! The lanes are a thread pool shared by the process's stores, rebuilt in a forked child
//! (`nearrec_io::Workers`).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use nearrec_io::Workers;

use crate::api::{PendingLookup, Submitted};
use crate::batch::{AsBatch, Bags, Batch, Pooled, TableLookup};
use crate::error::{Error, Result};
use crate::store::Store;

/// Background lookups a process runs at once.
const LANES: usize = 4;

/// A submitted batch: [`Pending::wait`] returns its result (or the lookup's error).
#[derive(Debug)]
pub struct Pending {
    slot: Arc<Slot>,
}

#[derive(Debug, Default)]
struct Slot {
    result: Mutex<Option<Result<Pooled>>>,
    done: Condvar,
}

impl Pending {
    fn new() -> (Self, Arc<Slot>) {
        let slot = Arc::new(Slot::default());
        (Self { slot: slot.clone() }, slot)
    }

    fn ready(value: Result<Pooled>) -> Self {
        let (p, slot) = Self::new();
        slot.put(value);
        p
    }

    /// Whether the result is in.
    pub fn is_done(&self) -> bool {
        self.slot.lock().is_some()
    }

    /// Waits for the result.
    pub fn wait(self) -> Result<Pooled> {
        let mut r = self.slot.lock();
        loop {
            if let Some(v) = r.take() {
                return v;
            }
            r = self.slot.done.wait(r).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Waits at most `timeout`; gives the handle back if the result is not in by then.
    pub fn wait_timeout(self, timeout: Duration) -> std::result::Result<Result<Pooled>, Self> {
        let r = self.slot.lock();
        let (mut r, _) = self
            .slot
            .done
            .wait_timeout_while(r, timeout, |v| v.is_none())
            .unwrap_or_else(|e| e.into_inner());
        match r.take() {
            Some(v) => Ok(v),
            None => {
                drop(r);
                Err(self)
            }
        }
    }
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Result<Pooled>>> {
        self.result.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn put(&self, value: Result<Pooled>) {
        *self.lock() = Some(value);
        self.done.notify_all();
    }
}

/// The results of a stream of batches, in order ([`Store::stream`]).
#[derive(Debug)]
pub struct Stream<I> {
    store: Store,
    batches: I,
    depth: usize,
    window: VecDeque<Pending>,
}

impl<I, B> Iterator for Stream<I>
where
    I: Iterator<Item = B>,
    B: AsBatch,
{
    type Item = Result<Pooled>;

    fn next(&mut self) -> Option<Result<Pooled>> {
        while self.window.len() < self.depth {
            match self.batches.next() {
                Some(b) => self.window.push_back(self.store.submit(b)),
                None => break,
            }
        }
        self.window.pop_front().map(Pending::wait)
    }
}

impl Store {
    /// Starts a lookup of `batch` in the background and returns at once.
    pub fn submit<B: AsBatch>(&self, batch: B) -> Pending {
        let pool = match Workers::shared("lanes", LANES).get() {
            Ok(pool) => pool,
            Err(e) => return Pending::ready(Err(Error::Engine(e.into()))),
        };
        let (pending, slot) = Pending::new();
        let store = self.clone();
        pool.spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let batch = batch.as_batch();
                store.lookup_at(&batch, &store.snapshot()).map(|(p, _)| p)
            }));
            slot.put(result.unwrap_or_else(|_| {
                Err(Error::Internal(
                    "a background lookup panicked (a bug in nearrec; please report it)".into(),
                ))
            }));
        });
        pending
    }

    /// The results of `batches` in order, `depth` (at least 1) of them in flight: batch `i + 1`
    /// is read while the caller works on batch `i`.
    pub fn stream<I>(&self, batches: I, depth: usize) -> Stream<I::IntoIter>
    where
        I: IntoIterator,
        I::Item: AsBatch,
    {
        Stream {
            store: self.clone(),
            batches: batches.into_iter(),
            depth: depth.max(1),
            window: VecDeque::new(),
        }
    }

    /// `StoreApi::lookup` with the bags cut into sub-batches of at most `sub_batch` bags that
    /// flow through two at a time (one reading while the other pools), each pooled into its
    /// rows of the one output.
    pub fn lookup_split(&self, batch: &Batch<'_>, sub_batch: usize) -> Result<Pooled> {
        if sub_batch == 0 {
            return Err(Error::invalid("sub_batch must be at least 1"));
        }
        let prepared = self.prepare(batch)?;
        let (bags, width) = (prepared.batch(), prepared.width());
        if bags <= sub_batch {
            return self.lookup_at(batch, &self.snapshot()).map(|(p, _)| p);
        }
        let parts = split(batch, &prepared, sub_batch);
        // every sub-batch reads the version the batch started at
        let snapshot = self.snapshot();
        let mut values = vec![0f32; bags * width];
        let chunks: Vec<&mut [f32]> = values.chunks_mut(sub_batch * width.max(1)).collect();
        let work = Mutex::new(parts.iter().zip(chunks));
        let failed: Mutex<Option<Error>> = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    loop {
                        let item = work.lock().unwrap_or_else(|e| e.into_inner()).next();
                        let Some((part, out)) = item else { break };
                        let b = part.batch();
                        let run = self.prepare(&b).and_then(|p| {
                            self.execute_at(&b, &p, &mut out[..p.batch() * width], &snapshot)
                        });
                        if let Err(e) = run {
                            failed
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .get_or_insert(e);
                            break;
                        }
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        Ok(self.pooled(batch, bags, values))
    }
}

/// One sub-batch: per table its lookups of bags `lo..hi`, bag lengths owned; answered in the
/// batch's dtype (each bag's vectors are rounded on their own).
struct Part<'a> {
    tables: Vec<(TableLookup<'a>, Vec<i64>)>,
    out: nearrec_engine::OutDtype,
}

impl Part<'_> {
    fn batch(&self) -> Batch<'_> {
        Batch::new(
            self.tables
                .iter()
                .map(|(t, lengths)| TableLookup {
                    bags: match t.bags {
                        Bags::Fixed { .. } => t.bags,
                        _ => Bags::Lengths(nearrec_engine::Indices::I64(lengths)),
                    },
                    ..*t
                })
                .collect(),
        )
        .with_out(self.out)
    }
}

/// `batch` (validated: `prepared`) cut at the same bags of every table.
fn split<'a>(
    batch: &Batch<'a>,
    prepared: &nearrec_engine::Prepared,
    sub_batch: usize,
) -> Vec<Part<'a>> {
    let bags = prepared.batch();
    (0..bags)
        .step_by(sub_batch)
        .map(|lo| {
            let hi = (lo + sub_batch).min(bags);
            let tables = batch
                .tables
                .iter()
                .enumerate()
                .map(|(k, t)| {
                    let bounds = prepared.bag_bounds(k);
                    let (a, b) = (bounds[lo], bounds[hi]);
                    let lengths = bounds[lo..=hi]
                        .windows(2)
                        .map(|w| (w[1] - w[0]) as i64)
                        .collect();
                    let part = TableLookup {
                        indices: t.indices.slice(a..b),
                        bags: match t.bags {
                            Bags::Fixed { bag_size, .. } => Bags::Fixed {
                                batch: hi - lo,
                                bag_size,
                            },
                            other => other,
                        },
                        per_sample_weights: t.per_sample_weights.map(|w| &w[a..b]),
                        ..*t
                    };
                    (part, lengths)
                })
                .collect();
            Part {
                tables,
                out: batch.out,
            }
        })
        .collect()
}

impl PendingLookup for Pending {
    fn is_done(&self) -> bool {
        Pending::is_done(self)
    }

    fn wait(self: Box<Self>) -> Result<Pooled> {
        Pending::wait(*self)
    }

    fn wait_timeout(
        self: Box<Self>,
        timeout: Duration,
    ) -> std::result::Result<Result<Pooled>, Submitted> {
        Pending::wait_timeout(*self, timeout).map_err(|p| Box::new(p) as Submitted)
    }
}
