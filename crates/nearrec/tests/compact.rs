//! Compaction of a live store: the delta folded into new table files on every tier (the
//! resident copy, the hot partition, the row cache, the SSD files), read-only openers that
//! follow it, calls that wait for it when the delta is full, and a writer killed at each step
//! of it (or after a log append) that loses no acknowledged write and applies no partial call.

use nearrec::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use nearrec::{Bags, Batch, Indices, Store, StoreConfig, TableLookup};
use nearrec_format::{DType, StoreOptions, StoreReader, StoreWriter, TableSpec};

const ROWS: u64 = 2000;
const TABLES: [(&str, u32, DType); 3] = [
    ("a", 16, DType::Fp32),
    ("b", 8, DType::Fp16),
    ("c", 12, DType::Int8),
];

/// The tiers a table can be read from, each table on a different one where it can be.
const TIERS: [&str; 4] = [
    "tier = \"dram\"",
    // no DRAM in front: every row read from the files
    "tier = \"ssd\"\ndram_budget = \"0\"",
    // a hot partition, a row cache, a table kept whole
    "tier = \"ssd\"\n[plan.tables.a]\nhot_rows = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]\n\
     cache_bytes = 65536\n[plan.tables.b]\nresident = true\n[plan.tables.c]\ncache_bytes = 65536",
    "tier = \"ssd\"\ndram_budget = \"32KiB\"\ncache_policy = \"lfu\"",
];

use nearrec_testkit::{Crash, pattern as base_value};

fn make_store(dir: &Path) -> PathBuf {
    let tables = TABLES.map(|(name, dim, dtype)| (name, ROWS, dim, dtype));
    nearrec_testkit::write_store(dir.join("store"), &tables, base_value)
}

fn config(toml: &str, writable: bool) -> StoreConfig {
    let mut c = StoreConfig::from_toml(toml).unwrap();
    c.writable = writable;
    c.auto_compact = false;
    c
}

/// What the table's encoding makes of `values`.
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

/// Rows as the store holds them at the start, and as calls change them.
#[derive(Default, Clone)]
struct Model(HashMap<(usize, u64), Vec<f32>>);

impl Model {
    fn row(&self, t: usize, r: u64) -> Vec<f32> {
        let dim = u64::from(TABLES[t].1);
        self.0.get(&(t, r)).cloned().unwrap_or_else(|| {
            let v: Vec<f32> = (0..dim).map(|j| base_value(t, r * dim + j)).collect();
            encoded(t, &v)
        })
    }

    /// Call `k` of a run: rows `ids(k)` of table `k % 3` written (or removed every fifth).
    fn call(&mut self, store: &Store, k: u64) {
        let t = (k % 3) as usize;
        let ids: Vec<i64> = (0..8).map(|j| ((k * 37 + j * 211) % ROWS) as i64).collect();
        if k % 5 == 4 {
            store.remove(TABLES[t].0, &ids).unwrap();
            for &i in &ids {
                self.0
                    .insert((t, i as u64), vec![0.0; TABLES[t].1 as usize]);
            }
        } else {
            let rows: Vec<Vec<f32>> = ids.iter().map(|&i| new_row(t, k + i as u64)).collect();
            store.write(TABLES[t].0, &ids, &rows.concat()).unwrap();
            for (&i, row) in ids.iter().zip(rows) {
                self.0.insert((t, i as u64), encoded(t, &row));
            }
        }
    }

    /// Every row of every table through `store` (one-row bags) against the model.
    fn check(&self, store: &Store, what: &str) {
        for (t, &(name, dim, _)) in TABLES.iter().enumerate() {
            let ids: Vec<i64> = (0..ROWS as i64).collect();
            let lengths = vec![1i64; ids.len()];
            let batch = Batch::new(vec![TableLookup::new(
                name,
                Indices::I64(&ids),
                Bags::Lengths(Indices::I64(&lengths)),
            )]);
            let got = store.lookup(&batch).unwrap().0.values;
            for (r, g) in got.chunks(dim as usize).enumerate() {
                let want = self.row(t, r as u64);
                let close = g
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| (a - b).abs() <= 1e-6 * b.abs().max(1.0));
                assert!(close, "{what}: table {name} row {r}: {g:?}, want {want:?}");
            }
        }
    }
}

fn stats(store: &Store) -> HashMap<&'static str, f64> {
    store.live_stats().into_iter().collect()
}

