//! The DRAM tiers in front of the SSD tier give the DRAM-resident path's results (within fp32
//! rounding) in every placement, policy and pooling mode, also under concurrent readers; their
//! counters add up; bad placements are typed errors. A co-located copy of the store (rows
//! permuted in the files) gives the same results and reads rows stored together together.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nearrec_cache::{CacheConfig, Policy};
use nearrec_engine::{
    Bags, Batch, Engine, EngineConfig, EngineError, Indices, PoolingMode, TableLookup, Tier,
};
use std::sync::atomic::Ordering::Relaxed;

use nearrec_format::{DType, RowOrder, StoreOptions, StoreReader, copy_ordered};
use nearrec_plan::{Placement, TablePlacement};

const ROWS: u64 = 3000;
const TABLES: [(&str, u32, DType); 3] = [
    ("a", 16, DType::Fp32),
    ("b", 8, DType::Fp16),
    ("c", 12, DType::Int8),
];

/// A copy of the store at `src` with rows of tables `a` and `c` permuted (`c` reversed, `a`
/// by `order_a`).
fn colocated(src: &Path, order_a: RowOrder) -> PathBuf {
    let dst = src.with_file_name("colocated");
    let reversed = RowOrder::from_slots((0..ROWS as u32).rev().collect()).unwrap();
    let reader = StoreReader::open(src).unwrap();
    let opts = StoreOptions {
        overwrite: true,
        ..StoreOptions::default()
    };
    copy_ordered(
        &reader,
        &dst,
        &[Some(order_a), None, Some(reversed)],
        opts,
        None,
    )
    .unwrap();
    dst
}

/// Rows `0, 71, 142, ...` (the test batches' hot rows) first, the others after them.
fn hot_first() -> RowOrder {
    let mut rows: Vec<u32> = (0..40).map(|i| i * 71).collect();
    rows.extend((0..ROWS as u32).filter(|r| r % 71 != 0 || *r >= 40 * 71));
    RowOrder::from_rows_by_slot(&rows).unwrap()
}

fn store(dir: &Path) -> PathBuf {
    let tables = TABLES.map(|(name, dim, dtype)| (name, ROWS, dim, dtype));
    nearrec_testkit::write_store(dir.join("store"), &tables, nearrec_testkit::pattern)
}

/// One batch: skewed indices (so caches hit), variable bags, weights / mean / max / padding.
struct Sample {
    indices: Vec<i64>,
    offsets: Vec<i64>,
    weights: Vec<f32>,
}

fn batch(seed: u64, bags: usize) -> Sample {
    let mut rng = nearrec_testkit::Xorshift::new(seed);
    let mut next = move || rng.next_u64();
    let (mut indices, mut offsets) = (Vec::new(), Vec::new());
    for _ in 0..bags {
        offsets.push(indices.len() as i64);
        for _ in 0..next() % 9 {
            // half the lookups on 40 hot rows, the rest anywhere
            let r = if next() % 2 == 0 {
                next() % 40 * 71
            } else {
                next() % ROWS
            };
            indices.push(r as i64);
        }
    }
    let weights = (0..indices.len()).map(|i| 0.25 + (i % 5) as f32).collect();
    Sample {
        indices,
        offsets,
        weights,
    }
}

fn run(engine: &Engine, b: &Sample) -> Vec<f32> {
    let tables = TABLES
        .iter()
        .enumerate()
        .map(|(t, &(name, _, _))| {
            let req = TableLookup::new(
                name,
                Indices::I64(&b.indices),
                Bags::Offsets {
                    offsets: Indices::I64(&b.offsets),
                    include_last_offset: false,
                },
            );
            match t {
                0 => req.with_weights(&b.weights),
                1 => req.with_mode(PoolingMode::Mean).with_padding_idx(0),
                _ => req.with_mode(PoolingMode::Max),
            }
        })
        .collect();
    engine.lookup(&Batch::new(tables)).unwrap().1
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{what}: cell {k}: {g} vs {w}"
        );
    }
}

fn ssd(placement: Placement, policy: Policy) -> EngineConfig {
    EngineConfig {
        tier: Tier::Ssd,
        // tables' hits pooled on parallel workers even for these small batches
        threads: 3,
        inline_lookups: 0,
        placement: Some(placement),
        cache: CacheConfig {
            policy,
            ways: 4,
            ..CacheConfig::default()
        },
        ..EngineConfig::default()
    }
}

