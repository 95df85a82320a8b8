//! The contract's capabilities beyond the core: each a trait of its own, which a store hands
//! out as an `Option` (`StoreApi::writes` and the rest) when it has it. Which store has which:
//!
//! | capability | embedded `Store` | node (`Client`) | sharded router |
//! |---|---|---|---|
//! | [`Writes`] | yes (refused `ReadOnly` when opened read-only) | yes | yes (two-phase across shards) |
//! | [`Schema`] | yes | yes | yes (a new plan every shard moves to) |
//! | [`Versions`] | yes | yes | yes (every shard at once) |
//! | [`Replica`] | yes | yes | no (it drives its replicas with it) |
//! | [`Inference`] | yes (refused `NoModel` without a kept model) | yes | yes |
//!
//! A node answers for the store it serves: its client has every capability, and a verb its
//! store lacks is refused by the node, typed and named.

use std::time::Duration;

use super::types::Rows;
use super::{NewTable, ShardTag, StoreApi, Versioned};
use crate::batch::{Batch, Pooled, Read};
use crate::error::Result;
use crate::live::{Compaction, Decision, Fed, Feeds, RowWrite, Transaction, WriteOptions};
use crate::membership::Membership;
use crate::model::{Inferred, SavedModel, Tensor};
use crate::versions::SwapTo;
use nearrec_format::FeedCursor;

use super::sync::{self, Synced};