#[test]
fn compaction_moves_the_base_on_every_tier() {
    for tier in TIERS {
        let dir = tempfile::tempdir().unwrap();
        let path = make_store(dir.path());
        let s = Store::open(&path, &config(tier, true)).unwrap();
        let mut model = Model::default();
        // every row read once, so that the caches hold base rows the compaction must replace
        model.check(&s, tier);
        for k in 0..60 {
            model.call(&s, k);
        }
        model.check(&s, tier);
        let done = s.compact().unwrap();
        assert_eq!((done.version, done.tables), (60, 3), "{tier}");
        assert!(done.rows > 0 && done.bytes > 0, "{tier}: {done:?}");
        let st = stats(&s);
        assert_eq!(
            (st["base_version"], st["delta_rows"], st["compactions"]),
            (60.0, 0.0, 1.0),
            "{tier}"
        );
        model.check(&s, &format!("{tier}, compacted"));
        // writes go on over the new base, and a second compaction folds them
        for k in 60..90 {
            model.call(&s, k);
        }
        model.check(&s, &format!("{tier}, written after"));
        assert_eq!(s.compact().unwrap().version, 90);
        model.check(&s, &format!("{tier}, compacted twice"));
        // nothing to fold
        assert_eq!(s.compact().unwrap().tables, 0);
        // the files: new ones named, those two compactions old gone, the last ones kept for
        // readers one compaction behind, the store whole
        let manifest = StoreReader::open(&path).unwrap().manifest().clone();
        assert_eq!(manifest.lsn, Some(90));
        assert_eq!(manifest.format_version, 4);
        for (t, meta) in manifest.tables.iter().enumerate() {
            assert_eq!(meta.file, format!("table-{t:04}.{:016x}.nrt", 90));
            assert!(!path.join(format!("table-{t:04}.nrt")).exists());
            assert!(path.join(format!("table-{t:04}.{:016x}.nrt", 60)).exists());
        }
        let checks = nearrec::verify(&path, None).unwrap();
        assert!(checks.iter().all(|c| c.error.is_none()), "{checks:?}");
        drop(s);
        for writable in [true, false] {
            let s = Store::open(&path, &config(tier, writable)).unwrap();
            assert_eq!(s.version().unwrap(), 90);
            model.check(&s, &format!("{tier}, reopened (writable: {writable})"));
        }
    }
}

#[test]
fn a_read_only_opener_follows_the_writers_compactions() {
    for tier in TIERS {
        let dir = tempfile::tempdir().unwrap();
        let path = make_store(dir.path());
        let writer = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
        let reader = Store::open(&path, &config(tier, false)).unwrap();
        let mut model = Model::default();
        let before = model.clone();
        before.check(&reader, tier);
        for k in 0..40 {
            model.call(&writer, k);
        }
        writer.compact().unwrap();
        for k in 40..50 {
            model.call(&writer, k);
        }
        // the reader keeps its version, on the files it opened, until it refreshes
        before.check(&reader, &format!("{tier}, before refresh"));
        assert_eq!(reader.refresh().unwrap(), 50);
        let st = stats(&reader);
        assert_eq!(
            (st["base_version"], st["compactions"]),
            (40.0, 1.0),
            "{tier}"
        );
        model.check(&reader, &format!("{tier}, refreshed"));
        writer.compact().unwrap();
        assert_eq!(reader.refresh().unwrap(), 50);
        model.check(&reader, &format!("{tier}, refreshed after the second"));
        assert_eq!(stats(&reader)["delta_rows"], 0.0);
    }
}

