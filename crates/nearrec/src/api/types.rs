//! The contract's data: what a store holds and serves ([`Info`], [`TableInfo`], [`ShardTag`]),
//! a table to create ([`NewTable`]), a batch's rows ([`Rows`]) and every counter ([`Stats`]).

use nearrec_format::DType;
use nearrec_format::wal::Init;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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

/// What a store holds and how it is served ([`crate::StoreApi::info`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// The name it is served as: its directory's, or the node's name for it.
    pub name: String,
    pub tables: Vec<TableInfo>,
    pub version: u64,
    /// `"dram"` or `"ssd"`.
    pub tier: String,
    pub writable: bool,
    /// Whether a model is kept with it ([`crate::Inference::infer`]).
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

/// RM_create_table's arguments ([`crate::Schema::create_table`]).
#[derive(Debug, Clone, Copy)]
pub struct NewTable<'a> {
    pub name: &'a str,
    pub rows: u64,
    pub dim: u32,
    pub dtype: DType,
    pub init: Init,
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

/// What a shard store says of itself (its manifest's `params.shard`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardTag {
    /// The plan's id.
    pub plan: String,
    pub shard: usize,
    /// The sharded store's name.
    pub store: String,
    /// The plan it was at before a change of the tables still under way (its router stages
    /// the new plan everywhere, publishes it, then lets go of this one): calls of routers at
    /// it are taken meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
}

impl ShardTag {
    /// The tag of the store `manifest` describes, if it is a shard.
    pub fn of(manifest: &nearrec_format::Manifest) -> Option<Self> {
        serde_json::from_value(manifest.params.get("shard")?.clone()).ok()
    }

    /// Whether a call of a router at plan `plan` is this shard's to take: its plan, or the one
    /// it is moving from.
    pub fn takes(&self, plan: &str) -> bool {
        self.plan == plan || self.previous.as_deref() == Some(plan)
    }
}

/// One table's distinct rows of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Rows {
    pub table: String,
    pub dim: usize,
    /// Distinct, ascending.
    pub ids: Vec<i64>,
    /// Row-major `[ids.len(), dim]`.
    pub values: Vec<f32>,
}

/// The SSD tier's counters: the device, then every counter and latency percentile (µs) of
/// `nearrec_engine::IoStats`, then the DRAM tiers' totals.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// `"io_uring"`, `"pread"`, `"flash-model"`, ...; `"dram"` for a DRAM-resident store.
    pub device: String,
    pub direct_io: bool,
    pub block_bytes: usize,
    pub values: Vec<(String, f64)>,
}

impl Stats {
    /// The counter or percentile named `key` (`"device_reads"`, `"dram_hit_ratio"`,
    /// `"end_to_end_p99_us"`, ...), the names Python's `store.stats()` has.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.values.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}
