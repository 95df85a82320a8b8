//! The shard planner and the shard plan file: every scheme covers every row once, balances by
//! bytes and by a trace's load, and a plan file that is not one is refused naming the table.

use nearrec_format::{DType, TableMeta};
use nearrec_plan::shards::{SHARD_PLAN, ShardPlan};
use nearrec_plan::{PlanError, Scheme, ShardOptions, TraceTable, plan_shards};
use proptest::prelude::*;

fn table(name: &str, rows: u64, dim: u32) -> TableMeta {
    let dtype = DType::Fp32;
    TableMeta {
        name: name.into(),
        file: format!("{name}.nrt"),
        rows,
        dim,
        dtype,
        row_bytes: dtype.row_bytes(dim),
        block_bytes: 4096,
        data_bytes: rows * dtype.row_bytes(dim),
        data_crc32c: 0,
        order: None,
        sums: None,
        keys: None,
        quant_error: None,
    }
}

fn options(shards: usize, scheme: Scheme) -> ShardOptions {
    ShardOptions {
        shards,
        replicas: 1,
        scheme,
        replicate_hot: 0,
    }
}

/// Every row of every table on exactly one shard, each shard holding something.
fn covers(plan: &ShardPlan, tables: &[TableMeta]) {
    assert_eq!(plan.tables.len(), tables.len());
    let mut held = vec![false; plan.shards];
    for (t, meta) in plan.tables.iter().zip(tables) {
        assert_eq!((t.rows, t.dim), (meta.rows, meta.dim));
        let mut next = 0;
        for p in &t.parts {
            assert_eq!(p.first, next, "{}", t.name);
            assert!(p.rows > 0);
            next += p.rows;
            held[p.shard] = true;
        }
        assert_eq!(next, t.rows, "{}", t.name);
        for id in [0, t.rows / 2, t.rows - 1] {
            let p = &t.parts[t.part_of(id)];
            assert!(p.first <= id && id < p.first + p.rows);
        }
    }
    assert!(held.iter().all(|&h| h), "an empty shard: {plan:?}");
}

#[test]
fn each_scheme_cuts_as_torchrec_names_it() {
    let tables: Vec<TableMeta> = (0..6)
        .map(|i| table(&format!("t{i}"), 1000 * (i + 1), 16))
        .collect();
    let plan = plan_shards("s", &tables, None, &options(3, Scheme::Table)).unwrap();
    covers(&plan, &tables);
    assert!(plan.tables.iter().all(|t| t.parts.len() == 1));
    // whole tables by bytes: 6k+1k, 5k+2k, 4k+3k
    let mut bytes = [0u64; 3];
    for t in &plan.tables {
        bytes[t.parts[0].shard] += t.rows;
    }
    assert_eq!(bytes, [7000, 7000, 7000]);

    let plan = plan_shards("s", &tables, None, &options(4, Scheme::Row)).unwrap();
    covers(&plan, &tables);
    for t in &plan.tables {
        assert_eq!(t.parts.len(), 4);
        assert!(t.parts.iter().all(|p| p.rows.abs_diff(t.rows / 4) <= 1));
    }
    assert_eq!(plan.scheme, Scheme::Row);

    // one table sixteen times the others' bytes: half the cost (half bytes, half lookups),
    // so spread over two shards; the four others whole, two on each of the other shards
    let mut skewed: Vec<TableMeta> = (0..4).map(|i| table(&format!("s{i}"), 1000, 16)).collect();
    skewed.push(table("big", 16_000, 16));
    let plan = plan_shards("s", &skewed, None, &options(4, Scheme::TableRow)).unwrap();
    covers(&plan, &skewed);
    let big: Vec<usize> = plan.tables[4].parts.iter().map(|p| p.shard).collect();
    assert_eq!(big.len(), 2, "{plan:?}");
    let mut small = [0; 4];
    for t in &plan.tables[..4] {
        assert_eq!(t.parts.len(), 1);
        assert!(!big.contains(&t.parts[0].shard), "{plan:?}");
        small[t.parts[0].shard] += 1;
    }
    assert!(small.iter().all(|&k| k == 0 || k == 2), "{plan:?}");
    // auto: whole tables do not balance, so table-row
    let auto = plan_shards("s", &skewed, None, &options(4, Scheme::Auto)).unwrap();
    assert_eq!(auto.scheme, Scheme::TableRow);
    let even: Vec<TableMeta> = (0..8).map(|i| table(&format!("e{i}"), 1000, 16)).collect();
    let auto = plan_shards("s", &even, None, &options(4, Scheme::Auto)).unwrap();
    assert_eq!(auto.scheme, Scheme::Table);
}

