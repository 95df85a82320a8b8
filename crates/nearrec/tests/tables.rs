//! Tables created and dropped in a live store: served at once on every tier, kept by a reopen,
//! followed by read-only openers, redone after a writer killed between its log append and its
//! manifest, refused whole when bad, and never in the way of lookups of the other tables.

use nearrec::SwapTo;
use nearrec::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nearrec::{Bags, Batch, Error, Indices, Init, Store, StoreConfig, TableLookup};
use nearrec_format::{DType, StoreOptions, StoreWriter, TableSpec, UniformInit};
use proptest::prelude::*;

const ROWS: u64 = 500;

fn make_store(dir: &Path) -> PathBuf {
    let tables = [("a", ROWS, 8, DType::Fp32), ("b", ROWS, 4, DType::Fp32)];
    // row r is r
    nearrec_testkit::write_store(dir.join("store"), &tables, |t, i| {
        (i / u64::from(tables[t].2)) as f32
    })
}

const TIERS: [&str; 3] = [
    "tier = \"dram\"",
    "tier = \"ssd\"\ndram_budget = \"0\"",
    "tier = \"ssd\"\ndram_budget = \"8KiB\"",
];

fn config(toml: &str, writable: bool) -> StoreConfig {
    let mut c = StoreConfig::from_toml(toml).unwrap();
    c.writable = writable;
    c.auto_compact = false;
    c
}

/// Rows `ids` of `table`, one-row bags.
fn rows(s: &Store, table: &str, ids: &[i64]) -> nearrec::Result<Vec<f32>> {
    let lengths = vec![1i64; ids.len()];
    let batch = Batch::new(vec![TableLookup::new(
        table,
        Indices::I64(ids),
        Bags::Lengths(Indices::I64(&lengths)),
    )]);
    Ok(s.lookup(&batch)?.0.values)
}

/// Row `r` of a table created with `Init::Uniform { seed }` at `position`, as fp16 stores it.
fn uniform_row(seed: u64, position: u64, r: u64, dim: usize) -> Vec<f32> {
    let mut v = vec![0f32; dim];
    UniformInit::new(seed, position, ROWS).fill(r, &mut v);
    let mut b = vec![0u8; DType::Fp16.row_bytes(dim as u32) as usize];
    DType::Fp16.encode_row(&v, &mut b);
    DType::Fp16.decode_row(&b, &mut v);
    v
}

