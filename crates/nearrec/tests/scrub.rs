//! A scrub (`nearrec::scrub`, a store's `scrub_rate`): every sector of every table read and
//! checked, at its pace; damage named by table and sector, in the files a build wrote and in
//! those a compaction wrote; a background scrub that counts what it found and stops with its
//! store.

use nearrec::prelude::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nearrec::{Store, StoreConfig};
use nearrec_format::{DType, SECTOR_BYTES, StoreReader};

const ROWS: u64 = 3000;

fn make_store(dir: &Path) -> PathBuf {
    let tables = [
        ("a", ROWS, 16, DType::Fp32),
        ("b", ROWS, 8, DType::Fp16),
        ("c", ROWS, 12, DType::Int8),
    ];
    nearrec_testkit::write_store(dir.join("store"), &tables, nearrec_testkit::pattern)
}

/// Flips a bit at byte `at` of table `t`'s data region; the sector it is in.
fn flip(path: &Path, t: usize, at: u64) -> u64 {
    nearrec_testkit::flip_bits(path, t, at, 0x10);
    at / SECTOR_BYTES
}

/// One scrub pass over the store at `path`, at `rate`.
fn pass(path: &Path, rate: u64) -> Vec<nearrec_format::TableCheck> {
    nearrec::scrub(&StoreReader::open(path).unwrap(), rate, None)
}

fn stat(store: &Store, key: &str) -> f64 {
    (store.live_stats().into_iter())
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {key} in the live stats"))
}

#[test]
fn a_pass_names_each_damaged_table_and_its_sector() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let checks = pass(&path, 0);
    assert_eq!(checks.len(), 3);
    assert!(checks.iter().all(|c| c.error.is_none()), "{checks:?}");
    let sector = flip(&path, 1, 5000);
    let checks = pass(&path, 0);
    let bad: Vec<_> = checks.iter().filter(|c| c.error.is_some()).collect();
    assert_eq!(bad.len(), 1, "{checks:?}");
    assert_eq!(bad[0].table, "b");
    let error = bad[0].error.as_deref().unwrap();
    assert!(error.contains(&format!("sector {sector} ")), "{error}");
    // what verify says, scrub says
    let verified = nearrec::verify(&path, None).unwrap();
    assert_eq!(verified[1].error.as_deref(), Some(error));
}

#[test]
fn a_pass_keeps_to_its_rate() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let bytes: u64 = (StoreReader::open(&path).unwrap().tables().iter())
        .map(|t| t.data_bytes)
        .sum();
    // a rate that makes the pass take half a second: it never goes faster
    let rate = bytes * 2;
    let start = Instant::now();
    pass(&path, rate);
    let floor = Duration::from_secs_f64(bytes as f64 / rate as f64);
    assert!(
        start.elapsed() >= floor,
        "{:?} < {floor:?}",
        start.elapsed()
    );
}

#[test]
fn the_sums_a_compaction_writes_are_the_ones_a_scrub_checks() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let mut config = StoreConfig::from_toml("tier = \"ssd\"\ndram_budget = \"0\"").unwrap();
    config.writable = true;
    config.auto_compact = false;
    let store = Store::open(&path, &config).unwrap();
    let ids: Vec<i64> = (0..ROWS as i64).step_by(3).collect();
    let rows = vec![0.25f32; ids.len() * 16];
    store.write("a", &ids, &rows).unwrap();
    store.compact().unwrap();
    store.close().unwrap();
    assert!(
        (pass(&path, 0).iter()).all(|c| c.error.is_none()),
        "a compaction's files fail their own sums"
    );
    let sector = flip(&path, 0, 700);
    let checks = pass(&path, 0);
    let error = checks[0].error.as_deref().expect("the damage is found");
    assert!(error.contains(&format!("sector {sector} ")), "{error}");
}

#[test]
fn a_serving_store_scrubs_itself_counts_what_it_finds_and_stops_when_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let mut config = StoreConfig::from_toml("tier = \"ssd\"\ndram_budget = \"0\"").unwrap();
    config.scrub_rate = nearrec::Size(64 << 20);
    let store = Store::open(&path, &config).unwrap();
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "never {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    until("a pass", &|| stat(&store, "scrub_passes") >= 1.0);
    assert_eq!(stat(&store, "scrub_damaged"), 0.0);
    assert_eq!(stat(&store, "scrub_rate"), (64 << 20) as f64);
    // rows nobody reads, damaged under it: a later pass finds them
    flip(&path, 2, 9000);
    let passes = stat(&store, "scrub_passes");
    until("the next whole pass", &|| {
        stat(&store, "scrub_passes") >= passes + 2.0
    });
    assert!(stat(&store, "scrub_damaged") >= 1.0);
    assert_eq!(stat(&store, "scrub_last_damaged"), 1.0);
    store.close().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let stopped = stat(&store, "scrub_bytes");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        stat(&store, "scrub_bytes"),
        stopped,
        "a closed store's scrub went on"
    );
}

#[test]
fn a_scrub_rate_is_a_size_in_the_config() {
    let c = StoreConfig::from_toml("scrub_rate = \"16MiB\"").unwrap();
    assert_eq!(c.scrub_rate.bytes(), 16 << 20);
    assert_eq!(StoreConfig::default().scrub_rate.bytes(), 0);
}