#[test]
fn a_trace_spreads_the_rows_it_reads_most() {
    let tables = vec![table("hot", 10_000, 8), table("cold", 1000, 8)];
    // table "hot" is read 20 times as often, and mostly in its first hundred rows
    let hot: Vec<i64> = (0..20_000).map(|i| (i * 7919) % 100).collect();
    let cold: Vec<i64> = (0..1000).map(|i| (i * 7919) % 1000).collect();
    let trace = [
        TraceTable {
            name: "hot",
            rows: 10_000,
            indices: &hot,
            keys: false,
        },
        TraceTable {
            name: "cold",
            rows: 1000,
            indices: &cold,
            keys: false,
        },
    ];
    let mut o = options(4, Scheme::TableRow);
    o.replicate_hot = 10;
    let plan = plan_shards("s", &tables, Some(&trace), &o).unwrap();
    covers(&plan, &tables);
    let (h, c) = (&plan.tables[0], &plan.tables[1]);
    assert!(h.parts.len() > c.parts.len(), "{plan:?}");
    assert!(h.load > 0.9);
    // the cut by cost: the first hundred rows are half the cost, so the first part is short
    assert!(h.parts[0].rows < h.parts.last().unwrap().rows, "{h:?}");
    assert_eq!(h.hot.len(), 10);
    assert!(h.hot.iter().all(|&id| id < 100));
    assert!(c.hot.is_empty(), "a table of one part keeps no hot rows");

    // a trace for another store
    let other = [TraceTable {
        name: "hot",
        rows: 5,
        indices: &[0],
        keys: false,
    }];
    let e = plan_shards("s", &tables, Some(&other), &o).unwrap_err();
    assert!(matches!(e, PlanError::TraceMismatch { .. }), "{e}");
    o.replicate_hot = 5;
    let e = plan_shards("s", &tables, None, &o).unwrap_err();
    assert!(e.to_string().contains("replicate_hot"), "{e}");
}

#[test]
fn impossible_plans_are_refused() {
    let tables = vec![table("a", 100, 4), table("b", 100, 4)];
    for (shards, scheme) in [(0, Scheme::Row), (3, Scheme::Table)] {
        let e = plan_shards("s", &tables, None, &options(shards, scheme)).unwrap_err();
        assert!(matches!(e, PlanError::InvalidArgument { .. }), "{e}");
    }
    // more shards than a table has rows: row-wise gives each shard what there is
    let tiny = vec![table("a", 2, 4)];
    let e = plan_shards("s", &tiny, None, &options(3, Scheme::Row)).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}

