//! DRAM tiers in front of the SSD tier, each holding rows in their stored encoding:
//!
//! - [`HotPartition`] (RecSSD's static partitioning): rows chosen ahead from a profiled trace,
//!   pinned, read without locks;
//! - [`RowCache`]: a set-associative cache filled by misses, read without a lock (a seqlock per
//!   slot; writers take their shard's mutex), with LRU or LFU victims and optional probabilistic
//!   admission (HS-Rec);
//! - [`CacheStats`]: hits, misses, admissions, rejections and evictions, always on;
//! - [`KeyedTable`]: rows addressed by unbounded 64-bit keys (DeepRec's EmbeddingVariable), a
//!   lock-free open-addressing hash table with a policy for unknown keys.
//!
//! Whole-table residency needs no type of its own: the engine keeps such a table's file image.

mod hash;
mod hot;
mod keyed;
mod policy;
mod row_cache;
mod stats;

pub use hot::HotPartition;
pub use keyed::{KeyedConfig, KeyedError, KeyedStats, KeyedTable, Pool, Unknown};
pub use policy::{CacheConfig, Policy, PolicyParseError};
pub use row_cache::{Offer, RowCache, SLOT_OVERHEAD, Slot, words_as_bytes};
pub use stats::{CacheStats, CacheStatsSnapshot};
