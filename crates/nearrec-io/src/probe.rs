use std::path::PathBuf;
use std::time::Instant;

use nearrec_format::AlignedBuf;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{Rng, SeedableRng};

use crate::device::ReadOp;
use crate::error::{IoError, Result};
use crate::open::{DeviceKind, IoConfig, open_device};

/// What one random-read probe measured: `reads` direct reads of `block` bytes in `seconds`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadRate {
    pub reads: usize,
    /// Bytes per read: the files' direct-I/O block.
    pub block: usize,
    pub seconds: f64,
}

impl ReadRate {
    pub fn reads_per_s(&self) -> f64 {
        self.reads as f64 / self.seconds
    }

    pub fn bytes_per_s(&self) -> f64 {
        (self.reads * self.block) as f64 / self.seconds
    }
}

/// The disk's random-read rate at `queue_depth`: `reads` uniformly random block-sized direct
/// reads over `paths` (each file in proportion to its size), submitted as one batch through
/// io_uring (what `fio --rw=randread --direct=1 --iodepth=QD --bs=<block>` measures). The flash
/// model is calibrated to it, and benchmarks compare against it. `seed` picks the blocks: a new
/// seed for each probe keeps a caching layer under the disk (a hypervisor's page cache) from
/// serving a repeat.
pub fn measure_read_rate(
    paths: &[PathBuf],
    reads: usize,
    queue_depth: u32,
    seed: u64,
) -> Result<ReadRate> {
    let probe = |reason: String| IoError::Probe { reason };
    if reads == 0 {
        return Err(probe("no reads asked for".into()));
    }
    let cfg = IoConfig::default()
        .with_kind(DeviceKind::Uring)
        .with_queue_depth(queue_depth);
    let dev = open_device(paths, &cfg)?;
    let block = dev.block_size();
    let b = block as u64;
    let lens = dev.file_lens().to_vec();
    let total_blocks: u64 = lens.iter().map(|l| l / b).sum();
    if total_blocks == 0 {
        return Err(probe(format!(
            "the {} file(s) hold no whole {block}-byte block",
            lens.len()
        )));
    }
    let bytes = reads
        .checked_mul(block)
        .ok_or_else(|| probe(format!("{reads} reads of {block} bytes overflow memory")))?;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let ops: Vec<ReadOp> = (0..reads)
        .map(|i| {
            let mut at = rng.next_u64() % total_blocks;
            let mut file = 0;
            while at >= lens[file] / b {
                at -= lens[file] / b;
                file += 1;
            }
            ReadOp {
                file: file as u32,
                offset: at * b,
                len: block as u32,
                buf_at: i * block,
            }
        })
        .collect();
    let mut buf = AlignedBuf::try_zeroed(bytes)
        .ok_or_else(|| probe(format!("no memory for {reads} reads of {block} bytes")))?;
    // fault the buffer in before the clock starts (a fresh mapping's pages, huge ones when memory
    // is fragmented, can take longer to fault in than the reads take)
    buf.as_mut_slice().fill(1);
    let t = Instant::now();
    dev.read_batch(&ops, buf.as_mut_slice(), &mut |_, _| {})?;
    Ok(ReadRate {
        reads,
        block,
        seconds: t.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file_of(dir: &std::path::Path, name: &str, bytes: usize) -> PathBuf {
        let path = dir.join(name);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![7u8; bytes]).unwrap();
        f.sync_all().unwrap();
        path
    }

    #[test]
    fn measures_every_read_over_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let paths = [
            file_of(dir.path(), "a", 64 << 12),
            file_of(dir.path(), "b", 16 << 12),
        ];
        let r = measure_read_rate(&paths, 300, 8, 3).unwrap();
        assert_eq!(r.reads, 300);
        assert!(r.block >= 512 && r.block.is_power_of_two());
        assert!(r.seconds > 0.0 && r.reads_per_s() > 0.0);
        assert_eq!(r.bytes_per_s(), r.reads_per_s() * r.block as f64);
    }

    #[test]
    fn refuses_what_it_cannot_measure() {
        let dir = tempfile::tempdir().unwrap();
        let small = [file_of(dir.path(), "small", 100)];
        let e = measure_read_rate(&small, 10, 1, 0).unwrap_err();
        assert!(matches!(e, IoError::Probe { .. }), "{e}");
        assert!(e.to_string().contains("no whole"), "{e}");
        let big = [file_of(dir.path(), "big", 8 << 12)];
        let e = measure_read_rate(&big, 0, 1, 0).unwrap_err();
        assert!(matches!(e, IoError::Probe { .. }), "{e}");
        let e = measure_read_rate(&[dir.path().join("missing")], 10, 1, 0).unwrap_err();
        assert!(matches!(e, IoError::Open { .. }), "{e}");
    }
}
