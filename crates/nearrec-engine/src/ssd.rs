//! The SSD tier: rows are read from the table files with direct I/O, only the blocks that hold
//! them (RM-SSD's vector-grained reads), de-duplicated across bags and tables, merged when they
//! share or neighbour a block (EMB-SSD's I/O merging), all submitted together, and pooled into
//! every bag that wants them the moment their read completes (RecSSD's per-page processing).
//! Only the pooled `[batch, Σ dim]` output leaves; no per-lookup row tensor is built.
//!
//! In front of the files sit each table's DRAM tiers ([`DramTiers`]): the whole table, a pinned
//! hot partition, a row cache. Every lookup is tried there first and a hit pooled at once by the
//! kernels' bag loop, which asks the tiers for each row a few lookups ahead so that their probes
//! overlap ([`TierSource`]; tables in parallel on the worker pool); only the misses are sorted,
//! de-duplicated, planned and read, and every row read is offered to the cache.
//!
//! A co-located table stores its rows permuted ([`RowOrder`]): only the misses' row ids are
//! mapped to *slots* (positions in the file), when reads are planned, so rows stored together are
//! read together while the DRAM tiers, keyed by row id, pay nothing for it.

use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use arc_swap::ArcSwap;
use nearrec_cache::{Home, HotPartition, Reader, RowCache, Set, Slot};
use nearrec_format::{DATA_OFFSET, SECTOR_BYTES, TableMeta};
use nearrec_io::{ReadOp, Workers};
use nearrec_kernels::{
    BagsOut, IndexError, PoolJob, RUN, RowIndex, RowPatch, RowRef, RowSource, SKIP,
};
use rayon::prelude::*;

use crate::cells::{Cells, Ready};
use crate::config::EngineConfig;
use crate::delta::DeltaView;
use crate::error::{EngineError, Result};
use crate::files::TableFiles;
use crate::request::{Checked, Indices, PoolingMode, TableLookup};
use crate::stats::{IoStats, Stages};
use crate::tiers::DramTiers;

/// Tables served from their files ([`TableFiles`]) behind their DRAM tiers.
#[derive(Debug)]
pub(crate) struct SsdTier {
    /// Replaced whole when a live store's compaction writes new table files: a batch reads
    /// through the files it loaded when it started.
    files: ArcSwap<TableFiles>,
    stats: Arc<IoStats>,
    /// `None`: no merging.
    merge_gap: Option<u64>,
    max_read: u64,
    dedup: bool,
    /// Per table; shared with the tiers of engines derived from this one.
    dram: Vec<Arc<DramTiers>>,
}

/// One table's part of a batch, as the engine hands it over.
pub(crate) struct SsdJob<'a> {
    /// Position of the table in the request.
    pub k: usize,
    pub id: usize,
    pub meta: &'a TableMeta,
    /// First output column of the table.
    pub col: usize,
    pub req: &'a TableLookup<'a>,
    pub checked: &'a Checked,
    /// The rows written or removed since the table's file (a live store's).
    pub deltas: DeltaView<'a>,
}

/// A job's lookups after its DRAM side ([`SsdTier::serve_dram`]): the ones the SSD must serve as
/// `(row, position, bag)` sorted by row, and the rows counted per bag (padding excluded).
struct Routed {
    entries: Vec<Entry>,
    counts: Vec<usize>,
    /// `(first entry, run length)` of each distinct row left for the SSD.
    misses: Vec<(usize, usize)>,
}

/// One lookup: `(row, position in the request, bag)`, as the kernel hands back those the DRAM
/// tiers lacked.
type Entry = nearrec_kernels::Lacked;

/// A batch's reads, where each distinct row lands, and which landings each read carries.
#[derive(Default)]
struct Plan {
    reads: Vec<ReadOp>,
    landings: Vec<Landing>,
    by_read: Vec<Range<usize>>,
    /// Staging bytes used by the closed reads (the open read starts here).
    total: usize,
}

