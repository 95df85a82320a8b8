//! A live store's engine changing under it: [`Engine::derive`] (tables created or dropped, the
//! rest's tiers shared), [`Engine::warm_from`] (a swapped-in version's row caches filled from the
//! old one's; [`Engine::warm`] from any list of rows, a restart's hot set or a recorded trace)
//! and [`Engine::rebase`] (a compaction's new base).

use std::sync::Arc;

use nearrec_format::{ProgressFn, StoreReader};

use super::Engine;
use super::open::table_files;
use crate::error::{EngineError, Result};
use crate::keyed;
use nearrec_format::Memory;
use nearrec_io::fork_gate;

/// The least a read costs in [`Engine::warm`]'s account to its pacer, however few bytes it
/// reads: a random read takes the disk about as long as 4 KiB does (the rate a pacer is given
/// is a share of the disk, in bytes a second).
const READ_COST_FLOOR: u64 = 4096;

/// Rows read at a time by a paced [`Engine::warm`]: its reads wait in the disk's queue beside
/// the lookups' (hundreds when the store is busy), so a few at a time take a small share of a
/// busy disk, and of an idle one all the pace allows.
const PACED_CHUNK: usize = 8;

impl Engine {
    /// An engine over `reader`'s tables (the same store with tables created or dropped) that
    /// shares this one's tiers: new table `i` is this engine's table `keep[i]` (its resident
    /// copy, DRAM tiers and counters shared, both engines serving the same rows), or, where
    /// `keep[i]` is `None`, a table loaded as this engine's tier loads one (whole into DRAM;
    /// on the SSD tier from its file, with no DRAM tiers in front).
    pub fn derive(&self, reader: &StoreReader, keep: &[Option<usize>]) -> Result<Self> {
        let _inside = fork_gate();
        if keep.len() != reader.tables().len()
            || keep.iter().flatten().any(|&o| o >= self.tables.len())
        {
            return Err(EngineError::Config(
                "a derived engine keeps tables it does not have".into(),
            ));
        }
        let memory = Memory::probe();
        let (dram, ssd) = match &self.ssd {
            None => {
                let fresh = keep
                    .iter()
                    .zip(reader.tables())
                    .filter(|(k, _)| k.is_none())
                    .map(|(_, t)| t.data_bytes)
                    .sum();
                memory.check(
                    || "the tables created, loaded whole (tier=\"dram\")".into(),
                    fresh,
                )?;
                let dram = keep
                    .iter()
                    .enumerate()
                    .map(|(i, k)| match k {
                        Some(old) => Ok(self.dram[*old].clone()),
                        None => reader
                            .read_table(i, self.config.verify_checksums, None)
                            .map(Arc::new)
                            .map_err(EngineError::from),
                    })
                    .collect::<Result<Vec<_>>>()?;
                (dram, None)
            }
            Some(_) if self.device_given => {
                return Err(EngineError::Config(
                    "a store served through a given device (a simulated drive) cannot change \
                     its tables"
                        .into(),
                ));
            }
            Some(ssd) => {
                let files = table_files(reader, &self.config, &memory)?;
                let tiers = keep
                    .iter()
                    .map(|k| k.map_or_else(Default::default, |old| ssd.dram_tiers()[old].clone()))
                    .collect();
                (Vec::new(), Some(ssd.derive(files, tiers)))
            }
        };
        let keys = keep
            .iter()
            .enumerate()
            .map(|(i, k)| match k {
                Some(old) => Ok(self.keys[*old].clone()),
                None => keyed::load_one(reader, i, &self.config.keyed, &self.clock)
                    .map(|k| k.map(Arc::new)),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::assemble(
            reader,
            self.config.clone(),
            self.workers.clone(),
            dram,
            ssd,
            keys,
            self.clock.clone(),
        ))
    }

    /// Fills this engine's row caches with the rows `old`'s DRAM tiers hold — its hot rows and
    /// cached rows — of each table both have with the same shape, read from this engine's
    /// files, up to each cache's size: a new version of a store (a swap) then starts with the
    /// old one's working set. Returns the rows loaded. Does nothing for tables kept whole.
    /// `pace` is told the cost of each read as [`Engine::warm`] tells it, and may sleep.
    pub fn warm_from(&self, old: &Engine, pace: Option<&ProgressFn>) -> Result<u64> {
        let mut loaded = 0u64;
        for (name, rows) in old.held_rows() {
            let Ok(id) = self.table_id(&name) else {
                continue;
            };
            let (was, meta) = (&old.tables[old.table_id(&name)?], &self.tables[id]);
            if (was.rows, was.dim, was.dtype) == (meta.rows, meta.dim, meta.dtype) {
                loaded += self.warm(id, &rows, pace)?;
            }
        }
        Ok(loaded)
    }

    /// Per table with DRAM tiers in front of the SSD tier, the rows they hold now: its hot
    /// rows, then its cached ones (a store's hot set, which warms another engine).
    pub fn held_rows(&self) -> Vec<(String, Vec<u64>)> {
        let Some(ssd) = &self.ssd else {
            return Vec::new();
        };
        let tiers = ssd.dram_tiers().iter().zip(&self.tables);
        tiers
            .filter(|(t, _)| t.hot.is_some() || t.cache.is_some())
            .map(|(t, meta)| {
                let mut rows: Vec<u64> = t.hot.as_ref().map(|h| h.row_ids()).unwrap_or_default();
                rows.extend(t.cache.as_ref().map(|c| c.rows()).unwrap_or_default());
                (meta.name.clone(), rows)
            })
            .collect()
    }

    /// Loads rows `rows` of table `id` — most wanted first — into its row cache, read from
    /// the table's file: each into a free way of its set (a row whose set is full of more
    /// wanted ones stays out), skipping rows its hot partition pins, rows beyond the table and
    /// rows cached already. Returns the rows loaded (0 without a row cache).
    ///
    /// With `pace`, the rows are read a few at a time, and after each read `pace` is
    /// told its cost in bytes — each read at least 4 KiB, as a random read costs the disk about
    /// what 4 KiB does — so that a pacer sleeping there leaves the disk to the
    /// lookups of a store being served (a swap's warm-up); without, they go as fast as the
    /// disk does (a store not yet serving).
    pub fn warm(&self, id: usize, rows: &[u64], pace: Option<&ProgressFn>) -> Result<u64> {
        let _inside = fork_gate();
        let Some(ssd) = &self.ssd else {
            return Ok(0);
        };
        let (meta, tiers) = (&self.tables[id], &ssd.dram_tiers()[id]);
        let Some(cache) = &tiers.cache else {
            return Ok(0);
        };
        let mut seen = std::collections::HashSet::new();
        let wanted: Vec<u64> = rows
            .iter()
            .copied()
            .filter(|&r| r < meta.rows && seen.insert(r))
            .filter(|&r| tiers.hot.as_ref().is_none_or(|h| h.get(r).is_none()))
            .take(cache.capacity_rows() as usize)
            .collect();
        let rb = meta.row_bytes as usize;
        let block = ssd.files().device().block_size() as u64;
        let cost = ((rb as u64).div_ceil(block) * block).max(READ_COST_FLOOR);
        let mut buf = vec![0u8; rb];
        let mut loaded = 0u64;
        let chunk_rows = if pace.is_some() { PACED_CHUNK } else { 4096 };
        for chunk in wanted.chunks(chunk_rows) {
            let mut sorted = chunk.to_vec();
            sorted.sort_unstable();
            buf.resize(sorted.len() * rb, 0);
            ssd.files().read_raw(id, meta, &sorted, &mut buf)?;
            // most wanted first, each into a free way: none displaces a more wanted one
            for &r in chunk {
                let i = sorted.binary_search(&r).expect("a row of this chunk");
                loaded += u64::from(cache.fill(r, &buf[i * rb..(i + 1) * rb]));
            }
            if let Some(pace) = pace {
                pace(chunk.len() as u64 * cost);
            }
        }
        Ok(loaded)
    }

    /// Brings the engine to a live store's new base (`docs/live.md`, compaction): each table's
    /// rows `rows[table]` — `(row, encoded bytes)` — are overwritten wherever the engine keeps
    /// them in DRAM (the resident copy, the hot partition, the row cache), and the SSD tier
    /// reads `reader`'s table files from then on (batches under way finish on the old ones).
    /// `reader` is the same store with new files: the same tables in the same order.
    ///
    /// # Safety
    /// No lookup reads one of the given rows from the engine until this returns: every reader
    /// takes them from its delta meanwhile, and the caller publishes the new base (with a
    /// release) only after.
    pub unsafe fn rebase(&self, reader: &StoreReader, rows: &[Vec<(u64, &[u8])>]) -> Result<()> {
        let _inside = fork_gate();
        let same = reader.tables().len() == self.tables.len()
            && reader.tables().iter().zip(&self.tables).all(|(a, b)| {
                (&a.name, a.rows, a.dim, a.dtype, a.row_bytes, a.block_bytes)
                    == (&b.name, b.rows, b.dim, b.dtype, b.row_bytes, b.block_bytes)
            });
        if !same || rows.len() != self.tables.len() {
            return Err(EngineError::Config(
                "a new base must hold the same tables as the old one".into(),
            ));
        }
        let files = match &self.ssd {
            Some(_) if self.device_given => {
                return Err(EngineError::Config(
                    "a store served through a given device (a simulated drive) cannot move to \
                     new table files"
                        .into(),
                ));
            }
            Some(_) => Some(table_files(reader, &self.config, &Memory::probe())?),
            None => None,
        };
        for (id, rows) in rows.iter().enumerate() {
            let layout = self.tables[id].layout();
            let resident = match &self.ssd {
                None => Some(self.dram[id].as_ref()),
                Some(ssd) => ssd.dram_tiers()[id].resident.as_ref(),
            };
            let tiers = self.ssd.as_ref().map(|s| &s.dram_tiers()[id]);
            for &(row, bytes) in rows {
                if let Some(buf) = resident {
                    // SAFETY: the caller's contract; a resident table is in row-id order
                    unsafe { buf.write_shared(layout.row_offset(row) as usize, bytes) };
                }
                if let Some(hot) = tiers.and_then(|t| t.hot.as_ref()) {
                    // SAFETY: the caller's contract
                    unsafe { hot.overwrite(row, bytes) };
                }
                if let Some(cache) = tiers.and_then(|t| t.cache.as_ref()) {
                    cache.replace(row, bytes);
                }
            }
        }
        if let (Some(ssd), Some(files)) = (&self.ssd, files) {
            ssd.replace_files(files);
        }
        Ok(())
    }
}
