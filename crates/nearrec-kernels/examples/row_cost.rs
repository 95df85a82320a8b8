//! Nanoseconds a row for pooling from a table that sits in the caches (4,096 rows, one thread),
//! by dtype and width: what the decode costs once memory does not bind.
//!
//! `cargo run --release -p nearrec-kernels --example row_cost`

use std::hint::black_box;
use std::time::Instant;

use nearrec_format::{AlignedBuf, DType, RowLayout};
use nearrec_kernels::{BagsOut, PoolJob, PoolingMode, TableView, pool_bags};

fn main() {
    // the table's rows, the bags and their lookups (`ROWS`, `BAGS`, `PER_BAG` to change them:
    // RMC2's bags are 120 lookups), and the floats from one bag's output to the next (`STRIDE`:
    // a store's answer holds every table's bag of a sample side by side; 0 = the width)
    let var = |name: &str, default: usize| {
        std::env::var(name).map_or(default, |v| v.parse().expect("a count"))
    };
    let (rows, bags, per_bag) = (
        var("ROWS", 4096) as u64,
        var("BAGS", 256),
        var("PER_BAG", 40),
    );
    let stride = var("STRIDE", 0);
    // rounds of 20 calls a cell, the best one kept (`ROUNDS`, 9 unless set: more for a profile)
    let rounds = var("ROUNDS", 9);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let indices: Vec<i64> = (0..bags * per_bag)
        .map(|_| (next() % rows) as i64)
        .collect();
    let bounds: Vec<usize> = (0..=bags).map(|b| b * per_bag).collect();
    let weights: Vec<f32> = (0..bags * per_bag)
        .map(|i| 0.5 + (i % 7) as f32 * 0.1)
        .collect();
    println!("dim  dtype  sum ns/row  weighted ns/row");
    // arguments: widths and dtype names to run (all of each when none is given)
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dims: Vec<u32> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let named = |d: DType| {
        args.iter().any(|a| a == d.name()) || args.iter().all(|a| a.parse::<u32>().is_ok())
    };
    let dims = if dims.is_empty() {
        vec![32, 64, 128]
    } else {
        dims
    };
    for dim in dims {
        for dtype in [
            DType::Fp32,
            DType::Fp16,
            DType::Fp8,
            DType::Int8,
            DType::Int4,
            DType::Int2,
        ] {
            if !named(dtype) {
                continue;
            }
            let layout = RowLayout::new(rows, dtype.row_bytes(dim), 4096);
            let mut buf = AlignedBuf::zeroed(layout.data_bytes() as usize);
            let values: Vec<f32> = (0..dim).map(|j| (j as f32 * 0.37).sin()).collect();
            for r in 0..rows {
                let at = layout.row_offset(r) as usize;
                dtype.encode_row(
                    &values,
                    &mut buf.as_mut_slice()[at..at + layout.row_bytes as usize],
                );
            }
            let table = TableView::new(buf.as_slice(), layout, dtype, dim).unwrap();
            let stride = stride.max(dim as usize);
            let mut out = vec![0f32; bags * stride];
            let mut cost = |weighted: bool| {
                let job = PoolJob {
                    indices: &indices[..],
                    bounds: &bounds,
                    weights: weighted.then_some(&weights[..]),
                    mode: PoolingMode::Sum,
                    padding_idx: None,
                };
                let mut best = f64::MAX;
                for _ in 0..rounds {
                    let t = Instant::now();
                    for _ in 0..20 {
                        let mut o = BagsOut::from_slice(&mut out, stride, dim as usize, bags);
                        pool_bags(&table, black_box(&job), &mut o).unwrap();
                    }
                    best = best.min(t.elapsed().as_secs_f64() / (20 * bags * per_bag) as f64);
                }
                black_box(&out);
                best * 1e9
            };
            let (s, w) = (cost(false), cost(true));
            println!("{dim:>3}  {:<5}  {s:>10.2}  {w:>15.2}", dtype.name());
        }
    }
}
