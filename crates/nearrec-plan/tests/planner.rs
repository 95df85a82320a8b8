//! The planner: it fits the budget, keeps a small busy table whole, pins the rows the first half
//! of a trace keeps coming back to, types tables, spreads what no curve could use, and refuses a
//! trace made for another store.

use nearrec_plan::{
    DEFAULT_STEPS, HOT_ROW_OVERHEAD, PlanError, PlanTable, TableData, TableKind, TraceFile,
    TraceTable, make_plan, plan_trace_file, write_trace,
};
use proptest::prelude::*;

fn table(name: &str, rows: u64, row_bytes: u64) -> PlanTable {
    PlanTable {
        name: name.into(),
        rows,
        row_bytes,
        data_bytes: rows * row_bytes,
    }
}

fn tr<'a>(name: &'a str, rows: u64, indices: &'a [i64]) -> TraceTable<'a> {
    TraceTable {
        name,
        rows,
        indices,
        keys: false,
    }
}

/// A small deterministic generator (no dependency on the trace generators under test).
fn lcg(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    move |n| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) % n.max(1)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_budget_is_never_exceeded(
        shapes in prop::collection::vec((1u64..300, 1u64..5, 0usize..600, 0u64..4), 1..4),
        budget_share in 0.0f64..1.5,
        steps in 1u64..200,
        seed in any::<u64>(),
    ) {
        let mut rng = lcg(seed);
        let names: Vec<String> = (0..shapes.len()).map(|i| format!("t{i}")).collect();
        let store: Vec<PlanTable> = shapes
            .iter()
            .zip(&names)
            .map(|(&(rows, w, _, _), n)| table(n, rows, 4 << w))
            .collect();
        // skew 0: uniform; higher: ids squeezed towards 0
        let ids: Vec<Vec<i64>> = shapes
            .iter()
            .map(|&(rows, _, n, skew)| {
                (0..n).map(|_| (rng(rows) >> (skew * rng(4))) as i64).collect()
            })
            .collect();
        let trace: Vec<TraceTable<'_>> = store
            .iter()
            .zip(&ids)
            .map(|(t, i)| tr(&t.name, t.rows, i))
            .collect();
        let total: u64 = store.iter().map(|t| t.data_bytes).sum();
        let budget = (total as f64 * budget_share) as u64;
        let plan = make_plan(&store, &trace, budget, steps).unwrap();
        prop_assert!(plan.bytes() <= budget, "{} > {budget}", plan.bytes());
        prop_assert_eq!(plan.tables.len(), store.len());
        for (t, s) in plan.tables.iter().zip(&store) {
            prop_assert_eq!(&t.table, &s.name);
            prop_assert!((0.0..=1.0).contains(&t.expected_hit_ratio));
            prop_assert!(t.hot_rows.iter().all(|&r| r < s.rows));
            let mut distinct = t.hot_rows.clone();
            distinct.sort_unstable();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), t.hot_rows.len());
            if t.resident {
                prop_assert!(t.hot_rows.is_empty() && t.cache_bytes == 0);
                prop_assert_eq!(t.expected_hit_ratio, 1.0);
            }
            prop_assert_eq!(t.curve.bytes.len(), 65);
        }
        prop_assert!((0.0..=1.0).contains(&plan.expected_hit_ratio()));
    }
}