fn placement(entries: &[(&str, TablePlacement)]) -> Placement {
    Placement {
        tables: entries
            .iter()
            .map(|(n, p)| ((*n).to_owned(), p.clone()))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn cache(bytes: u64) -> TablePlacement {
    TablePlacement {
        cache_bytes: bytes,
        ..TablePlacement::default()
    }
}

fn hot(rows: impl Iterator<Item = u64>, cache_bytes: u64) -> TablePlacement {
    TablePlacement {
        hot_rows: rows.collect(),
        cache_bytes,
        ..TablePlacement::default()
    }
}

fn resident() -> TablePlacement {
    TablePlacement {
        resident: true,
        ..TablePlacement::default()
    }
}

#[test]
fn every_placement_and_policy_matches_the_dram_tier() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let plain = StoreReader::open(&path).unwrap();
    let moved = StoreReader::open(colocated(&path, hot_first())).unwrap();
    let dram = Engine::from_reader(&plain, EngineConfig::default(), None).unwrap();
    let batches: Vec<Sample> = (0..6).map(|s| batch(s + 1, 64)).collect();
    let want: Vec<Vec<f32>> = batches.iter().map(|b| run(&dram, b)).collect();
    // a co-located store loaded whole is put back in row order
    let moved_dram = Engine::from_reader(&moved, EngineConfig::default(), None).unwrap();
    for (b, w) in batches.iter().zip(&want) {
        assert_close(&run(&moved_dram, b), w, "co-located, DRAM tier");
    }
    let layouts = [
        (
            "caches",
            placement(&[("a", cache(4096)), ("b", cache(2048)), ("c", cache(8192))]),
        ),
        (
            "hot",
            placement(&[
                ("a", hot((0..40).map(|i| i * 71), 0)),
                ("b", hot((0..20).map(|i| i * 71), 1024)),
                ("c", hot([5, 2999].into_iter(), 0)),
            ]),
        ),
        (
            "mixed",
            placement(&[("a", resident()), ("b", hot((0..40).map(|i| i * 71), 4096))]),
        ),
        (
            "resident",
            placement(&[("a", resident()), ("b", resident()), ("c", resident())]),
        ),
    ];
    for (reader, name, p) in [&plain, &moved]
        .into_iter()
        .flat_map(|r| layouts.iter().map(move |(n, p)| (r, *n, p)))
    {
        let store = if reader.order(0).is_some() {
            "co-located"
        } else {
            "plain"
        };
        for policy in Policy::ALL {
            let engine = Engine::from_reader(reader, ssd(p.clone(), policy), None).unwrap();
            for (i, (b, w)) in batches.iter().zip(&want).enumerate() {
                let what = format!("{store} {name} {policy} batch {i}");
                assert_close(&run(&engine, b), w, &what);
            }
            let lookups: u64 = batches.iter().map(|b| b.indices.len() as u64).sum();
            let padding: u64 = batches
                .iter()
                .map(|b| b.indices.iter().filter(|&&i| i == 0).count() as u64)
                .sum();
            let report = engine.tier_report();
            for r in &report {
                let served = r.lookups_resident + r.lookups_hot + r.lookups_cache + r.lookups_ssd;
                let want = if r.table == "b" {
                    lookups - padding
                } else {
                    lookups
                };
                assert_eq!(served, want, "{name} {policy}: table {}", r.table);
                assert_eq!(r.cache.hits, r.cache.hits.min(r.lookups_cache));
            }
            let by = |t: &str| report.iter().find(|r| r.table == t).unwrap();
            match name {
                "caches" => assert!(by("a").lookups_cache > 0, "{policy}: the cache hits"),
                "hot" => assert!(by("a").lookups_hot > 0 && by("c").hot_rows == 2),
                "mixed" => assert!(by("a").resident && by("a").lookups_ssd == 0),
                _ => assert!(report.iter().all(|r| r.lookups_ssd == 0)),
            }
            if name == "resident" {
                assert_eq!(engine.io_stats().unwrap().device_reads.load(Relaxed), 0);
            }
        }
    }
}

#[test]
fn rows_stored_together_are_read_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let moved = colocated(&path, hot_first());
    // one bag of the 40 rows `i * 71`: 40 blocks apart in row order, one block co-located
    let rows: Vec<i64> = (0..40).map(|i| i * 71).collect();
    let reads = |store: &Path, merge: bool| {
        let reader = StoreReader::open(store).unwrap();
        let config = EngineConfig {
            tier: Tier::Ssd,
            merge,
            ..EngineConfig::default()
        };
        let engine = Engine::from_reader(&reader, config, None).unwrap();
        let req = TableLookup::new(
            "a",
            Indices::I64(&rows),
            Bags::Fixed {
                batch: 1,
                bag_size: rows.len(),
            },
        );
        let got = engine.lookup(&Batch::new(vec![req])).unwrap().1;
        (engine.io_stats().unwrap().device_reads.load(Relaxed), got)
    };
    let (plain, want) = reads(&path, true);
    let (together, got) = reads(&moved, true);
    assert_close(&got, &want, "co-located bag");
    assert_eq!((plain, together), (40, 1));
    // without merging every row is its own read, wherever it sits
    assert_eq!((reads(&path, false).0, reads(&moved, false).0), (40, 40));
}

