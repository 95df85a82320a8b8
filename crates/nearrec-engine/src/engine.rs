//! The engine: validates a request, splits it into (table, bag-run) tasks and pools each task from
//! the tier that holds the table.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::AcqRel;
use std::time::Instant;

use nearrec_format::{AlignedBuf, ProgressFn, SectorSums, StoreReader, TableMeta};
use nearrec_kernels::{BagsOut, IndexError, PoolJob, RowIndex, RowPatch, TableView};
use rayon::prelude::*;

use crate::cells::{Cells, Ready};
use crate::config::{EngineConfig, Tier};
use crate::delta::DeltaView;
use crate::error::{EngineError, Result};
use crate::files::TableFiles;
use crate::request::{Bags, Batch, Checked, Indices, TableLookup, check};
use crate::ssd::{SsdJob, SsdTier};
use crate::stats::{IoStats, Stages};
use crate::tiers::{self, TierReport};
use nearrec_format::Memory;
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
    /// The SSD tier reads through a device the caller gave (a flash model, a faulty device),
    /// which cannot be reopened on other files.
    device_given: bool,
    /// The process's pooling threads, shared with its other stores.
    pub(crate) workers: Arc<Workers>,
    config: EngineConfig,
}

/// A validated request: its batch size, output width and per-table bag bounds.
#[derive(Debug)]
pub struct Prepared {
    /// The engine that prepared it ([`Engine::id`]): table ids are that engine's.
    engine: u64,
    batch: usize,
    width: usize,
    tables: Vec<(usize, usize, Checked)>, // (table id, output column, bounds)
    lookups: usize,
}

impl Prepared {
    /// The [`Engine::id`] of the engine that prepared it (whose table ids it holds).
    pub fn engine(&self) -> u64 {
        self.engine
    }

    /// Bags per table (the output's rows).
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Σ dim over the requested tables (the output's columns).
    pub fn width(&self) -> usize {
        self.width
    }

    pub fn lookups(&self) -> usize {
        self.lookups
    }

    /// Where each bag of request `k` starts in its indices, and where the last ends
    /// (`batch + 1` ascending positions): what cutting a batch into sub-batches needs.
    pub fn bag_bounds(&self, k: usize) -> &[usize] {
        &self.tables[k].2.bounds
    }
}

impl Engine {
    /// Opens the store at `path` and loads every table into DRAM.
    pub fn open(
        path: impl AsRef<Path>,
        config: EngineConfig,
        progress: Option<&ProgressFn>,
    ) -> Result<Self> {
        Self::from_reader(&StoreReader::open(path)?, config, progress)
    }

    /// Serves an opened store's tables from SSD through `device` (file `i` of the device holds
    /// table `i`'s file): a flash-device model, or a fault-injecting device in tests.
    pub fn with_device(
        reader: &StoreReader,
        config: EngineConfig,
        device: Box<dyn nearrec_io::BlockDevice>,
    ) -> Result<Self> {
        config.validate()?;
        let _inside = fork_gate();
        if device.file_lens().len() != reader.tables().len() {
            return Err(EngineError::Config(format!(
                "the device has {} files but the store has {} tables",
                device.file_lens().len(),
                reader.tables().len()
            )));
        }
        let config = config.with_tier(Tier::Ssd);
        let memory = Memory::probe();
        check_budget(&config, &memory)?;
        let budget = config.dram_tiers_budget(&memory);
        let files = TableFiles::new(
            device,
            reader.orders().to_vec(),
            sector_sums(reader, &config, &memory)?,
        );
        let dram = tiers::place(reader, &config, budget, &memory, &files, None)?;
        let ssd = SsdTier::new(files, dram, &config);
        let workers = Workers::shared("pool", config.resolved_threads());
        let mut engine = Self::assemble(reader, config, workers, Vec::new(), Some(ssd));
        engine.device_given = true;
        Ok(engine)
    }