#[test]
fn a_read_only_store_that_follows_serves_what_its_writer_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let writer = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
    let mut c = config("tier = \"ssd\"\ndram_budget = \"32KiB\"", false);
    c.follow_ms = Some(20);
    let reader = Store::open(&path, &c).unwrap();
    let mut model = Model::default();
    // writes, a compaction, writes after it: each seen without a refresh, within a bound
    for round in 0..3u64 {
        for k in round * 10..round * 10 + 10 {
            model.call(&writer, k);
        }
        if round == 1 {
            writer.compact().unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while reader.version().unwrap() != writer.version().unwrap() {
            assert!(std::time::Instant::now() < deadline, "not followed in 10 s");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        model.check(&reader, &format!("round {round}"));
    }
    let st = stats(&reader);
    assert_eq!((st["follow_ms"], st["follow_errors"]), (20.0, 0.0));
    assert!(st["follow_moved"] >= 3.0, "{st:?}");
    // a writable store has nobody to follow
    let mut both = config("tier = \"dram\"", true);
    both.follow_ms = Some(20);
    assert!(both.validate().is_err());
}

/// Flips a bit of row `row` of table `t` in its file (rows in id order).
fn flip_bit(path: &Path, t: usize, row: u64) {
    let meta = StoreReader::open(path).unwrap().tables()[t].clone();
    nearrec_testkit::flip_bits(path, t, meta.layout().row_offset(row) + 2, 0x08);
}

#[test]
fn a_compaction_does_not_launder_a_damaged_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    flip_bit(&path, 0, 100);
    let s = Store::open(&path, &config("tier = \"ssd\"\ndram_budget = \"0\"", true)).unwrap();
    let one = |id: i64| {
        let (ids, lengths) = ([id], [1i64]);
        let batch = Batch::new(vec![TableLookup::new(
            "a",
            Indices::I64(&ids),
            Bags::Lengths(Indices::I64(&lengths)),
        )]);
        s.lookup(&batch).map(|p| p.0.values)
    };
    let kind = |r: nearrec::Result<Vec<f32>>| r.unwrap_err().kind();
    assert_eq!(kind(one(100)), nearrec::ErrorKind::StoreCorrupted);
    s.write("a", &[7], &new_row(0, 1)).unwrap();
    let err = s.compact().unwrap_err();
    assert_eq!(err.kind(), nearrec::ErrorKind::StoreCorrupted, "{err}");
    assert_eq!(err.table(), Some("a"));
    assert!(err.to_string().contains("100"), "{err}");
    // nothing moved: the damage is still reported, the write still served
    assert_eq!(kind(one(100)), nearrec::ErrorKind::StoreCorrupted);
    assert_eq!(one(7).unwrap(), encoded(0, &new_row(0, 1)));
    assert!(
        StoreReader::open(&path).unwrap().verify(None)[0]
            .error
            .is_some()
    );
    // the rows of the damaged sector written anew: the compaction heals it
    let sector: Vec<i64> = (96..104).collect();
    let rows: Vec<Vec<f32>> = sector.iter().map(|&r| new_row(0, r as u64)).collect();
    s.write("a", &sector, &rows.concat()).unwrap();
    s.compact().unwrap();
    assert_eq!(one(100).unwrap(), encoded(0, &new_row(0, 100)));
    let reader = StoreReader::open(&path).unwrap();
    assert!(reader.verify(None).iter().all(|c| c.error.is_none()));
}

#[test]
fn a_full_delta_waits_for_the_background_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big");
    let rows = 40_000u64;
    let mut w = StoreWriter::create(&path, StoreOptions::default()).unwrap();
    let mut table = w
        .table(TableSpec::new("big", rows, 16, DType::Fp32))
        .unwrap();
    table.write_with(rows, |r, out| out.fill(r as f32)).unwrap();
    w.finish_table(table).unwrap();
    w.commit().unwrap();
    let mut c = config("tier = \"ssd\"\ndram_budget = \"64KiB\"", true);
    c.auto_compact = true;
    c.delta_budget = nearrec::Size(1 << 20);
    c.durability = nearrec::DurabilityMode::Async;
    let s = Store::open(&path, &c).unwrap();
    // 112 B per row (64 + 48): 1 MiB holds about 9,300 rows; write 40,000 distinct ones
    for k in 0..10i64 {
        let ids: Vec<i64> = (k * 4000..(k + 1) * 4000).collect();
        let values: Vec<f32> = ids.iter().flat_map(|&i| [-(i as f32); 16]).collect();
        s.write("big", &ids, &values).unwrap();
    }
    let st = stats(&s);
    assert!(st["compactions"] >= 2.0, "{st:?}");
    assert!(st["delta_bytes"] <= (1 << 20) as f64);
    let ids: Vec<i64> = (0..rows as i64).collect();
    let mut out = vec![0f32; ids.len() * 16];
    s.read_rows("big", &ids, &mut out).unwrap();
    for (r, row) in out.chunks(16).enumerate() {
        assert!(row.iter().all(|&v| v == -(r as f32)), "row {r}: {row:?}");
    }
    // a call larger than the whole budget can never fit: refused at once
    let err = s
        .write("big", &ids, &vec![0.5; ids.len() * 16])
        .unwrap_err();
    assert!(matches!(err, nearrec::Error::DeltaFull { .. }), "{err}");
}

/// Where a crash test stops the writer (the failpoints in `nearrec::live`).
const POINTS: [&str; 4] = [
    "live::logged",
    "compact::table",
    "compact::manifest",
    "compact::published",
];

/// Run by [`a_writer_killed_at_each_point_loses_no_acknowledged_write`] in a child process:
/// writes calls (each acknowledged in `acked` once it returns), compacts half-way, and is
/// stopped at the failpoint `NEARREC_CRASH_POINT`.
#[test]
#[ignore = "the child half of the crash test"]
fn crash_child() {
    let Some(mut crash) = Crash::child() else {
        return;
    };
    let point = crash.point.clone();
    let s = Store::open(
        &crash.store,
        &config("tier = \"ssd\"\ndram_budget = \"32KiB\"", true),
    )
    .unwrap();
    let mut model = Model::default();
    for k in 0..30 {
        model.call(&s, k);
        crash.acknowledge(k);
        if k == 19 {
            s.compact().unwrap();
        }
    }
    fail::cfg(&point, "return").unwrap();
    if point == "live::logged" {
        model.call(&s, 30);
    } else {
        s.compact().unwrap();
    }
    unreachable!("the failpoint {point} aborts the process");
}

