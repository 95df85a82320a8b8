//! The fast kernels against their scalar reference twin, over random tables, layouts and bags.
//!
//! Sum order is the same in both (row by row), so max and unweighted fp32 / fp16 / bf16 sums agree
//! bit for bit; int8 folds the weight into scale and bias (`w·s·c + w·b` instead of
//! `w·(s·c + b)`), so it is compared within fp32 rounding.

use nearrec_format::{AlignedBuf, DType, RowLayout};
use nearrec_kernels::{
    AHEAD, BagsOut, IndexError, PoolJob, PoolingMode, RUN, RowIndex, RowPatch, RowRef, RowSource,
    SKIP, TableView, reference,
};
use proptest::prelude::*;

/// A table of `rows` random rows in `[-1, 1)`, encoded as `dtype` in the store's block layout.
fn table(
    dtype: DType,
    rows: u64,
    dim: u32,
    block_bytes: u64,
    seed: u64,
) -> (AlignedBuf, RowLayout) {
    let layout = RowLayout::new(rows, dtype.row_bytes(dim), block_bytes);
    let mut buf = AlignedBuf::zeroed(layout.data_bytes() as usize);
    let mut state = seed | 1;
    let mut values = vec![0f32; dim as usize];
    for r in 0..rows {
        for v in &mut values {
            // xorshift: reproducible values without another dependency
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *v = (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        }
        let at = layout.row_offset(r) as usize;
        let row = &mut buf.as_mut_slice()[at..at + layout.row_bytes as usize];
        dtype.encode_row(&values, row);
        if r % 2 == 1 {
            // every other row of raw codes with a scale and bias of any exponent (as bytes from
            // elsewhere may have), so that sums round and the order of their steps shows
            raw_row(dtype, dim as usize, row, &mut state);
        }
    }
    (buf, layout)
}

#[derive(Debug, Clone)]
struct Case {
    dtype: DType,
    dim: u32,
    rows: u64,
    block_bytes: u64,
    /// Bag lengths; indices are drawn below `rows` except where `bad` puts one out of range.
    lengths: Vec<usize>,
    picks: Vec<u64>,
    weighted: bool,
    mode: PoolingMode,
    padding: Option<u64>,
    /// (position, value) of an index to make invalid, if any.
    bad: Option<(usize, i64)>,
    seed: u64,
}

/// Overwrites a quantised row (int8 / int4 / int2 / fp8) with random codes and, where it has
/// them, a random scale and bias between 2^-12 and 2^12 in magnitude.
fn raw_row(dtype: DType, dim: usize, row: &mut [u8], state: &mut u64) {
    let mut next = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    };
    let Some(bits) = dtype.code_bits() else {
        if dtype == DType::Fp8 {
            row.iter_mut().for_each(|b| *b = next() as u8);
        }
        return;
    };
    let packed = dim.div_ceil(8 / bits as usize);
    row[..packed].iter_mut().for_each(|b| *b = next() as u8);
    let mut any = || {
        let r = next();
        f32::from_bits((r as u32 & 0x807f_ffff) | ((115 + (r >> 32) % 25) as u32) << 23)
    };
    let (scale, bias) = (any(), any());
    let tail = &mut row[packed..];
    if bits == 8 {
        tail[..4].copy_from_slice(&scale.to_le_bytes());
        tail[4..8].copy_from_slice(&bias.to_le_bytes());
    } else {
        tail[..2].copy_from_slice(&half::f16::from_f32(scale).to_le_bytes());
        tail[2..4].copy_from_slice(&half::f16::from_f32(bias).to_le_bytes());
    }
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::sample::select(DType::ALL.to_vec()),
        prop::sample::select(vec![1u32, 3, 8, 12, 16, 17, 32, 33, 64, 100, 128, 256, 300]),
        1u64..300,
        prop::sample::select(vec![512u64, 4096]),
        prop::collection::vec(0usize..40, 0..12),
        prop::sample::select(vec![PoolingMode::Sum, PoolingMode::Mean, PoolingMode::Max]),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_flat_map(
            |(dtype, dim, rows, block_bytes, lengths, mode, weighted, pad, seed)| {
                let n: usize = lengths.iter().sum();
                (
                    prop::collection::vec(0..rows, n),
                    if pad {
                        (0..rows).prop_map(Some).boxed()
                    } else {
                        Just(None).boxed()
                    },
                    prop::option::weighted(
                        0.2,
                        (0..n.max(1), prop::sample::select(vec![-1i64, -7, 0])),
                    ),
                )
                    .prop_map(move |(picks, padding, bad)| Case {
                        dtype,
                        // int4 / int2 codes fill whole bytes
                        dim: dim.next_multiple_of(8 / dtype.code_bits().unwrap_or(8)),
                        rows,
                        block_bytes,
                        lengths: lengths.clone(),
                        picks,
                        weighted: weighted && mode != PoolingMode::Max,
                        mode,
                        padding,
                        // -1 and -7 stay negative; 0 becomes `rows` (one past the end)
                        bad: bad
                            .filter(|_| n > 0)
                            .map(|(p, v)| (p, if v == 0 { rows as i64 } else { v })),
                        seed,
                    })
            },
        )
}