#[test]
fn created_and_dropped_tables_are_served_at_once_and_after_a_reopen() {
    for tier in TIERS {
        let dir = tempfile::tempdir().unwrap();
        let path = make_store(dir.path());
        let s = Store::open(&path, &config(tier, true)).unwrap();
        s.write("a", &[3], &[-1.0; 8]).unwrap();
        let v = s
            .create_table(&nearrec::NewTable {
                name: "n",
                rows: ROWS,
                dim: 6,
                dtype: DType::Fp16,
                init: Init::Uniform { seed: 9 },
            })
            .unwrap();
        // everything before was folded, then the table was made: versions 1 and 2
        assert_eq!((v, s.version().unwrap()), (2, 2), "{tier}");
        assert_eq!(s.tables().len(), 3);
        let got = rows(&s, "n", &[0, 7, 499]).unwrap();
        for (k, r) in [0u64, 7, 499].into_iter().enumerate() {
            assert_eq!(
                &got[k * 6..][..6],
                &uniform_row(9, 2, r, 6)[..],
                "{tier}: row {r}"
            );
        }
        s.create_table(&nearrec::NewTable {
            name: "z",
            rows: ROWS,
            dim: 4,
            dtype: DType::Fp32,
            init: Init::Zeros,
        })
        .unwrap();
        assert_eq!(rows(&s, "z", &[11]).unwrap(), vec![0.0; 4]);
        // written, compacted and read like any table
        s.write("n", &[7], &[0.5; 6]).unwrap();
        assert_eq!(rows(&s, "n", &[7]).unwrap(), vec![0.5; 6]);
        s.compact().unwrap();
        assert_eq!(rows(&s, "n", &[7]).unwrap(), vec![0.5; 6]);
        let a_file = nearrec::StoreReader::open(&path).unwrap().manifest().tables[0]
            .file
            .clone();
        let v = s.drop_table("a").unwrap();
        assert_eq!(s.version().unwrap(), v);
        let err = rows(&s, "a", &[1]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Engine(nearrec_engine::EngineError::UnknownTable { .. })
            ),
            "{err}"
        );
        // the other tables are untouched
        assert_eq!(rows(&s, "b", &[4]).unwrap(), vec![4.0; 4]);
        assert_eq!(rows(&s, "b", &[0]).unwrap(), vec![0.0; 4]);
        let names: Vec<String> = s.tables().iter().map(|t| t.name.clone()).collect();
        assert_eq!(names, ["b", "n", "z"]);
        // a's files stay for readers one compaction behind, and go with the next but one
        s.write("b", &[0], &[0.0; 4]).unwrap();
        s.compact().unwrap();
        s.write("b", &[0], &[0.0; 4]).unwrap();
        s.compact().unwrap();
        assert!(
            !path.join(&a_file).exists(),
            "{tier}: a's file {a_file} is left"
        );
        let version = s.version().unwrap();
        drop(s);
        for writable in [true, false] {
            let s = Store::open(&path, &config(tier, writable)).unwrap();
            assert_eq!(s.version().unwrap(), version);
            assert_eq!(rows(&s, "n", &[7, 0]).unwrap()[..6], [0.5; 6]);
            assert_eq!(
                &rows(&s, "n", &[0]).unwrap()[..],
                &uniform_row(9, 2, 0, 6)[..]
            );
            assert_eq!(rows(&s, "b", &[4]).unwrap(), vec![4.0; 4]);
            assert!(rows(&s, "a", &[1]).is_err());
        }
        let checks = nearrec::verify(&path, None).unwrap();
        assert!(checks.iter().all(|c| c.error.is_none()), "{checks:?}");
    }
}

#[test]
fn bad_changes_are_typed_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let s = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
    let err = s
        .create_table(&nearrec::NewTable {
            name: "a",
            rows: 10,
            dim: 4,
            dtype: DType::Fp32,
            init: Init::Zeros,
        })
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidRequest { ref table, .. } if table.as_deref() == Some("a")),
        "{err}"
    );
    let err = s
        .create_table(&nearrec::NewTable {
            name: "x",
            rows: 10,
            dim: 0,
            dtype: DType::Fp32,
            init: Init::Zeros,
        })
        .unwrap_err();
    assert!(err.to_string().contains("\"x\""), "{err}");
    let err = s.drop_table("nope").unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    assert_eq!(s.version().unwrap(), 0);
    assert_eq!(s.tables().len(), 2);
    drop(s);
    let r = Store::open(&path, &config("tier = \"dram\"", false)).unwrap();
    let err = r
        .create_table(&nearrec::NewTable {
            name: "x",
            rows: 10,
            dim: 4,
            dtype: DType::Fp32,
            init: Init::Zeros,
        })
        .unwrap_err();
    assert!(matches!(err, Error::ReadOnly { .. }), "{err}");
    assert!(matches!(
        r.drop_table("a").unwrap_err(),
        Error::ReadOnly { .. }
    ));
}

#[test]
fn a_reader_follows_created_and_dropped_tables() {
    for tier in TIERS {
        let dir = tempfile::tempdir().unwrap();
        let path = make_store(dir.path());
        let w = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
        let r = Store::open(&path, &config(tier, false)).unwrap();
        w.write("b", &[1], &[7.0; 4]).unwrap();
        w.create_table(&nearrec::NewTable {
            name: "n",
            rows: ROWS,
            dim: 6,
            dtype: DType::Fp16,
            init: Init::Uniform { seed: 1 },
        })
        .unwrap();
        w.write("n", &[2], &[3.0; 6]).unwrap();
        w.drop_table("a").unwrap();
        w.write("b", &[2], &[8.0; 4]).unwrap();
        // until it refreshes, the reader serves what it opened
        assert_eq!(rows(&r, "a", &[5]).unwrap(), vec![5.0; 8]);
        assert_eq!(r.refresh().unwrap(), w.version().unwrap(), "{tier}");
        assert!(rows(&r, "a", &[5]).is_err());
        assert_eq!(rows(&r, "n", &[2]).unwrap(), vec![3.0; 6]);
        assert_eq!(
            rows(&r, "b", &[1, 2]).unwrap(),
            [[7.0; 4], [8.0; 4]].concat()
        );
    }
}

