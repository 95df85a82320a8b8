use std::hint::black_box;
use std::time::Instant;

use nearrec_format::AlignedBuf;
use nearrec_kernels::prefetch_row;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::Limit;

/// Streaming-read bandwidth: `threads` threads sum a `bytes`-byte buffer, `passes` times (best pass).
pub fn stream_read(bytes: usize, passes: usize, threads: usize) -> Limit {
    let mut buf = AlignedBuf::zeroed(bytes / 8 * 8);
    buf.as_mut_slice().fill(1);
    let words: &[u64] = bytemuck::cast_slice(buf.as_slice());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("threads");
    let mut best = f64::INFINITY;
    for _ in 0..passes.max(1) {
        let t = Instant::now();
        let s: u64 = pool.install(|| {
            words
                .par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u64, |a, &w| a.wrapping_add(w)))
                .sum()
        });
        black_box(s);
        best = best.min(t.elapsed().as_secs_f64());
    }
    let b = (words.len() * 8) as f64;
    Limit {
        bytes_per_s: b / best,
        items_per_s: words.len() as f64 / best,
        seconds: best,
    }
}

/// Random-gather limit: copy `gathers` uniformly random rows of `row_bytes` out of a
/// `table_bytes`-byte table into a dense buffer (the memory traffic of an embedding gather without
/// the pooling arithmetic), on `threads` threads; best of `passes`. Rows are prefetched 16 ahead
/// and the table is allocated as the engine allocates resident tables (huge-page backed where the
/// kernel allows), so the limit uses every trick the systems may use.
pub fn gather_rows(
    table_bytes: usize,
    row_bytes: usize,
    gathers: usize,
    passes: usize,
    threads: usize,
) -> Limit {
    let rows = (table_bytes / row_bytes).max(1);
    let mut buf = AlignedBuf::zeroed(rows * row_bytes);
    buf.as_mut_slice().fill(1);
    let table = buf.as_slice();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(42);
    let idx: Vec<u32> = (0..gathers)
        .map(|_| (rng.next_u64() % rows as u64) as u32)
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("threads");
    let chunk = 4096;
    let mut best = f64::INFINITY;
    for _ in 0..passes.max(1) {
        let t = Instant::now();
        pool.install(|| {
            idx.par_chunks(chunk).for_each_init(
                || vec![0u8; chunk * row_bytes],
                |dst, ix| {
                    for (k, &r) in ix.iter().enumerate() {
                        if let Some(&ahead) = ix.get(k + 16) {
                            prefetch_row(table[ahead as usize * row_bytes..].as_ptr(), row_bytes);
                        }
                        let at = r as usize * row_bytes;
                        dst[k * row_bytes..(k + 1) * row_bytes]
                            .copy_from_slice(&table[at..at + row_bytes]);
                    }
                    black_box(&dst[0]);
                },
            )
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    Limit {
        bytes_per_s: (gathers * row_bytes) as f64 / best,
        items_per_s: gathers as f64 / best,
        seconds: best,
    }
}
