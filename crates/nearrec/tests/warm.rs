//! Start-up warm-up: a store reopened with `hot_set_dir` serves the rows its last run held from
//! DRAM from its first lookup; one opened with `warm` a recorded trace's most requested rows; a
//! damaged kept hot set starts the store cold, a damaged `warm` file refuses the open; a keyed
//! table warms from a trace of its keys.

use nearrec::prelude::*;
use std::path::{Path, PathBuf};

use nearrec::{Bags, Batch, ErrorKind, Indices, Store, StoreConfig, TableLookup};
use nearrec_format::DType;

const ROWS: u64 = 5000;
const DIM: u32 = 16;

fn make_store(dir: &Path) -> PathBuf {
    let tables = [("a", ROWS, DIM, DType::Fp32), ("b", ROWS, DIM, DType::Fp16)];
    nearrec_testkit::write_store(dir.join("store"), &tables, nearrec_testkit::pattern)
}

/// The SSD tier with a row cache of 1,024 rows of `a` (64 KiB) and none for `b`.
fn config(extra: &str) -> StoreConfig {
    let toml = format!(
        "tier = \"ssd\"\n{extra}\n[plan.tables.a]\ncache_bytes = 65536\n[plan.tables.b]\n\
         cache_bytes = 0"
    );
    StoreConfig::from_toml(&toml).unwrap()
}

/// One bag per row of `ids` in table `a`.
fn lookup(store: &Store, ids: &[i64]) -> Vec<f32> {
    lookup_in(store, "a", ids)
}

/// One bag per id (a row, or a keyed table's key) of `ids` in `table`.
fn lookup_in(store: &Store, table: &str, ids: &[i64]) -> Vec<f32> {
    let batch = Batch::new(vec![TableLookup::new(
        table,
        Indices::I64(ids),
        Bags::Fixed {
            batch: ids.len(),
            bag_size: 1,
        },
    )]);
    store.lookup(&batch).unwrap().0.values
}

/// Table `a`'s lookups served by its row cache and by the SSD tier so far.
fn served_from(store: &Store) -> (u64, u64) {
    served_from_table(store, "a")
}

fn served_from_table(store: &Store, table: &str) -> (u64, u64) {
    let a = store
        .tier_report()
        .unwrap()
        .into_iter()
        .find(|t| t.table == table);
    let a = a.unwrap();
    (a.lookups_cache, a.lookups_ssd)
}

#[test]
fn a_restart_serves_the_kept_hot_set_from_dram_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    let kept = dir.path().join("hot");
    std::fs::create_dir(&kept).unwrap();
    let config = config(&format!("hot_set_dir = {:?}", kept.display().to_string()));
    let ids: Vec<i64> = (0..300).map(|i| (i * 13 + 7) % ROWS as i64).collect();

    let store = Store::open(&path, &config).unwrap();
    let want = lookup(&store, &ids);
    assert_eq!(
        served_from(&store),
        (0, ids.len() as u64),
        "a cold start reads them all"
    );
    store.close().unwrap();
    drop(store);
    let file = kept.join("store.hotset");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("nearrec-hot-set"), "{text:.80}");

    let store = Store::open(&path, &config).unwrap();
    assert_eq!(lookup(&store, &ids), want);
    assert_eq!(
        served_from(&store),
        (ids.len() as u64, 0),
        "the restart serves the kept rows from its row cache"
    );
    drop(store);

    // a damaged hot set only costs the warm-up; a damaged warm file refuses the open
    std::fs::write(&file, b"{\"format\": \"something else\"").unwrap();
    let store = Store::open(&path, &config).unwrap();
    assert_eq!(lookup(&store, &ids[..10]), want[..10 * DIM as usize]);
    assert_eq!(served_from(&store), (0, 10));
    drop(store);
    let warm = config.clone().with_warm(&file);
    let e = Store::open(&path, &warm).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    let e = Store::open(&path, &config.with_warm(dir.path().join("none"))).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert!(e.to_string().contains("none"), "{e}");
}