    /// Loads every table of an opened (validated) store into DRAM, or opens its files for the
    /// SSD tier, as `config.tier` says.
    pub fn from_reader(
        reader: &StoreReader,
        config: EngineConfig,
        progress: Option<&ProgressFn>,
    ) -> Result<Self> {
        config.validate()?;
        if let Some(p) = &config.placement {
            tiers::check_placement(p, reader.tables())?;
        }
        let _inside = fork_gate();
        let total = reader.tables().iter().map(|t| t.data_bytes).sum();
        let memory = Memory::probe();
        check_budget(&config, &memory)?;
        let tier = config.resolved_tier(total, &memory);
        let budget = config.dram_tiers_budget(&memory);
        let config = config.with_tier(tier);
        let workers = Workers::shared("pool", config.resolved_threads());
        let (dram, ssd) = match config.tier {
            Tier::Dram | Tier::Auto => {
                memory.check(
                    || {
                        format!(
                            "loading the store's {} tables whole (tier=\"dram\")",
                            reader.tables().len()
                        )
                    },
                    total,
                )?;
                let dram = workers.get()?.install(|| {
                    (0..reader.tables().len())
                        .into_par_iter()
                        .map(|i| {
                            reader
                                .read_table(i, config.verify_checksums, progress)
                                .map(Arc::new)
                        })
                        .collect::<Result<Vec<_>, _>>()
                })?;
                (dram, None)
            }
            Tier::Ssd => {
                let files = table_files(reader, &config, &memory)?;
                let tiers = tiers::place(reader, &config, budget, &memory, &files, progress)?;
                (Vec::new(), Some(SsdTier::new(files, tiers, &config)))
            }
        };
        Ok(Self::assemble(reader, config, workers, dram, ssd))
    }

