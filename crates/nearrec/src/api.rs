//! The contract: the store's verbs, defined once ([`StoreApi`]). The embedded [`Store`] and the
//! storage node's client (`nearrec_client::Client`) implement it, the node serves any
//! implementation of it, and one conformance suite (`crates/nearrec/tests/suite/`) holds every
//! implementation to the same answers and the same typed errors. A verb an implementation
//! cannot serve answers [`Error::Unsupported`] naming the verb, never a silent no-op. Verbs
//! made of other verbs are written here once, for every implementation: a training feed's
//! [`StoreApi::sync_table`] (`docs/live.md`).
//!
//! An embedded [`Store`] also has inherent methods under some of these names, in the shapes an
//! embedded caller wants: `version` and `tier_report` cannot fail, `stats` is `None` without an
//! SSD tier, `lookup` answers the [`Pooled`] alone, `table` the engine's full `TableMeta`,
//! `submit` takes any [`AsBatch`] by value and `swap` any path. Method calls on a `Store` find
//! those; code over any store (`&dyn StoreApi`, a generic `S: StoreApi`) gets the contract's,
//! and `StoreApi::version(&store)` names it on a concrete `Store`. Each trait verb of `Store` runs
//! the same inherent code as its twin (`impl StoreApi for Store` below), so the two cannot drift.

use std::collections::VecDeque;
use std::time::Duration;

use nearrec_engine::TierReport;
use nearrec_format::DType;
use nearrec_format::wal::Init;

use crate::batch::{AsBatch, Bags, Batch, Indices, Pooled, Read, TableLookup};
use crate::error::{Error, Result};
use crate::live::{Compaction, Decision, RowWrite, Transaction, WriteOptions};
use crate::membership::Membership;
use crate::model::{Inferred, Tensor};
use crate::pipeline::Pending;
use crate::raw::Rows;
use crate::shard::ShardTag;
use crate::store::{Stats, Store};
use crate::versions::SwapTo;

/// An answer and the version of the store it read.
pub type Versioned<T> = (T, u64);

/// One table as a store serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    pub name: String,
    pub rows: u64,
    pub dim: u32,
    pub dtype: DType,
    /// A keyed table's keys (its rows but the zero row; lookups name keys); `None`: rows are
    /// addressed by position.
    pub keys: Option<u64>,
}

/// What a store holds and how it is served ([`StoreApi::info`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// The name it is served as: its directory's, or the node's name for it.
    pub name: String,
    pub tables: Vec<TableInfo>,
    pub version: u64,
    /// `"dram"` or `"ssd"`.
    pub tier: String,
    pub writable: bool,
    /// Whether a model is kept with it ([`StoreApi::infer`]).
    pub model: bool,
    /// The stores served beside it that the caller may see (a node's; empty for an embedded
    /// store).
    pub stores: Vec<String>,
    /// The directory served now, on the serving side's file system.
    pub path: String,
    /// Served from a repository of versions: the version served now, and every version the
    /// repository holds (lowest first).
    pub served_version: Option<u64>,
    pub versions: Vec<u64>,
    /// A shard of a sharded store: which plan it was cut by, and which shard it is.
    pub shard: Option<ShardTag>,
}

impl Info {
    /// The table named `name`, or `UnknownTable`.
    pub fn table(&self, name: &str) -> Result<&TableInfo> {
        self.tables.iter().find(|t| t.name == name).ok_or_else(|| {
            let have: Vec<&str> = self.tables.iter().map(|t| t.name.as_str()).collect();
            Error::Engine(nearrec_engine::EngineError::UnknownTable {
                name: name.to_owned(),
                available: have.join(", "),
            })
        })
    }
}

/// RM_create_table's arguments ([`StoreApi::create_table`]).
#[derive(Debug, Clone, Copy)]
pub struct NewTable<'a> {
    pub name: &'a str,
    pub rows: u64,
    pub dim: u32,
    pub dtype: DType,
    pub init: Init,
}

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

