//! Live stores through the facade: writes and removes are seen by the next lookup on every
//! tier, survive a reopen (the log replayed), reach read-only openers on `refresh`, are refused
//! whole when bad, and never show a reader half of a call; one writer per store.

use nearrec::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nearrec::{
    Bags, Batch, Error, Indices, RowValues, RowWrite, Store, StoreApi, StoreConfig, TableLookup,
    WriteOptions,
};
use nearrec_format::DType;
use proptest::prelude::*;

const ROWS: u64 = 300;
const TABLES: [(&str, u32, DType); 3] = [
    ("a", 8, DType::Fp32),
    ("b", 4, DType::Fp16),
    ("c", 6, DType::Int8),
];

use nearrec_testkit::pattern as base_value;

fn store(dir: &Path) -> PathBuf {
    let tables = TABLES.map(|(name, dim, dtype)| (name, ROWS, dim, dtype));
    nearrec_testkit::write_store(dir.join("store"), &tables, base_value)
}

fn config(toml: &str, writable: bool) -> StoreConfig {
    let mut c = StoreConfig::from_toml(toml).unwrap();
    c.writable = writable;
    c
}

const TIERS: [&str; 3] = [
    "tier = \"dram\"",
    "tier = \"ssd\"",
    "tier = \"ssd\"\ndram_budget = \"16KiB\"\ncache_policy = \"lru\"",
];

/// Each table's row `r` as a lookup of one bag holding only it: the decoded row.
fn rows_of(store: &Store, t: usize, rows: &[i64]) -> Vec<Vec<f32>> {
    let lengths = vec![1i64; rows.len()];
    let batch = Batch::new(vec![TableLookup::new(
        TABLES[t].0,
        Indices::I64(rows),
        Bags::Lengths(Indices::I64(&lengths)),
    )]);
    let pooled = store.lookup(&batch).unwrap();
    let dim = TABLES[t].1 as usize;
    pooled.0.values.chunks(dim).map(<[f32]>::to_vec).collect()
}

/// What the table's encoding makes of `values` (int8 and fp16 round).
fn encoded(t: usize, values: &[f32]) -> Vec<f32> {
    let (_, dim, dtype) = TABLES[t];
    let mut bytes = vec![0u8; dtype.row_bytes(dim) as usize];
    dtype.encode_row(values, &mut bytes);
    let mut out = vec![0f32; dim as usize];
    dtype.decode_row(&bytes, &mut out);
    out
}

fn new_row(t: usize, seed: u64) -> Vec<f32> {
    (0..TABLES[t].1)
        .map(|j| (seed % 101) as f32 * 0.02 - j as f32 * 0.1)
        .collect()
}

#[test]
fn writes_and_removes_are_seen_at_once_and_after_a_reopen() {
    for tier in TIERS {
        let dir = tempfile::tempdir().unwrap();
        let path = store(dir.path());
        let s = Store::open(&path, &config(tier, true)).unwrap();
        assert!(s.writable());
        let before = rows_of(&s, 0, &[5, 6]);
        let v1 = s.write("a", &[5], &new_row(0, 1)).unwrap();
        let v2 = s.remove("a", &[6]).unwrap();
        assert!(v2 > v1, "{tier}");
        assert_eq!(s.version().unwrap(), v2);
        let after = rows_of(&s, 0, &[5, 6, 7]);
        assert_eq!(after[0], encoded(0, &new_row(0, 1)), "{tier}");
        assert_eq!(
            after[1],
            vec![0.0; 8],
            "a removed row pools as zeros ({tier})"
        );
        assert_ne!(after[0], before[0]);
        // int8 is re-quantised row-wise
        s.write("c", &[9], &new_row(2, 3)).unwrap();
        assert_eq!(
            rows_of(&s, 2, &[9])[0],
            encoded(2, &new_row(2, 3)),
            "{tier}"
        );
        let stats: HashMap<_, _> = s.live_stats().into_iter().collect();
        assert_eq!(stats["log_records"], 3.0);
        assert!(stats["removed_served"] >= 1.0);
        drop(s);
        // the log is replayed on open, writable or not
        for writable in [true, false] {
            let s = Store::open(&path, &config(tier, writable)).unwrap();
            assert_eq!(s.version().unwrap(), 3, "{tier}");
            assert_eq!(rows_of(&s, 0, &[5])[0], encoded(0, &new_row(0, 1)));
            assert_eq!(rows_of(&s, 0, &[6])[0], vec![0.0; 8]);
            assert_eq!(rows_of(&s, 2, &[9])[0], encoded(2, &new_row(2, 3)));
        }
    }
}

