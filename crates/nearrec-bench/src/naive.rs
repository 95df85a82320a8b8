//! The naive SSD baseline (RM-SSD's C++ SLS): for every lookup, one synchronous `pread` with
//! `O_DIRECT` of the blocks holding the row, then pooling on the host. No de-duplication, no
//! merging, no queue beyond one read per thread.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use nearrec_format::{AlignedBuf, DATA_OFFSET, DType, StoreReader};
use rayon::prelude::*;

/// Sum-pools `indices[t]` (bags of `bag_size` consecutive indices; the same bag count for every
/// table) from the fp32 tables of the store at `store` on `threads` threads (bags split between
/// them); returns the `[batch, Σ dim]` output.
pub fn pread_sls(
    store: &Path,
    indices: &[&[i64]],
    bag_size: usize,
    threads: usize,
) -> std::io::Result<Vec<f32>> {
    let reader = StoreReader::open(store).map_err(std::io::Error::other)?;
    let metas = reader.tables();
    if indices.len() != metas.len() || bag_size == 0 {
        return Err(std::io::Error::other(
            "one index array per table, and bag_size > 0",
        ));
    }
    let files = metas
        .iter()
        .map(|m| {
            if m.dtype != DType::Fp32 {
                return Err(std::io::Error::other(
                    "the naive baseline reads fp32 tables only",
                ));
            }
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(store.join(&m.file))
        })
        .collect::<std::io::Result<Vec<File>>>()?;
    let batch = indices[0].len() / bag_size;
    let width: usize = metas.iter().map(|m| m.dim as usize).sum();
    let mut out = vec![0f32; batch * width];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .map_err(std::io::Error::other)?;
    let per_thread = batch.div_ceil(threads.max(1)).max(1);
    pool.install(|| {
        out.par_chunks_mut(per_thread * width)
            .enumerate()
            .try_for_each(|(c, chunk)| {
                let mut buf = AlignedBuf::zeroed(64 * 1024);
                for (k, row_out) in chunk.chunks_mut(width).enumerate() {
                    let b = c * per_thread + k;
                    let mut col = 0;
                    for (t, m) in metas.iter().enumerate() {
                        let (dim, layout) = (m.dim as usize, m.layout());
                        for &ix in &indices[t][b * bag_size..(b + 1) * bag_size] {
                            if ix < 0 || ix as u64 >= m.rows {
                                return Err(std::io::Error::other(format!(
                                    "index {ix} out of range for table {}",
                                    m.name
                                )));
                            }
                            let start = DATA_OFFSET + layout.row_offset(ix as u64);
                            let lo = start / 512 * 512;
                            let hi = (start + m.row_bytes).div_ceil(512) * 512;
                            let dst = &mut buf.as_mut_slice()[..(hi - lo) as usize];
                            files[t].read_exact_at(dst, lo)?;
                            let row = &dst[(start - lo) as usize..][..dim * 4];
                            for (o, v) in
                                row_out[col..col + dim].iter_mut().zip(row.chunks_exact(4))
                            {
                                *o += f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
                            }
                        }
                        col += dim;
                    }
                }
                Ok(())
            })
    })?;
    Ok(out)
}
