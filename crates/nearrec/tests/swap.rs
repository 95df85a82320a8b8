//! Snapshot swap: a store built offline (a new model version) served from the next lookup on,
//! lookups under way finishing on the old one, none failing and none seeing half of each; row
//! caches warmed from the old version; a writable store's lock and log moving with it.

use nearrec::SwapTo;
use nearrec::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nearrec::{Bags, Batch, Error, Indices, Store, StoreConfig, TableLookup};
use nearrec_format::DType;

const ROWS: u64 = 4000;

/// A store of the tables `tables` — (name, rows, dim, dtype) — whose row `r` is `sign × r` in
/// every column.
fn store_of(dir: &Path, name: &str, tables: &[(&str, u64, u32, DType)], sign: f32) -> PathBuf {
    // row r is sign × r
    nearrec_testkit::write_store(dir.join(name), tables, |t, i| {
        sign * (i / u64::from(tables[t].2)) as f32
    })
}

/// Tables `a` (dim 16) and `b` (dim 8) of `ROWS` fp32 rows, row `r` being `sign × r`.
fn make_store(dir: &Path, name: &str, sign: f32) -> PathBuf {
    let tables = [("a", ROWS, 16, DType::Fp32), ("b", ROWS, 8, DType::Fp32)];
    store_of(dir, name, &tables, sign)
}

/// Two versions of one store: `v1` (row `r` is `r`) and `v2` (row `r` is `-r`).
fn two_versions(dir: &Path) -> (PathBuf, PathBuf) {
    (make_store(dir, "v1", 1.0), make_store(dir, "v2", -1.0))
}

fn config(toml: &str) -> StoreConfig {
    StoreConfig::from_toml(toml).unwrap()
}

const TIERS: [&str; 3] = [
    "tier = \"dram\"",
    "tier = \"ssd\"\ndram_budget = \"0\"",
    "tier = \"ssd\"\ndram_budget = \"64KiB\"",
];

/// One bag per id of table `a` and of table `b`: `[a row | b row]` per id.
fn both(s: &Store, ids: &[i64]) -> nearrec::Result<Vec<f32>> {
    let lengths = vec![1i64; ids.len()];
    let batch = Batch::new(
        ["a", "b"]
            .map(|t| TableLookup::new(t, Indices::I64(ids), Bags::Lengths(Indices::I64(&lengths))))
            .to_vec(),
    );
    Ok(s.lookup(&batch)?.0.values)
}

#[test]
fn a_swapped_store_serves_the_next_lookup() {
    for tier in TIERS {
        let dir = tempfile::tempdir().unwrap();
        let (v1, v2) = two_versions(dir.path());
        let s = Store::open(&v1, &config(tier)).unwrap();
        assert_eq!(
            both(&s, &[5]).unwrap(),
            [vec![5.0; 16], vec![5.0; 8]].concat()
        );
        // a batch prepared before the swap runs on the new version (the same shape)
        let ids = [7i64];
        let lengths = [1i64];
        let batch = Batch::new(vec![TableLookup::new(
            "a",
            Indices::I64(&ids),
            Bags::Lengths(Indices::I64(&lengths)),
        )]);
        let prepared = s.prepare(&batch).unwrap();
        s.swap(&SwapTo::path(&v2), false, false).unwrap();
        assert_eq!(s.path(), v2.canonicalize().unwrap_or(v2.clone()));
        assert_eq!(
            both(&s, &[5]).unwrap(),
            [vec![-5.0; 16], vec![-5.0; 8]].concat(),
            "{tier}"
        );
        let mut out = vec![0f32; 16];
        s.execute(&batch, &prepared, &mut out).unwrap();
        assert_eq!(out, vec![-7.0; 16]);
        // and back
        s.swap(&SwapTo::path(&v1), true, false).unwrap();
        assert_eq!(
            both(&s, &[9]).unwrap(),
            [vec![9.0; 16], vec![9.0; 8]].concat()
        );
        let err = s.swap(&SwapTo::path(&v1), false, false).unwrap_err();
        assert!(err.to_string().contains("being served"), "{err}");
        let err = s
            .swap(&SwapTo::path(dir.path().join("nothing")), false, false)
            .unwrap_err();
        assert!(matches!(err, Error::Format(_)), "{err}");
        assert_eq!(
            both(&s, &[9]).unwrap()[0],
            9.0,
            "a failed swap changes nothing"
        );
    }
}

#[test]
fn no_lookup_fails_or_mixes_versions_across_swaps() {
    for tier in TIERS {
        let dir = tempfile::tempdir().unwrap();
        let (v1, v2) = two_versions(dir.path());
        let s = Store::open(&v1, &config(tier)).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|k| {
                let (s, done) = (s.clone(), done.clone());
                std::thread::spawn(move || {
                    let ids: Vec<i64> = (0..64).map(|i| (i * 61 + k * 7) % ROWS as i64).collect();
                    let mut seen = [0usize; 2];
                    while !done.load(Ordering::Relaxed) || seen.iter().sum::<usize>() == 0 {
                        let v = both(&s, &ids).unwrap();
                        // one version for the whole batch: every value has one sign
                        let sign = if v.iter().any(|&x| x < 0.0) {
                            -1.0
                        } else {
                            1.0
                        };
                        for (i, &id) in ids.iter().enumerate() {
                            assert_eq!(v[i * 24], sign * id as f32, "{tier}: a mixed batch");
                            assert_eq!(v[i * 24 + 16], sign * id as f32, "{tier}: a mixed batch");
                        }
                        seen[usize::from(sign < 0.0)] += 1;
                    }
                    seen
                })
            })
            .collect();
        for k in 0..20 {
            s.swap(
                &SwapTo::path(if k % 2 == 0 { &v2 } else { &v1 }),
                k % 3 == 0,
                false,
            )
            .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        done.store(true, Ordering::Relaxed);
        for r in readers {
            let seen = r.join().unwrap();
            assert!(seen[0] + seen[1] > 0);
        }
    }
}