/// Issue 62, item 3, through the store: a bit flipped in the last logged write. The default
/// open drops that write and says so (`wal_tail_dropped`, a warning naming the record); with
/// `wal_recovery = "absolute"` the open is refused as `Corrupted`, naming the record.
#[test]
fn a_damaged_last_write_is_reported_or_refused_never_dropped_silently() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let s = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
    let before = rows_of(&s, 0, &[5]);
    for (k, row) in [1, 2, 3, 4].into_iter().enumerate() {
        s.write("a", &[k as i64 + 1], &new_row(0, row)).unwrap();
    }
    let last = s.write("a", &[5], &new_row(0, 9)).unwrap();
    drop(s);
    let segment = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "nrwal"))
        .unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    let end = bytes.iter().rposition(|&b| b != 0).unwrap();
    bytes[end - 8] ^= 0x04; // inside the last record's rows
    std::fs::write(&segment, &bytes).unwrap();

    let e = Store::open(
        &path,
        &config("tier = \"dram\"\nwal_recovery = \"absolute\"", true),
    )
    .unwrap_err();
    assert_eq!(e.kind(), nearrec::ErrorKind::StoreCorrupted, "{e}");
    assert!(e.to_string().contains(&format!("record {last}")), "{e}");

    let s = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
    assert_eq!(s.version().unwrap(), last - 1);
    assert_eq!(
        rows_of(&s, 0, &[5]),
        before,
        "the damaged write is not served"
    );
    let stats: HashMap<_, _> = s.live_stats().into_iter().collect();
    assert_eq!(stats["wal_tail_dropped"], 1.0);
}

#[test]
fn one_writer_and_readers_that_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let writer = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
    let err = Store::open(&path, &config("tier = \"dram\"", true)).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    let reader = Store::open(&path, &config("tier = \"ssd\"", false)).unwrap();
    let err = reader.write("a", &[1], &new_row(0, 1)).unwrap_err();
    assert!(matches!(err, Error::ReadOnly { .. }), "{err}");
    writer.write("a", &[1], &new_row(0, 7)).unwrap();
    writer.write("b", &[2], &new_row(1, 8)).unwrap();
    // a reader keeps the version it has until it refreshes
    assert_eq!(reader.version().unwrap(), 0);
    assert_eq!(rows_of(&reader, 0, &[1])[0].len(), 8);
    assert_ne!(rows_of(&reader, 0, &[1])[0], encoded(0, &new_row(0, 7)));
    assert_eq!(reader.refresh().unwrap(), 2);
    assert_eq!(rows_of(&reader, 0, &[1])[0], encoded(0, &new_row(0, 7)));
    assert_eq!(rows_of(&reader, 1, &[2])[0], encoded(1, &new_row(1, 8)));
    // a writer open does not keep an attach (which takes the directory's short lock) waiting,
    // in this process or another
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || tx.send(nearrec::attach(&p, "note", b"hello").map(|_| ())));
    let attached = rx.recv_timeout(std::time::Duration::from_secs(20));
    assert!(matches!(attached, Ok(Ok(()))), "{attached:?}");
    // the lock goes with the writer
    drop(writer);
    let again = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
    assert_eq!(again.version().unwrap(), 2);
}

#[test]
fn bad_calls_are_typed_errors_and_apply_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let s = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
    let good = new_row(0, 1);
    let mut nan = new_row(1, 2);
    nan[3] = f32::NAN;
    let cases: Vec<(Vec<RowWrite<'_>>, &str, Option<usize>)> = vec![
        (
            vec![RowWrite {
                table: "a",
                ids: &[1, 2],
                values: Some(RowValues::F32(&good)),
            }],
            "2 ids need 16 values",
            None,
        ),
        (
            vec![RowWrite {
                table: "a",
                ids: &[300],
                values: Some(RowValues::F32(&good)),
            }],
            "ids[0] = 300",
            Some(0),
        ),
        (
            vec![RowWrite {
                table: "a",
                ids: &[-1],
                values: None,
            }],
            "ids[0] = -1",
            Some(0),
        ),
        (
            // the first table's rows are fine: nothing of the call is applied
            vec![
                RowWrite {
                    table: "a",
                    ids: &[1],
                    values: Some(RowValues::F32(&good)),
                },
                RowWrite {
                    table: "b",
                    ids: &[4],
                    values: Some(RowValues::F32(&nan)),
                },
            ],
            "rows[0][3] is NaN",
            Some(0),
        ),
        (
            vec![RowWrite {
                table: "zz",
                ids: &[1],
                values: None,
            }],
            "zz",
            None,
        ),
    ];
    for (writes, says, position) in cases {
        let err = s.write_many(&writes, WriteOptions::default()).unwrap_err();
        assert!(err.to_string().contains(says), "{err} should say {says}");
        if let Error::InvalidRequest { position: p, .. } = &err {
            assert_eq!(*p, position, "{err}");
        }
    }
    assert_eq!(s.version().unwrap(), 0);
    let stats: HashMap<_, _> = s.live_stats().into_iter().collect();
    assert_eq!((stats["log_records"], stats["delta_rows"]), (0.0, 0.0));
    // allowed, a non-finite row is written
    let w = RowWrite {
        table: "b",
        ids: &[4],
        values: Some(RowValues::F32(&nan)),
    };
    s.write_many(
        &[w],
        WriteOptions {
            allow_nonfinite: true,
        },
    )
    .unwrap();
    assert!(rows_of(&s, 1, &[4])[0][3].is_nan());
}

