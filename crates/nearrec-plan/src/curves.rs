//! One table's value of DRAM bytes, measured on a trace: what the planner splits its budget by.
//!
//! To keep itself honest the planner ranks rows on the first half of a table's trace and scores
//! every curve on the second half (rows that were hot once but not later earn nothing):
//!
//! - the **hot-partition curve**: the second-half lookups that the `k` rows most frequent in the
//!   first half would serve if pinned (RecSSD's static partition);
//! - the **LRU curve**: the second half's hit ratio for a row cache of `c` rows, from Mattson
//!   stack distances ([`Profile`]), the cache warmed by the first half as a serving cache is
//!   (scored cold, it would be charged for every row the first half brought in, which the pinned
//!   rows ranked on that half are not).
//!
//! Hits are not all a table's lookups cost: each DRAM structure a lookup probes costs it time
//! whether it hits or not ([`PROBE_COST`]), so a table's bytes are split between pinned rows and
//! a row cache by the reads the split saves less what its probes cost.

use std::cmp::Reverse;

use nearrec_format::TableMeta;
use rustc_hash::FxHashSet;

use crate::profile::{LruCurve, Profile};

/// Bookkeeping bytes beside the row itself, as the engine counts them: per row-cache slot...
pub use nearrec_cache::SLOT_OVERHEAD;
/// ...and per pinned (hot) row.
pub const HOT_ROW_OVERHEAD: u64 = nearrec_cache::HotPartition::ROW_OVERHEAD;
/// Splits of a table's share tried between hot partition and row cache (the hot share).
pub const SPLITS: [f64; 5] = [0.0, 0.25, 0.5, 0.75, 1.0];
/// What a lookup's probe of one DRAM structure (a hot partition, a row cache) costs, in device
/// reads: a table with both probes twice for every lookup. Measured on RMC1 at K = 0 (issue 67,
/// `docs/results.md` "Pinned rows and a row cache, or one of them"): a second structure costs
/// 6.5–7 ns a lookup, and a read from this machine's disk 10–13 µs of its time (75–95k reads/s),
/// 1/1,500 of a read; a disk ten times faster makes it 1/150. Pinned rows beside a row cache
/// must save at least one read in a thousand lookups.
pub const PROBE_COST: f64 = 1e-3;
/// Points of the curve a plan keeps per table (for plots).
pub const CURVE_POINTS: usize = 65;

/// A store's table as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanTable {
    pub name: String,
    pub rows: u64,
    pub row_bytes: u64,
    /// The table's bytes (what keeping it whole in DRAM costs).
    pub data_bytes: u64,
}

impl From<&TableMeta> for PlanTable {
    fn from(t: &TableMeta) -> Self {
        Self {
            name: t.name.clone(),
            rows: t.rows,
            row_bytes: t.row_bytes,
            data_bytes: t.data_bytes,
        }
    }
}

/// A table's hit ratios by DRAM bytes (scored on the trace's second half), for plots.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Curve {
    pub bytes: Vec<f64>,
    /// With the bytes spent on pinned rows.
    pub hot: Vec<f64>,
    /// With the bytes spent on an LRU row cache.
    pub lru: Vec<f64>,
}

/// One table's curves, scored on the second half of its trace.
#[derive(Debug, Clone)]
pub(crate) struct TableCurves {
    pub table: PlanTable,
    /// Lookups in the scored (second) half.
    pub lookups: u64,
    /// The first half's rows, most frequent first (ties: lower id first).
    pub order: Vec<u64>,
    /// `hot_hits[k]`: second-half lookups of the first `k` rows of `order`.
    pub hot_hits: Vec<f64>,
    /// The second half.
    test: Vec<u64>,
    /// The first half, in order (what warms the cache the second half is scored on).
    train: Vec<u64>,
    /// Its LRU curve, warmed by the first half.
    lru: LruCurve,
    pub working_set: u64,
    /// LRU hit ratio with a cache of 10 % of the working set.
    pub locality: f64,
}

