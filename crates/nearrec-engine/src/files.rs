//! A store's table files as the SSD tier reads them: the block device (file `i` holds table
//! `i`), where a co-located table's rows sit, each table's sector checksums against which every
//! read is checked as it lands, the staging buffers reads land in, and the counters.
//!
//! Built whole before anything reads through it: the DRAM tiers load their hot rows through it
//! ([`TableFiles::read_raw`]), then the SSD tier takes it with them.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nearrec_format::{AlignedBuf, DATA_OFFSET, RowOrder, SECTOR_BYTES, SectorSums, TableMeta};
use nearrec_io::{BlockDevice, IoConfig, ReadOp, open_device};

use crate::config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::stats::IoStats;

/// The table files behind the SSD tier.
#[derive(Debug)]
pub(crate) struct TableFiles {
    device: Arc<dyn BlockDevice>,
    /// Per table: where a co-located table's rows sit (`None`: row `r` at slot `r`).
    orders: Vec<Option<Arc<RowOrder>>>,
    /// Per table: its sector checksums (`None`: unprotected — an older store, or
    /// `verify_reads` off).
    sums: Vec<Option<SectorSums>>,
    /// Staging buffers, reused across batches.
    buffers: Mutex<Vec<AlignedBuf>>,
    /// Shared with the files that replace these after a live store's compaction.
    pub(crate) stats: Arc<IoStats>,
}

impl TableFiles {
    /// The files at `paths` through the best device the machine offers.
    pub(crate) fn open(
        paths: &[PathBuf],
        config: &EngineConfig,
        orders: Vec<Option<Arc<RowOrder>>>,
        sums: Vec<Option<SectorSums>>,
    ) -> Result<Self> {
        let io = IoConfig::default()
            .with_direct(config.direct_io)
            .with_queue_depth(config.io_queue_depth)
            .with_rings(config.io_rings)
            .with_pread_threads(config.pread_threads);
        Ok(Self::new(open_device(paths, &io)?, orders, sums))
    }

    /// The files of `device`, whose file `i` holds table `i`, with each table's row order and
    /// sector checksums (index = table id).
    pub(crate) fn new(
        device: Box<dyn BlockDevice>,
        orders: Vec<Option<Arc<RowOrder>>>,
        sums: Vec<Option<SectorSums>>,
    ) -> Self {
        Self {
            device: Arc::from(device),
            orders,
            sums,
            buffers: Mutex::new(Vec::new()),
            stats: Arc::default(),
        }
    }

    /// These files' counters become `stats` (files that replace others keep counting there).
    pub(crate) fn with_stats(mut self, stats: Arc<IoStats>) -> Self {
        self.stats = stats;
        self
    }

    pub(crate) fn device(&self) -> &dyn BlockDevice {
        self.device.as_ref()
    }

    pub(crate) fn shared_device(&self) -> Arc<dyn BlockDevice> {
        self.device.clone()
    }

    /// Tables read without sector checks.
    pub(crate) fn unprotected(&self) -> usize {
        (0..self.device.file_lens().len())
            .filter(|&i| !matches!(self.sums.get(i), Some(Some(_))))
            .count()
    }

    /// Whether table `table` is stored in a co-located order.
    pub(crate) fn colocated(&self, table: usize) -> bool {
        matches!(self.orders.get(table), Some(Some(_)))
    }

    /// The slot of `row` of table `table`.
    pub(crate) fn slot(&self, table: usize, row: u64) -> u64 {
        match self.orders.get(table) {
            Some(Some(order)) => order.slot(row),
            _ => row,
        }
    }

    /// Checks read `op` of table `file` (its bytes `data`) against the table's sector sums:
    /// `Err(byte offset in the data region)` of the first sector that does not match.
    pub(crate) fn check(&self, op: &ReadOp, data: &[u8]) -> std::result::Result<(), u64> {
        match self.sums.get(op.file as usize) {
            Some(Some(sums)) => sums
                .check(op.offset - DATA_OFFSET, data)
                .map_err(|sector| sector * SECTOR_BYTES),
            _ => Ok(()),
        }
    }

    /// The error for a read of table `meta` whose sector at `at` (data-region offset) failed
    /// its checksum, naming `row` (a row the caller wanted from that sector; by default the
    /// first stored there), and counts it.
    pub(crate) fn corrupted(
        &self,
        id: usize,
        meta: &TableMeta,
        at: u64,
        row: Option<u64>,
    ) -> EngineError {
        IoStats::add(&self.stats.corrupt_reads, 1);
        let row = row.unwrap_or_else(|| {
            let layout = meta.layout();
            let span = at / layout.span_bytes();
            let slot = (span * layout.rows_per_span()
                + (at % layout.span_bytes()) / meta.row_bytes)
                .min(meta.rows.saturating_sub(1));
            match self.orders.get(id) {
                Some(Some(order)) => u64::from(order.rows_by_slot()[slot as usize]),
                _ => slot,
            }
        });
        EngineError::Corrupted {
            table: meta.name.clone(),
            row,
            reason: format!(
                "the 512-byte sector at byte {at} of its data region does not match its \
                 checksum (the disk returned damaged data; run `nearrec verify`)"
            ),
        }
    }

    /// A staging buffer of at least `bytes` bytes (reused when one is free); give it back with
    /// [`TableFiles::give_back`].
    pub(crate) fn buffer(&self, bytes: usize) -> AlignedBuf {
        let mut free = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        match free.iter().position(|b| b.len() >= bytes) {
            Some(i) => free.swap_remove(i),
            None => AlignedBuf::zeroed(bytes.max(1 << 20).next_power_of_two()),
        }
    }

    pub(crate) fn give_back(&self, buf: AlignedBuf) {
        self.buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(buf);
    }

    /// Reads rows `rows` (in range, any order) of table file `file` in their stored encoding into
    /// `out` (`rows.len() × row_bytes`), a few thousand reads at a time.
    pub(crate) fn read_raw(
        &self,
        file: usize,
        meta: &TableMeta,
        rows: &[u64],
        out: &mut [u8],
    ) -> Result<()> {
        let block = self.device.block_size() as u64;
        let (layout, rb) = (meta.layout(), meta.row_bytes as usize);
        for (c, chunk) in rows.chunks(4096).enumerate() {
            let mut reads = Vec::with_capacity(chunk.len());
            let mut at = 0usize;
            for &r in chunk {
                let start = DATA_OFFSET + layout.row_offset(self.slot(file, r));
                let lo = start / block * block;
                let len = ((start + rb as u64).div_ceil(block) * block - lo) as u32;
                reads.push(ReadOp {
                    file: file as u32,
                    offset: lo,
                    len,
                    buf_at: at,
                });
                at += len as usize;
            }
            let mut buf = self.buffer(at);
            let mut bad = None;
            let res =
                self.device
                    .read_batch(&reads, &mut buf.as_mut_slice()[..at], &mut |i, data| {
                        if let Err(sector) = self.check(&reads[i], data) {
                            bad.get_or_insert((sector, chunk[i]));
                            return;
                        }
                        let at = layout.row_offset(self.slot(file, chunk[i]));
                        let skip = (DATA_OFFSET + at - reads[i].offset) as usize;
                        out[(c * 4096 + i) * rb..][..rb].copy_from_slice(&data[skip..][..rb]);
                    });
            self.give_back(buf);
            res?;
            if let Some((at, row)) = bad {
                return Err(self.corrupted(file, meta, at, Some(row)));
            }
        }
        Ok(())
    }
}