/// A row cache large enough for every row serves every lookup once each row has been read:
/// alone, and behind a hot partition (the lookups it lacks are searched in the cache later
/// than the others), long batches included (more lookups ahead than the source's ring). Fails
/// when a set or slot found ahead of a lookup is not the one its row is read from.
#[test]
fn a_cache_holding_every_row_serves_every_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let reader = StoreReader::open(store(dir.path())).unwrap();
    let dram = Engine::from_reader(&reader, EngineConfig::default(), None).unwrap();
    // slots for 64 times the rows: no 4-way set is asked to hold more than 4 of them
    let whole = |t: usize| {
        let (_, dim, dtype) = TABLES[t];
        nearrec_cache::RowCache::budget_for_rows(64 * ROWS, dtype.row_bytes(dim) as usize, 4)
    };
    let layouts = [
        placement(&[
            ("a", cache(whole(0))),
            ("b", cache(whole(1))),
            ("c", cache(whole(2))),
        ]),
        placement(&[
            ("a", hot((0..40).map(|i| i * 71), whole(0))),
            ("b", hot((0..3).map(|i| i * 1000), whole(1))),
            ("c", cache(whole(2))),
        ]),
    ];
    for (l, p) in layouts.into_iter().enumerate() {
        for policy in Policy::ALL {
            let engine = Engine::from_reader(&reader, ssd(p.clone(), policy), None).unwrap();
            // every row once (a free slot for each: nothing evicted, whatever the policy)
            let all = Sample {
                indices: (0..ROWS as i64).collect(),
                offsets: (0..ROWS as i64).step_by(100).collect(),
                weights: vec![1.0; ROWS as usize],
            };
            run(&engine, &all);
            let before = engine.tier_report();
            eprintln!("{:?}", before[0]);
            for i in 0..4 {
                let b = batch(7 + i, 200);
                assert_close(
                    &run(&engine, &b),
                    &run(&dram, &b),
                    &format!("layout {l} {policy}"),
                );
            }
            for (r, was) in engine.tier_report().iter().zip(&before) {
                assert_eq!(
                    r.lookups_ssd, was.lookups_ssd,
                    "layout {l} {policy}: table {} read rows its cache holds from the disk",
                    r.table
                );
                assert!(r.lookups_cache > was.lookups_cache);
                assert_eq!(r.cache.evictions, 0);
            }
        }
    }
}

#[test]
fn concurrent_readers_share_the_caches() {
    let dir = tempfile::tempdir().unwrap();
    let reader = StoreReader::open(store(dir.path())).unwrap();
    let dram = Engine::from_reader(&reader, EngineConfig::default(), None).unwrap();
    let p = placement(&[
        ("a", cache(4096)),
        ("b", hot((0..10).map(|i| i * 71), 2048)),
        ("c", cache(1024)),
    ]);
    let engine = Engine::from_reader(&reader, ssd(p, Policy::LfuPa), None).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (engine, dram) = (&engine, &dram);
            s.spawn(move || {
                for i in 0..8 {
                    let b = batch(100 * t + i, 32);
                    assert_close(
                        &run(engine, &b),
                        &run(dram, &b),
                        &format!("thread {t} batch {i}"),
                    );
                }
            });
        }
    });
    let a = &engine.tier_report()[0];
    assert!(a.cache.hits > 0 && a.cache.admissions > 0);
}