/// Sorted ids as (distinct id, count) runs.
fn runs(sorted: &[u64]) -> (Vec<u64>, Vec<u64>) {
    let (mut ids, mut counts) = (Vec::new(), Vec::<u64>::new());
    for &id in sorted {
        match ids.last() {
            Some(&last) if last == id => *counts.last_mut().expect("a run per id") += 1,
            _ => {
                ids.push(id);
                counts.push(1);
            }
        }
    }
    (ids, counts)
}

/// `a // b` on floats as Python (and numpy) compute it: the floor of the exact quotient.
pub(crate) fn floor_div(a: f64, b: f64) -> f64 {
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div == 0.0 {
        return 0f64.copysign(a / b);
    }
    let floor = div.floor();
    if div - floor > 0.5 {
        floor + 1.0
    } else {
        floor
    }
}

impl TableCurves {
    /// The curves of `table` from its trace `ids` (each in `0..rows`: checked by the caller).
    pub fn new(table: &PlanTable, ids: &[i64]) -> Self {
        let half = ids.len() / 2;
        let as_ids = |s: &[i64]| s.iter().map(|&i| i as u64).collect::<Vec<u64>>();
        let train = as_ids(&ids[..half]);
        let mut sorted = train.clone();
        sorted.sort_unstable();
        let (rows, counts) = runs(&sorted);
        let mut by_count: Vec<usize> = (0..rows.len()).collect();
        // numpy: a stable argsort of -count over rows sorted by id
        by_count.sort_unstable_by_key(|&i| (Reverse(counts[i]), rows[i]));
        let order: Vec<u64> = by_count.iter().map(|&i| rows[i]).collect();

        let test = as_ids(&ids[half..]);
        let mut sorted = test.clone();
        sorted.sort_unstable();
        let (test_rows, test_counts) = runs(&sorted);
        let mut hot_hits = Vec::with_capacity(order.len() + 1);
        let mut acc = 0u64;
        hot_hits.push(0.0);
        for row in &order {
            acc += test_rows.binary_search(row).map_or(0, |j| test_counts[j]);
            hot_hits.push(acc as f64);
        }
        let profile = Profile::after(train.iter().copied(), test.iter().copied());
        let working_set = profile.working_set();
        let lru = profile.lru_curve();
        let locality = if test.is_empty() {
            0.0
        } else {
            lru.hit_ratio((working_set / 10).max(1))
        };
        Self {
            table: table.clone(),
            lookups: test.len() as u64,
            order,
            hot_hits,
            test,
            train,
            lru,
            working_set,
            locality,
        }
    }

    /// Bytes of one row-cache slot.
    pub fn slot(&self) -> u64 {
        nearrec_cache::RowCache::slot_bytes(self.table.row_bytes as usize)
    }

    /// Bytes of one pinned row.
    pub fn pin(&self) -> u64 {
        self.table.row_bytes + HOT_ROW_OVERHEAD
    }

    /// Lookups served by the better of a hot partition and an LRU cache of `nbytes` (all of them
    /// once the whole table fits).
    pub fn hits(&self, nbytes: u64) -> f64 {
        if nbytes >= self.table.data_bytes {
            return self.lookups as f64;
        }
        let k = (nbytes / self.pin()).min(self.hot_hits.len() as u64 - 1) as usize;
        let lru = self.lru.hit_ratio(nbytes / self.slot()) * self.lookups as f64;
        let hot = self.hot_hits[k];
        if hot >= lru { hot } else { lru }
    }

