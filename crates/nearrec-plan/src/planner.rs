//! The planner: from a trace, where each table's rows should live in a DRAM budget.
//!
//! Per table it measures the hot-partition and LRU curves of [`curves`](crate::curves) (ranked on
//! the first half of the trace, scored on the second), the working set and EMB-SSD's table type
//! ([`TableKind`]). It then splits the budget across tables greedily by
//! marginal gain: each step gives the next slice of bytes to the table whose lookups it saves
//! most reads for (misses cost a device read each), looking ahead past steps such as "keep the
//! whole table". Each table's share is then split between a hot partition and a row cache by
//! trying a few splits on the trace with the hot rows taken out, weighing the reads a split
//! saves against the probes it costs every lookup (pinned rows beside a cache probe twice:
//! [`PROBE_COST`](crate::curves::PROBE_COST)). Bytes no curve could use (the trace was too short
//! to show their value) become row caches, spread by lookups over the tables that have a cache
//! or no pinned rows. The curves are LRU's, warmed as a serving cache is; the engine's caches
//! may run LFU or admission, which the benchmark compares.
//!
//! `nearrec.plan.make_plan` of the Python package calls it.

use rustc_hash::FxHashMap;

use crate::curves::{PlanTable, TableCurves};
use crate::error::{PlanError, Result};
use crate::file::TraceFile;
use crate::plan::{Plan, TableKind, TablePlan};

/// The greedy split's default number of slices of the budget.
pub const DEFAULT_STEPS: u64 = 128;

/// A table of a trace: the row count it was made for and its lookups' row ids, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceTable<'a> {
    pub name: &'a str,
    pub rows: u64,
    pub indices: &'a [i64],
    /// The indices are a keyed table's keys, not rows: a plan of DRAM needs them mapped to
    /// rows first, through the store's key index ([`check_trace`] refuses them).
    pub keys: bool,
}

/// The tables of a trace file, in its order.
pub fn trace_tables(trace: &TraceFile) -> Vec<TraceTable<'_>> {
    (0..trace.header().tables.len())
        .map(|i| {
            let t = trace.table(i);
            TraceTable {
                name: &t.entry.name,
                rows: t.entry.rows,
                indices: t.indices,
                keys: t.entry.keys,
            }
        })
        .collect()
}

fn by_name(store: &[PlanTable]) -> Result<FxHashMap<&str, &PlanTable>> {
    let mut out = FxHashMap::default();
    for t in store {
        if out.insert(t.name.as_str(), t).is_some() {
            return Err(PlanError::InvalidArgument {
                what: "store",
                reason: format!("lists table {:?} twice", t.name),
            });
        }
    }
    Ok(out)
}

