//! The row cache on its own, for studies: a trace served through one `nearrec_cache::RowCache`
//! (look up; on a miss, offer the row), no I/O.

use std::str::FromStr;

use nearrec_cache::{CacheConfig, Policy, RowCache};
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;

use crate::error::{check_non_negative, detach, raise};

/// Serves `indices` through a cache of `capacity_rows` rows; returns `(hits, misses, admissions,
/// rejections, evictions)`.
#[pyfunction]
#[pyo3(signature = (indices, capacity_rows, policy = "lfu_pa", admission_probability = 0.5, ways = 16, seed = 0))]
pub(crate) fn cache_simulate(
    py: Python<'_>,
    indices: PyReadonlyArray1<'_, i64>,
    capacity_rows: u64,
    policy: &str,
    admission_probability: f64,
    ways: usize,
    seed: u64,
) -> PyResult<(u64, u64, u64, u64, u64)> {
    let invalid = |m: String| raise(py, "InvalidRequest", m, None, None);
    let policy = Policy::from_str(policy).map_err(|e| invalid(e.to_string()))?;
    if !(0.0..=1.0).contains(&admission_probability) || ways == 0 {
        return Err(invalid(format!(
            "admission_probability {admission_probability} must be in [0, 1] and ways ≥ 1"
        )));
    }
    let ids = indices.as_slice()?;
    check_non_negative(py, ids)?;
    // One-byte rows: the study is about which rows stay, not their bytes. A cache with a slot
    // for every id of the trace is as large as it can usefully be (and a larger capacity would
    // only allocate, up to more memory than the host has).
    let budget = capacity_rows
        .saturating_mul(RowCache::slot_bytes(1))
        .min(RowCache::budget_for_rows(ids.len() as u64, 1, ways));
    let cache = RowCache::new(
        budget,
        1,
        CacheConfig {
            policy,
            admission_probability,
            ways,
            seed,
        },
    );
    detach(py, || {
        for &i in ids {
            if cache.get(i as u64, |_| ()).is_none() {
                cache.offer(i as u64, &[0]);
            }
        }
    })?;
    let s = cache.stats();
    Ok((s.hits, s.misses, s.admissions, s.rejections, s.evictions))
}
