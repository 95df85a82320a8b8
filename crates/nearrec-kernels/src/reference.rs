//! The scalar reference twin of the fast kernels: decode each row, then reduce it, one value at a
//! time. Slow and obviously right; the parity tests hold the fast path to it.

use nearrec_format::DType;

use crate::job::{BagsOut, IndexError, PoolJob, PoolingMode, RowIndex};
use crate::patch::RowPatch;
use crate::source::{Lacked, RowSource};
use crate::table::TableView;

/// Pools every bag of `job` from `table` into `out` (same contract as [`crate::pool_bags`]).
pub fn pool_bags<I: RowIndex>(
    table: &TableView<'_>,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
) -> Result<(), IndexError> {
    pool_rows(table, job, out, |r| table.row(r))
}

/// [`pool_bags`] with `patch`'s rows standing in for the table's (a live store's written and
/// removed rows): the twin of [`crate::pool_bags_patched`].
pub fn pool_bags_patched<I: RowIndex>(
    table: &TableView<'_>,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
    patch: &RowPatch,
) -> Result<(), IndexError> {
    assert!(patch.is_empty() || patch.row_bytes() == table.row_bytes());
    pool_rows(table, job, out, |r| {
        patch.get(r).unwrap_or_else(|| table.row(r))
    })
}

/// Pools the rows `source` finds, bag by bag, unfinished, with `counts` and the lookups it
/// lacked: the twin of [`crate::pool_found`]. It asks the source for one lookup at a time, with
/// no hints.
#[allow(clippy::too_many_arguments)]
pub fn pool_found<I: RowIndex, S: RowSource>(
    dtype: DType,
    dim: usize,
    rows: u64,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
    counts: &mut [usize],
    source: &S,
    lacked: &mut Vec<Lacked>,
) -> Result<(), IndexError> {
    let mut row = vec![0f32; dim];
    for (b, count) in counts.iter_mut().enumerate().take(job.bags()) {
        let dst = out.bag(b);
        dst.fill(if job.mode == PoolingMode::Max {
            f32::NEG_INFINITY
        } else {
            0.0
        });
        *count = 0;
        for pos in job.bounds[b]..job.bounds[b + 1] {
            let value = job.indices[pos].to_i64();
            if value < 0 || value as u64 >= rows {
                return Err(IndexError {
                    position: pos,
                    value,
                });
            }
            if job.padding_idx == Some(value as u64) {
                continue;
            }
            *count += 1;
            let mut found = [None];
            source.resolve(pos, &[value as u64], &[], &mut found);
            let Some(found) = found[0] else {
                lacked.push((value as u64, pos, b));
                continue;
            };
            // SAFETY: a found row is as long as the call's rows (`RowSource`'s contract)
            let bytes = unsafe { found.bytes(dtype.row_bytes(dim as u32) as usize) };
            let w = job.weights.map(|w| w[pos]);
            add_row(job.mode, dtype, bytes, w, &mut row, dst);
        }
    }
    Ok(())
}

fn pool_rows<'t, I: RowIndex>(
    table: &TableView<'t>,
    job: &PoolJob<'_, I>,
    out: &mut BagsOut<'_>,
    row_of: impl Fn(u64) -> &'t [u8],
) -> Result<(), IndexError> {
    let dim = table.dim();
    let mut row = vec![0f32; dim];
    let mut bag = BagSum::new(job.mode, dim);
    for b in 0..job.bags() {
        bag.reset();
        for pos in job.bounds[b]..job.bounds[b + 1] {
            let value = job.indices[pos].to_i64();
            if value < 0 || value as u64 >= table.rows() {
                return Err(IndexError {
                    position: pos,
                    value,
                });
            }
            if job.padding_idx == Some(value as u64) {
                continue;
            }
            bag.add_encoded(
                table.dtype(),
                row_of(value as u64),
                job.weights.map(|w| w[pos]),
                &mut row,
            );
        }
        bag.finish(out.bag(b));
    }
    Ok(())
}