fn run<I: RowIndex>(c: &Case, indices: &[I], fast: bool) -> (Result<(), IndexError>, Vec<f32>) {
    run_patched(c, indices, fast, &[], false, false)
}

/// Rows standing in for the table's: `(row, Some(values) | None = removed)`.
type Patches = [(u64, Option<Vec<f32>>)];

/// [`run`] with `patches` given as a [`RowPatch`] (with the positions that read them recorded,
/// as the engine records them, when `record`), or (`in_table`) written into a copy of the
/// table instead: what a patch must mean.
fn run_patched<I: RowIndex>(
    c: &Case,
    indices: &[I],
    fast: bool,
    patches: &Patches,
    in_table: bool,
    record: bool,
) -> (Result<(), IndexError>, Vec<f32>) {
    let (mut buf, layout) = table(c.dtype, c.rows, c.dim, c.block_bytes, c.seed);
    let rb = layout.row_bytes as usize;
    let mut patch = RowPatch::new(rb);
    for (row, values) in patches {
        let mut bytes = vec![0u8; rb];
        if let Some(v) = values {
            c.dtype.encode_row(v, &mut bytes);
        }
        if in_table {
            let at = layout.row_offset(*row) as usize;
            buf.as_mut_slice()[at..at + rb].copy_from_slice(&bytes);
        } else {
            patch.set(*row, values.as_ref().map(|_| &bytes[..]));
        }
    }
    if record {
        let positions = (0..indices.len())
            .filter(|&pos| u64::try_from(indices[pos].to_i64()).is_ok_and(|r| patch.contains(r)))
            .collect();
        patch.read_at(positions);
    }
    let view = TableView::new(buf.as_slice(), layout, c.dtype, c.dim).expect("view");
    let mut bounds = vec![0usize];
    for l in &c.lengths {
        bounds.push(bounds.last().unwrap() + l);
    }
    let weights: Vec<f32> = (0..indices.len())
        .map(|i| 0.25 + (i % 7) as f32 * 0.5)
        .collect();
    let job = PoolJob {
        indices,
        bounds: &bounds,
        weights: c.weighted.then_some(&weights[..]),
        mode: c.mode,
        padding_idx: c.padding,
    };
    let dim = c.dim as usize;
    // A wider output row than the table's, so writes outside a bag's cells would show.
    let stride = dim + 3;
    let bags = c.lengths.len();
    let mut out = vec![f32::NAN; bags * stride];
    let mut cells = BagsOut::from_slice(&mut out, stride, dim, bags);
    let res = if !patch.is_empty() && fast {
        nearrec_kernels::pool_bags_patched(&view, &job, &mut cells, &patch)
    } else if !patch.is_empty() {
        reference::pool_bags_patched(&view, &job, &mut cells, &patch)
    } else if fast {
        nearrec_kernels::pool_bags(&view, &job, &mut cells)
    } else {
        reference::pool_bags(&view, &job, &mut cells)
    };
    (res, out)
}