impl Plan {
    /// Ends the open read (`lo..hi` of table file `file`): it carries the landings pushed since
    /// the previous read ended.
    fn close(&mut self, file: usize, (lo, hi): (u64, u64)) {
        self.reads.push(ReadOp {
            file: file as u32,
            offset: lo,
            len: (hi - lo) as u32,
            buf_at: self.total,
        });
        let first = self.by_read.last().map_or(0, |r| r.end);
        self.by_read.push(first..self.landings.len());
        self.total += (hi - lo) as usize;
    }
}

/// `(first index, length)` of each run of equal rows in row-sorted entries (each entry alone
/// without `dedup`).
fn runs(entries: &[Entry], dedup: bool) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        (i < entries.len()).then(|| {
            let row = entries[i].0;
            let run = if dedup {
                entries[i..].partition_point(|e| e.0 == row)
            } else {
                1
            };
            let at = i;
            i += run;
            (at, run)
        })
    })
}

/// Where one distinct row lands: in the staging buffer at `at`, wanted by `entries` of its job.
struct Landing {
    job: usize,
    entries: Range<usize>,
    at: usize,
}

impl SsdTier {
    /// The tier over `files`, with each table's DRAM tiers in front (index = table id).
    pub(crate) fn new(files: TableFiles, dram: Vec<DramTiers>, config: &EngineConfig) -> Self {
        Self {
            dram: dram.into_iter().map(Arc::new).collect(),
            stats: files.stats.clone(),
            files: ArcSwap::from_pointee(files),
            merge_gap: config.merge.then_some(config.merge_gap_bytes),
            max_read: config.max_read_bytes,
            dedup: config.dedup,
        }
    }

    /// A tier over `files` (another set of tables) with `dram` in front, counting into this
    /// tier's counters and reading as it reads.
    pub(crate) fn derive(&self, files: TableFiles, dram: Vec<Arc<DramTiers>>) -> Self {
        Self {
            files: ArcSwap::from_pointee(files.with_stats(self.stats.clone())),
            stats: self.stats.clone(),
            merge_gap: self.merge_gap,
            max_read: self.max_read,
            dedup: self.dedup,
            dram,
        }
    }

    /// The files a batch starting now reads.
    pub(crate) fn files(&self) -> Arc<TableFiles> {
        self.files.load_full()
    }

