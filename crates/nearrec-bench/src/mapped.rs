//! RM-SSD's SSD-S baseline: the table files memory-mapped, rows faulted in through the page cache
//! (whose size the caller caps, e.g. with a memory cgroup), pooled on the host with the same
//! kernels as the DRAM tier. `random` advises `MADV_RANDOM` / `POSIX_FADV_RANDOM` so read-ahead
//! does not fetch neighbours no one asked for; without it the kernel's read-ahead applies. Row ids
//! of a co-located table go through its row order, as in the engine's SSD tier.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use memmap2::{Advice, Mmap};
use nearrec_format::{DATA_OFFSET, RowOrder, StoreReader, TableMeta};
use nearrec_kernels::{BagsOut, PoolJob, PoolingMode, TableView, pool_bags};
use rayon::prelude::*;

/// A store's tables, mapped.
#[derive(Debug)]
pub struct MappedStore {
    maps: Vec<Mmap>,
    metas: Vec<TableMeta>,
    orders: Vec<Option<Arc<RowOrder>>>,
}

/// One table's bags: `bounds` has `batch + 1` positions into `indices`.
#[derive(Debug, Clone, Copy)]
pub struct MappedBags<'a> {
    pub table: usize,
    pub indices: &'a [i64],
    pub bounds: &'a [usize],
}

impl MappedStore {
    pub fn open(store: &Path, random: bool) -> std::io::Result<Self> {
        let reader = StoreReader::open(store).map_err(std::io::Error::other)?;
        let metas = reader.tables().to_vec();
        let maps = metas
            .iter()
            .map(|m| {
                let file = File::open(store.join(&m.file))?;
                // SAFETY: store files are written once and renamed into place; the baseline only
                // reads them.
                let map = unsafe { Mmap::map(&file) }?;
                if random {
                    map.advise(Advice::Random)?;
                    // SAFETY: the descriptor is open; the call only sets a hint.
                    let rc = unsafe {
                        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM)
                    };
                    if rc != 0 {
                        return Err(std::io::Error::from_raw_os_error(rc));
                    }
                }
                Ok(map)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let orders = reader.orders().to_vec();
        Ok(Self {
            maps,
            metas,
            orders,
        })
    }

    pub fn tables(&self) -> &[TableMeta] {
        &self.metas
    }

    /// Sum-pools `requests` (tables in output order) into `[batch, Σ dim]`, tables in parallel.
    pub fn pool(&self, requests: &[MappedBags<'_>], batch: usize) -> std::io::Result<Vec<f32>> {
        let parts = requests
            .par_iter()
            .map(|r| {
                let m = self
                    .metas
                    .get(r.table)
                    .ok_or_else(|| std::io::Error::other("no such table"))?;
                if r.bounds.len() != batch + 1 {
                    return Err(std::io::Error::other(
                        "every table needs one bag per sample",
                    ));
                }
                let data = &self.maps[r.table][DATA_OFFSET as usize..];
                let view = TableView::new(data, m.layout(), m.dtype, m.dim)
                    .ok_or_else(|| std::io::Error::other("table file shorter than its layout"))?;
                let dim = m.dim as usize;
                let mut part = vec![0f32; batch * dim];
                let slots: Vec<i64>;
                let indices = match &self.orders[r.table] {
                    None => r.indices,
                    Some(order) => {
                        // out-of-range ids pass through unmapped, for the kernel to report
                        slots = (r.indices.iter())
                            .map(|&i| match u64::try_from(i) {
                                Ok(row) if row < order.rows() => order.slot(row) as i64,
                                _ => i,
                            })
                            .collect();
                        &slots
                    }
                };
                let job = PoolJob {
                    indices,
                    bounds: r.bounds,
                    weights: None,
                    mode: PoolingMode::Sum,
                    padding_idx: None,
                };
                pool_bags(
                    &view,
                    &job,
                    &mut BagsOut::from_slice(&mut part, dim, dim, batch),
                )
                .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
                Ok((dim, part))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let width: usize = parts.iter().map(|p| p.0).sum();
        let mut out = vec![0f32; batch * width];
        let mut col = 0;
        for (dim, part) in parts {
            for (b, row) in part.chunks_exact(dim).enumerate() {
                out[b * width + col..][..dim].copy_from_slice(row);
            }
            col += dim;
        }
        Ok(out)
    }
}