    /// The best split of `nbytes` into pinned rows and row-cache bytes, each tried on the
    /// second half with the pinned rows taken out, with the cache and (rows pinned) without it:
    /// (hits, hot rows, cache bytes). Best by the reads a split saves less what its probes
    /// cost ([`PROBE_COST`] a lookup for each structure): rows are pinned beside a cache only
    /// where they save more reads than the second probe costs. On a tie the most rows pinned
    /// and the least cache win: a pinned row's hit marks nothing, a cache hit marks its slot
    /// for the policy, and where pinned rows serve the whole trace they were measured faster
    /// than the same bytes of cache (`docs/results.md`, "Pinned rows and a row cache, or one of
    /// them").
    pub fn split(&self, nbytes: u64) -> (f64, usize, u64) {
        let probe = self.lookups as f64 * PROBE_COST;
        let mut best = (f64::NEG_INFINITY, (0.0, 0, 0));
        let mut tried = None;
        for f in SPLITS.into_iter().rev() {
            let k = floor_div(f * nbytes as f64, self.pin() as f64) as u64;
            let k = k.min(self.order.len() as u64) as usize;
            if tried == Some(k) {
                // the same split again: the same hits, which lost (or won) already
                continue;
            }
            tried = Some(k);
            let cache = nbytes.saturating_sub(k as u64 * self.pin());
            let hot = self.hot_hits[k];
            let pinned = u8::from(k > 0);
            let with = (
                hot + self.cached(k, cache),
                pinned + u8::from(cache >= self.slot()),
            );
            let without = (hot, pinned);
            for ((hits, probes), cache) in [(without, 0), (with, cache)] {
                let score = hits - probe * f64::from(probes);
                if score > best.0 + 1e-9 {
                    best = (score, (hits, k, cache));
                }
            }
        }
        best.1
    }

    /// The second half's hits in a (warm) row cache of `cache` bytes beside the first `k`
    /// rows of `order` pinned: the lookups of the rows not pinned.
    fn cached(&self, k: usize, cache: u64) -> f64 {
        if cache < self.slot() {
            return 0.0;
        }
        if k == 0 {
            return self.lru.hit_ratio(cache / self.slot()) * self.test.len() as f64;
        }
        let hot: FxHashSet<u64> = self.order[..k].iter().copied().collect();
        let unpinned = |ids: &[u64]| -> Vec<u64> {
            ids.iter().copied().filter(|r| !hot.contains(r)).collect()
        };
        let rest = unpinned(&self.test);
        if rest.is_empty() {
            return 0.0;
        }
        Profile::after(unpinned(&self.train).into_iter(), rest.iter().copied())
            .lru_curve()
            .hit_ratio(cache / self.slot())
            * rest.len() as f64
    }

    /// The hot-partition and LRU hit ratios on a grid of [`CURVE_POINTS`] sizes from 0 to the
    /// table's bytes or `budget`, whichever is smaller (numpy's `linspace`).
    pub fn curve(&self, budget: u64) -> Curve {
        let stop = budget.min(self.table.data_bytes) as f64;
        let last = CURVE_POINTS - 1;
        let step = stop / last as f64;
        let bytes: Vec<f64> = (0..CURVE_POINTS)
            .map(|i| match i {
                _ if i == last => stop,
                _ if step == 0.0 => 0.0,
                _ => i as f64 * step,
            })
            .collect();
        let lookups = self.lookups.max(1) as f64;
        let hot = bytes
            .iter()
            .map(|&b| {
                let k = floor_div(b, self.pin() as f64) as u64;
                self.hot_hits[k.min(self.hot_hits.len() as u64 - 1) as usize] / lookups
            })
            .collect();
        let lru = bytes
            .iter()
            .map(|&b| self.lru.hit_ratio(floor_div(b, self.slot() as f64) as u64))
            .collect();
        Curve { bytes, hot, lru }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: u64, row_bytes: u64) -> PlanTable {
        PlanTable {
            name: "t".into(),
            rows,
            row_bytes,
            data_bytes: rows * row_bytes,
        }
    }

    #[test]
    fn floor_division_is_pythons() {
        assert_eq!(floor_div(7.0, 2.0), 3.0);
        assert_eq!(floor_div(-7.0, 2.0), -4.0);
        assert_eq!(floor_div(6.0, 3.0), 2.0);
        assert_eq!(floor_div(0.0, 3.0), 0.0);
        // 1 / 0.1 rounds to 10.0, but 0.1 is a little more than a tenth: the floor is 9
        assert_eq!(floor_div(1.0, 0.1), 9.0);
        assert_eq!((1.0f64 / 0.1).floor(), 10.0);
    }

