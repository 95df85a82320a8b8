use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nearrec_format::AlignedBuf;
use nearrec_io::{DeviceKind, IoConfig, ReadOp, open_device};
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{Rng, SeedableRng};

use crate::Limit;

/// Sequential-write bandwidth of the disk under `dir`: write `bytes` in 16 MiB buffered writes,
/// then fsync, timed together (what `dd bs=16M conv=fsync` measures, and the same path the store
/// writer takes). The file is removed afterwards.
pub fn sequential_write(dir: &Path, bytes: u64) -> std::io::Result<Limit> {
    const CHUNK: usize = 16 << 20;
    let path = dir.join(format!(".nearrec-seqwrite-{}", std::process::id()));
    let buf: Vec<u8> = (0..CHUNK).map(|i| (i * 31 % 251) as u8).collect();
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let t = Instant::now();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        f.sync_all()?;
        let s = t.elapsed().as_secs_f64();
        Ok(Limit {
            bytes_per_s: bytes as f64 / s,
            items_per_s: bytes as f64 / CHUNK as f64 / s,
            seconds: s,
        })
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// The device's random-read limit at `queue_depth`: `reads` uniformly random block-sized direct
/// reads over `paths` (each file in proportion to its size), submitted as one batch through
/// io_uring (what `fio --rw=randread --direct=1 --iodepth=QD --bs=<block>` measures). `items_per_s`
/// is reads/s. `seed` picks the blocks: a new seed for each probe keeps a caching layer under the
/// disk (a hypervisor's page cache) from serving a repeat.
pub fn random_read(
    paths: &[PathBuf],
    reads: usize,
    queue_depth: u32,
    seed: u64,
) -> Result<Limit, nearrec_io::IoError> {
    let cfg = IoConfig::default()
        .with_kind(DeviceKind::Uring)
        .with_queue_depth(queue_depth);
    let dev = open_device(paths, &cfg)?;
    let block = dev.block_size() as u64;
    let lens = dev.file_lens().to_vec();
    let total_blocks: u64 = lens.iter().map(|l| l / block).sum();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let ops: Vec<ReadOp> = (0..reads)
        .map(|i| {
            let mut b = rng.next_u64() % total_blocks.max(1);
            let mut file = 0;
            while b >= lens[file] / block {
                b -= lens[file] / block;
                file += 1;
            }
            ReadOp {
                file: file as u32,
                offset: b * block,
                len: block as u32,
                buf_at: i * block as usize,
            }
        })
        .collect();
    let mut buf = AlignedBuf::zeroed(reads * block as usize);
    // fault the buffer in before the clock starts (a fresh mapping's pages, huge ones when memory
    // is fragmented, can take longer to fault in than the reads take)
    buf.as_mut_slice().fill(1);
    let t = Instant::now();
    dev.read_batch(&ops, buf.as_mut_slice(), &mut |_, _| {})?;
    let s = t.elapsed().as_secs_f64();
    Ok(Limit {
        bytes_per_s: (reads as u64 * block) as f64 / s,
        items_per_s: reads as f64 / s,
        seconds: s,
    })
}