#[test]
fn the_plan_file_round_trips_and_a_bad_one_names_the_table() {
    let dir = tempfile::tempdir().unwrap();
    let tables = vec![table("a", 100, 4), table("b", 300, 4)];
    let plan = plan_shards("s", &tables, None, &options(2, Scheme::Row)).unwrap();
    plan.write(dir.path()).unwrap();
    assert_eq!(ShardPlan::read(dir.path()).unwrap(), plan);

    let path = dir.path().join(SHARD_PLAN);
    let text = std::fs::read_to_string(&path).unwrap();
    let edit = |from: &str, to: &str| {
        assert!(text.contains(from), "{from}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        ShardPlan::read(dir.path()).unwrap_err()
    };
    // an edit that keeps the plan well-formed: its id no longer matches
    let e = edit("\"store\": \"s\"", "\"store\": \"t\"");
    assert!(e.to_string().contains("edited"), "{e}");
    // a gap in table b's rows
    let e = edit("\"first\": 150", "\"first\": 151");
    match &e {
        PlanError::BadShardPlan { table, .. } => assert_eq!(table.as_deref(), Some("b"), "{e}"),
        _ => panic!("{e}"),
    }
    let e = edit("\"format\": 1", "\"format\": 2");
    assert!(e.to_string().contains("format 2"), "{e}");
    let e = edit("\"shards\": 2", "\"shard\": 2");
    assert!(e.to_string().contains("not a shard plan"), "{e}");
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        ShardPlan::read(dir.path()).unwrap_err(),
        PlanError::Io { .. }
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the tables, shards and scheme: every row on one shard, no empty shard, or a
    /// typed refusal; and the same input plans the same way twice.
    #[test]
    fn any_plan_covers_every_row_once(
        rows in prop::collection::vec(1u64..5000, 1..8),
        shards in 1usize..9,
        scheme in prop::sample::select(vec![Scheme::Table, Scheme::Row, Scheme::TableRow, Scheme::Auto]),
    ) {
        let tables: Vec<TableMeta> = rows.iter().enumerate()
            .map(|(i, &r)| table(&format!("t{i}"), r, 4)).collect();
        match plan_shards("s", &tables, None, &options(shards, scheme)) {
            Ok(plan) => {
                covers(&plan, &tables);
                prop_assert_eq!(plan_shards("s", &tables, None, &options(shards, scheme)).unwrap(), plan);
            }
            Err(e) => prop_assert!(matches!(e, PlanError::InvalidArgument { .. }), "{}", e),
        }
    }
}

#[test]
fn a_table_created_is_placed_as_the_scheme_places_one_and_the_plan_descends_from_its_parent() {
    let tables = [table("a", 1000, 8), table("b", 10, 8), table("c", 10, 8)];
    let by_table = plan_shards("s", &tables, None, &options(3, Scheme::Table)).unwrap();
    // whole, on the shard that holds least (a holds most; b and c tie: the lower one)
    let grown = by_table.with_table("n", 50, 4, DType::Fp16);
    let n = grown.tables.last().unwrap();
    let least = (by_table.tables[1].parts[0].shard).min(by_table.tables[2].parts[0].shard);
    assert_eq!(n.parts.len(), 1);
    assert_eq!(n.parts[0].shard, least);
    // the tables it had are as they were; the child names its parent and reads back whole
    assert_eq!(grown.tables[..3], by_table.tables[..]);
    assert_eq!(grown.parents, vec![by_table.id.clone()]);
    assert_eq!(grown.root(), by_table.id);
    assert!(grown.descends_from(&by_table.id) && !by_table.descends_from(&grown.id));
    let read = ShardPlan::parse(grown.to_json().as_bytes(), std::path::Path::new("x")).unwrap();
    assert_eq!(read, grown);
    // a cut's id is what it was before plans had parents
    assert!(!by_table.to_json().contains("parents"));

    // row-wise: over every shard, in even ranges
    let by_row = plan_shards("s", &tables, None, &options(3, Scheme::Row)).unwrap();
    let grown = by_row.with_table("n", 10, 4, DType::Fp32);
    let n = grown.tables.last().unwrap();
    assert_eq!(
        n.parts.iter().map(|p| p.rows).collect::<Vec<_>>(),
        [3, 3, 4]
    );
    let mut shards: Vec<usize> = n.parts.iter().map(|p| p.shard).collect();
    shards.sort_unstable();
    assert_eq!(shards, [0, 1, 2]);
    // fewer rows than shards: a part a row
    assert_eq!(
        by_row.with_table("m", 2, 4, DType::Fp32).tables[3]
            .parts
            .len(),
        2
    );

    // dropped: gone, the rest as they were, two generations down from the cut
    let dropped = grown.without_table("b").unwrap().unwrap();
    assert!(dropped.tables.iter().all(|t| t.name != "b"));
    assert_eq!(dropped.parents, vec![by_row.id.clone(), grown.id.clone()]);
    assert_eq!(dropped.root(), by_row.id);
    assert!(grown.without_table("nope").is_none());
    // a shard left without a table is no plan: said, naming the shard
    let reason = by_table.without_table("b").unwrap().unwrap_err();
    assert!(reason.contains("holds no table"), "{reason}");
}