/// The store's verbs, whatever serves them: an embedded [`Store`], a storage node's store
/// through its client, and (next) a store sharded over several nodes. Object-safe: surfaces
/// hold an `Arc<dyn StoreApi>`.
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

    /// [`StoreApi::lookup`] as version `version` of the repository the store is served from
    /// answers it — the one served, or one held open beside it ([`StoreApi::stage`]) — or
    /// [`Error::VersionNotServed`]: never an answer from another version. A sharded store pins
    /// every shard's share of a batch to one version this way.
    fn lookup_version(&self, _batch: &Batch<'_>, _version: u64) -> Result<(Pooled, Read)> {
        Err(Error::unsupported("lookup_version", self.describe()))
    }

    /// [`StoreApi::lookup_rows`] at version `version`, as [`StoreApi::lookup_version`].
    fn lookup_rows_version(
        &self,
        _batch: &Batch<'_>,
        _version: u64,
    ) -> Result<Versioned<Vec<Rows>>> {
        Err(Error::unsupported("lookup_rows_version", self.describe()))
    }

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

    /// The model kept with the store, run next to its embeddings: `[batch, outputs]`.
    fn infer(&self, dense: &[f32], batch: &Batch<'_>) -> Result<Inferred>;

    /// Replaces dense weights of the model kept with the store by name (a trainer's update of
    /// the dense part; the rest stay): each a weight the model keeps, of its shape, finite, or
    /// the whole update is refused. Durable when it returns; inferences from the next on run
    /// the new weights.
    fn update_model(&self, weights: &[Tensor<'_>]) -> Result<()>;

    /// EMB_WRITE of several tables' rows, and EMB_REMOVE of rows (a write without values), in
    /// one atomic call: all of it or none, durable when it returns. The version that holds it.
    fn write_many(&self, writes: &[RowWrite<'_>], options: WriteOptions) -> Result<u64>;

    /// RM_create_table: served from the next lookup on; the version that made it.
    fn create_table(&self, table: &NewTable<'_>) -> Result<u64>;

    /// EMB_REMOVE of a table; the version that dropped it.
    fn drop_table(&self, name: &str) -> Result<u64>;

    /// A cross-shard write's first phase on this store (two-phase commit, `docs/distributed.md`):
    /// the call checked as [`StoreApi::write_many`] checks it, its room reserved and its rows
    /// durable under transaction `tx`, none served yet; refused ([`ErrorKind::StoreLocked`])
    /// while another prepared transaction holds one of its rows. `note` is the coordinator's,
    /// kept with it. `epoch`: the membership epoch of the shard's replicas its sender holds
    /// (refused, [`ErrorKind::MembershipChanged`], by a replica at another, or by one that is
    /// no member); `None` for a shard of one replica.
    fn prepare_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        epoch: Option<u64>,
    ) -> Result<()> {
        let _ = (tx, writes, options, note, epoch);
        Err(Error::unsupported("prepare_write", self.describe()))
    }

    /// A cross-shard write's second phase: transaction `tx` committed (its rows logged and
    /// served) or aborted; `keep` keeps the outcome until [`StoreApi::forget`] (the deciding
    /// shard's). The store's version after.
    fn decide(&self, tx: u128, decision: Decision, keep: bool) -> Result<u64> {
        let _ = (tx, decision, keep);
        Err(Error::unsupported("decide", self.describe()))
    }

    /// Drops the outcome kept of transaction `tx`.
    fn forget(&self, tx: u128) -> Result<()> {
        let _ = tx;
        Err(Error::unsupported("forget", self.describe()))
    }

    /// The transactions the store has prepared, and the outcomes it keeps.
    fn transactions(&self) -> Result<Vec<Transaction>> {
        Err(Error::unsupported("transactions", self.describe()))
    }

    /// The store's membership of its shard, as a replica (`docs/distributed.md`, "A replica
    /// catching up").
    fn membership(&self) -> Result<Membership> {
        Err(Error::unsupported("membership", self.describe()))
    }

    /// Makes `members` (replica ids) the shard's members at `epoch` on this replica if it is
    /// at epoch `expected` (compare-and-set; else [`ErrorKind::MembershipChanged`] naming the
    /// one it holds), durably; lifts a fence.
    fn set_membership(&self, expected: u64, epoch: u64, members: &[u64]) -> Result<Membership> {
        let _ = (expected, epoch, members);
        Err(Error::unsupported("set_membership", self.describe()))
    }

    /// Fences a member at `epoch` for a catch-up's last pass: new prepares refused until its
    /// membership changes, those taken before drained within `lease`; the store's count of
    /// writes, which holds while fenced.
    fn fence(&self, epoch: u64, lease: Duration) -> Result<u64> {
        let _ = (epoch, lease);
        Err(Error::unsupported("fence", self.describe()))
    }

    /// A replica catching up (no member) takes rows copied from a live one as its write
    /// number `count`, its shard's count of writes becoming its own; its version after.
    fn adopt(&self, writes: &[RowWrite<'_>], options: WriteOptions, count: u64) -> Result<u64> {
        let _ = (writes, options, count);
        Err(Error::unsupported("adopt", self.describe()))
    }

    /// What `to` names — a store directory (on the serving side's file system), a version of
    /// the repository the store is served from, the version served before (a rollback) —
    /// served from the next request on; `warm` loads its DRAM tiers first, `force` skips the
    /// compatibility check. Returns the new store's version (its writes' count).
    fn swap(&self, to: &SwapTo, warm: bool, force: bool) -> Result<u64>;

    /// Opens what `to` names (a version of the repository the store is served from) beside
    /// the served version, checked and warmed as a swap would, without serving it: a swap to
    /// it then switches at once, and the version it replaces stays open for lookups pinned to
    /// it ([`StoreApi::lookup_version`]) until the next stage. Returns its number.
    fn stage(&self, _to: &SwapTo, _warm: bool, _force: bool) -> Result<u64> {
        Err(Error::unsupported("stage", self.describe()))
    }

    /// Lets go of the versions held open beside the served one (staged, or replaced by a swap
    /// to a staged one): lookups pinned to them are refused from now on.
    fn release(&self) -> Result<()> {
        Err(Error::unsupported("release", self.describe()))
    }

    /// The newest version the store's writer has logged, served from now on; returns it.
    fn refresh(&self) -> Result<u64>;

    /// Folds every write so far into new table files.
    fn compact(&self) -> Result<Compaction>;

    /// The digests of rows `first .. first + count` of `table` as it serves them now, one
    /// [`row_digest`] per row, computed where the rows are: a training feed compares them with
    /// its own rows' and reads or sends only the rows that differ. At most
    /// [`MAX_DIGEST_ROWS`] rows a call.
    fn row_digests(&self, table: &str, first: u64, count: u64) -> Result<Vec<u64>> {
        row_digests(self, table, first, count)
    }

    /// Writes the rows of `table` that differ from `values` (the whole table as a trainer
    /// holds it) by more than `tolerance`, comparing what the store would store with what it
    /// serves; in calls of at most 16,384 rows, each atomic and durable. Only rows whose
    /// digests differ ([`StoreApi::row_digests`]) are read or written: through a node, an
    /// unchanged table costs 8 bytes a row on the wire.
    fn sync_table(&self, table: &str, values: &[f32], tolerance: f32) -> Result<Synced> {
        sync_table(self, table, values, tolerance)
    }

    /// Every counter of the store: the SSD tier's and its DRAM tiers' totals, and the live
    /// store's (writes, log, compaction). `device` is `"dram"` for a DRAM-resident store.
    fn stats(&self) -> Result<Stats>;

    /// Per table: what its DRAM tiers hold and served (empty for a DRAM-resident store).
    fn tier_report(&self) -> Result<Vec<TierReport>>;

    /// Lets go of what the handle holds now — a writable store's writer lock, a connection —
    /// rather than when its last reference goes. Every later call fails.
    fn close(&self) -> Result<()>;
}

impl dyn StoreApi + '_ {
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

/// The embedded store: each verb its own method's.
impl StoreApi for Store {
    fn describe(&self) -> String {
        format!("the store at {}", self.path().display())
    }

    fn info(&self) -> Result<Info> {
        let path = self.path();
        Ok(Info {
            name: self.name(),
            tables: self.tables().iter().map(|t| self.table_info(t)).collect(),
            version: Store::version(self),
            tier: self.tier().name().to_owned(),
            writable: self.writable(),
            model: self.keeps_model(),
            stores: Vec::new(),
            path: path.to_string_lossy().into_owned(),
            served_version: self.served_version(),
            versions: match self.repository() {
                Some(r) => r.versions()?,
                None => Vec::new(),
            },
            shard: ShardTag::of(&self.manifest()),
        })
    }

    fn resident(&self) -> bool {
        self.tier() == nearrec_engine::Tier::Dram
    }

    fn location(&self) -> Option<std::path::PathBuf> {
        Some(self.path())
    }

    fn table(&self, name: &str) -> Result<TableInfo> {
        Ok(self.table_info(&Store::table(self, name)?))
    }

    fn version(&self) -> Result<u64> {
        Ok(Store::version(self))
    }

    fn shard(&self) -> Result<Option<ShardTag>> {
        Ok(self.with_opened(ShardTag::of))
    }

    fn lookup(&self, batch: &Batch<'_>) -> Result<(Pooled, Read)> {
        self.read_at(batch, &self.snapshot())
    }

    fn lookup_into(&self, batch: &Batch<'_>, out: &mut [f32]) -> Result<Read> {
        self.lookup_into_at(batch, out, &self.snapshot())
    }

    fn lookup_rows(&self, batch: &Batch<'_>) -> Result<Versioned<Vec<Rows>>> {
        Store::lookup_rows(self, batch)
    }

    fn lookup_version(&self, batch: &Batch<'_>, version: u64) -> Result<(Pooled, Read)> {
        Store::lookup_version(self, batch, version)
    }

    fn lookup_rows_version(&self, batch: &Batch<'_>, version: u64) -> Result<Versioned<Vec<Rows>>> {
        Store::lookup_rows_version(self, batch, version)
    }

    fn read_rows(&self, table: &str, rows: &[i64], out: &mut [f32]) -> Result<()> {
        Store::read_rows(self, table, rows, out)
    }

    fn submit(&self, batch: Box<dyn AsBatch>) -> Result<Submitted> {
        Ok(Box::new(Store::submit(self, batch)))
    }

    fn infer(&self, dense: &[f32], batch: &Batch<'_>) -> Result<Inferred> {
        Store::infer(self, dense, batch)
    }

    fn update_model(&self, weights: &[Tensor<'_>]) -> Result<()> {
        Store::update_model(self, weights)
    }

    fn write_many(&self, writes: &[RowWrite<'_>], options: WriteOptions) -> Result<u64> {
        Store::write_many(self, writes, options)
    }

    fn create_table(&self, t: &NewTable<'_>) -> Result<u64> {
        Store::create_table(self, t.name, t.rows, t.dim, t.dtype, t.init)
    }

    fn drop_table(&self, name: &str) -> Result<u64> {
        Store::drop_table(self, name)
    }

    fn prepare_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        epoch: Option<u64>,
    ) -> Result<()> {
        Store::prepare_write(self, tx, writes, options, note, epoch)
    }

    fn decide(&self, tx: u128, decision: Decision, keep: bool) -> Result<u64> {
        Store::decide(self, tx, decision, keep)
    }

    fn forget(&self, tx: u128) -> Result<()> {
        Store::forget(self, tx)
    }

    fn transactions(&self) -> Result<Vec<Transaction>> {
        Store::transactions(self)
    }

    fn membership(&self) -> Result<Membership> {
        Ok(Store::membership(self))
    }

    fn set_membership(&self, expected: u64, epoch: u64, members: &[u64]) -> Result<Membership> {
        Store::set_membership(self, expected, epoch, members)
    }

    fn fence(&self, epoch: u64, lease: Duration) -> Result<u64> {
        Store::fence(self, epoch, lease)
    }

    fn adopt(&self, writes: &[RowWrite<'_>], options: WriteOptions, count: u64) -> Result<u64> {
        Store::adopt(self, writes, options, count)
    }

    fn swap(&self, to: &SwapTo, warm: bool, force: bool) -> Result<u64> {
        Store::swap_to(self, to, warm, force)
    }

    fn stage(&self, to: &SwapTo, warm: bool, force: bool) -> Result<u64> {
        Store::stage(self, to, warm, force)
    }

    fn release(&self) -> Result<()> {
        Store::release(self);
        Ok(())
    }

    fn refresh(&self) -> Result<u64> {
        Store::refresh(self)
    }

    fn compact(&self) -> Result<Compaction> {
        Store::compact(self)
    }

    fn stats(&self) -> Result<Stats> {
        let mut stats = Store::stats(self).unwrap_or_else(|| Stats {
            device: "dram".into(),
            direct_io: false,
            block_bytes: 0,
            values: Vec::new(),
        });
        let live = self.live_stats().into_iter();
        stats.values.extend(live.map(|(k, v)| (k.to_owned(), v)));
        stats.values.extend(self.key_stats());
        Ok(stats)
    }

    fn tier_report(&self) -> Result<Vec<TierReport>> {
        Ok(Store::tier_report(self))
    }

    fn close(&self) -> Result<()> {
        Store::close(self)
    }
}

impl From<&nearrec_format::TableMeta> for TableInfo {
    fn from(t: &nearrec_format::TableMeta) -> Self {
        Self {
            name: t.name.clone(),
            rows: t.rows,
            dim: t.dim,
            dtype: t.dtype,
            keys: t.is_keyed().then(|| t.entries()),
        }
    }
}

impl Store {
    /// `t`'s info, a keyed table's keys as its writer has decided them (a reader's as it
    /// serves them).
    fn table_info(&self, t: &nearrec_format::TableMeta) -> TableInfo {
        TableInfo {
            keys: t
                .is_keyed()
                .then(|| self.keys_held(&t.name).unwrap_or(t.entries())),
            ..TableInfo::from(t)
        }
    }
}

/// Rows compared and written per write call of [`Store::sync_table`].
const CHUNK_ROWS: usize = 16 << 10;

/// What [`StoreApi::sync_table`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Synced {
    /// Rows compared.
    pub compared: u64,
    /// Rows that differed, written.
    pub written: u64,
    /// Write calls made (each atomic and durable).
    pub calls: u64,
    /// The store's version after the last of them.
    pub version: u64,
}

/// The most rows one [`StoreApi::row_digests`] call digests (a node answers 8 bytes a row).
pub const MAX_DIGEST_ROWS: u64 = 1 << 20;

/// A row's digest: xxh3-64 of its float32 values' bits, every NaN taken as one NaN and `-0.0`
/// as `0.0`, so that two rows have one digest exactly when they are equal value by value (as
/// [`StoreApi::sync_table`] compares them with no tolerance).
pub fn row_digest(row: &[f32]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
    for &v in row {
        let canonical = if v.is_nan() {
            f32::NAN
        } else if v == 0.0 {
            0.0
        } else {
            v
        };
        hasher.update(&canonical.to_bits().to_le_bytes());
    }
    hasher.digest()
}

/// Whether rows `first .. first + count` of `table` (of `rows` rows) may be asked for their
/// digests in one call: within the table, at most [`MAX_DIGEST_ROWS`]; else `InvalidRequest`
/// naming the table. Every implementation of [`StoreApi::row_digests`] checks this.
pub fn check_digest_rows(table: &str, rows: u64, first: u64, count: u64) -> Result<()> {
    let end = first.checked_add(count).filter(|&e| e <= rows);
    if count > MAX_DIGEST_ROWS || end.is_none() {
        return Err(Error::InvalidRequest {
            table: Some(table.to_owned()),
            position: None,
            reason: format!(
                "rows {first} + {count} are not within its {rows} rows, at most {MAX_DIGEST_ROWS} a call"
            ),
        });
    }
    Ok(())
}

/// [`StoreApi::row_digests`] from the rows as `store` reads them.
pub(crate) fn row_digests<S: StoreApi + ?Sized>(
    store: &S,
    table: &str,
    first: u64,
    count: u64,
) -> Result<Vec<u64>> {
    let meta = store.table(table)?;
    check_digest_rows(table, meta.rows, first, count)?;
    let dim = meta.dim as usize;
    let ids: Vec<i64> = (first..first + count).map(|r| r as i64).collect();
    let mut rows = vec![0f32; ids.len() * dim];
    store.read_rows(table, &ids, &mut rows)?;
    Ok(rows.chunks_exact(dim.max(1)).map(row_digest).collect())
}

/// [`StoreApi::sync_table`] on any implementation: the rows of `table` that differ from
/// `values` (the whole table, `rows × dim` float32, as a trainer holds it) by more than
/// `tolerance` in any value are written, comparing what the store would store — each new row
/// encoded in the table's dtype — with what it serves, so that an fp16 or int8 table is not
/// rewritten for its rounding. Rows are compared by digest first ([`StoreApi::row_digests`],
/// computed where the rows are): equal digests are equal rows; with a tolerance, the rows whose
/// digests differ are read and compared value by value. The rows go in calls of 16,384 at
/// most, each atomic and durable; a call that finds the delta full waits for compaction as
/// any write does.
pub(crate) fn sync_table<S: StoreApi + ?Sized>(
    store: &S,
    table: &str,
    values: &[f32],
    tolerance: f32,
) -> Result<Synced> {
    let meta = store.table(table)?;
    let (rows, dim) = (meta.rows as usize, meta.dim as usize);
    if values.len() != rows * dim {
        return Err(Error::InvalidRequest {
            table: Some(table.to_owned()),
            position: None,
            reason: format!(
                "the table has {rows} rows × dim {dim} = {} values, not {}",
                rows * dim,
                values.len()
            ),
        });
    }
    if !(tolerance >= 0.0 && tolerance.is_finite()) {
        return Err(Error::invalid(format!(
            "tolerance must be a finite number ≥ 0, not {tolerance}"
        )));
    }
    let mut done = Synced {
        version: store.version()?,
        ..Synced::default()
    };
    let (mut stored, mut served) = (vec![0f32; dim], Vec::new());
    let mut encoded = vec![0u8; meta.dtype.row_bytes(meta.dim) as usize];
    for first in (0..rows).step_by(CHUNK_ROWS) {
        let count = CHUNK_ROWS.min(rows - first);
        let theirs = store.row_digests(table, first as u64, count as u64)?;
        // the rows whose digests differ, and what the store would store of each
        let (mut candidates, mut new) = (Vec::new(), Vec::new());
        for (k, &digest) in theirs.iter().enumerate() {
            let id = first + k;
            let row = &values[id * dim..][..dim];
            meta.dtype.encode_row(row, &mut encoded);
            meta.dtype.decode_row(&encoded, &mut stored);
            if row_digest(&stored) != digest {
                candidates.push(id as i64);
                new.extend_from_slice(&stored);
            }
        }
        let changed = if tolerance == 0.0 || candidates.is_empty() {
            candidates
        } else {
            served.resize(candidates.len() * dim, 0.0);
            store.read_rows(table, &candidates, &mut served)?;
            // past the tolerance, or NaN on one side only
            let differs =
                |(a, b): (&f32, &f32)| (a - b).abs() > tolerance || a.is_nan() != b.is_nan();
            candidates
                .iter()
                .enumerate()
                .filter(|&(k, _)| {
                    let (mine, now) = (&new[k * dim..][..dim], &served[k * dim..][..dim]);
                    mine.iter().zip(now).any(differs)
                })
                .map(|(_, &id)| id)
                .collect()
        };
        done.compared += count as u64;
        if !changed.is_empty() {
            let rows: Vec<f32> = changed
                .iter()
                .flat_map(|&id| &values[id as usize * dim..][..dim])
                .copied()
                .collect();
            let w = RowWrite {
                table,
                ids: &changed,
                values: Some(&rows),
            };
            done.version = store.write_many(&[w], WriteOptions::default())?;
            done.written += changed.len() as u64;
            done.calls += 1;
        }
    }
    Ok(done)
}
