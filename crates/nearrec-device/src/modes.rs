//! The papers' designs, run on the flash model: the same batches, timed as each would serve them.
//!
//! | mode | where rows are pooled | flash reads | host path |
//! |---|---|---|---|
//! | SSD-S | host | a page per page-cache miss (4 KiB, kernel file path, synchronous) | kernel, page cache in `host.dram_bytes` |
//! | EMB-MMIO | host | a page per lookup, all in flight | user space, pages loaded over MMIO |
//! | EMB-PageSum | device (FPGA) | a page per lookup, all in flight | one command per batch |
//! | EMB-VectorSum | device (FPGA) | one vector per lookup (`T_flush + EV/P · T_trans`) | one command per batch |
//! | RM-SSD | device, MLPs too | as EMB-VectorSum | CTRs back over MMIO; MLPs by [`MlpEngine`] |
//! | RecSSD | device (FTL cores) + host hot rows | a page per distinct page not in the direct-mapped SSD cache | one NDP command pair per table |
//! | EMB-SSD | device (ARM, SIMD) | distinct pages (I/O merging), selective per-table caching | one vectored command per batch |

use std::num::NonZeroUsize;

use lru::LruCache;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};

use crate::config::DeviceConfig;
use crate::error::{DeviceError, Result};
use crate::flash::block_command;
use crate::ftl::{Ftl, PageAddr};
use crate::mlp::MlpEngine;
use crate::sim::{self, Command, Piece, Resource, Servers, Step};
use crate::workload::{TableBatch, Workload, check_batch};

/// The operating-system page the kernel file path reads and caches.
const OS_PAGE: u64 = 4096;

/// A design to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Mode {
    SsdS,
    EmbMmio,
    #[serde(rename = "emb-pagesum")]
    EmbPageSum,
    #[serde(rename = "emb-vectorsum")]
    EmbVectorSum,
    #[serde(rename = "recssd")]
    RecSsd,
    RmSsd,
    /// EMB-SSD, with its two techniques switchable (its Fig. 9 compares them).
    EmbSsd {
        merging: bool,
        caching: bool,
    },
}

impl Mode {
    /// Every design, EMB-SSD with both techniques on.
    pub const ALL: [Mode; 7] = [
        Mode::SsdS,
        Mode::EmbMmio,
        Mode::EmbPageSum,
        Mode::EmbVectorSum,
        Mode::RecSsd,
        Mode::RmSsd,
        Mode::EmbSsd {
            merging: true,
            caching: true,
        },
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Mode::SsdS => "ssd-s",
            Mode::EmbMmio => "emb-mmio",
            Mode::EmbPageSum => "emb-pagesum",
            Mode::EmbVectorSum => "emb-vectorsum",
            Mode::RecSsd => "recssd",
            Mode::RmSsd => "rm-ssd",
            Mode::EmbSsd {
                merging: true,
                caching: true,
            } => "emb-ssd",
            Mode::EmbSsd {
                merging: true,
                caching: false,
            } => "emb-ssd:merge",
            Mode::EmbSsd {
                merging: false,
                caching: true,
            } => "emb-ssd:cache",
            Mode::EmbSsd {
                merging: false,
                caching: false,
            } => "emb-ssd:base",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        let all = Mode::ALL.into_iter().chain([
            Mode::EmbSsd {
                merging: true,
                caching: false,
            },
            Mode::EmbSsd {
                merging: false,
                caching: true,
            },
            Mode::EmbSsd {
                merging: false,
                caching: false,
            },
        ]);
        let names: Vec<_> = all.clone().map(|m| m.name()).collect();
        all.into_iter().find(|m| m.name() == s).ok_or_else(|| {
            DeviceError::Config(format!(
                "unknown mode {s:?}: expected one of {}",
                names.join(", ")
            ))
        })
    }
}

/// One batch through one design, in simulated time.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BatchReport {
    pub samples: usize,
    pub lookups: u64,
    /// From the batch's arrival to its last result (pooled vectors, or CTRs), ns.
    pub latency_ns: f64,
    /// Time between batches in steady state: the latency, or for RM-SSD's pipelined engine its
    /// slowest stage, ns.
    pub period_ns: f64,
    pub embed_ns: f64,
    pub mlp_ns: f64,
    pub flash_reads: u64,
    pub channel_bytes: u64,
    /// Bytes over the host link, both ways.
    pub link_bytes: u64,
    /// Of those, bytes read back by the host (RM-SSD's Table IV counts these).
    pub link_read_bytes: u64,
    /// Commands the host issued.
    pub host_ios: u64,
    /// Rows served from host DRAM (page cache, hot partition).
    pub host_hits: u64,
    /// Rows served from controller DRAM.
    pub device_hits: u64,
    /// Bytes of the rows looked up (what a byte-addressable device would read).
    pub useful_bytes: u64,
}

