//! EMB-SSD Figs. 9(b) and 10 on the real engine's kernels: the fast pooling loop against its
//! plain twin, and the cost of a pooling operation as the rows widen.

use std::time::Instant;

use nearrec_format::{AlignedBuf, DType, RowLayout};
use nearrec_kernels::{BagsOut, PoolJob, PoolingMode, TableView};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::cost::uniform_rows;

/// Seconds to sum-pool `bags` bags of `pooling` rows each from a table of `rows` rows of `dim`
/// values stored as `dtype`, uniform random rows (a fixed seed), on this thread: `(fast,
/// reference)` — the engine's kernel ([`nearrec_kernels::pool_bags`]: register accumulators,
/// prefetch, AVX2 / AVX-512 chosen at run time) and its scalar twin
/// ([`nearrec_kernels::reference::pool_bags`]: plain loops for the x86-64 baseline). Each is the
/// median of `reps` timings, the two alternated; the outputs are checked to agree.
#[pyfunction]
#[pyo3(signature = (dim, dtype, rows, bags, pooling, reps = 9))]
pub(crate) fn kernel_cost(
    py: Python<'_>,
    dim: u32,
    dtype: &str,
    rows: u64,
    bags: usize,
    pooling: usize,
    reps: usize,
) -> PyResult<(f64, f64)> {
    let dtype: DType = dtype
        .parse()
        .map_err(|e| PyValueError::new_err(format!("{e}")))?;
    if dim == 0 || rows == 0 || reps == 0 {
        return Err(PyValueError::new_err("dim, rows and reps must be positive"));
    }
    py.detach(|| {
        let layout = RowLayout::new(rows, dtype.row_bytes(dim), 4096);
        let mut data = AlignedBuf::zeroed(layout.data_bytes() as usize);
        let rb = layout.row_bytes as usize;
        let values: Vec<f32> = (0..dim).map(|j| (j % 13) as f32 * 0.125 - 0.75).collect();
        for r in 0..rows {
            let at = layout.row_offset(r) as usize;
            dtype.encode_row(&values, &mut data.as_mut_slice()[at..at + rb]);
        }
        let view = TableView::new(data.as_slice(), layout, dtype, dim).expect("a whole table");
        // the same rows for both kernels
        let mut next = uniform_rows(11);
        let indices: Vec<i64> = (0..bags * pooling).map(|_| next(rows)).collect();
        let bounds: Vec<usize> = (0..=bags).map(|b| b * pooling).collect();
        let job = PoolJob {
            indices: &indices,
            bounds: &bounds,
            weights: None,
            mode: PoolingMode::Sum,
            padding_idx: None,
        };
        let d = dim as usize;
        let (mut fast_out, mut slow_out) = (vec![0f32; bags * d], vec![0f32; bags * d]);
        let time = |reference: bool, out: &mut [f32]| {
            let mut cells = BagsOut::from_slice(out, d, d, bags);
            let t = Instant::now();
            let res = if reference {
                nearrec_kernels::reference::pool_bags(&view, &job, &mut cells)
            } else {
                nearrec_kernels::pool_bags(&view, &job, &mut cells)
            };
            res.expect("indices in range");
            t.elapsed().as_secs_f64()
        };
        let (mut fast, mut slow) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            fast.push(time(false, &mut fast_out));
            slow.push(time(true, &mut slow_out));
        }
        let agree = fast_out
            .iter()
            .zip(&slow_out)
            .all(|(a, b)| (a - b).abs() <= 1e-3 * (1.0 + b.abs()));
        if !agree {
            return Err(PyValueError::new_err(
                "the fast and reference kernels disagree",
            ));
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Ok((median(fast), median(slow)))
    })
}