#[test]
fn lookups_of_other_tables_go_on_while_tables_change() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let s = Store::open(
        &path,
        &config("tier = \"ssd\"\ndram_budget = \"8KiB\"", true),
    )
    .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !done.load(Ordering::Relaxed) || n == 0 {
                assert_eq!(
                    rows(&s, "b", &[9, 10]).unwrap(),
                    [[9.0; 4], [10.0; 4]].concat()
                );
                n += 1;
            }
            n
        })
    };
    for k in 0..10 {
        let name = format!("t{k}");
        s.create_table(&nearrec::NewTable {
            name: &name,
            rows: ROWS,
            dim: 4,
            dtype: DType::Fp32,
            init: Init::Zeros,
        })
        .unwrap();
        s.write(&name, &[1], &[1.0; 4]).unwrap();
        if k % 2 == 1 {
            s.drop_table(&name).unwrap();
        }
    }
    done.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    assert_eq!(s.tables().len(), 2 + 5);
}

/// The child half of [`a_writer_killed_after_logging_a_change_has_it_redone`].
#[test]
#[ignore = "the child half of the crash test"]
fn tables_crash_child() {
    let Ok(path) = std::env::var("NEARREC_CRASH_STORE") else {
        return;
    };
    let s = Store::open(&path, &config("tier = \"ssd\"", true)).unwrap();
    s.write("a", &[1], &[2.0; 8]).unwrap();
    fail::cfg("tables::logged", "return").unwrap();
    let _ = s.create_table(&nearrec::NewTable {
        name: "n",
        rows: ROWS,
        dim: 6,
        dtype: DType::Fp16,
        init: Init::Uniform { seed: 4 },
    });
    unreachable!("the failpoint aborts the process");
}

#[test]
fn a_writer_killed_after_logging_a_change_has_it_redone() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "tables_crash_child", "--ignored", "--nocapture"])
        .env("NEARREC_CRASH_STORE", &path)
        .status()
        .unwrap();
    assert!(!status.success());
    // a reader stops before the change it cannot see in the manifest yet
    let r = Store::open(&path, &config("tier = \"dram\"", false)).unwrap();
    assert_eq!(r.version().unwrap(), 1);
    assert!(rows(&r, "n", &[0]).is_err());
    // the writer's open redoes it
    let w = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
    assert_eq!(w.version().unwrap(), 2);
    assert_eq!(
        &rows(&w, "n", &[3]).unwrap()[..],
        &uniform_row(4, 2, 3, 6)[..]
    );
    assert_eq!(rows(&w, "a", &[1]).unwrap(), vec![2.0; 8]);
    assert_eq!(r.refresh().unwrap(), 2);
    assert_eq!(
        &rows(&r, "n", &[3]).unwrap()[..],
        &uniform_row(4, 2, 3, 6)[..]
    );
}

/// One step of the model-based test below.
#[derive(Debug, Clone)]
enum Step {
    Write(prop::sample::Index, Vec<u64>, u8),
    Remove(prop::sample::Index, Vec<u64>),
    Create(u32),
    Drop(prop::sample::Index),
    Compact,
    Swap,
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    let ids = prop::collection::vec(0u64..ROWS, 1..6);
    let table = any::<prop::sample::Index>();
    prop_oneof![
        4 => (table.clone(), ids.clone(), any::<u8>()).prop_map(|(t, i, v)| Step::Write(t, i, v)),
        2 => (table.clone(), ids).prop_map(|(t, i)| Step::Remove(t, i)),
        1 => (1u32..6).prop_map(Step::Create),
        1 => table.prop_map(Step::Drop),
        1 => Just(Step::Compact),
        1 => Just(Step::Swap),
        1 => Just(Step::Reopen),
    ]
}

