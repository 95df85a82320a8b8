//! DRAM tiers in front of the SSD tier, each holding rows in their stored encoding:
//!
//! - [`HotPartition`] (RecSSD's static partitioning): rows chosen ahead from a profiled trace,
//!   pinned, read without locks;
//! - [`RowCache`]: a set-associative cache filled by misses, read in place under a read lock
//!   taken once per batch (writers that meet readers keep their rows aside for the last reader
//!   out), with LRU or LFU victims and optional probabilistic admission (HS-Rec);
//! - [`CacheStats`]: hits, misses, admissions, rejections and evictions, always on;
//! - [`KeyIndex`]: a keyed table's keys to its row numbers, for tables kept in a store;
//! - [`KeyedTable`]: rows addressed by unbounded 64-bit keys (DeepRec's EmbeddingVariable), a
//!   `KeyIndex` and its rows under one reader-writer lock, with a policy for unknown keys.
//!
//! Whole-table residency needs no type of its own: the engine keeps such a table's file image.
//!
//! Modules:
//! - `row_cache/`: `RowCache` (`mod.rs`: layout, placement, marks), its writes (`write.rs`) and
//!   its `Reader` (`read.rs`) — hits read in three prefetchable steps, each
//!   for a run of lookups: `locate` (the row hashed once), `probe` (a byte tag per way, eight
//!   compared at once) and `read` (the key checked, the row's bytes lent where they lie); misses
//!   offered back, and a compaction's
//!   replaced rows written, under the write lock, or kept aside while readers hold the cache;
//!   tags, heads (key, mark) and rows in one huge-page buffer each; victims exact LRU / LFU for
//!   one thread; a cache with a slot for every row places rows by number and never evicts;
//! - `hot.rs`: `HotPartition`, pinned rows behind an open-addressing index of its own, so that
//!   probes can be prefetched a few lookups ahead;
//! - `key_index.rs`: `KeyIndex`, the DRAM index of a keyed table whose rows live in a store
//!   (raw 64-bit keys to row numbers, five keys to a cache line, seeded hash);
//! - `keyed.rs`: `KeyedTable` — a `KeyIndex`, the rows apart, a lock readers share per batch;
//!   the unknown-key policy `Unknown` (error / zero / init), counted;
//! - `policy.rs`: `Policy` (LRU, LFU and their probabilistic-admission `_pa` variants),
//!   `CacheConfig`;
//! - `stats.rs`: `CacheStats`, always-on counters, and their `CacheStatsSnapshot`;
//! - `admission.rs`: `Admission`, a keyed table's count of new keys' sightings (a count-min
//!   sketch of fixed size, cleared each window) that decides when one is given a row;
//! - `hash.rs`: the one hash the tiers place rows and keys with.
//!
//! `tests/caches.rs` holds one-set caches to exact LRU / LFU models (proptest), checks admission
//! rates and whole rows under concurrent use; `tests/keyed.rs` holds keyed tables to a `HashMap`
//! model and races inserts from many threads.

mod admission;
mod hash;
mod hot;
mod key_index;
mod keyed;
mod policy;
mod row_cache;
mod stats;

pub use admission::Admission;
pub use hot::{Home, HotPartition};
pub use key_index::{Full, Inserted, KeyIndex, MAX_ROWS as MAX_KEYED_ROWS, MISSING};
pub use keyed::{KeyedConfig, KeyedError, KeyedStats, KeyedTable, Unknown, init_row};
pub use policy::{CacheConfig, Policy, PolicyParseError};
pub use row_cache::{Offer, Reader, RowCache, SLOT_OVERHEAD, Set, Slot};
pub use stats::{CacheStats, CacheStatsSnapshot};
