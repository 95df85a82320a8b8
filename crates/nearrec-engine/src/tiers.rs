//! The DRAM tiers in front of the SSD tier, per table: the whole table, a pinned hot partition, a
//! row cache (`nearrec-cache`), laid out by a [`Placement`] within one byte budget.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use nearrec_cache::{CacheConfig, CacheStatsSnapshot, HotPartition, RowCache};
use nearrec_format::{AlignedBuf, ProgressFn, StoreReader, TableMeta};
use nearrec_plan::{Placement, TableSize};

use crate::config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::files::TableFiles;
use nearrec_format::Memory;

/// One table's DRAM tiers in front of its file, and the lookups each served.
#[derive(Debug, Default)]
pub(crate) struct DramTiers {
    /// The table's data region, as in its file.
    pub resident: Option<AlignedBuf>,
    pub hot: Option<HotPartition>,
    pub cache: Option<RowCache>,
    /// Lookups served by: the whole table, the hot partition, the row cache, the SSD.
    pub served: [AtomicU64; 4],
}

/// What a table's DRAM tiers hold and served (see [`crate::Engine::tier_report`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TierReport {
    pub table: String,
    pub resident: bool,
    pub hot_rows: u64,
    pub cache_rows: u64,
    /// DRAM taken: the whole table, or pinned rows plus the row cache.
    pub bytes: u64,
    pub lookups_resident: u64,
    pub lookups_hot: u64,
    pub lookups_cache: u64,
    pub lookups_ssd: u64,
    pub cache: CacheStatsSnapshot,
}

impl DramTiers {
    pub(crate) fn is_empty(&self) -> bool {
        self.resident.is_none() && self.hot.is_none() && self.cache.is_none()
    }

    fn bytes(&self) -> u64 {
        self.resident.as_ref().map_or(0, |b| b.len() as u64)
            + self.hot.as_ref().map_or(0, HotPartition::bytes)
            + self.cache.as_ref().map_or(0, RowCache::bytes)
    }

    pub(crate) fn report(&self, table: &str) -> TierReport {
        let n = |i: usize| self.served[i].load(Relaxed);
        TierReport {
            table: table.to_owned(),
            resident: self.resident.is_some(),
            hot_rows: self.hot.as_ref().map_or(0, |h| h.rows() as u64),
            cache_rows: self.cache.as_ref().map_or(0, RowCache::capacity_rows),
            bytes: self.bytes(),
            lookups_resident: n(0),
            lookups_hot: n(1),
            lookups_cache: n(2),
            lookups_ssd: n(3),
            cache: self.cache.as_ref().map(RowCache::stats).unwrap_or_default(),
        }
    }
}

/// A placement against the store's tables: every table it names exists, its hot rows are in
/// range and distinct. Checked whatever tier serves the store (an `auto` store in DRAM ignores
/// its placement, but a wrong one is still an error where it is given).
pub(crate) fn check_placement(placement: &Placement, tables: &[TableMeta]) -> Result<()> {
    for (name, p) in &placement.tables {
        let Some(meta) = tables.iter().find(|t| &t.name == name) else {
            return Err(EngineError::UnknownTable {
                name: name.clone(),
                available: tables
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        if let Some(position) = p.hot_rows.iter().position(|&r| r >= meta.rows) {
            return Err(EngineError::IndexOutOfRange {
                table: name.clone(),
                position,
                bag: 0,
                value: p.hot_rows[position].min(i64::MAX as u64) as i64,
                rows: meta.rows,
            });
        }
        let mut sorted = p.hot_rows.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(EngineError::invalid(
                name,
                format!("hot rows name row {} more than once", w[0]),
            ));
        }
    }
    Ok(())
}

/// Builds every table's DRAM tiers: `config.placement`, or [`Placement::by_size`] over `budget`.
/// An explicit placement must fit an explicit budget; hot rows are read from `files`.
pub(crate) fn place(
    reader: &StoreReader,
    config: &EngineConfig,
    budget: u64,
    memory: &Memory,
    files: &TableFiles,
    progress: Option<&ProgressFn>,
) -> Result<Vec<DramTiers>> {
    let tables = reader.tables();
    let mut placement = match &config.placement {
        Some(p) => p.clone(),
        None => {
            let sizes: Vec<TableSize<'_>> = tables
                .iter()
                .map(|t| TableSize {
                    name: &t.name,
                    bytes: t.data_bytes,
                })
                .collect();
            Placement::by_size(&sizes, budget)
        }
    };
    if config.placement.is_some() {
        check_placement(&placement, tables)?;
    }
    let mut needed = 0u64;
    for (name, p) in &mut placement.tables {
        let meta = tables
            .iter()
            .find(|t| &t.name == name)
            .expect("a checked placement names the store's tables");
        // A cache with a slot for every row is as large as it can usefully be.
        p.cache_bytes = p.cache_bytes.min(RowCache::budget_for_rows(
            meta.rows,
            meta.row_bytes as usize,
            config.cache.ways,
        ));
        needed += if p.resident {
            meta.data_bytes
        } else {
            HotPartition::bytes_for(p.hot_rows.len() as u64, meta.row_bytes as usize)
                + p.cache_bytes
        };
    }
    if config.placement.is_some() && config.dram_budget_bytes.is_some() && needed > budget {
        return Err(EngineError::Config(format!(
            "the placement takes {needed} bytes of DRAM, more than dram_budget_bytes = {budget}"
        )));
    }
    memory.check(
        || "the DRAM tiers in front of the SSD tier (whole tables, hot rows, row caches)".into(),
        needed,
    )?;
    tables
        .iter()
        .enumerate()
        .map(|(i, meta)| {
            let mut t = DramTiers::default();
            let Some(p) = placement.tables.get(&meta.name) else {
                return Ok(t);
            };
            let rb = meta.row_bytes as usize;
            if p.resident {
                t.resident = Some(reader.read_table(i, config.verify_checksums, progress)?);
                return Ok(t);
            }
            if !p.hot_rows.is_empty() {
                t.hot = Some(HotPartition::new(&p.hot_rows, rb, |rows, buf| {
                    files.read_raw(i, meta, rows, buf)
                })?);
            }
            if p.cache_bytes > 0 {
                let cache = CacheConfig {
                    seed: config.cache.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    ..config.cache
                };
                t.cache = Some(RowCache::new(p.cache_bytes, rb, cache).with_rows(meta.rows));
            }
            Ok(t)
        })
        .collect()
}
