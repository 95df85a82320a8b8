//! A store sharded over storage nodes, as one implementation of the store's contract
//! ([`nearrec::StoreApi`]): [`ShardedStore`].
//!
//! A sharded store is a plan (`shards.json`, [`nearrec::plan::ShardPlan`], cut by
//! `nearrec shard` — `nearrec::shard`) and one ordinary store per shard, each served by one or
//! more storage nodes (its replicas). The router here:
//! - splits a batch by shard (`split/`): a whole table goes to its shard as asked; a
//!   table cut into row ranges is split bag by bag into local rows, hot rows replicated on every
//!   shard of the table going with their bag's other ids; every check the engine makes comes
//!   first, so a bad batch gets the engine's error naming the caller's table and position;
//! - sends every shard's share at once over the nodes' gRPC and merges the pooled parts exactly
//!   (row-wise parts add, a `mean` divides by the whole bag's count, a `max` takes the maximum of
//!   the shards that held part of the bag);
//! - reads one replica of each shard, hedging to a second after the shard's observed p95 and
//!   moving a failed sub-request to another replica within the call's deadline
//!   (`shard.rs`); a shard no replica of which answers fails the call, naming the shard
//!   — never a partial answer;
//! - writes a call's rows to the one node of their shard; a call whose rows span shards (hot
//!   rows are on every shard of their table), or a shard of several replicas, commits on all of
//!   them or none, by two-phase commit (`txn/`) — replicas take every router's writes
//!   in one order — a prepared write its router left settled by the next router that meets it;
//! - keeps each shard's membership: a replica that missed a write is left out at the next epoch,
//!   which every write carries, and one that was down catches up from a member — the differing
//!   rows copied, the members fenced for the last pass — before it is admitted again
//!   (`members/`), every router catching up its stale replicas in the
//!   background (`catch_up.rs`); with etcd, each shard's epoch and members are decided there by
//!   transactions, and each replica is held by its node's lease (`etcd/`);
//! - reads each batch at one cluster version (a version of every shard's repository), and swaps
//!   every shard to a new one so that no batch of any router reads two (`versions.rs`);
//! - runs the model its shards keep: on the nodes of the shard that holds every table whole,
//!   else itself — the lookups split and merged as any, the dense part on the router's core,
//!   the model read from a shard (the `Model` verb) once per cluster version (`store/infer.rs`);
//! - counts: batches, bags, the bags of split tables and the shards each reached (the fan-out),
//!   reads, hedges and the
//!   hedges that won, retries, failures (`cluster_*` in [`nearrec::StoreApi::stats`]).
//!
//! Modules: `split/` (cut and merge; `parted.rs`, a table's ids routed to its parts), `shard.rs` (a shard's replicas: hedging, failover,
//! writes to all; `committing.rs`, this router's commits on their way to it), `txn/` (writes across shards: two-phase commit, settling; the commits after the answer in `commits.rs`), `versions.rs`
//! (the cluster version: pin, stage, switch, release), `members/` (membership, catch-up),
//! `etcd/` (membership kept in etcd: records, transactions, a replica's hold),
//! `catch_up.rs` (catch-up in the background, every router's by default), `store/`
//! (`ShardedStore`: opened, split and merged; its verbs in `contract.rs`, writes routed in
//! `writes.rs`, the model run in `infer.rs`, counters in `counters.rs`, `replicas.toml` in
//! `replicas.rs`). Tests: `tests/contract.rs` runs the whole conformance suite on sharded stores
//! of every scheme over loopback nodes.

mod catch_up;
mod committing;
pub mod etcd;
mod members;
mod shard;
mod split;
mod store;
mod txn;
mod versions;

pub use members::CaughtUp;
pub use shard::Hedge;
pub use store::{Endpoint, REPLICAS_FILE, ReplicasFile, ShardedOptions, ShardedStore};
pub use txn::Settled;