/// One bag pooled a decoded row at a time, as the reference pools every bag: a weighted row
/// added with one rounding (as PyTorch does, see fast.rs), a row-wise quantised one as FBGEMM
/// adds it ([`BagSum::add_encoded`]), max from `-inf`, mean divided by the rows' count at the
/// end, an empty bag zeros. Also what pools a bag whose rows were
/// gathered by hand (a keyed table's bag holding init rows).
#[derive(Debug, Clone)]
pub struct BagSum {
    mode: PoolingMode,
    acc: Vec<f32>,
    count: usize,
}

impl BagSum {
    /// An empty bag of `dim` values pooled by `mode`.
    pub fn new(mode: PoolingMode, dim: usize) -> Self {
        let mut bag = Self {
            mode,
            acc: vec![0.0; dim],
            count: 0,
        };
        bag.reset();
        bag
    }

    /// Empties the bag for the next one.
    pub fn reset(&mut self) {
        let init = if self.mode == PoolingMode::Max {
            f32::NEG_INFINITY
        } else {
            0.0
        };
        self.acc.fill(init);
        self.count = 0;
    }

    /// Adds `row` (decoded, `dim` values) with its weight, if it has one.
    pub fn add(&mut self, row: &[f32], weight: Option<f32>) {
        self.count += 1;
        add_values(self.mode, row, weight, &mut self.acc);
    }

    /// Adds `row`, encoded as `dtype`, with its weight, as the fast path does: a row-wise
    /// quantised row (int8 / int4 / int2) summed as FBGEMM sums it, `acc = fma(scale·w, code,
    /// acc + bias·w)`; any other row decoded into `scratch` (`dim` values), then added.
    pub fn add_encoded(
        &mut self,
        dtype: DType,
        row: &[u8],
        weight: Option<f32>,
        scratch: &mut [f32],
    ) {
        self.count += 1;
        add_row(self.mode, dtype, row, weight, scratch, &mut self.acc);
    }

    /// The pooled bag into `dst`.
    pub fn finish(&self, dst: &mut [f32]) {
        if self.count == 0 {
            dst.fill(0.0);
        } else if self.mode == PoolingMode::Mean {
            for (d, a) in dst.iter_mut().zip(&self.acc) {
                *d = a / self.count as f32;
            }
        } else {
            dst.copy_from_slice(&self.acc);
        }
    }
}

/// Reduces decoded `row` (weight `weight`) into `acc` by `mode`.
fn add_values(mode: PoolingMode, row: &[f32], weight: Option<f32>, acc: &mut [f32]) {
    for (a, &v) in acc.iter_mut().zip(row) {
        match (mode, weight) {
            (PoolingMode::Sum | PoolingMode::Mean, Some(w)) => *a = w.mul_add(v, *a),
            (PoolingMode::Sum | PoolingMode::Mean, None) => *a += v,
            (PoolingMode::Max, _) => *a = a.max(v),
        }
    }
}

/// Reduces `row`, encoded as `dtype`, into `acc` by `mode`: a row-wise quantised row summed as
/// FBGEMM sums it, `acc = fma(scale·w, code, acc + bias·w)`; any other, and every row under max,
/// decoded into `scratch` first.
fn add_row(
    mode: PoolingMode,
    dtype: DType,
    row: &[u8],
    weight: Option<f32>,
    scratch: &mut [f32],
    acc: &mut [f32],
) {
    if dtype.code_bits().is_none() || mode == PoolingMode::Max {
        dtype.decode_row(row, scratch);
        return add_values(mode, scratch, weight, acc);
    }
    let (scale, bias) = dtype.scale_bias(row, acc.len());
    let (scale, bias) = weight.map_or((scale, bias), |w| (scale * w, bias * w));
    for (j, a) in acc.iter_mut().enumerate() {
        *a = scale.mul_add(dtype.code_at(row, j) as f32, *a + bias);
    }
}