#[test]
fn a_small_busy_table_is_kept_whole() {
    let mut rng = lcg(3);
    let store = [table("big", 100_000, 64), table("tiny", 100, 64)];
    let big: Vec<i64> = (0..4_000).map(|_| rng(100_000) as i64).collect();
    let tiny: Vec<i64> = (0..4_000).map(|_| rng(100) as i64).collect();
    let trace = [tr("big", 100_000, &big), tr("tiny", 100, &tiny)];
    // room for the tiny table and some more, far from all of the big one
    let budget = 100 * 64 * 4;
    let plan = make_plan(&store, &trace, budget, DEFAULT_STEPS).unwrap();
    let t = plan.table("tiny").unwrap();
    assert!(t.resident && t.expected_hit_ratio == 1.0);
    assert_eq!(t.bytes(), 100 * 64);
    let b = plan.table("big").unwrap();
    assert!(!b.resident);
    assert!(plan.bytes() <= budget);
    // a budget short of the tiny table: nothing is resident
    let plan = make_plan(&store, &trace, 100 * 64 / 2, DEFAULT_STEPS).unwrap();
    assert!(plan.tables.iter().all(|t| !t.resident));
}

/// Row `r` of `0..10` appears `r + 1` times in the first half: the first-half ranking is 9, 8,
/// 7, ... (not the ids' order); the second half reads them the other way round (0 most),
/// between one-off rows that defeat any small LRU cache. The pinned rows are the first half's
/// most frequent, although others would serve more of the second half.
#[test]
fn hot_rows_are_the_first_halfs_most_frequent() {
    let mut first: Vec<i64> = (0..10i64).flat_map(|r| vec![r; (r + 1) as usize]).collect();
    let mut rng = lcg(5);
    for i in (1..first.len()).rev() {
        first.swap(i, rng(i as u64 + 1) as usize);
    }
    let mut second = Vec::new();
    let mut oneoff = 1_000i64;
    for round in 0..10i64 {
        for r in 0..10i64 {
            if round < 10 - r {
                second.extend([r, oneoff, oneoff + 1, oneoff + 2]);
                oneoff += 3;
            }
        }
    }
    // pad the first half to the second's length with one-off rows seen once
    while first.len() < second.len() {
        first.push(oneoff);
        oneoff += 1;
    }
    let ids: Vec<i64> = first.iter().chain(&second).copied().collect();
    let store = [table("t", 10_000, 256)];
    let pin = 256 + HOT_ROW_OVERHEAD;
    let plan = make_plan(&store, &[tr("t", 10_000, &ids)], 4 * pin, 4).unwrap();
    let t = &plan.tables[0];
    assert!(!t.hot_rows.is_empty(), "{t:?}");
    let k = t.hot_rows.len() as u64;
    assert_eq!(t.hot_rows, (10 - k..10).rev().collect::<Vec<_>>());
    // what they serve in the second half: row r appears 10 - r times there
    let served: u64 = (10 - k..10).map(|r| 10 - r).sum();
    assert!(t.expected_hit_ratio * t.lookups as f64 >= served as f64 - 1e-9);
}

#[test]
fn table_types_follow_working_set_and_locality() {
    let twice = |half: Vec<i64>| -> Vec<i64> { half.iter().chain(&half).copied().collect() };
    let cases = [
        // one row over and over: small, and a one-row cache hits
        (vec![5i64; 100], TableKind::A),
        // ten rows in a cycle: small, but a one-row cache never hits
        ((0..100).map(|i| i % 10).collect(), TableKind::B),
        // half the rows, each read twice in a row: large, a cache of 5 hits half
        ((0..100).map(|i| i / 2).collect(), TableKind::C),
        // every row once: large, no locality
        ((0..100).collect(), TableKind::D),
    ];
    for (half, kind) in cases {
        let ids = twice(half);
        let plan = make_plan(&[table("t", 100, 8)], &[tr("t", 100, &ids)], 0, 1).unwrap();
        assert_eq!(plan.tables[0].kind, kind, "{:?}", plan.tables[0]);
    }
}

