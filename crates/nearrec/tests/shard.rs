//! A store cut into shards (`nearrec::shard`): each shard's rows are the source's bytes, its
//! hot rows after its part; the plan comes last; what cannot be cut is refused, typed.

use std::path::Path;

use nearrec::format::{DType, StoreReader};
use nearrec::plan::shards::{SHARD_PLAN, ShardPlan};
use nearrec::plan::{Scheme, ShardOptions, TraceTable, plan_shards};
use nearrec::shard::{shard_store, shard_tag, write_shards};
use nearrec::{ErrorKind, Store, StoreConfig};

const TABLES: [(&str, u64, u32, DType); 3] = [
    ("a", 1000, 8, DType::Fp32),
    ("b", 700, 16, DType::Int8),
    ("c", 50, 4, DType::Fp16),
];

fn source(dir: &Path) -> std::path::PathBuf {
    nearrec_testkit::write_store(dir.join("src"), &TABLES, nearrec_testkit::pattern)
}

/// Rows `ids` of table `name` as stored, in the store at `path`.
fn stored(path: &Path, name: &str, ids: &[u64]) -> Vec<u8> {
    let r = StoreReader::open(path).unwrap();
    let i = r.tables().iter().position(|t| t.name == name).unwrap();
    let mut out = vec![0u8; ids.len() * r.tables()[i].row_bytes as usize];
    let sums = r.sector_sums(i).unwrap();
    r.read_rows_encoded(i, ids, sums.as_ref(), &mut out)
        .unwrap();
    out
}

#[test]
fn each_shard_holds_its_parts_and_hot_rows_as_the_source_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path());
    let reader = StoreReader::open(&src).unwrap();
    let ids: Vec<i64> = (0..5000).map(|i| (i * 13) % 40).collect();
    let trace: Vec<TraceTable<'_>> = TABLES
        .iter()
        .map(|&(name, rows, ..)| TraceTable {
            name,
            rows,
            indices: &ids,
        })
        .collect();
    let options = ShardOptions {
        shards: 3,
        replicas: 1,
        scheme: Scheme::Row,
        replicate_hot: 5,
    };
    let plan = plan_shards("src", reader.tables(), Some(&trace), &options).unwrap();
    let out = dir.path().join("sharded");
    write_shards(&reader, &plan, &out, false).unwrap();
    assert_eq!(ShardPlan::read(&out).unwrap(), plan);
    for t in &plan.tables {
        assert_eq!(t.hot.len(), 5, "{}", t.name);
        for (p, part) in t.parts.iter().enumerate() {
            let shard = ShardPlan::shard_dir(&out, part.shard);
            let tag = shard_tag(&shard).unwrap().unwrap();
            assert_eq!(
                (tag.plan.as_str(), tag.shard),
                (plan.id.as_str(), part.shard)
            );
            let global: Vec<u64> = (part.first..part.first + part.rows)
                .chain(t.hot.iter().copied())
                .collect();
            let local: Vec<u64> = (0..t.shard_rows(p)).collect();
            assert_eq!(
                stored(&shard, &t.name, &local),
                stored(&src, &t.name, &global),
                "{} part {p}",
                t.name
            );
        }
    }
    // a second cut over it: refused unless asked to replace it
    let e = write_shards(&reader, &plan, &out, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreExists, "{e}");
    let fewer = ShardOptions {
        shards: 2,
        replicate_hot: 0,
        ..options
    };
    let plan = shard_store(&src, None, &fewer, &out, true).unwrap();
    assert_eq!(ShardPlan::read(&out).unwrap(), plan);
    assert!(
        !ShardPlan::shard_dir(&out, 2).exists(),
        "a stale shard left"
    );
}

#[test]
fn what_cannot_be_cut_is_refused_and_leaves_no_plan() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path());
    let options = ShardOptions {
        shards: 2,
        replicas: 1,
        scheme: Scheme::Table,
        replicate_hot: 0,
    };
    // writes not yet folded into the table files
    {
        let config = StoreConfig {
            writable: true,
            ..StoreConfig::default()
        };
        let store = Store::open(&src, &config).unwrap();
        store.write("a", &[1], &[0.5; 8]).unwrap();
        store.close().unwrap();
    }
    let out = dir.path().join("sharded");
    let e = shard_store(&src, None, &options, &out, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert!(e.to_string().contains("compact"), "{e}");
    assert!(!out.join(SHARD_PLAN).exists());

    // a damaged sector of a table's data: named, and no plan written
    let src = source(&dir.path().join("other"));
    let reader = StoreReader::open(&src).unwrap();
    let file = src.join(&reader.tables()[0].file);
    drop(reader);
    let mut bytes = std::fs::read(&file).unwrap();
    let at = nearrec::format::DATA_OFFSET as usize + 100;
    bytes[at] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    let e = shard_store(&src, None, &options, &out, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreCorrupted, "{e}");
    assert!(!out.join(SHARD_PLAN).exists());
}
