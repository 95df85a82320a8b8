//! The contract: a narrow core every store implements ([`StoreApi`]: what a read-only store
//! is) and capabilities beyond it, each a trait of its own obtained as an `Option` from the
//! core (`caps.rs`: [`Writes`], [`Schema`], [`Versions`], [`Replica`], [`Inference`]), so that
//! what a store cannot do is known before it is called, and a surface that asks answers it once
//! ([`Error::Unsupported`] naming the verb, `<dyn StoreApi>::able`). The embedded [`Store`](crate::Store), the
//! storage node's client (`nearrec_client::Client`) and the sharded router
//! (`nearrec_cluster::ShardedStore`) implement it; the node serves any implementation, and one
//! conformance suite (`crates/nearrec/tests/suite/`) holds every implementation to the same
//! answers and typed errors, each case run where the store has its capabilities. Verbs made of
//! other verbs are provided methods, written once for every implementation (`sync.rs`: row
//! digests, and a training feed's [`Writes::sync_table`], `docs/live.md`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use nearrec_engine::{EngineError, InferTimes, TierReport};
use nearrec_format::TableCheck;

use crate::batch::{AsBatch, Bags, Batch, Indices, Pooled, Read, TableLookup};
use crate::error::{Error, Result};
use crate::model::{Inferred, StoredModel};

mod caps;
mod sync;
mod types;

pub use caps::{Inference, Replica, Schema, Versions, Writes};
pub use sync::{MAX_DIGEST_ROWS, Synced, check_digest_rows, row_digest};
pub use types::{Info, NewTable, Rows, ShardTag, Stats, TableInfo};

/// Every capability's name, as surfaces show them (Python's `Store.capabilities`).
pub const CAPABILITIES: [&str; 5] = ["writes", "schema", "versions", "replica", "inference"];

/// An answer and the version of the store it read.
pub type Versioned<T> = (T, u64);

/// A lookup under way ([`StoreApi::submit`]).
pub trait PendingLookup: Send + std::fmt::Debug {
    /// Whether the answer is in.
    fn is_done(&self) -> bool;
    /// Waits for the answer.
    fn wait(self: Box<Self>) -> Result<Pooled>;
    /// Waits at most `timeout`; the handle back if the answer has not come by then.
    fn wait_timeout(
        self: Box<Self>,
        timeout: Duration,
    ) -> std::result::Result<Result<Pooled>, Submitted>;
}

/// A submitted lookup, whatever serves it.
pub type Submitted = Box<dyn PendingLookup>;

/// The core of the contract, what every store is — a read-only store: what it holds, its
/// lookups, its counters, and the capabilities it has beyond them ([`StoreApi::writes`] and the
/// rest), each `None` where the implementation has none. Implemented by an embedded [`Store`](crate::Store),
/// a storage node's store through its client, and a store sharded over several nodes.
/// Object-safe: surfaces hold an `Arc<dyn StoreApi>`.
pub trait StoreApi: Send + Sync + std::fmt::Debug {
    /// What serves the store, in words, for errors: `"the store at PATH"`, `"store S on node
    /// ADDR"`.
    fn describe(&self) -> String;

    /// Its tables, version, tier and whether it keeps a model.
    fn info(&self) -> Result<Info>;

    /// Whether every row is in DRAM here, so that a lookup never waits on a device (a node
    /// runs such lookups on its async workers).
    fn resident(&self) -> bool {
        false
    }