    fn assemble(
        reader: &StoreReader,
        config: EngineConfig,
        workers: Arc<Workers>,
        dram: Vec<Arc<AlignedBuf>>,
        ssd: Option<SsdTier>,
    ) -> Self {
        let tables = reader.manifest().tables.clone();
        let by_name = tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            tables,
            by_name,
            dram,
            ssd,
            device_given: false,
            workers,
            config,
        }
    }

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
        Ok(Self::assemble(
            reader,
            self.config.clone(),
            self.workers.clone(),
            dram,
            ssd,
        ))
    }

    /// Fills this engine's row caches with the rows `old`'s DRAM tiers hold — its hot rows and
    /// cached rows — of each table both have with the same shape, read from this engine's
    /// files, up to each cache's size: a new version of a store (a swap) then starts with the
    /// old one's working set. Rows this engine pins already are skipped. Returns the rows
    /// loaded. Does nothing for tables kept whole.
    pub fn warm_from(&self, old: &Engine) -> Result<u64> {
        let _inside = fork_gate();
        let (Some(ssd), Some(old_ssd)) = (&self.ssd, &old.ssd) else {
            return Ok(0);
        };
        let files = ssd.files();
        let mut loaded = 0u64;
        for (id, meta) in self.tables.iter().enumerate() {
            let tiers = &ssd.dram_tiers()[id];
            let Some(cache) = &tiers.cache else {
                continue;
            };
            let Ok(o) = old.table_id(&meta.name) else {
                continue;
            };
            let was = &old.tables[o];
            if (was.rows, was.dim, was.dtype) != (meta.rows, meta.dim, meta.dtype) {
                continue;
            }
            let before = &old_ssd.dram_tiers()[o];
            let mut rows: Vec<u64> = before.hot.as_ref().map(|h| h.row_ids()).unwrap_or_default();
            rows.extend(before.cache.as_ref().map(|c| c.rows()).unwrap_or_default());
            rows.retain(|&r| tiers.hot.as_ref().is_none_or(|h| h.get(r).is_none()));
            rows.sort_unstable();
            rows.dedup();
            rows.truncate(cache.capacity_rows() as usize);
            let rb = meta.row_bytes as usize;
            let mut buf = vec![0u8; rows.len() * rb];
            files.read_raw(id, meta, &rows, &mut buf)?;
            for (&r, bytes) in rows.iter().zip(buf.chunks_exact(rb)) {
                cache.offer(r, bytes);
            }
            loaded += rows.len() as u64;
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

    pub fn tables(&self) -> &[TableMeta] {
        &self.tables
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

    /// Decodes rows `rows` of table `id` into `out` (`rows.len() * dim` floats), for callers that
    /// need the rows themselves (inspection, reference checks). Errors name the first bad position.
    pub fn read_rows(&self, id: usize, rows: &[i64], out: &mut [f32]) -> Result<()> {
        self.read_rows_at(id, rows, out, DeltaView::NONE)
    }

    /// [`Self::read_rows`] as a live store's snapshot sees them (a written row is the delta's,
    /// a removed one zeros).
    pub fn read_rows_at(
        &self,
        id: usize,
        rows: &[i64],
        out: &mut [f32],
        deltas: DeltaView<'_>,
    ) -> Result<()> {
        let _inside = fork_gate();
        let meta = &self.tables[id];
        let dim = meta.dim as usize;
        assert_eq!(out.len(), rows.len() * dim, "output has the wrong size");
        if self.ssd.is_some() {
            // One-row sum bags: the row itself (0 + v, so only -0.0 comes back as +0.0).
            let req = Batch::new(vec![TableLookup::new(
                &meta.name,
                Indices::I64(rows),
                Bags::Fixed {
                    batch: rows.len(),
                    bag_size: 1,
                },
            )]);
            let prepared = self.prepare(&req)?;
            return self.run(&req, &prepared, out, None, deltas).map(drop);
        }
        let view = self.view(id);
        let patch = deltas.patch(id, Indices::I64(rows), 0..rows.len(), meta.rows);
        for (position, (&r, dst)) in rows.iter().zip(out.chunks_exact_mut(dim)).enumerate() {
            if r < 0 || r as u64 >= meta.rows {
                return Err(EngineError::IndexOutOfRange {
                    table: meta.name.clone(),
                    position,
                    bag: position,
                    value: r,
                    rows: meta.rows,
                });
            }
            let row = patch.as_ref().and_then(|p| p.get(r as u64));
            meta.dtype
                .decode_row(row.unwrap_or_else(|| view.row(r as u64)), dst);
        }
        Ok(())
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

    fn view(&self, id: usize) -> TableView<'_> {
        let t = &self.tables[id];
        TableView::new(
            self.resident(id)
                .expect("pooled from DRAM only when resident"),
            t.layout(),
            t.dtype,
            t.dim,
        )
        .expect("loaded table matches its layout")
    }

    /// Validates `req`: known tables, well-formed bags, weights and padding, one batch size.
    pub fn prepare(&self, req: &Batch<'_>) -> Result<Prepared> {
        self.check_size(req)?;
        let mut tables = Vec::with_capacity(req.tables.len());
        let (mut width, mut lookups) = (0usize, 0usize);
        let mut batch: Option<(usize, &str)> = None;
        for t in &req.tables {
            let id = self.table_id(t.table)?;
            let checked = check(t, self.tables[id].rows)?;
            match batch {
                Some((b, first)) if b != checked.batch() => {
                    return Err(EngineError::invalid(
                        t.table,
                        format!(
                            "has {} bags but table {first:?} has {b}; every table needs one bag per sample",
                            checked.batch()
                        ),
                    ));
                }
                _ => batch = Some((checked.batch(), t.table)),
            }
            lookups += checked.bounds[checked.batch()] - checked.bounds[0];
            tables.push((id, width, checked));
            width += self.tables[id].dim as usize;
        }
        Ok(Prepared {
            engine: self.id,
            batch: batch.map_or(0, |b| b.0),
            width,
            tables,
            lookups,
        })
    }

    /// A request's shape is its caller's: a fixed batch of 2³¹ empty bags is a few bytes of
    /// request but gigabytes of bag bounds and output. Past 64 MiB, what preparing and answering
    /// it takes is checked against what the process may have first — a typed error, not an abort
    /// in the allocator (smaller requests are not checked: the probe reads /proc).
    fn check_size(&self, req: &Batch<'_>) -> Result<()> {
        const CHECKED: u64 = 64 << 20;
        let bags = req
            .tables
            .iter()
            .map(TableLookup::declared_bags)
            .max()
            .unwrap_or(0) as u64;
        let width: u64 = req
            .tables
            .iter()
            .filter_map(|t| self.table_id(t.table).ok())
            .map(|id| u64::from(self.tables[id].dim))
            .sum();
        let bounds = (bags + 1).saturating_mul(8 * req.tables.len() as u64);
        let bytes = bounds.saturating_add(bags.saturating_mul(width).saturating_mul(4));
        if bytes > CHECKED {
            Memory::probe().check(
                || format!("a batch of {bags} bags over {width} columns"),
                bytes,
            )?;
        }
        Ok(())
    }

    /// Pools `req` into `out`, a row-major `[batch, width]` matrix (`prepared` from [`Self::prepare`]
    /// on the same request). Returns where the batch's time went.
    pub fn execute(&self, req: &Batch<'_>, prepared: &Prepared, out: &mut [f32]) -> Result<Stages> {
        self.execute_at(req, prepared, out, DeltaView::NONE)
    }

    /// [`Self::execute`] as a live store's snapshot sees it: each row the `deltas` hold for it
    /// (written or removed since this engine's tables) stands in for the table's.
    pub fn execute_at(
        &self,
        req: &Batch<'_>,
        prepared: &Prepared,
        out: &mut [f32],
        deltas: DeltaView<'_>,
    ) -> Result<Stages> {
        let _inside = fork_gate();
        self.run(req, prepared, out, None, deltas)
    }

    /// [`Self::execute`], handing each table's pooled `[batch, dim]` block to `ready` (with the
    /// table's position in the request) the moment its last bag is final, from whichever thread
    /// finished it: the SSD tier's as its last read lands, a pooling task's on the DRAM path.
    pub(crate) fn run(
        &self,
        req: &Batch<'_>,
        prepared: &Prepared,
        out: &mut [f32],
        ready: Option<&Ready<'_>>,
        deltas: DeltaView<'_>,
    ) -> Result<Stages> {
        assert_eq!(
            out.len(),
            prepared.batch * prepared.width,
            "output has the wrong size"
        );
        if prepared.engine != self.id {
            return Err(EngineError::Config(
                "the batch was prepared by another engine (the store's tables changed between \
                 prepare and execute)"
                    .into(),
            ));
        }
        assert_eq!(
            req.tables.len(),
            prepared.tables.len(),
            "prepared for another request"
        );
        if prepared.batch == 0 || prepared.width == 0 {
            return Ok(Stages::default());
        }
        let mut stages = Stages::default();
        if let Some(ssd) = &self.ssd {
            // tables kept whole in DRAM go through the DRAM path below; the rest read from SSD
            let jobs: Vec<SsdJob<'_>> = prepared
                .tables
                .iter()
                .zip(&req.tables)
                .enumerate()
                .filter(|(_, ((id, _, _), _))| self.resident(*id).is_none())
                .map(|(k, ((id, col, checked), t))| SsdJob {
                    k,
                    id: *id,
                    meta: &self.tables[*id],
                    col: *col,
                    req: t,
                    checked,
                    deltas,
                })
                .collect();
            if !jobs.is_empty() {
                let workers =
                    (prepared.lookups > self.config.inline_lookups).then_some(&*self.workers);
                stages = ssd.execute(&jobs, prepared.batch, prepared.width, out, workers, ready)?;
            }
        }
        // Tasks: runs of bags of one table, about `task_lookups` lookups each.
        let mut tasks = Vec::new();
        for (k, (id, _, checked)) in prepared.tables.iter().enumerate() {
            if self.resident(*id).is_none() {
                continue;
            }
            if let Some(ssd) = &self.ssd {
                let (lo, hi) = (checked.bounds[0], checked.bounds[prepared.batch]);
                let t = &req.tables[k];
                let padding = checked.padding.map_or(0, |p| {
                    (lo..hi).filter(|&i| t.indices.get(i) == p as i64).count()
                });
                ssd.count_resident(*id, (hi - lo - padding) as u64);
            }
            let per_bag = (checked.bounds[prepared.batch] / prepared.batch).max(1);
            let step = (self.config.task_lookups / per_bag).clamp(1, prepared.batch);
            tasks.extend(
                (0..prepared.batch)
                    .step_by(step)
                    .map(|b0| (k, b0, (b0 + step).min(prepared.batch))),
            );
        }
        // per table, its tasks not yet done (the last one hands the table to `ready`)
        let mut left: Vec<AtomicUsize> = (0..prepared.tables.len())
            .map(|_| AtomicUsize::new(0))
            .collect();
        for &(k, _, _) in &tasks {
            *left[k].get_mut() += 1;
        }
        let cells = Cells::new(out, prepared.batch, prepared.width);
        let pooling = Instant::now();
        let run = |&(k, b0, b1): &(usize, usize, usize)| {
            let (id, col, checked) = &prepared.tables[k];
            let dim = self.tables[*id].dim as usize;
            // SAFETY: tasks cover disjoint (table, bag) cells: each table owns columns
            // [col, col + dim) and each task of that table owns rows [b0, b1). `out` outlives the
            // tasks, and its length was checked above.
            let mut bags =
                unsafe { BagsOut::from_raw(cells.ptr(b0, *col), prepared.width, dim, b1 - b0) };
            self.pool(&req.tables[k], checked, *id, b0..b1, &mut bags, deltas)?;
            if let Some(ready) = ready
                && left[k].fetch_sub(1, AcqRel) == 1
            {
                // SAFETY: every task of table k is done (the AcqRel count orders their writes
                // before this read) and no task writes its columns again; the others write only
                // their own columns.
                ready(k, unsafe { cells.block(*col, dim) });
            }
            Ok::<_, EngineError>(())
        };
        if prepared.lookups <= self.config.inline_lookups
            || self.workers.threads() == 1
            || tasks.len() <= 1
        {
            tasks.iter().try_for_each(run)?;
        } else {
            self.workers
                .get()?
                .install(|| tasks.par_iter().try_for_each(run))?;
        }
        if !tasks.is_empty() {
            stages.pool += pooling.elapsed();
        }
        Ok(stages)
    }

    /// Validates and pools `req` into a new `[batch, width]` vector.
    pub fn lookup(&self, req: &Batch<'_>) -> Result<(Prepared, Vec<f32>)> {
        let prepared = self.prepare(req)?;
        let mut out = vec![0f32; prepared.batch * prepared.width];
        self.execute(req, &prepared, &mut out)?;
        Ok((prepared, out))
    }

    fn pool(
        &self,
        t: &crate::request::TableLookup<'_>,
        checked: &Checked,
        id: usize,
        bags: std::ops::Range<usize>,
        out: &mut BagsOut<'_>,
        deltas: DeltaView<'_>,
    ) -> Result<()> {
        let (b0, b1) = (bags.start, bags.end);
        let view = self.view(id);
        let (lo, hi) = (checked.bounds[b0], checked.bounds[b1]);
        let patch = deltas.patch(id, t.indices, lo..hi, view.rows());
        fn job<'a, I: RowIndex>(
            indices: &'a [I],
            t: &crate::request::TableLookup<'a>,
            bounds: &'a [usize],
            padding: Option<u64>,
        ) -> PoolJob<'a, I> {
            PoolJob {
                indices,
                bounds,
                weights: t.per_sample_weights,
                mode: t.mode,
                padding_idx: padding,
            }
        }
        let bounds = &checked.bounds[b0..=b1];
        // a task that reads rows written since the table's file pools them from its patch
        fn pool<I: RowIndex>(
            view: &TableView<'_>,
            job: &PoolJob<'_, I>,
            out: &mut BagsOut<'_>,
            patch: Option<&RowPatch>,
        ) -> std::result::Result<(), IndexError> {
            match patch {
                None => nearrec_kernels::pool_bags(view, job, out),
                Some(p) => nearrec_kernels::pool_bags_patched(view, job, out, p),
            }
        }
        let patch = patch.as_ref();
        let res = match t.indices {
            Indices::I32(ix) => pool(&view, &job(ix, t, bounds, checked.padding), out, patch),
            Indices::I64(ix) => pool(&view, &job(ix, t, bounds, checked.padding), out, patch),
        };
        res.map_err(
            |IndexError { position, value }| EngineError::IndexOutOfRange {
                table: t.table.to_owned(),
                position,
                bag: checked
                    .bounds
                    .partition_point(|&s| s <= position)
                    .saturating_sub(1),
                value,
                rows: view.rows(),
            },
        )
    }
}

