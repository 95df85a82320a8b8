use std::hint::black_box;
use std::time::Instant;

use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::Limit;

/// Streaming-read bandwidth: `threads` threads sum a `bytes`-byte buffer, `passes` times (best pass).
pub fn stream_read(bytes: usize, passes: usize, threads: usize) -> Limit {
    let words = vec![1u64; bytes / 8];
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
/// the pooling arithmetic), on `threads` threads; best of `passes`.
pub fn gather_rows(
    table_bytes: usize,
    row_bytes: usize,
    gathers: usize,
    passes: usize,
    threads: usize,
) -> Limit {
    let rows = (table_bytes / row_bytes).max(1);
    let table = vec![1u8; rows * row_bytes];
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