#[test]
fn a_writer_killed_at_each_point_loses_no_acknowledged_write() {
    for point in POINTS {
        let dir = tempfile::tempdir().unwrap();
        let path = make_store(dir.path());
        assert_eq!(Crash::run("crash_child", &path, point), 30, "{point}");
        // every acknowledged call, and the one cut after its log append whole or not at all
        let mut model = Model::default();
        let scratch = Store::open(
            make_store(&dir.path().join("twin")),
            &config("tier = \"dram\"", true),
        )
        .unwrap();
        for k in 0..30 {
            model.call(&scratch, k);
        }
        for writable in [false, true] {
            let s = Store::open(
                &path,
                &config("tier = \"ssd\"\ndram_budget = \"32KiB\"", writable),
            )
            .unwrap();
            let version = s.version().unwrap();
            let mut want = model.clone();
            if point == "live::logged" {
                // synced to the log but never acknowledged: recovery keeps it, whole
                assert_eq!(version, 31, "{point}");
                want.call(&scratch, 30);
            } else {
                assert_eq!(version, 30, "{point}");
            }
            want.check(
                &s,
                &format!("killed at {point}, reopened (writable: {writable})"),
            );
            if writable {
                // what the crash left unnamed is gone, and the store compacts and verifies
                s.compact().unwrap();
                want.check(&s, &format!("killed at {point}, compacted after"));
                let checks = nearrec::verify(&path, None).unwrap();
                assert!(
                    checks.iter().all(|c| c.error.is_none()),
                    "{point}: {checks:?}"
                );
            }
        }
    }
}

#[test]
fn changes_since_tells_a_cache_above_the_store_what_to_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let s = Store::open(&path, &config("tier = \"dram\"", true)).unwrap();
    let rows = |c: &nearrec::Changes, t: &str| {
        let mut r = c
            .rows
            .as_ref()
            .unwrap()
            .iter()
            .find(|(n, _)| n == t)
            .unwrap()
            .1
            .clone();
        r.sort_unstable();
        r
    };
    s.write("a", &[3, 9], &[0.0; 32]).unwrap();
    s.remove("b", &[4]).unwrap();
    let c = s.changes_since(0);
    assert_eq!((c.version, c.base), (2, 0));
    assert_eq!((rows(&c, "a"), rows(&c, "b")), (vec![3, 9], vec![4]));
    assert_eq!(
        s.changes_since(1).rows.unwrap().len(),
        1,
        "only b changed after 1"
    );
    assert_eq!(s.changes_since(2).rows, Some(vec![]));
    s.compact().unwrap();
    s.write("a", &[5], &[0.0; 16]).unwrap();
    // the compaction's rows are still told to a cache that looked before it
    assert_eq!(rows(&s.changes_since(0), "a"), vec![3, 5, 9]);
    assert_eq!(rows(&s.changes_since(2), "a"), vec![5]);
    s.compact().unwrap();
    assert_eq!(
        s.changes_since(0).rows,
        None,
        "two compactions ago: drop everything"
    );
    assert_eq!(rows(&s.changes_since(2), "a"), vec![5]);
    let engine = s.changes_since(3).engine;
    s.create_table(&nearrec::NewTable {
        name: "n",
        rows: 10,
        dim: 2,
        dtype: DType::Fp32,
        init: nearrec::Init::Zeros,
    })
    .unwrap();
    assert_ne!(s.changes_since(3).engine, engine);
}

/// Issue 62, item 5: a compaction killed between writing the manifest's temporary and its
/// rename left `.MANIFEST.tmp-PID` for good, and `verify` failed on it at every later open.
/// A writable open removes it (it holds the directory's lock: no manifest is being published).
#[test]
fn a_writable_open_removes_a_dead_compactions_manifest_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let temp = path.join(format!(".{}.tmp-4194000", nearrec_format::MANIFEST_FILE));
    std::fs::write(&temp, b"half a manifest").unwrap();
    let leftovers = |p: &Path| {
        let reader = StoreReader::open(p).unwrap();
        nearrec_format::orphans(p, reader.manifest())
            .into_iter()
            .filter(|o| o.ours)
            .count()
    };
    assert_eq!(leftovers(&path), 1);
    drop(Store::open(&path, &config("tier = \"dram\"", false)).unwrap());
    assert!(temp.exists(), "a read-only open writes nothing");
    drop(Store::open(&path, &config("tier = \"dram\"", true)).unwrap());
    assert!(!temp.exists());
    assert_eq!(leftovers(&path), 0);
}
