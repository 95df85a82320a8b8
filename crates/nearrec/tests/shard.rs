//! A store cut into shards (`nearrec::shard`): each shard's rows are the source's bytes, its
//! hot rows after its part, as version 1 of the shard's repository; the plan comes last; a
//! later store cut by the same plan is one version of every shard; what cannot be cut is
//! refused, typed.

use nearrec::prelude::*;
use std::path::Path;

use nearrec::format::Repository;
use nearrec::format::{DType, StoreReader};
use nearrec::plan::shards::{SHARD_PLAN, ShardPlan};
use nearrec::plan::{Scheme, ShardOptions, TraceTable, plan_shards};
use nearrec::shard::{publish_cut, shard_store, shard_tag, write_shards};
use nearrec::versions::Located;
use nearrec::{ErrorKind, Store, StoreConfig};

const TABLES: [(&str, u64, u32, DType); 3] = [
    ("a", 1000, 8, DType::Fp32),
    ("b", 700, 16, DType::Int8),
    ("c", 50, 4, DType::Fp16),
];

fn source(dir: &Path) -> std::path::PathBuf {
    nearrec_testkit::write_store(dir.join("src"), &TABLES, nearrec_testkit::pattern)
}

/// Rows `ids` of table `name` as stored, in the store at `path` (a repository's current
/// version).
fn stored(path: &Path, name: &str, ids: &[u64]) -> Vec<u8> {
    let r = Located::open(path).unwrap().reader;
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
            keys: false,
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
    for k in 0..plan.shards {
        let repo = Repository::detect(&ShardPlan::shard_dir(&out, k)).unwrap();
        assert_eq!(
            (repo.versions().unwrap(), repo.current().unwrap()),
            (vec![1], 1)
        );
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

#[test]
fn a_store_published_into_a_cut_is_the_next_version_of_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path());
    let options = ShardOptions {
        shards: 2,
        replicas: 1,
        scheme: Scheme::Row,
        replicate_hot: 0,
    };
    let out = dir.path().join("sharded");
    let plan = shard_store(&src, None, &options, &out, false).unwrap();
    // the next model: the same tables, other values
    let next = nearrec_testkit::write_store(dir.path().join("next"), &TABLES, |t, i| {
        nearrec_testkit::pattern(t, i) + 1.0
    });
    // one shard's repository ahead of the other (a publish interrupted there): the version
    // goes above it on both
    let ahead = Repository::detect(&ShardPlan::shard_dir(&out, 1)).unwrap();
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    for e in std::fs::read_dir(ahead.version_path(1)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
    }
    ahead
        .publish(&copy, nearrec::format::Publish::Move)
        .unwrap();
    assert_eq!(publish_cut(&next, &out).unwrap(), 3);
    for t in &plan.tables {
        for (p, part) in t.parts.iter().enumerate() {
            let repo = Repository::detect(&ShardPlan::shard_dir(&out, part.shard)).unwrap();
            assert!(repo.versions().unwrap().ends_with(&[3]), "{t:?}");
            let global: Vec<u64> = (part.first..part.first + part.rows)
                .chain(t.hot.iter().copied())
                .collect();
            let local: Vec<u64> = (0..t.shard_rows(p)).collect();
            assert_eq!(
                stored(&repo.version_path(3), &t.name, &local),
                stored(&next, &t.name, &global),
                "{} part {p}",
                t.name
            );
            // published, not served: the pointer is a swap's to move
            assert_eq!(repo.current().unwrap(), 1);
        }
    }
    // a store of other tables does not fit the plan: refused, naming the table
    let other = nearrec_testkit::write_store(
        dir.path().join("other"),
        &[("a", 999, 8, DType::Fp32)],
        nearrec_testkit::pattern,
    );
    let e = publish_cut(&other, &out).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
}

/// A shard's tag moves by compare-and-set (`Replica::retag`), durably: refused from a plan it
/// is not at, naming the one it is; done again as nothing; kept across a reopen; refused on a
/// store that is no shard and on one opened read-only.
#[test]
fn a_shard_is_retagged_by_compare_and_set_and_keeps_its_tag() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path());
    let options = ShardOptions {
        shards: 2,
        replicas: 1,
        scheme: Scheme::Row,
        replicate_hot: 0,
    };
    let out = dir.path().join("sharded");
    let plan = shard_store(&src, None, &options, &out, false).unwrap();
    let shard = ShardPlan::shard_dir(&out, 1);
    let writable = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let store = Store::open(&shard, &writable).unwrap();
    let replica = store.replica().unwrap();
    let tag = replica.retag(&plan.id, "next", Some(&plan.id)).unwrap();
    assert_eq!(
        (tag.plan.as_str(), tag.previous.as_deref()),
        ("next", Some(plan.id.as_str()))
    );
    assert_eq!(store.shard().unwrap(), Some(tag.clone()));
    assert!(tag.takes("next") && tag.takes(&plan.id) && !tag.takes("other"));
    // done again: nothing; from a plan it is not at: refused, naming the one it is at
    assert_eq!(
        replica.retag(&plan.id, "next", Some(&plan.id)).unwrap(),
        tag
    );
    let e = replica.retag(&plan.id, "third", None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert!(e.to_string().contains("is of plan next"), "{e}");
    let tag = replica.retag("next", "next", None).unwrap();
    drop(store);
    let store = Store::open(&shard, &writable).unwrap();
    assert_eq!(store.shard().unwrap(), Some(tag));
    assert_eq!(shard_tag(&shard).unwrap().unwrap().plan, "next");
    drop(store);
    let read_only = Store::open(&shard, &StoreConfig::default()).unwrap();
    let e = read_only
        .replica()
        .unwrap()
        .retag("next", "x", None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreReadOnly, "{e}");
    let plain = Store::open(&src, &writable).unwrap();
    let e = plain.replica().unwrap().retag("a", "b", None).unwrap_err();
    assert!(e.to_string().contains("no shard"), "{e}");
}

/// A replica its node holds in etcd, told by a router that it is no member
/// (`Replica::set_membership`), serves nothing from then on, though its hold has not run out:
/// its router lets the members take a write it lacks as soon as it answers. Served without a
/// hold, it is left as it is.
#[test]
fn a_held_replica_told_it_is_out_serves_nothing_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let writable = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let lookup = |store: &Store| {
        let ids = [1i64];
        let batch = nearrec::Batch::new(vec![nearrec::TableLookup::new(
            "a",
            nearrec::Indices::I64(&ids),
            nearrec::Bags::Fixed {
                batch: 1,
                bag_size: 1,
            },
        )]);
        store.lookup(&batch).map(drop)
    };
    for held in [true, false] {
        let sub = dir.path().join(format!("held-{held}"));
        std::fs::create_dir(&sub).unwrap();
        let store = Store::open(source(&sub), &writable).unwrap();
        let replica = store.replica().unwrap();
        let me = replica.membership().unwrap().replica;
        if held {
            store.require_hold();
            let (now, hold) = (
                std::time::Instant::now(),
                std::time::Duration::from_secs(60),
            );
            store.hold(1, &[me, me + 1], now, hold).unwrap();
        } else {
            replica.set_membership(0, 1, &[me, me + 1]).unwrap();
        }
        lookup(&store).unwrap();
        replica.set_membership(1, 2, &[me + 1]).unwrap();
        match held {
            true => {
                let e = lookup(&store).unwrap_err();
                assert!(e.to_string().contains("no member"), "{e}");
            }
            false => lookup(&store).unwrap(),
        }
    }
}
