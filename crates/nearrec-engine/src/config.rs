use nearrec_cache::CacheConfig;
use nearrec_plan::Placement;
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::keyed::KeyPolicy;
use nearrec_format::Memory;

/// Where a store's rows are served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Every table loaded into DRAM at open.
    #[default]
    Dram,
    /// Rows read from the table files per batch, with direct I/O ([`crate::Engine`]'s SSD tier).
    Ssd,
    /// DRAM when the tables fit `dram_budget_bytes`, else SSD with DRAM tiers in that budget.
    Auto,
}

impl Tier {
    pub fn name(self) -> &'static str {
        match self {
            Tier::Dram => "dram",
            Tier::Ssd => "ssd",
            Tier::Auto => "auto",
        }
    }
}

/// How an [`crate::Engine`] is built. `Default` gives the recommended settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EngineConfig {
    /// Worker threads for pooling; 0 means one per available core.
    pub threads: usize,
    /// Check each table's CRC-32C while loading it into DRAM (costs little next to the read).
    pub verify_checksums: bool,
    /// SSD tier: check every read against its table's sector checksums as it lands (format
    /// version 3; older stores are unprotected). A mismatch fails the batch with
    /// `EngineError::Corrupted`. Costs a CRC-32C of the bytes read and 4 bytes of memory per
    /// 512 bytes of table.
    pub verify_reads: bool,
    /// Lookups below which a request is pooled on the calling thread: waking workers costs more
    /// than it saves for tiny requests (batch-1 latency).
    pub inline_lookups: usize,
    /// Target lookups per parallel task; a task is a run of bags of one table.
    pub task_lookups: usize,
    /// Where rows are served from.
    pub tier: Tier,
    /// Bytes of DRAM the tables may take: [`Tier::Auto`] loads them only if they fit, and on the
    /// SSD tier the DRAM tiers in front of it (whole tables, hot rows, row caches) share it.
    /// `None`: half of this machine's memory for [`Tier::Auto`], no DRAM tiers for an explicit
    /// [`Tier::Ssd`].
    pub dram_budget_bytes: Option<u64>,
    /// SSD tier: the row caches' policy, admission probability and set size.
    pub cache: CacheConfig,
    /// SSD tier: which tables are kept whole, which rows pinned, how much row cache each table
    /// gets (the planner's output). `None`: [`Placement::by_size`] over the DRAM budget.
    pub placement: Option<Placement>,
    /// SSD tier: bypass the page cache (`O_DIRECT`); off only for comparisons.
    pub direct_io: bool,
    /// SSD tier: reads in flight per io_uring ring.
    pub io_queue_depth: u32,
    /// SSD tier: io_uring rings, i.e. batches that can read at the same time.
    pub io_rings: usize,
    /// SSD tier: read threads of the pread fallback (its queue depth).
    pub pread_threads: usize,
    /// SSD tier: rows whose blocks are at most this many bytes apart share one read (0 merges
    /// only rows in the same or adjacent blocks).
    pub merge_gap_bytes: u64,
    /// SSD tier: the largest merged read, in bytes.
    pub max_read_bytes: u64,
    /// SSD tier: read each distinct row once per batch, however many bags want it. Off only to
    /// measure what it saves.
    pub dedup: bool,
    /// SSD tier: merge reads of rows in the same or neighbouring blocks. Off only to measure what
    /// it saves.
    pub merge: bool,
    /// Keyed tables: what a key a table does not hold answers.
    pub keyed: KeyPolicy,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: 0,
            verify_checksums: true,
            verify_reads: true,
            inline_lookups: 4096,
            task_lookups: 8192,
            tier: Tier::Dram,
            dram_budget_bytes: None,
            cache: CacheConfig::default(),
            placement: None,
            direct_io: true,
            io_queue_depth: 128,
            io_rings: 2,
            pread_threads: 16,
            merge_gap_bytes: 0,
            max_read_bytes: 128 * 1024,
            dedup: true,
            merge: true,
            keyed: KeyPolicy::default(),
        }
    }
}

impl EngineConfig {
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    pub fn with_verify_checksums(mut self, verify: bool) -> Self {
        self.verify_checksums = verify;
        self
    }

    pub fn with_tier(mut self, tier: Tier) -> Self {
        self.tier = tier;
        self
    }

    pub fn validate(&self) -> Result<()> {
        self.keyed.validate()?;
        if self.io_queue_depth == 0 || self.io_queue_depth > 4096 {
            return Err(EngineError::Config(format!(
                "io_queue_depth = {} must be in 1..=4096",
                self.io_queue_depth
            )));
        }
        if self.io_rings == 0
            || self.io_rings > 64
            || self.pread_threads == 0
            || self.pread_threads > 1024
        {
            return Err(EngineError::Config(format!(
                "io_rings = {} must be in 1..=64 and pread_threads = {} in 1..=1024",
                self.io_rings, self.pread_threads
            )));
        }
        if self.max_read_bytes < 4096 || self.max_read_bytes > u64::from(u32::MAX) {
            return Err(EngineError::Config(format!(
                "max_read_bytes = {} must be in 4096..=4294967295",
                self.max_read_bytes
            )));
        }
        if self.threads > 1024 {
            return Err(EngineError::Config(format!(
                "threads = {} is more than 1024",
                self.threads
            )));
        }
        let p = self.cache.admission_probability;
        if !(0.0..=1.0).contains(&p) || self.cache.ways == 0 || self.cache.ways > 4096 {
            return Err(EngineError::Config(format!(
                "admission_probability = {p} must be in [0, 1] and cache ways = {} in 1..=4096",
                self.cache.ways
            )));
        }
        if self.task_lookups == 0 {
            return Err(EngineError::Config(
                "task_lookups must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// The tier a store of `table_bytes` gets: [`Tier::Auto`] resolved against the DRAM budget
    /// and the memory available now.
    pub fn resolved_tier(&self, table_bytes: u64, memory: &Memory) -> Tier {
        match self.tier {
            Tier::Auto
                if table_bytes <= self.resolved_dram_budget(memory).min(memory.available) =>
            {
                Tier::Dram
            }
            Tier::Auto => Tier::Ssd,
            t => t,
        }
    }

    /// The bytes the DRAM tiers in front of the SSD tier may take (see `dram_budget_bytes`).
    pub fn dram_tiers_budget(&self, memory: &Memory) -> u64 {
        match (self.dram_budget_bytes, self.tier) {
            (Some(b), _) => b,
            (None, Tier::Ssd) => 0,
            (None, _) => self.resolved_dram_budget(memory),
        }
    }

    /// The DRAM budget in bytes (half of what this process may have when not set: physical
    /// memory, or its cgroup's limit if lower).
    pub fn resolved_dram_budget(&self, memory: &Memory) -> u64 {
        self.dram_budget_bytes.unwrap_or(memory.limit / 2)
    }

    /// The thread count this config resolves to on this machine.
    pub fn resolved_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }
}