    /// Serves the table files `files` from now on (batches under way finish on the old ones).
    /// The old files are closed here, once the batches on them end (not by whichever batch
    /// lets them go last: closing a device takes milliseconds).
    pub(crate) fn replace_files(&self, files: TableFiles) {
        let old = self
            .files
            .swap(Arc::new(files.with_stats(self.stats.clone())));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while Arc::strong_count(&old) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    pub(crate) fn stats(&self) -> &IoStats {
        &self.stats
    }

    pub(crate) fn dram_tiers(&self) -> &[Arc<DramTiers>] {
        &self.dram
    }

    /// Counts lookups of a table kept whole, which the engine pools on its DRAM path.
    pub(crate) fn count_resident(&self, table: usize, lookups: u64) {
        if let Some(t) = self.dram.get(table) {
            IoStats::add(&t.served[0], lookups);
        }
    }

    /// Pools `jobs` into `out`, a row-major `[batch, width]` matrix whose cells the jobs own.
    /// With `workers`, the DRAM tiers' hits of different tables are pooled in parallel. Each job
    /// is finished (means divided, empty bags zeroed) and handed to `ready` as soon as its last
    /// row is in: after the DRAM tiers when they served it all, else as its last read lands.
    pub(crate) fn execute(
        &self,
        jobs: &[SsdJob<'_>],
        batch: usize,
        width: usize,
        out: &mut [f32],
        workers: Option<&Workers>,
        ready: Option<&Ready<'_>>,
    ) -> Result<Stages> {
        let start = Instant::now();
        let files = self.files();
        let files = files.as_ref();
        let cells = Cells::new(out, batch, width);
        let serving = Instant::now();
        let serve = |job: &SsdJob<'_>| self.serve_dram(job, batch, &cells);
        // every table's DRAM side, then the first bad index in request order (before any read)
        let routed: Vec<Result<Routed>> = match workers {
            Some(w) if jobs.len() > 1 && w.threads() > 1 => {
                w.get()?.install(|| jobs.par_iter().map(serve).collect())
            }
            _ => jobs.iter().map(serve).collect(),
        };
        let routed = routed.into_iter().collect::<Result<Vec<_>>>()?;
        let served = serving.elapsed(); // the DRAM tiers' hits pooled
        let finish = |j: &SsdJob<'_>, r: &Routed| {
            let dim = j.meta.dim as usize;
            for (b, &count) in r.counts.iter().enumerate() {
                // SAFETY: the job's own columns; its last row is pooled, no one else writes them
                let cell = unsafe { cells.cell(b, j.col, dim) };
                if count == 0 {
                    cell.fill(0.0);
                } else if j.req.mode == PoolingMode::Mean {
                    cell.iter_mut().for_each(|a| *a /= count as f32);
                }
            }
            if let Some(ready) = ready {
                // SAFETY: as above; the other jobs write only their own columns
                ready(j.k, unsafe { cells.block(j.col, dim) });
            }
        };
        // per job, its distinct rows still to land
        let mut left: Vec<usize> = routed.iter().map(|r| r.misses.len()).collect();
        for ((j, r), _) in jobs
            .iter()
            .zip(&routed)
            .zip(&left)
            .filter(|(_, n)| **n == 0)
        {
            finish(j, r);
        }
        let max_dim = jobs.iter().map(|j| j.meta.dim as usize).max().unwrap_or(0);
        let mut row = vec![0f32; max_dim];
        let Plan {
            reads,
            landings,
            by_read,
            total: bytes,
        } = self.plan(files, jobs, &routed);
        let route_done = Instant::now();
        let route = (route_done - start).saturating_sub(served);
        self.stats.route.record(route);

        let mut buf = files.buffer(bytes);
        let mut pooling = served;
        let mut bad: Option<(usize, u64)> = None; // (read, sector's data-region offset)
        let res =
            files
                .device()
                .read_batch(&reads, &mut buf.as_mut_slice()[..bytes], &mut |i, data| {
                    let t = Instant::now();
                    if let Err(at) = files.check(&reads[i], data) {
                        // none of its rows is pooled or cached; the batch fails below
                        bad.get_or_insert((i, at));
                        return;
                    }
                    for land in &landings[by_read[i].clone()] {
                        let job = &jobs[land.job];
                        let (dim, rb) = (job.meta.dim as usize, job.meta.row_bytes as usize);
                        let encoded = &data[land.at - reads[i].buf_at..][..rb];
                        let row = &mut row[..dim];
                        job.meta.dtype.decode_row(encoded, row);
                        let r = &routed[land.job];
                        pool_row(job, &r.entries[land.entries.clone()], row, &cells);
                        if let Some(cache) = self.dram.get(job.id).and_then(|d| d.cache.as_ref()) {
                            cache.offer(r.entries[land.entries.start].0, encoded);
                        }
                        left[land.job] -= 1;
                        if left[land.job] == 0 {
                            finish(job, r);
                        }
                    }
                    pooling += t.elapsed();
                });
        files.give_back(buf);
        res?;
        if let Some((i, at)) = bad {
            // the first row this read carried that sits in the bad sector
            let op = &reads[i];
            let sector = op.buf_at + (at + DATA_OFFSET - op.offset) as usize;
            let sector = sector..sector + SECTOR_BYTES as usize;
            let hit = landings[by_read[i].clone()].iter().find(|l| {
                let rb = jobs[l.job].meta.row_bytes as usize;
                l.at < sector.end && l.at + rb > sector.start
            });
            let row = hit.map(|l| routed[l.job].entries[l.entries.start].0);
            let job = hit.map_or_else(
                || jobs.iter().find(|j| j.id == op.file as usize),
                |l| Some(&jobs[l.job]),
            );
            let job = job.expect("a read of a job's table");
            return Err(files.corrupted(job.id, job.meta, at, row));
        }
        let stages = Stages {
            route,
            io_wait: (route_done.elapsed()).saturating_sub(pooling - served),
            pool: pooling,
        };
        self.stats.pool.record(stages.pool);
        self.stats.io_wait.record(stages.io_wait);
        self.account(jobs, &routed, &reads, bytes);
        self.stats.end_to_end.record(start.elapsed());
        Ok(stages)
    }

    /// Reads for every distinct row, in file order: the aligned blocks that hold it, merged with
    /// the previous read of the same file when they overlap or lie within `merge_gap` bytes and
    /// the merged read stays within `max_read`. Returns the reads, where each row lands, and each
    /// read's landings.
    fn plan(&self, files: &TableFiles, jobs: &[SsdJob<'_>], routed: &[Routed]) -> Plan {
        let block = files.device().block_size() as u64;
        let mut plan = Plan::default();
        for (k, (job, r)) in jobs.iter().zip(routed).enumerate() {
            let layout = job.meta.layout();
            // (slot, first entry, run) of each miss, by slot (row ids are sorted already)
            let mut misses: Vec<(u64, usize, usize)> = r
                .misses
                .iter()
                .map(|&(i, run)| (files.slot(job.id, r.entries[i].0), i, run))
                .collect();
            if files.colocated(job.id) {
                misses.sort_unstable();
            }
            // the open read, as (start, end) bytes of the file; its buffer offset is `plan.total`
            let mut open: Option<(u64, u64)> = None;
            for (slot, i, run) in misses {
                let start = DATA_OFFSET + layout.row_offset(slot);
                let lo = start / block * block;
                let hi = (start + layout.row_bytes).div_ceil(block) * block;
                open = match open {
                    Some((olo, ohi))
                        if self
                            .merge_gap
                            .is_some_and(|gap| lo <= ohi + gap && hi - olo <= self.max_read) =>
                    {
                        Some((olo, ohi.max(hi)))
                    }
                    previous => {
                        if let Some(read) = previous {
                            plan.close(job.id, read);
                        }
                        Some((lo, hi))
                    }
                };
                let olo = open.map_or(lo, |o| o.0);
                plan.landings.push(Landing {
                    job: k,
                    entries: i..i + run,
                    at: plan.total + (start - olo) as usize,
                });
            }
            if let Some(read) = open {
                plan.close(job.id, read);
            }
        }
        plan
    }

    fn account(&self, jobs: &[SsdJob<'_>], routed: &[Routed], reads: &[ReadOp], bytes: usize) {
        let s = &self.stats;
        let (mut lookups, mut unique, mut useful) = (0u64, 0u64, 0u64);
        for (j, r) in jobs.iter().zip(routed) {
            lookups += r.misses.iter().map(|m| m.1 as u64).sum::<u64>();
            unique += r.misses.len() as u64;
            useful += r.misses.len() as u64 * j.meta.row_bytes;
        }
        IoStats::add(&s.batches, 1);
        IoStats::add(&s.lookups, lookups);
        IoStats::add(&s.unique_rows, unique);
        IoStats::add(&s.device_reads, reads.len() as u64);
        IoStats::add(&s.bytes_read, bytes as u64);
        IoStats::add(&s.useful_bytes, useful);
        IoStats::add(&s.reads_saved_dedup, lookups - unique); // 0 without dedup: rows = lookups
        IoStats::add(&s.reads_saved_merge, unique - reads.len() as u64);
        s.max_batch_reads.fetch_max(reads.len() as u64, Relaxed);
    }
}

impl SsdTier {
    /// Pools every lookup of `job` whose row its DRAM side holds — the live table's patch, the
    /// hot partition, the row cache — straight into its cells with the kernels' bag loop
    /// ([`nearrec_kernels::pool_found`]; every bag's cells start there), and routes the others
    /// to the SSD: sorted by row, with their runs of equal rows. A bad index is an error before
    /// anything is read.
    fn serve_dram(&self, job: &SsdJob<'_>, batch: usize, cells: &Cells) -> Result<Routed> {
        let (meta, dim) = (job.meta, job.meta.dim as usize);
        let bounds = &job.checked.bounds[..=batch];
        let tiers = self.dram.get(job.id).filter(|t| !t.is_empty());
        let patch = job
            .deltas
            .patch(job.id, job.req.indices, bounds[0]..bounds[batch], meta.rows);
        let source = TierSource::new(
            meta.row_bytes as usize,
            patch.as_ref(),
            tiers.and_then(|t| t.hot.as_ref()),
            tiers.and_then(|t| t.cache.as_ref()),
        );
        let mut misses = Vec::new();
        let mut counts = vec![0usize; batch];
        // SAFETY: a job pools only into its own table's columns
        let mut out = unsafe { cells.bags(job.col, dim) };
        fn pool<I: RowIndex>(
            job: &SsdJob<'_>,
            indices: &[I],
            bounds: &[usize],
            out: &mut BagsOut<'_>,
            counts: &mut [usize],
            source: &TierSource<'_>,
            misses: &mut Vec<Entry>,
        ) -> std::result::Result<(), IndexError> {
            let pool_job = PoolJob {
                indices,
                bounds,
                weights: job.req.per_sample_weights,
                mode: job.req.mode,
                padding_idx: job.checked.padding,
            };
            let (meta, dim) = (job.meta, job.meta.dim as usize);
            nearrec_kernels::pool_found(
                meta.dtype, dim, meta.rows, &pool_job, out, counts, source, misses,
            )
        }
        let res = match job.req.indices {
            Indices::I32(ix) => pool(job, ix, bounds, &mut out, &mut counts, &source, &mut misses),
            Indices::I64(ix) => pool(job, ix, bounds, &mut out, &mut counts, &source, &mut misses),
        };
        res.map_err(
            |IndexError { position, value }| EngineError::IndexOutOfRange {
                table: meta.name.clone(),
                position,
                bag: bounds.partition_point(|&b| b <= position) - 1,
                value,
                rows: meta.rows,
            },
        )?;
        let TierSource { served, cache, .. } = source;
        let served = served.map(Cell::into_inner);
        if let Some(t) = tiers {
            IoStats::add(&t.served[1], served[0]);
            IoStats::add(&t.served[2], served[1]);
        }
        if let Some(reader) = cache {
            // let go here, before this batch's reads offer rows to the cache
            reader.cache().count(served[1], misses.len() as u64);
        }
        if let Some(t) = self.dram.get(job.id) {
            IoStats::add(&t.served[3], misses.len() as u64);
        }
        misses.sort_unstable();
        let runs = runs(&misses, self.dedup).collect();
        Ok(Routed {
            entries: misses,
            counts,
            misses: runs,
        })
    }
}

/// One table's DRAM side as the kernel's row source: a live table's patch (the rows written or
/// removed since its file), then the hot partition, then the row cache (held for reading for
/// the whole job: a hit is pooled from where its row lies); a lookup none of them holds is a
/// miss, kept for the SSD.
///
/// The kernel asks for a run of lookups at a time ([`RUN`]) and names the rows of the run after
/// the next one. Finding a run's rows is a pipeline of three steps a run apart, each one short
/// loop over the run that asks for the lines the next step reads: two runs ahead each lookup is
/// *located* (the hot partition's index entry and the cache's set, whose tags are asked for);
/// one run ahead it is *probed* (the hot partition's entry read and its row asked for; for what
/// it lacks, the cache's tags compared and the slot's lines asked for); at its run it is *read*
/// (the cache slot's key checked). A table with both tiers locates every row in both (the
/// cache's tags of a row the hot partition holds are asked for in vain), so that what the hot
/// partition lacks is probed in the cache a run before it is read. The patch's rows, found at
/// the run itself, clear their lookups' slots, so that no tier overwrites them.
struct TierSource<'a> {
    /// The patch and the positions that read it, from the next run's on.
    patch: Option<(&'a RowPatch, Cell<&'a [usize]>)>,
    hot: Option<&'a HotPartition>,
    cache: Option<Reader<'a>>,
    /// Runs on their way, by their order modulo 3 (this run, the next one probed, the one
    /// after located), and the place of the run the next call most likely asks for.
    ahead: RefCell<([Prepared<'a>; 3], usize)>,
    /// Lookups served by the hot partition, by the row cache.
    served: [Cell<u64>; 2],
}

/// A run of lookups on its way through [`TierSource`]'s pipeline.
#[derive(Clone, Copy)]
struct Prepared<'a> {
    /// Its first position (`usize::MAX`: none) and its lookups.
    first: usize,
    len: usize,
    rows: [u64; RUN],
    /// Located: where each row's search of the hot partition starts.
    homes: [Option<Home>; RUN],
    /// Probed: the rows the hot partition holds.
    hot: [Option<RowRef<'a>>; RUN],
    /// Located in the row cache (once probed, none where the hot partition holds the row).
    sets: [Set; RUN],
    /// Probed in the row cache.
    slots: [Slot; RUN],
}

impl Prepared<'_> {
    const NONE: Self = Self {
        first: usize::MAX,
        len: 0,
        rows: [SKIP; RUN],
        homes: [None; RUN],
        hot: [None; RUN],
        sets: [Set::NONE; RUN],
        slots: [Slot::NONE; RUN],
    };
}

impl<'a> TierSource<'a> {
    /// The tiers of a table whose rows are `row_bytes` long (each tier's are checked to be).
    fn new(
        row_bytes: usize,
        patch: Option<&'a RowPatch>,
        hot: Option<&'a HotPartition>,
        cache: Option<&'a RowCache>,
    ) -> Self {
        assert!(patch.is_none_or(|p| p.is_empty() || p.row_bytes() == row_bytes));
        assert!(hot.is_none_or(|h| h.row_bytes() == row_bytes));
        assert!(cache.is_none_or(|c| c.row_bytes() == row_bytes));
        Self {
            patch: patch.map(|p| (p, Cell::new(p.read_positions()))),
            hot,
            cache: cache.map(RowCache::reader),
            ahead: RefCell::new(([Prepared::NONE; 3], 0)),
            served: Default::default(),
        }
    }

    /// The patch's rows for the run of `rows` from `first`, which no tier then reads (`slots`:
    /// the run's slots in the row cache, passed over where the patch has the row).
    fn patch<'s>(
        &'s self,
        first: usize,
        rows: &[u64],
        found: &mut [Option<RowRef<'s>>],
        mut slots: Option<&mut [Slot; RUN]>,
    ) {
        let Some((patch, at)) = &self.patch else {
            return;
        };
        let n = rows.len();
        // positions ascend, and so do the patch's: a cursor, no look-up per lookup
        let mut left = at.get();
        while let Some((&pos, rest)) = left.split_first()
            && pos < first + n
        {
            let i = pos.wrapping_sub(first);
            // a position recorded for a row the patch lacks reads the tiers
            if i < n && rows[i] != SKIP {
                found[i] = patch.get(rows[i]).map(RowRef::new);
                if let Some(slots) = &mut slots
                    && found[i].is_some()
                {
                    slots[i] = Slot::NONE;
                }
            }
            left = rest;
        }
        at.set(left);
    }

    /// The first step for the run of `rows` from `first`.
    fn locate(&self, run: &mut Prepared<'a>, first: usize, rows: &[u64]) {
        let n = rows.len().min(RUN);
        (run.first, run.len) = (first, n);
        run.rows[..n].copy_from_slice(&rows[..n]);
        if let Some(hot) = self.hot {
            for (home, &row) in run.homes.iter_mut().zip(&rows[..n]) {
                *home = Some(hot.prefetch(row));
            }
        }
        // every row, the hot partition's too: its set's tags are on their way by the probe
        if let Some(cache) = &self.cache {
            cache.locate(&rows[..n], &mut run.sets[..n]);
        }
    }

    /// The second step, for a located run: the cache is probed for what the hot partition
    /// lacks.
    fn probe(&self, run: &mut Prepared<'a>) {
        let n = run.len;
        if let Some(hot) = self.hot {
            for i in 0..n {
                run.hot[i] = run.homes[i]
                    .and_then(|home| hot.get_prefetched(home, run.rows[i]))
                    .map(RowRef::new);
                if run.hot[i].is_some() {
                    run.sets[i] = Set::NONE;
                }
            }
        }
        if let Some(cache) = &self.cache {
            cache.probe(&run.sets[..n], &mut run.slots[..n]);
        }
    }
}

// SAFETY: every row found is a row of the patch, the hot partition or the row cache, each
// checked in `new` to be the table's `row_bytes` long; `serve_dram` pools with the table's dtype
// and dim, whose rows are that long (checked when the store was opened)
unsafe impl RowSource for TierSource<'_> {
    fn resolve<'s>(
        &'s self,
        first: usize,
        rows: &[u64],
        ahead: &[u64],
        found: &mut [Option<RowRef<'s>>],
    ) {
        let n = rows.len().min(RUN);
        let (rows, found) = (&rows[..n], &mut found[..n]);
        if self.hot.is_none() && self.cache.is_none() {
            self.patch(first, rows, found, None);
            return;
        }
        let mut pipe = self.ahead.borrow_mut();
        let (ring, at) = &mut *pipe;
        let here = *at;
        *at = (here + 1) % 3;
        let [run, next, after] = ring
            .get_disjoint_mut([here, (here + 1) % 3, (here + 2) % 3])
            .expect("three places");
        // this run as it was probed a call ago, or all its steps now
        if run.first != first || run.len != n {
            self.locate(run, first, rows);
            self.probe(run);
        }
        // the next two runs a step on (a next run not located a call ago, as a job's second
        // is not, takes all its steps at its own call)
        if next.first == first + n {
            self.probe(next);
        }
        self.locate(after, first + n + RUN, &ahead[..ahead.len().min(RUN)]);
        self.patch(first, rows, found, Some(&mut run.slots));
        // the last step: what the hot partition holds, then the cache's slots' keys, for the
        // lookups still wanted (not padding, not the patch's)
        let mut served = [0u64; 2];
        if self.hot.is_some() {
            for i in 0..n {
                if found[i].is_none() && rows[i] != SKIP {
                    found[i] = run.hot[i];
                    served[0] += u64::from(found[i].is_some());
                }
            }
        }
        if let Some(cache) = &self.cache {
            // what the patch or the hot partition found, and padding, are passed over
            served[1] = cache.read(&run.slots[..n], rows, found);
        }
        drop(pipe);
        for (count, n) in self.served.iter().zip(served) {
            count.set(count.get() + n);
        }
    }
}

/// Adds a decoded row into the cells of the bags that want it (`entries`: its lookups).
fn pool_row(job: &SsdJob<'_>, entries: &[Entry], row: &[f32], cells: &Cells) {
    for &(_, pos, bag) in entries {
        // SAFETY: a job pools only into its own table's columns, one cell at a time
        let cell = unsafe { cells.cell(bag, job.col, row.len()) };
        match (job.req.mode, job.req.per_sample_weights) {
            (PoolingMode::Max, _) => cell.iter_mut().zip(row).for_each(|(a, &v)| *a = a.max(v)),
            (_, Some(w)) => {
                // one rounding, as the DRAM kernels and PyTorch (nearrec-kernels' fast.rs)
                let w = w[pos];
                cell.iter_mut()
                    .zip(row)
                    .for_each(|(a, &v)| *a = w.mul_add(v, *a));
            }
            (_, None) => cell.iter_mut().zip(row).for_each(|(a, &v)| *a += v),
        }
    }
}
