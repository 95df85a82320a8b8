//! The engine: validates a request, splits it into (table, bag-run) tasks and pools each task from
//! the tier that holds the table.
//!
//! This file holds [`Engine`] and its accessors; `open.rs` opens one over a store, `execute.rs`
//! prepares and runs batches ([`Prepared`]), `rebase.rs` holds a live store's changes to an open
//! engine (derive, warm_from, rebase).

mod execute;
mod open;
mod rebase;

pub use execute::Prepared;

use std::collections::HashMap;
use std::sync::Arc;

use nearrec_format::{AlignedBuf, TableMeta};

use crate::config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::keyed::{Clock, KeyLife, KeyReport, Keys};
use crate::ssd::SsdTier;
use crate::stats::IoStats;
use crate::tiers::TierReport;
use nearrec_io::{Workers, fork_gate};

/// Serves pooled lookups from a store whose tables are resident in DRAM or read from SSD.
#[derive(Debug)]
pub struct Engine {
    /// Unique in the process: a [`Prepared`] batch runs only on the engine that prepared it.
    id: u64,
    tables: Vec<TableMeta>,
    by_name: HashMap<String, usize>,
    /// Each DRAM-resident table's data region, laid out exactly as on disk (empty for the SSD
    /// tier); shared with the engines derived from this one.
    dram: Vec<Arc<AlignedBuf>>,
    ssd: Option<SsdTier>,
    /// Each keyed table's index of keys to rows (`None` for tables addressed by position);
    /// shared with the engines derived from this one.
    keys: Vec<Option<Arc<Keys>>>,
    /// What keyed tables' TTLs and admission windows read (shared with derived engines).
    clock: Arc<Clock>,
    /// The SSD tier reads through a device the caller gave (a flash model, a faulty device),
    /// which cannot be reopened on other files.
    device_given: bool,
    /// The process's pooling threads, shared with its other stores.
    pub(crate) workers: Arc<Workers>,
    config: EngineConfig,
}

impl Engine {
    pub fn tables(&self) -> &[TableMeta] {
        &self.tables
    }

    /// Table `name`'s keys, if it is keyed.
    pub(crate) fn keys_of(&self, name: &str) -> Option<&Keys> {
        self.keys[*self.by_name.get(name)?].as_deref()
    }

    /// Whether table `id` is keyed.
    pub fn is_keyed(&self, id: usize) -> bool {
        self.keys.get(id).is_some_and(Option::is_some)
    }

    /// Calls `f` with each of keyed table `id`'s keys and its row as of the tables' base (none
    /// for a table addressed by position), the index read in place.
    pub fn for_each_key(&self, id: usize, mut f: impl FnMut(u64, u32)) {
        if let Some(k) = &self.keys[id] {
            k.index().iter().for_each(|(key, row)| f(key, row));
        }
    }

    /// Key `key`'s row in keyed table `id` as of the tables' base.
    pub fn base_row_of(&self, id: usize, key: u64) -> Option<u32> {
        self.keys[id].as_ref()?.index().get(key)
    }

    /// The most keys keyed table `id` holds (its cap, else its rows less the zero row).
    pub fn key_cap(&self, id: usize) -> u64 {
        self.keys[id].as_ref().map_or(0, |k| k.cap())
    }

    /// Keyed table `id`'s touches and admission counts, when its keys are limited.
    pub fn key_life(&self, id: usize) -> Option<&KeyLife> {
        self.keys[id].as_ref()?.life()
    }

    /// Folds a compaction's changes of keyed table `id`'s keys into its index (each key
    /// given its row, or let go of with `None`).
    ///
    /// Only while every snapshot reads these keys from its key delta (at or past the
    /// compaction's version), as for [`Engine::rebase`]'s rows.
    pub fn fold_keys(&self, id: usize, changes: &[(u64, Option<u32>)]) -> Result<()> {
        match &self.keys[id] {
            Some(k) => k.fold(&self.tables[id].name, changes),
            None => Ok(()),
        }
    }

    /// The clock keyed tables' TTLs and admission windows read (Unix seconds).
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Moves a manual clock (`keyed.manual_clock`) `seconds` ahead; the time it then reads.
    pub fn advance_clock(&self, seconds: u64) -> Result<u64> {
        self.clock.advance(seconds)
    }

    /// What each keyed table's index holds and its lookups found.
    pub fn key_report(&self) -> Vec<KeyReport> {
        self.tables
            .iter()
            .zip(&self.keys)
            .filter_map(|(t, k)| k.as_ref().map(|k| k.report(&t.name)))
            .collect()
    }

    /// Whether the engine's tables can be read again from their store (false when it serves
    /// them through a device its caller gave, such as a simulated drive).
    pub fn reopenable(&self) -> bool {
        !self.device_given
    }

    /// This engine's id, unique in the process.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn threads(&self) -> usize {
        self.workers.threads()
    }

    /// The id of table `name`, or `UnknownTable`.
    pub fn table_id(&self, name: &str) -> Result<usize> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| EngineError::UnknownTable {
                name: name.to_owned(),
                available: self
                    .tables
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Table `id`'s data region in DRAM, rows in row-id order as the table's layout places them
    /// (a co-located table's rows are put back in place at load; `None` when it is read from SSD).
    pub fn table_data(&self, id: usize) -> Option<&[u8]> {
        (id < self.tables.len())
            .then(|| self.resident(id))
            .flatten()
    }

    /// The SSD tier's counters and latency histograms (`None` when tables are in DRAM).
    pub fn io_stats(&self) -> Option<&IoStats> {
        self.ssd.as_ref().map(SsdTier::stats)
    }

    /// What each table's DRAM tiers in front of the SSD tier hold and served, in table order
    /// (empty when the tables are resident in DRAM).
    pub fn tier_report(&self) -> Vec<TierReport> {
        let _inside = fork_gate(); // the row caches' counters are behind their shards' locks
        self.ssd.as_ref().map_or_else(Vec::new, |s| {
            s.dram_tiers()
                .iter()
                .zip(&self.tables)
                .map(|(d, t)| d.report(&t.name))
                .collect()
        })
    }

    /// Tables whose SSD reads are not checked against sector checksums (an older store, or
    /// `verify_reads` off); 0 when tables are resident in DRAM (checked whole as they load).
    pub fn unprotected_tables(&self) -> usize {
        self.ssd.as_ref().map_or(0, |s| s.files().unprotected())
    }

    /// The SSD tier's block device: its kind (`"io_uring"`, `"pread"`), whether reads are
    /// direct, its block size.
    pub fn device(&self) -> Option<Arc<dyn nearrec_io::BlockDevice>> {
        self.ssd.as_ref().map(|s| s.files().shared_device())
    }

    /// Table `id`'s data region when it is whole in DRAM (the DRAM tier, or kept whole in front
    /// of the SSD tier).
    fn resident(&self, id: usize) -> Option<&[u8]> {
        match &self.ssd {
            None => Some(self.dram[id].as_ref().as_slice()),
            Some(ssd) => ssd
                .dram_tiers()
                .get(id)?
                .resident
                .as_ref()
                .map(AlignedBuf::as_slice),
        }
    }
}
