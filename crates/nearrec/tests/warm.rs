//! Start-up warm-up: a store reopened with `hot_set_dir` serves the rows its last run held from
//! DRAM from its first lookup; one opened with `warm` a recorded trace's most requested rows; a
//! damaged kept hot set starts the store cold, a damaged `warm` file refuses the open.

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
    let batch = Batch::new(vec![TableLookup::new(
        "a",
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
    let a = store
        .tier_report()
        .unwrap()
        .into_iter()
        .find(|t| t.table == "a");
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