/// The trace's tables against the store: each one the store has, with the store's row count,
/// and every row id in range (at plan time, not when a plan is applied).
pub fn check_trace(store: &[PlanTable], trace: &[TraceTable<'_>]) -> Result<()> {
    let tables = by_name(store)?;
    for (i, t) in trace.iter().enumerate() {
        let mismatch = |position, reason| PlanError::TraceMismatch {
            table: t.name.to_owned(),
            position,
            reason,
        };
        if trace[..i].iter().any(|u| u.name == t.name) {
            return Err(PlanError::InvalidArgument {
                what: "trace",
                reason: format!("lists table {:?} twice", t.name),
            });
        }
        let Some(s) = tables.get(t.name) else {
            let names: Vec<&str> = store.iter().map(|s| s.name.as_str()).collect();
            return Err(mismatch(
                None,
                format!(
                    "the trace has table {:?}, which the store lacks (it has {names:?})",
                    t.name
                ),
            ));
        };
        if t.keys {
            return Err(mismatch(
                None,
                format!(
                    "the trace's table {:?} holds keys: a plan places rows, so its keys are \
                     mapped to the rows they hold with the store open first (nearrec plan and \
                     nearrec.plan.make_plan do)",
                    t.name
                ),
            ));
        }
        if t.rows != s.rows {
            return Err(mismatch(
                None,
                format!(
                    "the trace's table {:?} has {} rows but the store's has {}: the trace was \
                     made for another store",
                    t.name, t.rows, s.rows
                ),
            ));
        }
        if let Some(pos) = t
            .indices
            .iter()
            .position(|&id| id < 0 || id as u64 >= s.rows)
        {
            return Err(mismatch(
                Some(pos),
                format!(
                    "the trace's table {:?} reads row {} at position {pos}, outside the store's \
                     {} rows",
                    t.name, t.indices[pos], s.rows
                ),
            ));
        }
    }
    Ok(())
}

/// Plans `budget` bytes of DRAM for the `store`'s tables from `trace` in `steps` slices (see the
/// module docs). Tables the trace does not cover get nothing. The plan's `trace` and `store` are
/// left empty for the caller to fill in.
pub fn make_plan(
    store: &[PlanTable],
    trace: &[TraceTable<'_>],
    budget: u64,
    steps: u64,
) -> Result<Plan> {
    if steps == 0 {
        return Err(PlanError::InvalidArgument {
            what: "steps",
            reason: "must be an integer at least 1, not 0".into(),
        });
    }
    check_trace(store, trace)?;
    let tables = by_name(store)?;
    let curves: Vec<TableCurves> = trace
        .iter()
        .map(|t| TableCurves::new(tables[t.name], t.indices))
        .collect();
    let (given, left) = greedy(&curves, budget, steps);
    // each table not kept whole: its share split between pinned rows and a row cache
    let splits: Vec<Option<(f64, usize, u64)>> = curves
        .iter()
        .zip(&given)
        .map(|(c, &b)| (b < c.table.data_bytes).then(|| c.split(b)))
        .collect();
    // bytes no curve could use (the trace saw too little) still serve as row caches: spread them
    // over the tables not kept whole, in proportion to their lookups — but not beside pinned rows
    // that have no cache, where they would add a second probe to every lookup (PROBE_COST)
    let open = |i: usize| splits[i].is_some_and(|(_, k, cache)| k == 0 || cache > 0);
    let weight: u64 = (0..curves.len())
        .filter(|&i| open(i))
        .map(|i| curves[i].lookups)
        .sum();
    let mut out = Vec::with_capacity(curves.len());
    for (i, c) in curves.iter().enumerate() {
        let leftover = if open(i) {
            (u128::from(left) * u128::from(c.lookups) / u128::from(weight.max(1))) as u64
        } else {
            0
        };
        let mut tp = TablePlan {
            table: c.table.name.clone(),
            rows: c.table.rows,
            row_bytes: c.table.row_bytes,
            table_bytes: c.table.data_bytes,
            lookups: c.lookups,
            working_set: c.working_set,
            locality: c.locality,
            kind: TableKind::of(c.working_set, c.table.rows, c.locality),
            resident: false,
            hot_rows: Vec::new(),
            cache_bytes: 0,
            expected_hit_ratio: 0.0,
            curve: c.curve(budget),
        };
        match splits[i] {
            None => {
                tp.resident = true;
                tp.expected_hit_ratio = 1.0;
            }
            Some((hits, k, cache)) if given[i].saturating_add(leftover) > 0 => {
                tp.hot_rows = c.order[..k].to_vec();
                tp.cache_bytes = cache + leftover;
                tp.expected_hit_ratio = hits / c.lookups.max(1) as f64;
            }
            Some(_) => {}
        }
        out.push(tp);
    }
    Ok(Plan {
        budget,
        tables: out,
        trace: String::new(),
        store: String::new(),
    })
}

/// [`make_plan`] from a trace file; the plan names the file.
pub fn plan_trace_file(
    store: &[PlanTable],
    trace: &TraceFile,
    budget: u64,
    steps: u64,
) -> Result<Plan> {
    let mut plan = make_plan(store, &trace_tables(trace), budget, steps)?;
    plan.trace = trace.path().display().to_string();
    Ok(plan)
}

/// The greedy split by marginal gain: the bytes each table gets, and the bytes left over.
fn greedy(curves: &[TableCurves], budget: u64, steps: u64) -> (Vec<u64>, u64) {
    let chunk = (budget / steps).max(1);
    let mut given = vec![0u64; curves.len()];
    let mut left = budget;
    while left >= chunk {
        let mut best: Option<(f64, usize, u64)> = None;
        for (i, c) in curves.iter().enumerate() {
            let now = c.hits(given[i]);
            // look ahead: the best gain per byte over any number of further chunks
            for k in 1..=left / chunk {
                let extra = k * chunk;
                let gain = (c.hits(given[i].saturating_add(extra)) - now) / extra as f64;
                if best.is_none_or(|b| gain > b.0 + 1e-15) {
                    best = Some((gain, i, extra));
                }
                if given[i].saturating_add(extra) >= c.table.data_bytes {
                    break;
                }
            }
        }
        let Some((gain, i, extra)) = best else { break };
        if gain <= 0.0 {
            break;
        }
        let extra = extra.min(curves[i].table.data_bytes.saturating_sub(given[i]));
        if extra == 0 {
            break;
        }
        given[i] += extra;
        left -= extra;
    }
    (given, left)
}
