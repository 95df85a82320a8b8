use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

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

/// The device's random-read limit at `queue_depth` (`nearrec_io::measure_read_rate`: `reads`
/// uniformly random block-sized direct reads over `paths`, one io_uring batch, blocks picked by
/// `seed`). `items_per_s` is reads/s.
pub fn random_read(
    paths: &[PathBuf],
    reads: usize,
    queue_depth: u32,
    seed: u64,
) -> Result<Limit, nearrec_io::IoError> {
    let r = nearrec_io::measure_read_rate(paths, reads, queue_depth, seed)?;
    Ok(Limit {
        bytes_per_s: r.bytes_per_s(),
        items_per_s: r.reads_per_s(),
        seconds: r.seconds,
    })
}