#[test]
fn a_full_delta_refuses_the_call_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let mut c = config("tier = \"dram\"", true);
    c.delta_budget = nearrec::Size(1 << 20);
    c.durability = nearrec::DurabilityMode::Async;
    c.auto_compact = false;
    let s = Store::open(&path, &c).unwrap();
    // a reader that holds the first version keeps every later row in the delta
    let held = s.snapshot();
    let ids: Vec<i64> = (0..ROWS as i64).collect();
    let values = vec![0.5f32; ids.len() * 8];
    // 80 B per fp32 row of dim 8 (32 B + 48): 1 MiB holds 43 calls of 300 rows
    let mut n = 0;
    let err = loop {
        match s.write("a", &ids, &values) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 1000, "the delta never filled");
    };
    assert!(matches!(err, Error::DeltaFull { .. }), "{err}");
    assert_eq!(n, (1u64 << 20) / (300 * 80));
    assert_eq!(s.version().unwrap(), n);
    // without the old reader, a rewrite of the same rows replaces them
    drop(held);
    s.write("a", &ids[..1], &values[..8]).unwrap();
}

/// Readers on several threads while a writer writes one value into a row of every table per
/// call: every batch sees one call's value in all three (never half of a call), every row whole.
#[test]
fn readers_never_see_half_of_a_call() {
    for tier in TIERS {
        let dir = tempfile::tempdir().unwrap();
        let path = store(dir.path());
        let mut c = config(tier, true);
        c.durability = nearrec::DurabilityMode::Async;
        let s = Store::open(&path, &c).unwrap();
        // one call writes x into row 17 of every table (a = [x; 8], b = [x; 4], c = [x; 6])
        let write_all = |x: f32| {
            let (a, b, cc) = (vec![x; 8], vec![x; 4], vec![x; 6]);
            let writes = [("a", &a), ("b", &b), ("c", &cc)].map(|(table, v)| RowWrite {
                table,
                ids: &[17],
                values: Some(RowValues::F32(v.as_slice())),
            });
            s.write_many(&writes, WriteOptions::default()).unwrap();
        };
        write_all(0.0);
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (s, done) = (s.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut seen = 0;
                    while !done.load(Ordering::Relaxed) || seen == 0 {
                        let ids = [17i64];
                        let lengths = [1i64];
                        let batch = Batch::new(
                            TABLES
                                .iter()
                                .map(|t| {
                                    TableLookup::new(
                                        t.0,
                                        Indices::I64(&ids),
                                        Bags::Lengths(Indices::I64(&lengths)),
                                    )
                                })
                                .collect(),
                        );
                        let v = s.lookup(&batch).unwrap().0.values;
                        // a = [x; 8], b = [x; 4], c = [x; 6]: one x everywhere
                        let x = v[0];
                        assert!(v.iter().all(|&y| y == x), "{tier}: a torn batch {v:?}");
                        seen += 1;
                    }
                    seen
                })
            })
            .collect();
        for call in 1..=200u32 {
            // small integers: exact in fp32, fp16 and int8 (a constant row)
            write_all((call % 50) as f32);
            if call % 40 == 0 {
                // the base moves under the readers
                s.compact().unwrap();
            }
        }
        done.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    }
}