    #[test]
    fn rows_are_ranked_on_the_first_half_and_scored_on_the_second() {
        // first half: 3 x3, 1 x2, 2 x2, 0 x1; second half: 1 x4, 3 x1, 5 x3
        let ids = [3, 1, 3, 2, 0, 3, 2, 1, 1, 3, 1, 5, 5, 1, 5, 1];
        let c = TableCurves::new(&table(8, 64), &ids);
        assert_eq!(c.order, vec![3, 1, 2, 0], "by count, ties by id");
        assert_eq!(c.hot_hits, vec![0.0, 1.0, 5.0, 5.0, 5.0]);
        assert_eq!(c.lookups, 8);
        assert_eq!(c.working_set, 3);
        // the whole table serves every lookup
        assert_eq!(c.hits(8 * 64), 8.0);
        // two pinned rows serve 5 of 8; as many bytes of cache (two slots: a slot costs about
        // what a pinned row does), warmed by the first half, 6 (distances 1 3 2 0 1 2 2 2)
        assert_eq!(2 * c.pin() / c.slot(), 2);
        assert_eq!(c.hits(2 * c.pin()), 6.0);
        // one slot: the two lookups at distance 1
        assert_eq!(c.hits(c.slot()), 2.0);
        assert_eq!(c.hits(0), 0.0);
    }

    #[test]
    fn a_split_pins_rows_a_scan_would_push_out() {
        // the first half's busy rows, 1 and 2, come back in the second half between rows seen
        // once: pinned, they serve 3 of 8; a cache of the same bytes (two slots) loses them to
        // the scan and serves 1
        let ids = [1, 1, 2, 2, 1, 2, 1, 2, 1, 3, 4, 5, 2, 6, 7, 1];
        let c = TableCurves::new(&table(10, 64), &ids);
        let nbytes = 2 * c.pin();
        assert_eq!(c.hits(nbytes), 3.0);
        assert_eq!(c.split(nbytes), (3.0, 2, 0));
        assert_eq!(c.split(0), (0.0, 0, 0));
    }

    #[test]
    fn a_split_keeps_one_structure_where_a_second_buys_nothing() {
        // the second half alternates the first half's busy rows: pinned, they serve all 8, and
        // so does a warm cache of the same bytes; both beside each other would probe twice.
        // One structure, the pinned rows (their hits mark nothing)
        let ids = [1, 1, 2, 2, 9, 8, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2];
        let c = TableCurves::new(&table(10, 64), &ids);
        let nbytes = 4 * c.pin();
        assert_eq!(c.split(nbytes), (8.0, 4, 0));
        // a row the first half never read comes back in the second: a cache alone serves all
        // but its first read (7), pinned rows beside a cache as many with two probes
        let ids = [1, 1, 2, 2, 9, 8, 1, 2, 1, 2, 3, 1, 3, 2, 3, 1];
        let c = TableCurves::new(&table(10, 64), &ids);
        assert_eq!(c.split(nbytes), (7.0, 0, nbytes));
    }

    #[test]
    fn a_split_caches_when_the_first_half_rows_are_gone() {
        // the first half's row never comes back; the second half repeats one row
        let ids = [7, 7, 7, 7, 1, 1, 1, 1];
        let c = TableCurves::new(&table(10, 64), &ids);
        let nbytes = c.slot() + c.pin() / 2;
        assert_eq!(c.split(nbytes), (3.0, 0, nbytes));
        // with room for the pinned row and a slot, pinning it buys nothing: the cache wins alone
        let nbytes = c.slot() + c.pin();
        assert_eq!(c.split(nbytes), (3.0, 0, nbytes));
    }

    #[test]
    fn an_empty_trace_has_flat_curves() {
        let c = TableCurves::new(&table(10, 8), &[]);
        assert_eq!((c.lookups, c.working_set, c.locality), (0, 0, 0.0));
        assert_eq!(c.hits(40), 0.0);
        let curve = c.curve(1_000);
        assert_eq!(curve.bytes.len(), CURVE_POINTS);
        assert_eq!(curve.bytes[64], 80.0);
        assert!(curve.hot.iter().chain(&curve.lru).all(|&h| h == 0.0));
    }
}
