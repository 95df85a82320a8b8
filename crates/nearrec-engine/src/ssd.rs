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

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use arc_swap::ArcSwap;
use nearrec_cache::{Home, HotPartition, RowCache, Set, Slot, words_as_bytes};
use nearrec_format::{DATA_OFFSET, SECTOR_BYTES, TableMeta};
use nearrec_io::{ReadOp, Workers};
use nearrec_kernels::{
    BagsOut, FIND_AHEAD, IndexError, PoolJob, RowIndex, RowPatch, RowSource, TOUCH_AHEAD,
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

/// One lookup: `(row, position in the request, bag)`.
type Entry = (u64, usize, usize);

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
        let mut source = TierSource::new(
            meta.row_bytes as usize,
            patch.as_ref(),
            tiers.and_then(|t| t.hot.as_ref()),
            tiers.and_then(|t| t.cache.as_ref()),
        );
        let mut counts = vec![0usize; batch];
        // SAFETY: a job pools only into its own table's columns
        let mut out = unsafe { cells.bags(job.col, dim) };
        fn pool<I: RowIndex>(
            job: &SsdJob<'_>,
            indices: &[I],
            bounds: &[usize],
            out: &mut BagsOut<'_>,
            counts: &mut [usize],
            source: &mut TierSource<'_>,
        ) -> std::result::Result<(), IndexError> {
            let pool_job = PoolJob {
                indices,
                bounds,
                weights: job.req.per_sample_weights,
                mode: job.req.mode,
                padding_idx: job.checked.padding,
            };
            let (meta, dim) = (job.meta, job.meta.dim as usize);
            nearrec_kernels::pool_found(meta.dtype, dim, meta.rows, &pool_job, out, counts, source)
        }
        let res = match job.req.indices {
            Indices::I32(ix) => pool(job, ix, bounds, &mut out, &mut counts, &mut source),
            Indices::I64(ix) => pool(job, ix, bounds, &mut out, &mut counts, &mut source),
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
        let TierSource {
            mut misses,
            served,
            cache,
            ..
        } = source;
        if let Some(t) = tiers {
            IoStats::add(&t.served[1], served[0]);
            IoStats::add(&t.served[2], served[1]);
        }
        if let Some(c) = cache {
            c.count(served[1], misses.len() as u64);
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

/// Lookups [`TierSource`] keeps what it worked out ahead for: more than `TOUCH_AHEAD` + 1, a
/// power of two.
const RING: usize = (TOUCH_AHEAD + 1).next_power_of_two();

/// Lookups after its `find` that a lookup the hot partition lacks is probed in the row cache
/// (whose set `find` asked for), so that its row's lines are asked for before the lookup.
const LATER: usize = FIND_AHEAD / 2;

/// What a table's DRAM side worked out for one position ahead of it.
#[derive(Clone, Copy)]
enum Found<'a> {
    /// Touched: the hot partition's probe starts here (its line asked for).
    Home(Home),
    /// Touched, or not in the hot partition: the row cache's set (its tags asked for).
    Set(Set),
    Hot(&'a [u8]),
    Cache(Slot),
    Neither,
}

/// One table's DRAM side as the kernel's row source: a live table's patch (the rows written or
/// removed since its file), then the hot partition, then the row cache; a lookup none of them
/// holds is a miss, kept for the SSD.
///
/// Each step is worked out once and carried to the next through a ring of the positions ahead:
/// [`nearrec_kernels::TOUCH_AHEAD`] lookups ahead, the first structure a lookup searches (the
/// hot partition's index, else the cache's set) is located and its line asked for; `FIND_AHEAD`
/// ahead it is searched and the row's lines asked for. A table with both searches its cache
/// only for what the hot partition lacks (the hot partition takes most lookups by design;
/// asking for every lookup's set as well costs more than it saves): that set is located and
/// asked for at `find`, searched [`LATER`] lookups later, and the row's lines asked for then.
struct TierSource<'a> {
    /// The patch and the positions that read it, from the next lookup's on.
    patch: Option<(&'a RowPatch, &'a [usize])>,
    hot: Option<&'a HotPartition>,
    cache: Option<&'a RowCache>,
    /// `(position, found)` by position modulo [`RING`].
    ring: [(usize, Found<'a>); RING],
    /// Where a cache hit's row is copied.
    scratch: Vec<u64>,
    row_bytes: usize,
    misses: Vec<Entry>,
    /// Lookups served by the hot partition, by the row cache.
    served: [u64; 2],
}

impl<'a> TierSource<'a> {
    fn new(
        row_bytes: usize,
        patch: Option<&'a RowPatch>,
        hot: Option<&'a HotPartition>,
        cache: Option<&'a RowCache>,
    ) -> Self {
        Self {
            patch: patch.map(|p| (p, p.read_positions())),
            hot,
            cache,
            ring: [(usize::MAX, Found::Neither); RING],
            scratch: vec![0; cache.map_or(0, RowCache::words)],
            row_bytes,
            misses: Vec::new(),
            served: [0; 2],
        }
    }

    /// The first step: where the row's search starts.
    #[inline(always)]
    fn locate(&self, row: u64) -> Found<'a> {
        match (self.hot, self.cache) {
            (Some(h), _) => Found::Home(h.prefetch(row)),
            (None, Some(c)) => c.set(row).map_or(Found::Neither, Found::Set),
            (None, None) => Found::Neither,
        }
    }

    /// The next step from `found`; `ahead`: the lookup is still `FIND_AHEAD` away (a row the
    /// hot partition lacks then waits [`LATER`] lookups for its cache probe).
    #[inline(always)]
    fn search(&self, found: Found<'a>, row: u64, ahead: bool) -> Found<'a> {
        match found {
            Found::Home(home) => {
                let hot = self.hot.expect("a home in the hot partition");
                if let Some(bytes) = hot.get_prefetched(home, row) {
                    return Found::Hot(bytes);
                }
                match self.cache.and_then(|c| c.set(row)) {
                    Some(set) if ahead => Found::Set(set),
                    Some(set) => self.probe(set),
                    None => Found::Neither,
                }
            }
            Found::Set(set) => self.probe(set),
            found => found,
        }
    }

    #[inline(always)]
    fn probe(&self, set: Set) -> Found<'a> {
        match self.cache.and_then(|c| c.probe(set)) {
            Some(slot) => Found::Cache(slot),
            None => Found::Neither,
        }
    }

    /// A cache hit whose slot changed since it was found: the row searched again, once.
    #[cold]
    fn read_again(&mut self, row: u64) -> bool {
        let cache = self.cache.expect("found in the cache");
        cache
            .set(row)
            .and_then(|set| cache.probe(set))
            .is_some_and(|slot| cache.read(slot, row, &mut self.scratch))
    }
}

impl RowSource for TierSource<'_> {
    #[inline(always)]
    fn touch(&mut self, pos: usize, row: u64) {
        if self.hot.is_some() || self.cache.is_some() {
            self.ring[pos % RING] = (pos, self.locate(row));
        }
    }

    #[inline(always)]
    fn find(&mut self, pos: usize, row: u64) {
        let (at, found) = self.ring[pos % RING];
        if at == pos {
            self.ring[pos % RING].1 = self.search(found, row, true);
        }
        if self.hot.is_some()
            && let Some(earlier) = pos.checked_sub(LATER)
            && let (at, Found::Set(set)) = self.ring[earlier % RING]
            && at == earlier
        {
            self.ring[earlier % RING].1 = self.probe(set);
        }
    }

    #[inline(always)]
    fn row(&mut self, pos: usize, bag: usize, row: u64) -> Option<&[u8]> {
        if let Some((patch, at)) = &mut self.patch {
            // positions ascend, and so do the patch's: a cursor, no look-up per lookup
            while at.first().is_some_and(|&p| p < pos) {
                *at = &at[1..];
            }
            if at.first() == Some(&pos) {
                *at = &at[1..];
                // a position recorded for a row the patch lacks reads the tiers
                if let Some(bytes) = patch.get(row) {
                    return Some(bytes);
                }
            }
        }
        let (at, found) = self.ring[pos % RING];
        // a position touched ahead carries on from there; any other starts now
        let found = if at == pos { found } else { self.locate(row) };
        // not ahead, one search reaches the end: a home goes on to the cache's probe itself
        match self.search(found, row, false) {
            Found::Hot(bytes) => {
                self.served[0] += 1;
                return Some(bytes);
            }
            Found::Cache(slot) => {
                let cache = self.cache.expect("found in the cache");
                // a writer changed the slot since it was found: one more search, then the SSD
                if cache.read(slot, row, &mut self.scratch) || self.read_again(row) {
                    self.served[1] += 1;
                    return Some(&words_as_bytes(&self.scratch)[..self.row_bytes]);
                }
            }
            Found::Home(_) | Found::Set(_) | Found::Neither => {}
        }
        self.misses.push((row, pos, bag));
        None
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