    /// The store's directory on this machine, where it has one (a node resolves a swap's
    /// relative path against it).
    fn location(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// One table as served now (`UnknownTable` if there is none of that name).
    fn table(&self, name: &str) -> Result<TableInfo> {
        self.info()?.table(name).cloned()
    }

    /// The store's version: the number of the last write applied (0 before any).
    fn version(&self) -> Result<u64> {
        Ok(self.info()?.version)
    }

    /// Which shard of which plan the store is, if it is one ([`Info::shard`]); what a node
    /// checks a router's call against (`docs/distributed.md`, "Which node answers").
    fn shard(&self) -> Result<Option<ShardTag>> {
        Ok(self.info()?.shard)
    }

    /// Pools `batch` (EMB_READ): one `[batch, Σ dim]` output, tables in request order, every
    /// table read at one version.
    fn lookup(&self, batch: &Batch<'_>) -> Result<(Pooled, Read)>;

    /// Runs `model` (a dense part the caller built: Python's `nearrec.models.offload`) on this
    /// store's lookups: `batch` names the model's inputs in any order, or with `in_order` is
    /// already its tables in input order ([`StoredModel::inputs_of`]).
    /// Here the vectors are pooled through [`StoreApi::lookup`] (a node's, a sharded store's)
    /// and the dense part runs on the caller's core; the embedded store runs it beside its
    /// reads.
    fn infer_model(
        &self,
        model: &StoredModel,
        dense: &[f32],
        batch: &Batch<'_>,
        in_order: bool,
    ) -> Result<Inferred> {
        let start = Instant::now();
        let (pooled, _) = self.lookup(&model.inputs_of(batch, in_order)?)?;
        let embeddings = start.elapsed();
        let dims = model.dense.table_dims();
        let wrong = (pooled.tables.iter().zip(&dims)).find(|((_, d), want)| d != *want);
        if let Some(((table, dim), want)) = wrong {
            return Err(Error::InvalidRequest {
                table: Some(table.clone()),
                position: None,
                reason: format!("is {dim} wide; the model's input takes {want}"),
            });
        }
        let outputs = (model.dense)
            .forward(dense, &pooled.values, pooled.batch)
            .map_err(EngineError::Model)?;
        let total = start.elapsed();
        Ok(Inferred {
            batch: pooled.batch,
            width: model.dense.outputs(),
            outputs,
            times: InferTimes {
                total,
                embeddings,
                finish: total - embeddings,
                ..InferTimes::default()
            },
        })
    }

    /// [`StoreApi::lookup`] into `out` (`[batch, Σ dim]` float32, the caller's buffer), where
    /// the implementation can pool straight into it.
    fn lookup_into(&self, batch: &Batch<'_>, out: &mut [f32]) -> Result<Read> {
        let (pooled, read) = self.lookup(batch)?;
        if out.len() != pooled.values.len() {
            return Err(Error::invalid(format!(
                "the output holds {} floats; the batch pools to {} × {} = {}",
                out.len(),
                pooled.batch,
                pooled.width(),
                pooled.values.len()
            )));
        }
        out.copy_from_slice(&pooled.values);
        Ok(read)
    }

    /// Each table's distinct rows `batch` reads, decoded to float32, for a caller that pools
    /// them itself; and the version they were read at.
    fn lookup_rows(&self, batch: &Batch<'_>) -> Result<Versioned<Vec<Rows>>>;

    /// Rows `rows` of `table` decoded into `out` (`rows.len() × dim` floats), as the store is
    /// now: written rows as written, removed ones zeros.
    fn read_rows(&self, table: &str, rows: &[i64], out: &mut [f32]) -> Result<()> {
        let batch = Batch::new(vec![TableLookup::new(
            table,
            Indices::I64(rows),
            Bags::Fixed {
                batch: rows.len(),
                bag_size: 1,
            },
        )]);
        self.lookup_into(&batch, out).map(|_| ())
    }

    /// Starts a lookup and returns at once (RM_send_inputs); the answer comes from the handle
    /// (RM_read_outputs). Batches submitted together are in flight together.
    fn submit(&self, batch: Box<dyn AsBatch>) -> Result<Submitted>;

    /// The digests of rows `first .. first + count` of `table` as it serves them now, one
    /// [`row_digest`] per row, computed where the rows are: a training feed compares them with
    /// its own rows' and reads or sends only the rows that differ. At most
    /// [`MAX_DIGEST_ROWS`] rows a call.
    fn row_digests(&self, table: &str, first: u64, count: u64) -> Result<Vec<u64>> {
        sync::row_digests(self, table, first, count)
    }

    /// The newest version the store's writer has logged, served from now on; returns it (a
    /// store that always serves its newest: its version).
    fn refresh(&self) -> Result<u64> {
        self.version()
    }

    /// Every counter of the store: the SSD tier's and its DRAM tiers' totals, and the live
    /// store's (writes, log, compaction). `device` is `"dram"` for a DRAM-resident store.
    fn stats(&self) -> Result<Stats>;

    /// Per table: what its DRAM tiers hold and served (empty for a DRAM-resident store).
    fn tier_report(&self) -> Result<Vec<TierReport>>;

    /// One scrub pass where the store's data lies: every table read back from its device (not
    /// a page cache) at most `rate` bytes a second (0: as fast as it reads) and checked against
    /// its sector sums and checksums ([`crate::scrub`]); per table, the bytes checked and the
    /// damage found. It changes nothing, and lookups go on meanwhile.
    fn scrub(&self, rate: u64) -> Result<Vec<TableCheck>>;

    /// Lets go of what the handle holds now — a writable store's writer lock, a connection —
    /// rather than when its last reference goes. Every later call fails.
    fn close(&self) -> Result<()>;

    /// The implementation itself, for a surface that knows it (to downcast): what only an
    /// embedded store has (its tables' memory, its config, sub-batches, a caller's model, the
    /// simulated drive; a fast path pooling into the caller's buffer), what only a router has
    /// (its replicas moved). `None`: nothing beyond the contract (a node's store).
    fn concrete(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// Its writes, if it takes any ([`Writes`]).
    fn writes(&self) -> Option<&dyn Writes> {
        None
    }

    /// Its tables created and dropped while it serves, if it can ([`Schema`]).
    fn schema(&self) -> Option<&dyn Schema> {
        None
    }

    /// Its versions, if it swaps them ([`Versions`]).
    fn versions(&self) -> Option<&dyn Versions> {
        None
    }

    /// The verbs a router drives a replica of a shard with, if it is one ([`Replica`]).
    fn replica(&self) -> Option<&dyn Replica> {
        None
    }

    /// The model kept with it, if it can run one ([`Inference`]).
    fn inference(&self) -> Option<&dyn Inference> {
        None
    }
}

/// Inside an `impl StoreApi`: the getters of the capabilities the implementation has whole,
/// each answering `Some(self)` (`capable!(writes, versions)`); a capability it has only
/// sometimes keeps a getter of its own.
#[macro_export]
macro_rules! capable {
    ($($getter:ident),* $(,)?) => { $($crate::capable!(@ $getter);)* };
    (@ writes) => { fn writes(&self) -> Option<&dyn $crate::Writes> { Some(self) } };
    (@ schema) => { fn schema(&self) -> Option<&dyn $crate::Schema> { Some(self) } };
    (@ versions) => { fn versions(&self) -> Option<&dyn $crate::Versions> { Some(self) } };
    (@ replica) => { fn replica(&self) -> Option<&dyn $crate::Replica> { Some(self) } };
    (@ inference) => { fn inference(&self) -> Option<&dyn $crate::Inference> { Some(self) } };
}

impl dyn StoreApi + '_ {
    /// The names of the capabilities it hands out, in [`CAPABILITIES`]' order.
    pub fn capabilities(&self) -> Vec<&'static str> {
        let has = [
            self.writes().is_some(),
            self.schema().is_some(),
            self.versions().is_some(),
            self.replica().is_some(),
            self.inference().is_some(),
        ];
        (CAPABILITIES.iter().zip(has))
            .filter_map(|(name, on)| on.then_some(*name))
            .collect()
    }

    /// `capability` (one of this store's, `store.writes()` and the rest), or
    /// [`Error::Unsupported`] naming `verb` and the store: how a surface answers "this store
    /// cannot do that", once, typed.
    pub fn able<'a, T: ?Sized>(
        &self,
        capability: Option<&'a T>,
        verb: &'static str,
    ) -> Result<&'a T> {
        capability.ok_or_else(|| Error::unsupported(verb, self.describe()))
    }

    /// The answers of `batches` in order, `depth` (at least 1) of them in flight: batch `i + 1`
    /// is under way while the caller works on batch `i`.
    pub fn stream<I>(&self, batches: I, depth: usize) -> impl Iterator<Item = Result<Pooled>> + '_
    where
        I: IntoIterator<Item = Box<dyn AsBatch>>,
        I::IntoIter: 'static,
    {
        let mut batches = batches.into_iter();
        let mut window: VecDeque<Result<Submitted>> = VecDeque::new();
        let depth = depth.max(1);
        std::iter::from_fn(move || {
            while window.len() < depth {
                match batches.next() {
                    Some(b) => window.push_back(self.submit(b)),
                    None => break,
                }
            }
            window.pop_front().map(|p| p.and_then(PendingLookup::wait))
        })
    }
}

impl AsBatch for Box<dyn AsBatch> {
    fn as_batch(&self) -> Batch<'_> {
        (**self).as_batch()
    }
}