#[test]
fn default_placement_fills_the_budget_and_bad_placements_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let reader = StoreReader::open(store(dir.path())).unwrap();
    let bytes: Vec<u64> = reader.tables().iter().map(|t| t.data_bytes).collect();
    // a budget that keeps the smallest table whole (it fits a third) and caches the rest
    let budget = bytes.iter().min().unwrap() * 3 + 1;
    let engine = Engine::from_reader(
        &reader,
        EngineConfig {
            tier: Tier::Ssd,
            dram_budget_bytes: Some(budget),
            ..EngineConfig::default()
        },
        None,
    )
    .unwrap();
    let report = engine.tier_report();
    assert_eq!(report.iter().filter(|r| r.resident).count(), 1);
    assert!(
        report
            .iter()
            .filter(|r| !r.resident)
            .all(|r| r.cache_rows > 0)
    );
    assert!(report.iter().map(|r| r.bytes).sum::<u64>() <= budget);
    // explicit tier = ssd without a budget: no DRAM tiers
    let plain =
        Engine::from_reader(&reader, EngineConfig::default().with_tier(Tier::Ssd), None).unwrap();
    assert!(plain.tier_report().iter().all(|r| r.bytes == 0));

    let open = |p: Placement, budget: Option<u64>| {
        Engine::from_reader(
            &reader,
            EngineConfig {
                dram_budget_bytes: budget,
                ..ssd(p, Policy::Lru)
            },
            None,
        )
    };
    assert!(matches!(
        open(placement(&[("zz", cache(10))]), None),
        Err(EngineError::UnknownTable { name, .. }) if name == "zz"
    ));
    assert!(matches!(
        open(placement(&[("b", hot([1, 3000].into_iter(), 0))]), None),
        Err(EngineError::IndexOutOfRange { table, position: 1, value: 3000, .. }) if table == "b"
    ));
    assert!(matches!(
        open(placement(&[("b", hot([4, 4].into_iter(), 0))]), None),
        Err(EngineError::InvalidRequest { table, .. }) if table == "b"
    ));
    assert!(matches!(
        open(placement(&[("a", resident())]), Some(100)),
        Err(EngineError::Config(msg)) if msg.contains("more than dram_budget")
    ));
    let bad_p = EngineConfig {
        cache: CacheConfig {
            admission_probability: 1.5,
            ..CacheConfig::default()
        },
        ..EngineConfig::default()
    };
    assert!(matches!(bad_p.validate(), Err(EngineError::Config(_))));
}

/// A paced warm-up (a swap's, beside lookups) loads what an unpaced one does, and tells its
/// pacer the cost of every read as it goes, a few rows at a time, each read at least 4 KiB: a
/// pacer that sleeps there leaves the disk to the lookups between its chunks.
#[test]
fn a_paced_warm_up_tells_its_pacer_every_read_as_it_goes() {
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let reader = StoreReader::open(store(dir.path())).unwrap();
    // room for 2,048 rows of `a` (64 bytes each), in sets of 4 ways
    let config = || ssd(placement(&[("a", cache(128 << 10))]), Policy::Lru);
    let rows: Vec<u64> = (0..ROWS).step_by(3).collect();
    let unpaced = Engine::from_reader(&reader, config(), None).unwrap();
    let loaded = unpaced.warm(0, &rows, None).unwrap();
    assert!(
        loaded > 500,
        "the cache takes a good part of the rows ({loaded})"
    );

    let told = Arc::new(Mutex::new(Vec::new()));
    let pace: nearrec_format::ProgressFn = {
        let told = told.clone();
        Arc::new(move |bytes| told.lock().unwrap().push(bytes))
    };
    let paced = Engine::from_reader(&reader, config(), None).unwrap();
    assert_eq!(paced.warm(0, &rows, Some(&pace)).unwrap(), loaded);
    let told = told.lock().unwrap();
    // every row asked for is read (fewer than the cache holds), a row whose set is full too
    assert_eq!(
        told.iter().sum::<u64>(),
        rows.len() as u64 * 4096,
        "{told:?}"
    );
    assert!(
        told.len() >= 100 && told.iter().all(|&b| b <= 8 * 4096),
        "{told:?}"
    );
    // and the same rows were loaded: the same lookups read the disk as often on both
    let b = Sample {
        indices: rows.iter().map(|&r| r as i64).collect(),
        offsets: vec![0],
        weights: vec![1.0; rows.len()],
    };
    let reads = |e: &Engine| {
        let before = e.io_stats().unwrap().device_reads.load(Relaxed);
        let got = run(e, &b);
        (
            e.io_stats().unwrap().device_reads.load(Relaxed) - before,
            got,
        )
    };
    let ((paced_reads, got), (unpaced_reads, want)) = (reads(&paced), reads(&unpaced));
    assert_eq!(paced_reads, unpaced_reads);
    assert!(paced_reads > 0);
    assert_close(&got, &want, "paced vs unpaced warm-up");
}