impl BatchReport {
    /// Counts `sent` bytes to the drive and `read` bytes back over the link.
    fn link(&mut self, sent: u64, read: u64) {
        self.link_bytes += sent + read;
        self.link_read_bytes += read;
    }
}

/// One design on one drive, with the caches it keeps between batches.
#[derive(Debug)]
pub struct Simulator {
    config: DeviceConfig,
    workload: Workload,
    mode: Mode,
    ftl: Ftl,
    servers: Servers,
    /// SSD-S: the page cache, (table, OS page).
    page_cache: Option<LruCache<(u32, u64), ()>>,
    /// RecSSD: the host's static hot partition per table.
    hot: Vec<FxHashSet<u64>>,
    /// RecSSD: the SSD-side direct-mapped cache, keys + 1 (0 = empty).
    direct: Vec<u64>,
    /// EMB-SSD: per table, an LRU when the table is selected for caching.
    selective: Vec<Option<LruCache<u64, ()>>>,
    mlp: Option<MlpEngine>,
}

fn lru<K: std::hash::Hash + Eq, V>(n: u64) -> Option<LruCache<K, V>> {
    NonZeroUsize::new(n as usize).map(LruCache::new)
}

impl Simulator {
    pub fn new(config: DeviceConfig, workload: Workload, mode: Mode) -> Result<Self> {
        config.validate()?;
        workload.validate()?;
        let page = u64::from(config.flash.page_bytes);
        let ftl = Ftl::contiguous(&workload.file_lens(page), &config.flash);
        let servers = Servers {
            host: config.host.io_threads,
            controller: config.controller.cores,
            units: config.flash.units(),
            channels: config.flash.channels,
        };
        let n = workload.tables.len();
        let max_row = workload
            .tables
            .iter()
            .map(|t| u64::from(t.row_bytes))
            .max()
            .unwrap_or(1);
        let page_cache = match mode {
            Mode::SsdS => lru(config.host.dram_bytes / OS_PAGE),
            _ => None,
        };
        let direct = match mode {
            Mode::RecSsd => vec![0; (config.controller.dram_cache_bytes / max_row) as usize],
            _ => Vec::new(),
        };
        Ok(Self {
            config,
            workload,
            mode,
            ftl,
            servers,
            page_cache,
            hot: vec![FxHashSet::default(); n],
            direct,
            selective: (0..n).map(|_| None).collect(),
            mlp: None,
        })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// RM-SSD's MLP engine, once planned (at [`Simulator::warm`] or the first batch).
    pub fn mlp_engine(&self) -> Option<&MlpEngine> {
        self.mlp.as_ref()
    }

    /// Profiles warm-up batches: RecSSD's static partition (the most frequent rows, host DRAM
    /// split evenly over tables), EMB-SSD's choice of tables to cache (reused rows, small working
    /// sets first, within controller DRAM); and runs them through the LRU caches.
    pub fn warm(&mut self, batches: &[Vec<TableBatch<'_>>]) -> Result<()> {
        let n = self.workload.tables.len();
        let mut counts: Vec<FxHashMap<u64, u64>> = vec![FxHashMap::default(); n];
        let mut samples = 0;
        let mut lookups = 0;
        for batch in batches {
            samples += check_batch(&self.workload, batch)?;
            for (t, b) in batch.iter().enumerate() {
                lookups += b.indices.len();
                for &r in b.indices {
                    *counts[t].entry(r as u64).or_default() += 1;
                }
            }
        }
        if samples > 0 && self.mode == Mode::RmSsd {
            self.plan_mlp(lookups as f64 / samples as f64);
        }
        match self.mode {
            Mode::RecSsd => {
                let share = self.config.host.dram_bytes / n as u64;
                for (t, c) in counts.iter().enumerate() {
                    let cap = (share / u64::from(self.workload.tables[t].row_bytes)) as usize;
                    let mut by: Vec<(u64, u64)> = c.iter().map(|(&r, &k)| (k, r)).collect();
                    by.sort_unstable_by(|a, b| b.cmp(a));
                    self.hot[t] = by.into_iter().take(cap).map(|(_, r)| r).collect();
                }
            }
            Mode::EmbSsd { caching: true, .. } => {
                let mut left = self.config.controller.dram_cache_bytes;
                let mut order: Vec<usize> = (0..n).filter(|&t| !counts[t].is_empty()).collect();
                let reuse =
                    |t: usize| counts[t].values().sum::<u64>() as f64 / counts[t].len() as f64;
                order.sort_by(|&a, &b| reuse(b).total_cmp(&reuse(a)));
                for t in order {
                    let set = counts[t].len() as u64 * u64::from(self.workload.tables[t].row_bytes);
                    if reuse(t) >= 2.0 && set <= left {
                        left -= set;
                        self.selective[t] = lru(counts[t].len() as u64);
                    }
                }
            }
            _ => {}
        }
        for batch in batches {
            self.touch_caches(batch);
        }
        Ok(())
    }

    fn plan_mlp(&mut self, lookups_per_sample: f64) {
        let f = &self.config.flash;
        let dim_bytes = self
            .workload
            .tables
            .iter()
            .map(|t| u64::from(t.row_bytes))
            .sum::<u64>()
            / self.workload.tables.len() as u64;
        let t_ev = (f.flush_ns() + f.transfer_ns(dim_bytes)) as f64;
        let per_row = (t_ev / f64::from(f.units()))
            .max(f.transfer_ns(dim_bytes) as f64 / f64::from(f.channels));
        self.mlp = Some(MlpEngine::plan(
            &self.workload.bottom,
            &self.workload.top,
            self.workload.pooled_width(),
            lookups_per_sample * per_row,
            &self.config.controller.fpga,
        ));
    }

    /// Brings the LRU caches up to date with a batch without timing it.
    fn touch_caches(&mut self, batch: &[TableBatch<'_>]) {
        let page = u64::from(self.config.flash.page_bytes);
        for (t, b) in batch.iter().enumerate() {
            for &r in b.indices {
                let r = r as u64;
                if let Some(pc) = self.page_cache.as_mut() {
                    let off = self.workload.row_offset(t, r, page);
                    pc.put((t as u32, off / OS_PAGE), ());
                }
                if let Some(c) = self.selective[t].as_mut() {
                    c.put(r, ());
                }
                if !self.direct.is_empty() {
                    let (slot, key) = self.direct_slot(t, r);
                    self.direct[slot] = key;
                }
            }
        }
    }

    /// The slot of (table, row) in the direct-mapped cache, which must have slots.
    fn direct_slot(&self, t: usize, r: u64) -> (usize, u64) {
        let key = ((t as u64) << 40 | r) + 1;
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17;
        ((h % self.direct.len() as u64) as usize, key)
    }

    fn page_of(&self, t: usize, r: u64) -> PageAddr {
        let page = u64::from(self.config.flash.page_bytes);
        let lba = self
            .ftl
            .lba_byte(t as u32, self.workload.row_offset(t, r, page));
        self.ftl.page_of(lba)
    }

    fn piece(&self, page: PageAddr, transfer_bytes: u64, after: Option<Step>) -> Piece {
        let f = &self.config.flash;
        Piece {
            unit: page.unit,
            channel: page.channel,
            flush_ns: f.flush_ns(),
            transfer_ns: f.transfer_ns(transfer_bytes),
            bytes: transfer_bytes,
            after,
        }
    }

    /// Host pooling of `rows` rows of `dim` floats.
    fn host_pool_ns(&self, rows: u64, dim: u32) -> f64 {
        let h = &self.config.host;
        rows as f64 * (h.pool_row_ns + f64::from(dim) * h.pool_elem_ns)
    }

    /// Host pooling of every lookup of a batch, split over the host's I/O threads.
    fn host_pool_batch_ns(&self, batch: &[TableBatch<'_>]) -> f64 {
        let rows = |t: usize, b: &TableBatch<'_>| {
            self.host_pool_ns(b.indices.len() as u64, self.workload.tables[t].dim)
        };
        let total: f64 = batch.iter().enumerate().map(|(t, b)| rows(t, b)).sum();
        total / f64::from(self.config.host.io_threads)
    }

    /// Controller accumulation of `rows` rows of `dim` floats, `lanes` at a time.
    fn ctrl_pool_ns(&self, rows: u64, dim: u32, lanes: u32) -> u64 {
        let c = &self.config.controller;
        (rows as f64 * (c.row_ns as f64 + f64::from(dim) * c.elem_ns / f64::from(lanes))) as u64
    }

    /// Host MLPs for a batch: the slower of the arithmetic and streaming the weights once, plus
    /// the per-layer dispatch.
    fn host_mlp_ns(&self, samples: usize) -> f64 {
        let h = &self.config.host;
        let flops = 2.0 * samples as f64 * self.workload.mlp_macs() as f64 / h.mlp_gflops;
        let weights = self.workload.mlp_weight_bytes() as f64 / h.mlp_weight_gb_s;
        flops.max(weights) + (self.workload.mlp_layers() as u64 * h.mlp_layer_ns) as f64
    }

    /// Runs one batch.
    pub fn run_batch(&mut self, batch: &[TableBatch<'_>]) -> Result<BatchReport> {
        let samples = check_batch(&self.workload, batch)?;
        if self.mode == Mode::RmSsd && self.mlp.is_none() {
            let lookups: usize = batch.iter().map(|b| b.indices.len()).sum();
            self.plan_mlp(lookups as f64 / samples.max(1) as f64);
        }
        let mut rep = BatchReport {
            samples,
            ..BatchReport::default()
        };
        for (t, b) in batch.iter().enumerate() {
            rep.lookups += b.indices.len() as u64;
            rep.useful_bytes +=
                b.indices.len() as u64 * u64::from(self.workload.tables[t].row_bytes);
        }
        let (commands, qd, host_ns) = match self.mode {
            Mode::SsdS => self.ssd_s(batch, &mut rep),
            Mode::EmbMmio => self.emb_mmio(batch, &mut rep),
            Mode::EmbPageSum | Mode::EmbVectorSum | Mode::RmSsd => self.ev_engine(batch, &mut rep),
            Mode::RecSsd => self.recssd(batch, &mut rep),
            Mode::EmbSsd { merging, caching } => self.emb_ssd(batch, merging, caching, &mut rep),
        };
        let out = sim::run(&commands, self.servers, qd);
        rep.flash_reads = out.flash_reads;
        rep.channel_bytes = out.channel_bytes;
        rep.embed_ns = out.end_ns as f64 + host_ns;
        if self.mode == Mode::RmSsd {
            let eng = self.mlp.as_ref().expect("planned above");
            let emb = rep.embed_ns.max(eng.emb_layer_ns(samples));
            let (bot, top) = (eng.bottom_ns(samples), eng.top_ns(samples));
            rep.mlp_ns = bot + top;
            rep.latency_ns = emb.max(bot) + top + self.config.host.mmio_transfer_ns(64) as f64;
            rep.period_ns = emb.max(bot).max(top);
        } else {
            rep.mlp_ns = self.host_mlp_ns(samples);
            rep.latency_ns = rep.embed_ns + rep.mlp_ns;
            rep.period_ns = rep.latency_ns;
        }
        Ok(rep)
    }

    /// SSD-S: every lookup through the kernel's file path; misses read a 4 KiB page synchronously.
    fn ssd_s(
        &mut self,
        batch: &[TableBatch<'_>],
        rep: &mut BatchReport,
    ) -> (Vec<Command>, u32, f64) {
        let h = &self.config.host;
        let page = u64::from(self.config.flash.page_bytes);
        let mut cmds = Vec::new();
        for (t, b) in batch.iter().enumerate() {
            for &r in b.indices {
                let off = self.workload.row_offset(t, r as u64, page);
                let key = (t as u32, off / OS_PAGE);
                let hit = self
                    .page_cache
                    .as_mut()
                    .is_some_and(|pc| pc.get(&key).is_some());
                if hit {
                    rep.host_hits += 1;
                    cmds.push(Command {
                        pre: vec![Step::new(Resource::Host, h.page_cache_hit_ns)],
                        ..Command::default()
                    });
                    continue;
                }
                if let Some(pc) = self.page_cache.as_mut() {
                    pc.put(key, ());
                }
                let pages = self.ftl.pages(t as u32, key.1 * OS_PAGE, OS_PAGE);
                rep.host_ios += 1;
                rep.link(0, OS_PAGE);
                cmds.push(block_command(&self.config, h.kernel_io_ns, &pages, OS_PAGE));
            }
        }
        (cmds, h.io_threads, self.host_pool_batch_ns(batch))
    }

    /// EMB-MMIO: every lookup's page read (all in flight across the channels) and loaded into
    /// user space over MMIO, one page after another, then pooled on the host.
    fn emb_mmio(
        &mut self,
        batch: &[TableBatch<'_>],
        rep: &mut BatchReport,
    ) -> (Vec<Command>, u32, f64) {
        let h = &self.config.host;
        let page = u64::from(self.config.flash.page_bytes);
        let mut cmds = Vec::new();
        for (t, b) in batch.iter().enumerate() {
            for &r in b.indices {
                let p = self.page_of(t, r as u64);
                rep.host_ios += 1;
                rep.link(0, page);
                cmds.push(Command {
                    release_ns: 0,
                    pre: vec![Step::new(Resource::Host, h.mmio_ns)],
                    pieces: vec![self.piece(p, page, None)],
                    post: vec![Step::new(Resource::Link, h.mmio_transfer_ns(page))],
                });
            }
        }
        (cmds, h.queue_depth, self.host_pool_batch_ns(batch))
    }

    /// The indices of a batch sent to the drive by DMA (8-byte rows, 8-byte offsets).
    fn indices_bytes(batch: &[TableBatch<'_>]) -> u64 {
        batch
            .iter()
            .map(|b| 8 * (b.indices.len() + b.offsets.len()) as u64)
            .sum()
    }

    /// EMB-PageSum, EMB-VectorSum, RM-SSD: one command carries the batch; the EV translator
    /// issues a flash read per lookup; the FPGA sums as reads land.
    fn ev_engine(
        &mut self,
        batch: &[TableBatch<'_>],
        rep: &mut BatchReport,
    ) -> (Vec<Command>, u32, f64) {
        let (h, fpga) = (&self.config.host, &self.config.controller.fpga);
        let page = u64::from(self.config.flash.page_bytes);
        let vector = self.mode != Mode::EmbPageSum;
        let lookups: u64 = batch.iter().map(|b| b.indices.len() as u64).sum();
        let samples = batch[0].bags() as u64;
        let mut pieces = Vec::with_capacity(lookups as usize);
        for (t, b) in batch.iter().enumerate() {
            let rb = u64::from(self.workload.tables[t].row_bytes);
            for &r in b.indices {
                let p = self.page_of(t, r as u64);
                pieces.push(self.piece(p, if vector { rb } else { page }, None));
            }
        }
        let mut dense_in = 0;
        let result = if self.mode == Mode::RmSsd {
            dense_in = 4 * samples * self.workload.bottom.first().copied().unwrap_or(0) as u64;
            (4 * samples).max(64)
        } else {
            4 * samples * self.workload.pooled_width() as u64
        };
        let sent = Self::indices_bytes(batch) + dense_in;
        rep.host_ios += 1;
        rep.link(sent, result);
        let translate = fpga.cycles_ns((lookups * u64::from(fpga.translate_cycles)) as f64) as u64;
        let back = if self.mode == Mode::RmSsd {
            Step::new(Resource::Link, h.mmio_transfer_ns(result))
        } else {
            Step::new(Resource::Link, h.dma_transfer_ns(result))
        };
        let cmd = Command {
            release_ns: 0,
            pre: vec![
                Step::new(Resource::Host, h.mmio_ns * 2),
                Step::new(Resource::Link, h.dma_transfer_ns(sent)),
                Step::new(Resource::Delay, translate),
            ],
            pieces,
            post: vec![back],
        };
        (vec![cmd], 1, 0.0)
    }

    /// RecSSD: hot rows pooled on the host; the rest sent to the FTL as one configuration write and
    /// one result read per table; the FTL reads each distinct page once (unless the SSD-side
    /// direct-mapped cache holds the row), extracting and accumulating rows on its core.
    fn recssd(
        &mut self,
        batch: &[TableBatch<'_>],
        rep: &mut BatchReport,
    ) -> (Vec<Command>, u32, f64) {
        let page = u64::from(self.config.flash.page_bytes);
        let mut cmds = Vec::new();
        let mut host = 0.0;
        for (t, b) in batch.iter().enumerate() {
            let dim = self.workload.tables[t].dim;
            let mut cold: Vec<u64> = Vec::new();
            for &r in b.indices {
                if self.hot[t].contains(&(r as u64)) {
                    rep.host_hits += 1;
                } else {
                    cold.push(r as u64);
                }
            }
            host += self.host_pool_ns(b.indices.len() as u64 - cold.len() as u64, dim);
            // The host adds the device's partial sums into its own.
            host += self.host_pool_ns(b.bags() as u64, dim);
            let mut pages: FxHashMap<u64, (PageAddr, u64)> = FxHashMap::default();
            let mut hits = 0u64;
            for &r in &cold {
                if !self.direct.is_empty() {
                    let (slot, key) = self.direct_slot(t, r);
                    if self.direct[slot] == key {
                        hits += 1;
                        continue;
                    }
                    self.direct[slot] = key;
                }
                let p = self.page_of(t, r);
                pages.entry(p.lpn).or_insert((p, 0)).1 += 1;
            }
            rep.device_hits += hits;
            let c = &self.config.controller;
            let mut ps: Vec<_> = pages.into_values().collect();
            ps.sort_unstable_by_key(|(p, _)| p.lpn);
            let pieces = ps
                .into_iter()
                .map(|(p, rows)| {
                    let work = c.page_issue_ns + self.ctrl_pool_ns(rows, dim, 1);
                    self.piece(p, page, Some(Step::new(Resource::Controller, work)))
                })
                .collect();
            let h = &self.config.host;
            let config_bytes = 8 * cold.len() as u64;
            let result = 4 * b.bags() as u64 * u64::from(dim);
            rep.host_ios += 2;
            rep.link(config_bytes, result);
            cmds.push(Command {
                release_ns: 0,
                pre: vec![
                    Step::new(Resource::Host, h.user_io_ns),
                    Step::new(Resource::Link, h.dma_transfer_ns(config_bytes)),
                    Step::new(
                        Resource::Controller,
                        c.command_ns + cold.len() as u64 * c.pair_ns,
                    ),
                ],
                pieces,
                post: vec![
                    Step::new(
                        Resource::Controller,
                        self.ctrl_pool_ns(hits, dim, 1) + c.command_ns,
                    ),
                    Step::new(Resource::Host, h.user_io_ns),
                    Step::new(Resource::Link, h.dma_transfer_ns(result)),
                ],
            });
        }
        (cmds, self.config.host.queue_depth, host)
    }

    /// EMB-SSD: one vectored EMB_READ for the batch; rows of selected tables from controller DRAM;
    /// the rest read per NAND page once (I/O merging) or per lookup; pooled with NEON.
    fn emb_ssd(
        &mut self,
        batch: &[TableBatch<'_>],
        merging: bool,
        caching: bool,
        rep: &mut BatchReport,
    ) -> (Vec<Command>, u32, f64) {
        let page = u64::from(self.config.flash.page_bytes);
        let lanes = self.config.controller.simd_lanes;
        let mut reads: Vec<(PageAddr, u64, u32)> = Vec::new();
        let mut merged: FxHashMap<u64, usize> = FxHashMap::default();
        let mut hit_ns = 0;
        for (t, b) in batch.iter().enumerate() {
            let dim = self.workload.tables[t].dim;
            for &r in b.indices {
                let r = r as u64;
                if caching && let Some(c) = self.selective[t].as_mut() {
                    if c.get(&r).is_some() {
                        rep.device_hits += 1;
                        hit_ns += self.ctrl_pool_ns(1, dim, lanes);
                        continue;
                    }
                    c.put(r, ());
                }
                let p = self.page_of(t, r);
                match merged.get(&p.lpn) {
                    Some(&i) if merging => reads[i].1 += 1,
                    _ => {
                        merged.insert(p.lpn, reads.len());
                        reads.push((p, 1, dim));
                    }
                }
            }
        }
        let c = &self.config.controller;
        let pieces = reads
            .iter()
            .map(|&(p, rows, dim)| {
                let work = c.page_issue_ns + self.ctrl_pool_ns(rows, dim, lanes);
                self.piece(p, page, Some(Step::new(Resource::Controller, work)))
            })
            .collect();
        let h = &self.config.host;
        let sent = Self::indices_bytes(batch);
        let result = 4 * batch[0].bags() as u64 * self.workload.pooled_width() as u64;
        rep.host_ios += 1;
        rep.link(sent, result);
        let cmd = Command {
            release_ns: 0,
            pre: vec![
                Step::new(Resource::Host, h.user_io_ns),
                Step::new(Resource::Link, h.dma_transfer_ns(sent)),
                Step::new(Resource::Controller, c.command_ns),
            ],
            pieces,
            post: vec![
                Step::new(Resource::Controller, hit_ns),
                Step::new(Resource::Link, h.dma_transfer_ns(result)),
                Step::new(Resource::Host, h.user_io_ns),
            ],
        };
        (vec![cmd], 1, 0.0)
    }
}