/// Second halves of rows never seen before: no curve gains from a partial share, the budget is
/// too small for either table whole, so all of it is spread as row caches by lookups.
#[test]
fn what_no_curve_can_use_is_spread_by_lookups() {
    let fresh = |n: i64, from: i64| -> Vec<i64> { (from..from + n).collect() };
    let a = fresh(600, 0);
    let b = fresh(200, 0);
    let store = [table("a", 10_000, 64), table("b", 10_000, 64)];
    let budget = 4_000;
    let plan = make_plan(
        &store,
        &[tr("a", 10_000, &a), tr("b", 10_000, &b)],
        budget,
        8,
    )
    .unwrap();
    let (pa, pb) = (&plan.tables[0], &plan.tables[1]);
    assert_eq!((pa.lookups, pb.lookups), (300, 100));
    assert_eq!(pa.cache_bytes, budget * 300 / 400);
    assert_eq!(pb.cache_bytes, budget * 100 / 400);
    assert!(pa.hot_rows.is_empty() && pb.hot_rows.is_empty());
    assert_eq!(plan.expected_hit_ratio(), 0.0);
    assert_eq!(plan.bytes(), budget);
}

#[test]
fn a_trace_for_another_store_is_refused() {
    let store = [table("a", 50, 8), table("b", 30, 8)];
    let ids = [1i64, 2, 3, 60];
    let mismatch = |trace: &[TraceTable<'_>]| match make_plan(&store, trace, 1024, 8) {
        Err(PlanError::TraceMismatch {
            table,
            position,
            reason,
        }) => (table, position, reason),
        other => panic!("{other:?}"),
    };
    let (table, position, reason) = mismatch(&[tr("a", 500, &ids)]);
    assert_eq!((table.as_str(), position), ("a", None));
    assert!(reason.contains("500 rows"), "{reason}");
    let (table, position, reason) = mismatch(&[tr("a", 50, &ids)]);
    assert_eq!((table.as_str(), position), ("a", Some(3)));
    assert!(reason.contains("row 60 at position 3"), "{reason}");
    let (table, _, _) = mismatch(&[tr("b", 30, &[0, -1]), tr("a", 50, &ids)]);
    assert_eq!(table, "b");
    let (table, position, reason) = mismatch(&[tr("zz", 5, &[])]);
    assert_eq!((table.as_str(), position), ("zz", None));
    assert!(reason.contains("lacks"), "{reason}");
    assert!(matches!(
        make_plan(&store, &[tr("a", 50, &[1])], 1024, 0),
        Err(PlanError::InvalidArgument { what: "steps", .. })
    ));
}

#[test]
fn planning_from_a_trace_file_is_planning_from_its_tables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.nrtrace");
    let mut rng = lcg(9);
    let a: Vec<i64> = (0..3_000)
        .map(|_| {
            let bound = rng(500) + 1;
            rng(bound) as i64
        })
        .collect();
    let b: Vec<i64> = (0..3_000).map(|_| rng(40) as i64).collect();
    let offsets: Vec<i64> = (0..=1_000).map(|i| i * 3).collect();
    let data = |name, rows, indices| TableData {
        name,
        rows,
        pooling: 3,
        generator: None,
        first_reference_share: None,
        keys: false,
        offsets: &offsets,
        indices,
    };
    write_trace(
        &path,
        64,
        1,
        &[data("a", 500, &a), data("b", 40, &b)],
        false,
    )
    .unwrap();
    let file = TraceFile::open(&path).unwrap();
    let store = [table("b", 40, 32), table("a", 500, 32)];
    let budget = 6_000;
    let from_file = plan_trace_file(&store, &file, budget, DEFAULT_STEPS).unwrap();
    let direct = make_plan(
        &store,
        &[tr("a", 500, &a), tr("b", 40, &b)],
        budget,
        DEFAULT_STEPS,
    )
    .unwrap();
    assert_eq!(from_file.trace, path.display().to_string());
    assert_eq!(from_file.tables, direct.tables);
    let names: Vec<&str> = from_file.tables.iter().map(|t| t.table.as_str()).collect();
    assert_eq!(names, ["a", "b"], "the trace's order");
    let text = from_file.text();
    assert!(text.lines().count() == 4 && text.contains("expected DRAM hit ratio"));
}