/// A store as plain rows: per table, its rows (fp32, so exact).
type Rows = std::collections::BTreeMap<String, Vec<Vec<f32>>>;

fn initial(sign: f32) -> Rows {
    [("a", 8usize), ("b", 4)]
        .into_iter()
        .map(|(t, dim)| {
            let rows = (0..ROWS).map(|r| vec![sign * r as f32; dim]).collect();
            (t.to_owned(), rows)
        })
        .collect()
}

fn make_signed(dir: &Path, name: &str, sign: f32) -> PathBuf {
    let path = dir.join(name);
    let mut w = StoreWriter::create(&path, StoreOptions::default()).unwrap();
    for (table, rows) in initial(sign) {
        let dim = rows[0].len() as u32;
        let mut t = w
            .table(TableSpec::new(table, ROWS, dim, DType::Fp32))
            .unwrap();
        t.write_f32(&rows.concat()).unwrap();
        w.finish_table(t).unwrap();
    }
    w.commit().unwrap();
    path
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Random writes, removes, created and dropped tables, compactions, swaps between two
    /// stores and reopens, on each tier, against plain rows per store: after every step each
    /// table the model has is served whole and exactly, and no other.
    #[test]
    fn a_live_store_is_its_tables(steps in prop::collection::vec(step(), 1..25), tier in 0usize..3) {
        let dir = tempfile::tempdir().unwrap();
        let paths = [make_signed(dir.path(), "one", 1.0), make_signed(dir.path(), "two", -1.0)];
        let mut models = [initial(1.0), initial(-1.0)];
        let mut at = 0usize;
        let c = config(TIERS[tier], true);
        let mut s = Store::open(&paths[0], &c).unwrap();
        let mut created = 0;
        for st in steps {
            let model = &mut models[at];
            let names: Vec<String> = model.keys().cloned().collect();
            match st {
                Step::Write(t, ids, v) => {
                    let name = &names[t.index(names.len())];
                    let dim = model[name][0].len();
                    let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
                    let rows: Vec<Vec<f32>> =
                        (0..ids.len()).map(|k| vec![f32::from(v) + k as f32 * 0.5; dim]).collect();
                    s.write(name, &ids, &rows.concat()).unwrap();
                    for (i, row) in ids.iter().zip(rows) {
                        model.get_mut(name).unwrap()[*i as usize] = row;
                    }
                }
                Step::Remove(t, ids) => {
                    let name = &names[t.index(names.len())];
                    let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
                    s.remove(name, &ids).unwrap();
                    let dim = model[name][0].len();
                    for i in ids {
                        model.get_mut(name).unwrap()[i as usize] = vec![0.0; dim];
                    }
                }
                Step::Create(dim) => {
                    created += 1;
                    let name = format!("n{created}");
                    s.create_table(&nearrec::NewTable { name: &name, rows: ROWS, dim, dtype: DType::Fp32, init: Init::Zeros }).unwrap();
                    model.insert(name, vec![vec![0.0; dim as usize]; ROWS as usize]);
                }
                Step::Drop(t) if names.len() > 1 => {
                    let name = &names[t.index(names.len())];
                    s.drop_table(name).unwrap();
                    model.remove(name);
                }
                Step::Drop(_) => {}
                Step::Compact => {
                    s.compact().unwrap();
                }
                Step::Swap => {
                    at = 1 - at;
                    // the two stores' tables differ as the steps made them: forced
                    s.swap(&SwapTo::path(&paths[at]), true, true).unwrap();
                }
                Step::Reopen => {
                    let version = s.version().unwrap();
                    drop(s);
                    s = Store::open(&paths[at], &c).unwrap();
                    prop_assert_eq!(s.version().unwrap(), version);
                }
            }
            let model = &models[at];
            let served: Vec<String> = s.tables().iter().map(|t| t.name.clone()).collect();
            prop_assert_eq!(&served, &model.keys().cloned().collect::<Vec<_>>());
            let ids: Vec<i64> = (0..ROWS as i64).collect();
            for (name, want) in model {
                prop_assert_eq!(rows(&s, name, &ids).unwrap(), want.concat(), "table {}", name);
            }
        }
    }
}