#[derive(Debug, Clone)]
enum Step {
    Write(usize, Vec<u64>, u64),
    Remove(usize, Vec<u64>),
    Look(usize, Vec<u64>),
    Compact,
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    let ids = prop::collection::vec(prop_oneof![0u64..8, 0..ROWS], 1..5);
    prop_oneof![
        3 => (0usize..3, ids.clone(), any::<u64>()).prop_map(|(t, i, s)| Step::Write(t, i, s)),
        1 => (0usize..3, ids.clone()).prop_map(|(t, i)| Step::Remove(t, i)),
        3 => (0usize..3, ids).prop_map(|(t, i)| Step::Look(t, i)),
        1 => Just(Step::Compact),
        1 => Just(Step::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Random writes, removes, lookups, compactions and reopens on each tier against a map of
    /// rows.
    #[test]
    fn a_live_store_is_its_rows(steps in prop::collection::vec(step(), 1..30), tier in 0usize..3) {
        let dir = tempfile::tempdir().unwrap();
        let path = store(dir.path());
        let c = config(TIERS[tier], true);
        let mut s = Store::open(&path, &c).unwrap();
        let mut model: HashMap<(usize, u64), Vec<f32>> = HashMap::new();
        let want = |model: &HashMap<(usize, u64), Vec<f32>>, t: usize, r: u64| {
            let dim = TABLES[t].1 as usize;
            model.get(&(t, r)).cloned().unwrap_or_else(|| {
                encoded(t, &(0..dim as u64).map(|j| base_value(t, r * dim as u64 + j)).collect::<Vec<_>>())
            })
        };
        for st in steps {
            match st {
                Step::Write(t, ids, seed) => {
                    let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
                    let rows: Vec<Vec<f32>> = (0..ids.len() as u64).map(|k| new_row(t, seed + k)).collect();
                    s.write(TABLES[t].0, &ids, &rows.concat()).unwrap();
                    for (i, row) in ids.iter().zip(rows) {
                        model.insert((t, *i as u64), encoded(t, &row));
                    }
                }
                Step::Remove(t, ids) => {
                    let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
                    s.remove(TABLES[t].0, &ids).unwrap();
                    for i in ids {
                        model.insert((t, i as u64), vec![0.0; TABLES[t].1 as usize]);
                    }
                }
                Step::Look(t, ids) => {
                    let rows: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
                    let got = rows_of(&s, t, &rows);
                    for (r, g) in ids.iter().zip(got) {
                        let w = want(&model, t, *r);
                        let close = g.iter().zip(&w).all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs().max(1.0));
                        prop_assert!(close, "table {} row {}: {:?} vs {:?}", t, r, g, w);
                    }
                }
                Step::Compact => {
                    let version = s.version().unwrap();
                    let done = s.compact().unwrap();
                    prop_assert_eq!(done.version, version);
                    let stats: HashMap<_, _> = s.live_stats().into_iter().collect();
                    prop_assert_eq!(stats["base_version"], version as f64);
                    prop_assert_eq!(stats["delta_rows"], 0.0);
                }
                Step::Reopen => {
                    let version = s.version().unwrap();
                    drop(s);
                    s = Store::open(&path, &c).unwrap();
                    prop_assert_eq!(s.version().unwrap(), version);
                }
            }
        }
    }
}

#[test]
fn a_table_synced_from_a_trainer_gets_the_rows_that_differ() {
    let dir = tempfile::tempdir().unwrap();
    let path = store(dir.path());
    let s = Store::open(&path, &config("tier = \"ssd\"", true)).unwrap();
    for (t, &(name, dim, _)) in TABLES.iter().enumerate() {
        let dim = dim as usize;
        // the trainer's table: the store's rows, three changed (one by less than the tolerance)
        let mut values: Vec<f32> = (0..ROWS as usize * dim)
            .map(|i| base_value(t, i as u64))
            .collect();
        values[5 * dim..6 * dim].fill(0.5);
        values[9 * dim] += 0.25;
        values[11 * dim] += 1e-4;
        let done = s.sync_table(name, &values, 1e-3).unwrap();
        assert_eq!(
            (done.compared, done.written, done.calls),
            (ROWS, 2, 1),
            "{name}"
        );
        assert_eq!(rows_of(&s, t, &[5])[0], encoded(t, &[0.5; 8][..dim]));
        // nothing differs any more
        assert_eq!(s.sync_table(name, &values, 1e-3).unwrap().written, 0);
    }
    let err = s.sync_table("a", &[0.0; 3], 0.0).unwrap_err();
    assert!(err.to_string().contains("values"), "{err}");
}