#[test]
fn a_recorded_trace_warms_its_most_requested_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = make_store(dir.path());
    // 2,000 requests of `a`: rows 0..100 twenty times each... and 1,900 rows once each, past
    // what the cache holds; `b` and a table the store lacks too
    let mut indices: Vec<i64> = (0..2000).map(|i| (i % 100) as i64).collect();
    indices.extend((0..1900).map(|i| 1000 + i as i64));
    let offsets: Vec<i64> = (0..=indices.len() as i64).collect();
    let table = |name, rows| nearrec_plan::file::TableData {
        name,
        rows,
        pooling: 1,
        generator: None,
        first_reference_share: None,
        keys: false,
        offsets: &offsets,
        indices: &indices,
    };
    let trace = dir.path().join("requests.nrtrace");
    let tables = [table("a", ROWS), table("b", ROWS), table("gone", 5000)];
    nearrec_plan::file::write_trace(&trace, 64, 0, &tables, false).unwrap();

    let store = Store::open(&path, &config("").with_warm(&trace)).unwrap();
    let hot: Vec<i64> = (0..100).collect();
    lookup(&store, &hot);
    assert_eq!(
        served_from(&store),
        (100, 0),
        "the most requested rows are in DRAM"
    );
}

/// A keyed table's trace holds keys (past the rows, the high bit set): the most requested keys'
/// rows are warmed through the key index, keys the store does not hold are dropped, and a keyed
/// trace of a table addressed by row is skipped, not read as rows.
#[test]
fn a_keyed_trace_warms_its_most_requested_keys() {
    let dir = tempfile::tempdir().unwrap();
    let key = |i: u64| (1u64 << 63) | (i * 1_000_003);
    let keys: Vec<u64> = (0..ROWS).map(key).collect();
    let path = nearrec_testkit::write_keyed_store(
        dir.path().join("keyed"),
        "k",
        &keys,
        DIM,
        DType::Fp32,
        |_, i| i as f32,
    );
    // keys 0..100 twenty times each, 1,900 others once, and 500 the store does not hold
    let mut indices: Vec<i64> = (0..2000).map(|i| key(i % 100) as i64).collect();
    indices.extend((0..1900).map(|i| key(1000 + i) as i64));
    indices.extend((0..500).map(|i| key(ROWS + i) as i64));
    let offsets: Vec<i64> = (0..=indices.len() as i64).collect();
    let table = |name, keys| nearrec_plan::file::TableData {
        name,
        rows: ROWS + 1,
        pooling: 1,
        generator: None,
        first_reference_share: None,
        keys,
        offsets: &offsets,
        indices: &indices,
    };
    let trace = dir.path().join("keys.nrtrace");
    nearrec_plan::file::write_trace(&trace, 64, 0, &[table("k", true)], false).unwrap();
    let keyed =
        StoreConfig::from_toml("tier = \"ssd\"\n[plan.tables.k]\ncache_bytes = 65536").unwrap();

    let cold = Store::open(&path, &keyed).unwrap();
    let hot: Vec<i64> = (0..100).map(|i| key(i) as i64).collect();
    let want = lookup_in(&cold, "k", &hot);
    assert_eq!(
        served_from_table(&cold, "k"),
        (0, 100),
        "a cold start reads them"
    );
    drop(cold);
    let store = Store::open(&path, &keyed.with_warm(&trace)).unwrap();
    assert_eq!(lookup_in(&store, "k", &hot), want);
    assert_eq!(
        served_from_table(&store, "k"),
        (100, 0),
        "the most requested keys' rows are in DRAM"
    );
    drop(store);

    // the same keys named as table `a` of a store addressed by row: skipped, the store opens cold
    let rows = make_store(dir.path());
    std::fs::remove_file(&trace).unwrap();
    nearrec_plan::file::write_trace(&trace, 64, 0, &[table("a", true)], false).unwrap();
    let store = Store::open(&rows, &config("").with_warm(&trace)).unwrap();
    lookup(&store, &[0, 1, 2]);
    assert_eq!(served_from(&store), (0, 3));
}
