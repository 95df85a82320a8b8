//! [`FlashDevice`]: the model as a [`BlockDevice`]. Bytes come from an inner device (memory or the
//! real table files), so everything read through it is real; time comes from the simulation, so
//! the engine above runs unchanged on a drive that does not exist.

use std::sync::Mutex;

use nearrec_io::{BlockDevice, ReadOp, Result, check_batch};
use serde::Serialize;

use crate::config::DeviceConfig;
use crate::ftl::{Ftl, PageAddr};
use crate::sim::{self, Command, Piece, Resource, Servers, Step};

/// What a [`FlashDevice`] has done, in simulated time.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FlashStats {
    /// `read_batch` calls.
    pub batches: u64,
    /// Host block commands (reads).
    pub commands: u64,
    /// Flash page reads (array reads).
    pub flash_reads: u64,
    /// Bytes moved over the channels.
    pub channel_bytes: u64,
    /// Bytes moved over the host link.
    pub link_bytes: u64,
    /// Simulated time the batches took, end to end, summed.
    pub busy_ns: u64,
    /// Simulated time of each batch, in call order.
    pub batch_ns: Vec<u64>,
    /// Real time spent in the inner device fetching the bytes (to take out of a measured
    /// wall time when predicting the drive's).
    pub inner_ns: u64,
    /// Real time the caller's completion callbacks took (pooling each row as it lands).
    pub callback_ns: u64,
    /// Simulated time of the batches with the callbacks run as their reads complete: each
    /// starts when its read finishes and the previous callback is done, as on a real drive,
    /// where that work overlaps the reads still in flight.
    pub served_ns: u64,
}

/// A simulated drive in front of real bytes.
///
/// Each `read_batch` is simulated from an idle drive: batches read one after another are timed
/// right, but two batches in flight at once (pipelined lookups on several rings) are each timed as
/// if alone, so their overlap is not charged.
#[derive(Debug)]
pub struct FlashDevice<D> {
    inner: D,
    config: DeviceConfig,
    ftl: Ftl,
    stats: Mutex<FlashStats>,
}

impl<D: BlockDevice> FlashDevice<D> {
    /// The drive `config` (already validated) holding `inner`'s files, laid out back to back.
    pub fn new(inner: D, config: DeviceConfig) -> Self {
        let ftl = Ftl::contiguous(inner.file_lens(), &config.flash);
        Self {
            inner,
            config,
            ftl,
            stats: Mutex::new(FlashStats::default()),
        }
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    pub fn stats(&self) -> FlashStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The block commands `ops` become, on the user-space I/O path the engine uses.
    fn commands(&self, ops: &[ReadOp]) -> Vec<Command> {
        ops.iter()
            .map(|op| {
                let pages = self.ftl.pages(op.file, op.offset, u64::from(op.len));
                block_command(
                    &self.config,
                    self.config.host.user_io_ns,
                    &pages,
                    u64::from(op.len),
                )
            })
            .collect()
    }
}

/// One block read of `len` bytes: `host_ns` on a host I/O thread (the kernel's path or a
/// user-space driver's), the firmware's command handling, one flash read per page touched (each
/// moving the bytes the controller drains from it), the DMA back.
pub(crate) fn block_command(
    cfg: &DeviceConfig,
    host_ns: u64,
    pages: &[(PageAddr, u64)],
    len: u64,
) -> Command {
    let f = &cfg.flash;
    let pieces = pages
        .iter()
        .map(|&(page, bytes)| {
            let moved = f.block_transfer_bytes(bytes);
            Piece {
                unit: page.unit,
                channel: page.channel,
                flush_ns: f.flush_ns(),
                transfer_ns: f.transfer_ns(moved),
                bytes: moved,
                after: None,
            }
        })
        .collect();
    Command {
        release_ns: 0,
        pre: vec![
            Step::new(Resource::Host, host_ns),
            Step::new(Resource::Controller, cfg.controller.command_ns),
        ],
        pieces,
        post: vec![Step::new(Resource::Link, cfg.host.dma_transfer_ns(len))],
    }
}

impl<D: BlockDevice> BlockDevice for FlashDevice<D> {
    fn kind(&self) -> &'static str {
        "flash-model"
    }

    fn direct(&self) -> bool {
        true
    }

    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    fn file_lens(&self) -> &[u64] {
        self.inner.file_lens()
    }

    fn read_batch(
        &self,
        ops: &[ReadOp],
        buf: &mut [u8],
        done: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        check_batch(ops, buf, self.block_size(), self.file_lens())?;
        let commands = self.commands(ops);
        let f = &self.config.flash;
        let servers = Servers {
            host: self.config.host.io_threads,
            controller: self.config.controller.cores,
            units: f.units(),
            channels: f.channels,
        };
        let outcome = sim::run(&commands, servers, self.config.host.queue_depth);
        // Bytes first (the inner device may complete in any order), then completions in the
        // order the simulated drive finishes them.
        let started = std::time::Instant::now();
        self.inner.read_batch(ops, buf, &mut |_, _| {})?;
        let inner_ns = started.elapsed().as_nanos() as u64;
        let mut order: Vec<usize> = (0..ops.len()).collect();
        order.sort_by_key(|&i| (outcome.finish_ns[i], i));
        let (mut served, mut callbacks) = (0u64, 0u64);
        for i in order {
            let op = &ops[i];
            let t = std::time::Instant::now();
            done(i, &buf[op.buf_at..op.buf_at + op.len as usize]);
            let cb = t.elapsed().as_nanos() as u64;
            callbacks += cb;
            served = served.max(outcome.finish_ns[i]) + cb;
        }
        let mut st = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        st.batches += 1;
        st.commands += ops.len() as u64;
        st.flash_reads += outcome.flash_reads;
        st.channel_bytes += outcome.channel_bytes;
        st.link_bytes += ops.iter().map(|op| u64::from(op.len)).sum::<u64>();
        st.busy_ns += outcome.end_ns;
        st.inner_ns += inner_ns;
        st.callback_ns += callbacks;
        st.served_ns += served.max(outcome.end_ns);
        st.batch_ns.push(outcome.end_ns);
        Ok(())
    }
}