/// Rows written and removed while the store serves (`docs/live.md`).
pub trait Writes: StoreApi {
    /// EMB_WRITE of several tables' rows, and EMB_REMOVE of rows (a write without values), in
    /// one atomic call: all of it or none, durable when it returns. The version that holds it.
    fn write_many(&self, writes: &[RowWrite<'_>], options: WriteOptions) -> Result<u64>;

    /// Folds every write so far into new table files.
    fn compact(&self) -> Result<Compaction>;

    /// Applies delta file `cursor.sequence` of feed `feed` (its rows, `writes`, as
    /// [`Writes::write_many`] takes them) and moves the feed's cursor to it, in one atomic call
    /// whose log record holds both: a file at or before the cursor is not applied again
    /// (`applied: false`), one past the next is refused as a gap (`docs/live.md`, "Delta
    /// feeds").
    fn feed(
        &self,
        feed: &str,
        cursor: FeedCursor,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
    ) -> Result<Fed>;

    /// Each delta feed the store has applied, with the last file it applied.
    fn feed_status(&self) -> Result<Feeds>;

    /// Writes the rows of `table` that differ from `values` (the whole table as a trainer
    /// holds it) by more than `tolerance`, comparing what the store would store with what it
    /// serves; in calls of at most 16,384 rows, each atomic and durable. Only rows whose
    /// digests differ ([`StoreApi::row_digests`]) are read or written: through a node, an
    /// unchanged table costs 8 bytes a row on the wire.
    fn sync_table(&self, table: &str, values: &[f32], tolerance: f32) -> Result<Synced> {
        sync::sync_table(self, table, values, tolerance)
    }
}

/// Tables created and dropped while the store serves.
pub trait Schema: Send + Sync {
    /// RM_create_table: served from the next lookup on; the version that made it.
    fn create_table(&self, table: &NewTable<'_>) -> Result<u64>;

    /// EMB_REMOVE of a table; the version that dropped it.
    fn drop_table(&self, name: &str) -> Result<u64>;
}

/// Versions of the store swapped while it serves, and lookups pinned to one.
pub trait Versions: Send + Sync {
    /// What `to` names — a store directory (on the serving side's file system), a version of
    /// the repository the store is served from, the version served before (a rollback) —
    /// served from the next request on; `warm` loads its DRAM tiers first, `force` skips the
    /// compatibility check. Returns the new store's version (its writes' count).
    fn swap(&self, to: &SwapTo, warm: bool, force: bool) -> Result<u64>;

    /// [`StoreApi::lookup`] as version `version` of the repository the store is served from
    /// answers it — the one served, or one held open beside it ([`Replica::stage`]) — or
    /// [`crate::Error::VersionNotServed`]: never an answer from another version. A sharded store
    /// pins every shard's share of a batch to one version this way.
    fn lookup_version(&self, batch: &Batch<'_>, version: u64) -> Result<(Pooled, Read)>;

    /// [`StoreApi::lookup_rows`] at version `version`, as [`Versions::lookup_version`].
    fn lookup_rows_version(&self, batch: &Batch<'_>, version: u64) -> Result<Versioned<Vec<Rows>>>;
}

/// What a sharded store's router asks of one replica of a shard (`docs/distributed.md`): a
/// version staged beside the served one and let go, a write across shards in two phases, and
/// the replica's place in its shard.
pub trait Replica: Send + Sync {
    /// Opens what `to` names (a version of the repository the store is served from) beside
    /// the served version, checked and warmed as a swap would, without serving it: a swap to
    /// it then switches at once, and the version it replaces stays open for lookups pinned to
    /// it ([`Versions::lookup_version`]) until the next stage. Returns its number.
    fn stage(&self, to: &SwapTo, warm: bool, force: bool) -> Result<u64>;

    /// Lets go of the versions held open beside the served one (staged, or replaced by a swap
    /// to a staged one): lookups pinned to them are refused from now on.
    fn release(&self) -> Result<()>;

    /// A cross-shard write's first phase on this store (two-phase commit): the call checked as
    /// [`Writes::write_many`] checks it, its room reserved and its rows durable under
    /// transaction `tx`, none served yet; refused ([`crate::ErrorKind::StoreLocked`]) while
    /// another prepared transaction holds one of its rows. `note` is the coordinator's, kept
    /// with it. `epoch`: the membership epoch of the shard's replicas its sender holds
    /// (refused, [`crate::ErrorKind::MembershipChanged`], by a replica at another, or by one
    /// that is no member); `None` for a shard of one replica. `feed`: the writes are delta file
    /// `cursor.sequence` of that feed (a sharded store's [`Writes::feed`]): the cursor is
    /// committed with them, and a commit that finds the feed at or past it logs nothing.
    fn prepare_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        epoch: Option<u64>,
        feed: Option<(&str, FeedCursor)>,
    ) -> Result<()>;

    /// The deciding replica's share of a cross-shard write: checked and held as
    /// [`Replica::prepare_write`] holds it, but not logged until its commit logs it with the
    /// decision and the rows in one record — one sync on the call's path instead of two. A
    /// crash before the commit forgets it; the commit is then refused, and the transaction,
    /// which the decider holds nothing of, is aborted everywhere (`docs/distributed.md`,
    /// "Writes").
    fn hold_write(
        &self,
        tx: u128,
        writes: &[RowWrite<'_>],
        options: WriteOptions,
        note: &str,
        epoch: Option<u64>,
        feed: Option<(&str, FeedCursor)>,
    ) -> Result<()>;

    /// A cross-shard write's second phase: transaction `tx` committed (its rows logged and
    /// served) or aborted; `keep` keeps the outcome until [`Replica::forget`] (the deciding
    /// shard's). The store's version after.
    fn decide(&self, tx: u128, decision: Decision, keep: bool) -> Result<u64>;

    /// Drops the outcome kept of transaction `tx`.
    fn forget(&self, tx: u128) -> Result<()>;

    /// The transactions the store has prepared, and the outcomes it keeps.
    fn transactions(&self) -> Result<Vec<Transaction>>;

    /// The store's membership of its shard (`docs/distributed.md`, "A replica catching up").
    fn membership(&self) -> Result<Membership>;

    /// Makes `members` (replica ids) the shard's members at `epoch` on this replica if it is
    /// at epoch `expected` (compare-and-set; else [`crate::ErrorKind::MembershipChanged`]
    /// naming the one it holds), durably; lifts a fence.
    fn set_membership(&self, expected: u64, epoch: u64, members: &[u64]) -> Result<Membership>;

    /// Fences a member at `epoch` for a catch-up's last pass: new prepares refused until its
    /// membership changes, those taken before drained within `lease`; the store's count of
    /// writes, which holds while fenced.
    fn fence(&self, epoch: u64, lease: Duration) -> Result<u64>;

    /// A replica catching up (no member) takes rows copied from a live one as its write
    /// number `count`, its shard's count of writes becoming its own; its version after.
    fn adopt(&self, writes: &[RowWrite<'_>], options: WriteOptions, count: u64) -> Result<u64>;

    /// Keyed table `table`'s keys past `after` (from the first: `None`), in order, at most
    /// `count` (≤ [`crate::MAX_DIGEST_ROWS`]), each with the digest of its row as served now
    /// ([`crate::row_digest`]): what a catch-up compares a keyed table by, its keys' rows being
    /// each replica's own. Refused for a table addressed by row.
    fn key_digests(&self, table: &str, after: Option<u64>, count: u64) -> Result<Vec<(u64, u64)>>;

    /// Makes the store shard of plan `plan`, still taking calls of routers at `previous`
    /// meanwhile where one is given (a change of the sharded store's tables under way), if it
    /// is now of plan `expected` (compare-and-set; its tag unchanged otherwise, and refused
    /// naming the plan it is of), durably; the tag after. Done already (its tag `plan` and
    /// `previous`), it is done again as nothing. Refused for a store that is no shard.
    fn retag(&self, expected: &str, plan: &str, previous: Option<&str>) -> Result<ShardTag>;
}

/// The model kept with the store, run next to its embeddings.
pub trait Inference: Send + Sync {
    /// The model's outputs for one batch: `[batch, outputs]`.
    fn infer(&self, dense: &[f32], batch: &Batch<'_>) -> Result<Inferred>;

    /// Replaces dense weights of the model by name (a trainer's update of the dense part; the
    /// rest stay): each a weight the model keeps, of its shape, finite, or the whole update is
    /// refused. Durable when it returns; inferences from the next on run the new weights.
    fn update_model(&self, weights: &[Tensor<'_>]) -> Result<()>;

    /// The model as the store keeps it (configuration and dense weights), read and checked,
    /// not built: what a router builds to run the dense part itself.
    fn saved_model(&self) -> Result<SavedModel>;
}