#[test]
fn warm_swaps_start_with_the_old_working_set() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = two_versions(dir.path());
    let c = config("tier = \"ssd\"\ndram_budget = \"256KiB\"\ncache_policy = \"lru\"");
    let hot: Vec<i64> = (0..200).map(|i| i * 13).collect();
    for warm in [false, true] {
        let s = Store::open(&v1, &c).unwrap();
        both(&s, &hot).unwrap(); // the old version's working set, in its caches
        s.swap(&SwapTo::path(&v2), warm, false).unwrap();
        let before = s.stats().unwrap().get("device_reads").unwrap();
        let v = both(&s, &hot).unwrap();
        assert_eq!(v[24], -13.0);
        let reads = s.stats().unwrap().get("device_reads").unwrap() - before;
        if warm {
            assert_eq!(
                reads, 0.0,
                "a warm swap reads the working set before it switches"
            );
        } else {
            assert!(reads > 0.0, "a cold swap reads it after");
        }
    }
}

#[test]
fn a_writable_store_takes_the_new_stores_lock_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = two_versions(dir.path());
    let mut c = config("tier = \"dram\"");
    c.writable = true;
    let s = Store::open(&v1, &c).unwrap();
    s.write("a", &[1], &[0.5; 16]).unwrap();
    s.swap(&SwapTo::path(&v2), true, false).unwrap();
    assert_eq!(s.version().unwrap(), 0);
    s.write("a", &[2], &[0.25; 16]).unwrap();
    let v = both(&s, &[1, 2]).unwrap();
    assert_eq!((&v[..16], &v[24..40]), (&[-1.0; 16][..], &[0.25; 16][..]));
    // the old store is free for another writer once the version swapped out lets go of it (on
    // a thread of its own, after the lookups still reading it), and kept its write; the new one
    // is held
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let old = loop {
        match Store::open(&v1, &c) {
            Err(Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(both(&old, &[1]).unwrap()[..16], [0.5; 16]);
    assert!(matches!(
        Store::open(&v2, &c).unwrap_err(),
        Error::Locked { .. }
    ));
}

#[test]
fn a_writable_store_swaps_back_at_once() {
    // the version swapped out lets go of its writer lock on a thread of its own; swapping back
    // to it waits for that instead of failing with `Locked`
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = two_versions(dir.path());
    let mut c = config("tier = \"dram\"");
    c.writable = true;
    let s = Store::open(&v1, &c).unwrap();
    for i in 0..40i64 {
        let to = if i % 2 == 0 { &v2 } else { &v1 };
        s.swap(&SwapTo::path(to), false, false).unwrap();
        s.write("a", &[i % 8], &[i as f32; 16]).unwrap();
    }
    assert_eq!(both(&s, &[39 % 8]).unwrap()[..16], [39.0; 16]);
}

#[test]
fn a_store_that_would_fail_the_served_requests_is_refused_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, _) = two_versions(dir.path());
    let s = Store::open(&v1, &config("tier = \"dram\"")).unwrap();
    let fp32 = DType::Fp32;
    let cases = [
        ("no_b", vec![("a", ROWS, 16, fp32)], "b", "no table"),
        (
            "dim",
            vec![("a", ROWS, 32, fp32), ("b", ROWS, 8, fp32)],
            "a",
            "dim 32",
        ),
        (
            "dtype",
            vec![("a", ROWS, 16, DType::Fp16), ("b", ROWS, 8, fp32)],
            "a",
            "fp16",
        ),
        (
            "rows",
            vec![("a", ROWS, 16, fp32), ("b", 10, 8, fp32)],
            "b",
            "10 rows",
        ),
    ];
    for (name, tables, table, says) in cases {
        let path = store_of(dir.path(), name, &tables, 1.0);
        let err = s.swap(&SwapTo::path(&path), false, false).unwrap_err();
        assert_eq!(
            err.kind(),
            nearrec::ErrorKind::InvalidRequest,
            "{name}: {err}"
        );
        assert_eq!(err.table(), Some(table), "{name}: {err}");
        assert!(err.to_string().contains(says), "{name}: {err}");
        assert_eq!(
            both(&s, &[3]).unwrap()[0],
            3.0,
            "{name}: a refused swap changes nothing"
        );
    }
    // more rows and more tables are compatible; a forced swap serves anything
    let grown = [
        ("a", 2 * ROWS, 16, fp32),
        ("b", ROWS, 8, fp32),
        ("c", 5, 4, fp32),
    ];
    s.swap(
        &SwapTo::path(store_of(dir.path(), "grown", &grown, 1.0)),
        false,
        false,
    )
    .unwrap();
    s.swap(
        &SwapTo::path(store_of(dir.path(), "other", &[("z", 5, 4, fp32)], 1.0)),
        false,
        true,
    )
    .unwrap();
    assert_eq!(s.tables()[0].name, "z");
    // a file, or a path holding a NUL, is not a store directory: a caller's error
    std::fs::write(dir.path().join("file"), b"x").unwrap();
    for bad in [dir.path().join("file"), dir.path().join("v1\0x")] {
        let err = s.swap(&SwapTo::path(&bad), false, true).unwrap_err();
        assert_eq!(err.kind(), nearrec::ErrorKind::InvalidRequest, "{err}");
    }
}