fn check_same(c: &Case, fast: &[f32], slow: &[f32]) -> Result<(), TestCaseError> {
    let exact = !c.weighted;
    let dim = c.dim as usize;
    for (k, (&f, &s)) in fast.iter().zip(slow).enumerate() {
        if k % (dim + 3) >= dim {
            prop_assert!(f.is_nan(), "cell {k} is outside every bag but was written");
        } else if f.is_nan() || s.is_nan() {
            prop_assert!(
                f.is_nan() && s.is_nan(),
                "cell {k}: fast {f} vs reference {s}"
            );
        } else if f == s {
            // equal (infinities too: an unfinished max of no found row is -inf)
        } else if exact {
            prop_assert_eq!(
                f.to_bits(),
                s.to_bits(),
                "cell {}: fast {} vs reference {}",
                k,
                f,
                s
            );
        } else {
            prop_assert!(
                (f - s).abs() <= 1e-5 + 1e-5 * s.abs(),
                "cell {k}: fast {f} vs reference {s}"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn fast_matches_reference(c in case()) {
        let mut picks: Vec<i64> = c.picks.iter().map(|&p| p as i64).collect();
        if let Some((pos, value)) = c.bad {
            picks[pos] = value;
        }
        let (fast_res, fast_out) = run(&c, &picks, true);
        let (slow_res, slow_out) = run(&c, &picks, false);
        prop_assert_eq!(fast_res, slow_res);
        match fast_res {
            // Bags before the bad index are written; which bags after it are is unspecified.
            Err(IndexError { position, .. }) => {
                let stride = c.dim as usize + 3;
                let mut done = 0;
                let mut at = 0;
                for l in &c.lengths {
                    if at + l > position { break; }
                    at += l;
                    done += 1;
                }
                check_same(&c, &fast_out[..done * stride], &slow_out[..done * stride])?;
            }
            Ok(()) => check_same(&c, &fast_out, &slow_out)?,
        }
        // i32 indices take the same path.
        let narrow: Vec<i32> = picks.iter().map(|&p| p as i32).collect();
        let (res32, out32) = run(&c, &narrow, true);
        prop_assert_eq!(res32, fast_res);
        if fast_res.is_ok() {
            check_same(&c, &out32, &fast_out)?;
        }
    }
}

#[test]
fn mean_skips_padding_and_empty_bags_are_zero() {
    let c = Case {
        dtype: DType::Fp32,
        dim: 4,
        rows: 10,
        block_bytes: 512,
        lengths: vec![3, 0, 2],
        picks: vec![1, 2, 2, 2, 2],
        weighted: false,
        mode: PoolingMode::Mean,
        padding: Some(2),
        bad: None,
        seed: 9,
    };
    let picks: Vec<i64> = c.picks.iter().map(|&p| p as i64).collect();
    let (res, out) = run(&c, &picks, true);
    assert_eq!(res, Ok(()));
    let (buf, layout) = table(c.dtype, c.rows, c.dim, c.block_bytes, c.seed);
    let mut row1 = vec![0f32; 4];
    c.dtype.decode_row(
        &buf.as_slice()[layout.row_offset(1) as usize..][..16],
        &mut row1,
    );
    // bag 0: rows 1, 2, 2 with 2 the padding → the mean of row 1 alone
    assert_eq!(&out[..4], &row1[..]);
    // bag 1: empty; bag 2: only padding → zeros
    assert_eq!(&out[7..11], &[0.0; 4]);
    assert_eq!(&out[14..18], &[0.0; 4]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Rows patched in (written or removed) pool as if the table held them.
    #[test]
    fn patched_rows_pool_as_if_written_into_the_table(
        c in case().prop_filter("valid indices", |c| c.bad.is_none()),
        which in prop::collection::vec((any::<prop::sample::Index>(), any::<bool>()), 0..8),
    ) {
        let mut patches: Vec<(u64, Option<Vec<f32>>)> = Vec::new();
        for (i, (at, removed)) in which.iter().enumerate() {
            let row = at.index(c.rows as usize) as u64;
            if patches.iter().any(|(r, _)| *r == row) {
                continue;
            }
            let values = (0..c.dim).map(|j| (i as f32 + 1.0) * 0.125 - j as f32 * 0.01).collect();
            patches.push((row, (!removed).then_some(values)));
        }
        let picks: Vec<i64> = c.picks.iter().map(|&p| p as i64).collect();
        let (slow_res, slow_out) = run_patched(&c, &picks, false, &patches, false, false);
        let (want_res, want_out) = run_patched(&c, &picks, false, &patches, true, false);
        let (fast_res, fast_out) = run_patched(&c, &picks, true, &patches, true, false);
        prop_assert!(fast_res.is_ok() && slow_res.is_ok() && want_res.is_ok());
        // the fast kernels on the patched table agree with the reference with the patch
        check_same(&c, &fast_out, &slow_out)?;
        // and so does the engine's way with a patch: touched bags on the reference, the others
        // on the fast kernels, the touched ones found by looking at every index or from the
        // positions recorded
        for record in [false, true] {
            let (split_res, split_out) = run_patched(&c, &picks, true, &patches, false, record);
            prop_assert!(split_res.is_ok());
            check_same(&c, &split_out, &slow_out)?;
        }
        // the reference with a patch and on the patched table: the same rows, the same sums
        for (k, (&a, &b)) in slow_out.iter().zip(&want_out).enumerate() {
            prop_assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                         "cell {}: patched {} vs written {}", k, a, b);
        }
    }
}

/// One call of [`RowSource::resolve`]: its first position, its rows, the rows ahead.
type Asked = (usize, Vec<u64>, Vec<u64>);

/// A [`RowSource`] over a table that lacks the rows `absent` picks, and records every run it was
/// asked for (held afterwards to the job's positions).
struct Partial<'t> {
    view: &'t TableView<'t>,
    absent: u64,
    runs: std::cell::RefCell<Vec<Asked>>,
}

impl Partial<'_> {
    fn lacks(&self, row: u64) -> bool {
        self.absent != 0 && row.is_multiple_of(self.absent)
    }
}

// SAFETY: every row found is a row of `view`, the job's table: as long as the call's rows
unsafe impl RowSource for Partial<'_> {
    fn resolve<'s>(
        &'s self,
        first: usize,
        rows: &[u64],
        ahead: &[u64],
        found: &mut [Option<RowRef<'s>>],
    ) {
        assert!(rows.len() <= RUN && rows.len() == found.len() && ahead.len() <= AHEAD);
        self.runs
            .borrow_mut()
            .push((first, rows.to_vec(), ahead.to_vec()));
        for (f, &row) in found.iter_mut().zip(rows) {
            assert!(f.is_none(), "a run's found rows must start empty");
            if row != SKIP && !self.lacks(row) {
                *f = Some(RowRef::new(self.view.row(row)));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// `pool_found` against its twin; and the rows it lacked, added after and finished, give
    /// what pooling the whole table gives.
    #[test]
    fn found_rows_pool_as_the_reference_and_the_rest_complete_them(
        c in case(),
        absent in prop::sample::select(vec![0u64, 1, 2, 3, 7]),
    ) {
        let mut picks: Vec<i64> = c.picks.iter().map(|&p| p as i64).collect();
        if let Some((pos, value)) = c.bad {
            picks[pos] = value;
        }
        let (buf, layout) = table(c.dtype, c.rows, c.dim, c.block_bytes, c.seed);
        let view = TableView::new(buf.as_slice(), layout, c.dtype, c.dim).expect("view");
        let mut bounds = vec![0usize];
        for l in &c.lengths {
            bounds.push(bounds.last().unwrap() + l);
        }
        let weights: Vec<f32> = (0..picks.len()).map(|i| 0.25 + (i % 7) as f32 * 0.5).collect();
        let job = PoolJob {
            indices: &picks[..],
            bounds: &bounds,
            weights: c.weighted.then_some(&weights[..]),
            mode: c.mode,
            padding_idx: c.padding,
        };
        let (dim, bags) = (c.dim as usize, c.lengths.len());
        let stride = dim + 3;
        let mut results = Vec::new();
        for fast in [true, false] {
            let mut out = vec![f32::NAN; bags * stride];
            let mut counts = vec![usize::MAX; bags];
            let src = Partial { view: &view, absent, runs: Default::default() };
            let mut lacked = Vec::new();
            let mut cells = BagsOut::from_slice(&mut out, stride, dim, bags);
            let res = if fast {
                nearrec_kernels::pool_found(c.dtype, dim, c.rows, &job, &mut cells, &mut counts, &src, &mut lacked)
            } else {
                reference::pool_found(c.dtype, dim, c.rows, &job, &mut cells, &mut counts, &src, &mut lacked)
            };
            // runs ascend without gaps or overlaps, and name the rows at their positions
            let mut next = bounds[0];
            for (first, rows, ahead) in src.runs.into_inner() {
                prop_assert!(first >= next, "a run from {} after one up to {}", first, next);
                if fast {
                    prop_assert_eq!(first, next);
                }
                for (i, &r) in rows.iter().enumerate() {
                    let value = picks[first + i];
                    let want = if c.padding == Some(value as u64) { SKIP } else { value as u64 };
                    prop_assert_eq!(r, want, "position {}", first + i);
                }
                next = first + rows.len();
                // the hints are the rows of the run after the next, as far as the job goes
                let from = (next + RUN).min(picks.len());
                let after = &picks[from..picks.len().min(from + AHEAD)];
                if fast {
                    prop_assert_eq!(ahead.len(), after.len());
                }
                for (&h, &value) in ahead.iter().zip(after) {
                    prop_assert_eq!(h, value as u64);
                }
            }
            results.push((res, out, counts, lacked));
        }
        let (fast, slow) = (&results[0], &results[1]);
        prop_assert_eq!(fast.0, slow.0);
        let done = match fast.0 {
            Err(IndexError { position, .. }) => bounds.partition_point(|&b| b <= position) - 1,
            Ok(()) => bags,
        };
        let in_done = |pos: usize| pos < bounds[done];
        check_same(&c, &fast.1[..done * stride], &slow.1[..done * stride])?;
        prop_assert_eq!(&fast.2[..done], &slow.2[..done]);
        let lacked = |l: &[(u64, usize, usize)]| -> Vec<(u64, usize, usize)> {
            l.iter().copied().filter(|e| in_done(e.1)).collect()
        };
        prop_assert_eq!(lacked(&fast.3), lacked(&slow.3));
        if fast.0.is_err() {
            return Ok(());
        }
        // the caller's part: the lacked rows added, then each bag finished
        let mut out = fast.1.clone();
        let mut row = vec![0f32; dim];
        for &(r, pos, bag) in &fast.3 {
            c.dtype.decode_row(view.row(r), &mut row);
            let cell = &mut out[bag * stride..][..dim];
            for (a, &v) in cell.iter_mut().zip(&row) {
                *a = match (c.mode, c.weighted) {
                    (PoolingMode::Max, _) => a.max(v),
                    (_, true) => weights[pos].mul_add(v, *a),
                    (_, false) => *a + v,
                };
            }
        }
        for (b, &n) in fast.2.iter().enumerate() {
            let cell = &mut out[b * stride..][..dim];
            if n == 0 {
                cell.fill(0.0);
            } else if c.mode == PoolingMode::Mean {
                cell.iter_mut().for_each(|a| *a /= n as f32);
            }
        }
        let (res, whole) = run(&c, &picks, false);
        prop_assert!(res.is_ok());
        // summed in another order: within a few roundings of the bag's mass (the sum of its
        // rows' largest magnitudes, weighted), which raw quantised rows make large
        let mass: Vec<f32> = (0..bags)
            .map(|b| {
                (bounds[b]..bounds[b + 1])
                    .map(|pos| {
                        c.dtype.decode_row(view.row(picks[pos] as u64), &mut row);
                        let w = if c.weighted { weights[pos] } else { 1.0 };
                        w * row.iter().fold(0f32, |m, v| m.max(v.abs()))
                    })
                    .sum()
            })
            .collect();
        for (k, (&f, &s)) in out.iter().zip(&whole).enumerate() {
            if k % stride < dim {
                let tol = 1e-4 + 1e-4 * s.abs() + 1e-5 * mass[k / stride];
                prop_assert!((f - s).abs() <= tol, "cell {k}: {f} vs {s}");
            }
        }
    }
}