/// Every table's sector checksums, for the SSD tier to check reads against (`None` for tables
/// of older stores, and for all with `verify_reads` off).
/// The table files of `reader`'s store as the SSD tier reads them.
fn table_files(reader: &StoreReader, config: &EngineConfig, memory: &Memory) -> Result<TableFiles> {
    let paths: Vec<_> = reader
        .tables()
        .iter()
        .map(|t| reader.path().join(&t.file))
        .collect();
    TableFiles::open(
        &paths,
        config,
        reader.orders().to_vec(),
        sector_sums(reader, config, memory)?,
    )
}

fn sector_sums(
    reader: &StoreReader,
    config: &EngineConfig,
    memory: &Memory,
) -> Result<Vec<Option<SectorSums>>> {
    if !config.verify_reads {
        return Ok(vec![None; reader.tables().len()]);
    }
    let bytes = reader
        .tables()
        .iter()
        .filter(|t| t.sums.is_some())
        .map(|t| SectorSums::bytes_for(t.data_bytes))
        .sum();
    memory.check(|| "the tables' sector checksums".into(), bytes)?;
    (0..reader.tables().len())
        .map(|i| reader.sector_sums(i).map_err(EngineError::from))
        .collect()
}

/// An explicit DRAM budget above what the process may ever have is refused: it could not be
/// kept, and the tiers planned in it would fail to allocate later.
fn check_budget(config: &EngineConfig, memory: &Memory) -> Result<()> {
    match config.dram_budget_bytes {
        Some(b) if b > memory.limit => {
            Err(EngineError::InsufficientMemory(nearrec_format::Shortfall {
                what: "dram_budget_bytes".into(),
                asked: b,
                available: memory.available,
                limit: memory.limit,
            }))
        }
        _ => Ok(()),
    }
}
