//! The store's conformance suite (`nearrec`'s `tests/suite/`) over sharded stores: the suite's
//! store cut table-, row- and table-row-wise (with replicas, and with hot rows replicated),
//! each shard replica a storage node on loopback in this process. Then what only a sharded
//! store has: writes that span shards refused whole, a plan that does not fit its shards, a
//! shard with no replica up, a replica lost under load, the fan-out hot rows save.
//!
//! Then cluster versions: a swap of every shard under load from two routers, no batch read at
//! two versions.
//!
//! The suite runs whole on each scheme, from its one list: a case that needs a capability the
//! sharded store lacks (`Schema`, `Replica`; `Inference` without a shard holding every table
//! whole) ends where it asks, said; so does one that needs what the runner says it lacks (a
//! swap to a directory, a repository's other versions: `Cluster::lacks`). Its own swaps are tested below.

#[path = "../../nearrec/tests/suite/mod.rs"]
#[macro_use]
mod suite;

#[path = "../../nearrec-server/tests/common/mod.rs"]
mod common;

use nearrec::prelude::*;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nearrec::plan::shards::ShardPlan;
use nearrec::plan::{Scheme, ShardOptions, TraceTable, plan_shards};
use nearrec::{
    Bags, Batch, ErrorKind, Indices, RowValues, RowWrite, StoreApi, TableLookup, WriteOptions,
};
use nearrec_cluster::{Endpoint, Hedge, ShardedOptions, ShardedStore};
use nearrec_server::{NodeConfig, Stores};
use suite::Opened;

/// The nodes of a sharded store, one per shard replica, and the directory of its shards.
struct Cluster {
    nodes: Vec<Vec<common::Node>>,
    _dir: tempfile::TempDir,
    /// What the store cannot do that a case may ask ([`suite::Opened::lacks`]).
    lacks: Vec<(&'static str, &'static str)>,
}

/// The suite's store at `path` cut by `options` (a trace of the suite's ids where hot rows
/// are replicated), each shard replica on a node of its own, through a sharded store.
fn sharded(path: &Path, writable: bool, options: ShardOptions) -> (ShardedStore, Cluster) {
    let dir = tempfile::tempdir().unwrap();
    let mut lacks = vec![(
        "path swaps",
        "a sharded store swaps to versions every shard holds (nearrec shard --publish), not \
         to a directory",
    )];
    lacks.push((
        "its table files at the path",
        "each shard serves a copy of its part, cut from the path",
    ));
    // a repository's served version is cut; its other versions are not published
    let reader = nearrec::Located::open(path).unwrap().reader;
    if reader.path() != path {
        lacks.push((
            "a repository's versions",
            "the runner cuts the served version alone",
        ));
    }
    // as many shards as tables at most, table-wise (a keyed store has one)
    let options = match options.scheme {
        Scheme::Table => ShardOptions {
            shards: options.shards.min(reader.tables().len()),
            ..options
        },
        _ => options,
    };
    lacks.push((
        "its model's updates at the path",
        "the runner cuts the store at the path again at each open: an update went to the \
         shards' copies",
    ));
    // every table read mostly at its rows 0..20, the hottest
    let ids: Vec<i64> = (0..4000)
        .map(|i| if i % 4 == 0 { i % 300 } else { i % 20 })
        .collect();
    let trace: Vec<TraceTable<'_>> = (reader.tables().iter())
        .map(|t| TraceTable {
            name: &t.name,
            rows: t.rows,
            indices: &ids,
            keys: false,
        })
        .collect();
    let traced = (options.replicate_hot > 0).then_some(trace.as_slice());
    let plan = plan_shards("suite", reader.tables(), traced, &options).unwrap();
    nearrec::shard::write_shards(&reader, &plan, dir.path(), false).unwrap();
    let toml = format!("tier = \"ssd\"\ndram_budget = \"16KiB\"\nwritable = {writable}");
    let mut nodes = Vec::new();
    let mut endpoints = Vec::new();
    for k in 0..plan.shards {
        let (mut held, mut at) = (Vec::new(), Vec::new());
        for r in 0..plan.replicas {
            // a writable store has one writer: each replica its own copy; read-only, they
            // share the shard's repository, as nodes of one file system would
            let shard = ShardPlan::shard_dir(dir.path(), k);
            let served = match writable {
                true => {
                    let copy = dir.path().join(format!("copy-{k}-{r}"));
                    copy_dir(&shard, &copy);
                    copy
                }
                false => shard,
            };
            let mut stores = Stores::new();
            stores.insert("s", common::open(&served, &toml)).unwrap();
            let node = common::Node::start(stores, NodeConfig::default());
            at.push(Endpoint {
                addr: node.addr.to_string(),
                store: "s".into(),
            });
            held.push(node);
        }
        nodes.push(held);
        endpoints.push(at);
    }
    let store = ShardedStore::open(dir.path(), &endpoints, manual()).unwrap();
    let cluster = Cluster {
        nodes,
        _dir: dir,
        lacks,
    };
    (store, cluster)
}

/// `from`'s files and folders copied to `to` (a shard's repository and its versions).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A router whose replicas are caught up only when a test calls for it.
fn manual() -> ShardedOptions {
    ShardedOptions {
        catch_up_every: None,
        ..ShardedOptions::default()
    }
}

fn options(shards: usize, replicas: usize, scheme: Scheme, hot: u64) -> ShardOptions {
    ShardOptions {
        shards,
        replicas,
        scheme,
        replicate_hot: hot,
    }
}

fn opened(s: (ShardedStore, Cluster)) -> Opened {
    Opened {
        store: Arc::new(s.0),
        lacks: s.1.lacks.clone(),
        keep: Box::new(s.1),
    }
}

/// Whole tables, one per shard.
fn table_wise(path: &Path, writable: bool) -> Opened {
    opened(sharded(path, writable, options(3, 1, Scheme::Table, 0)))
}

/// Every table over two shards, each shard on two replicas.
fn row_wise(path: &Path, writable: bool) -> Opened {
    opened(sharded(path, writable, options(2, 2, Scheme::Row, 0)))
}

/// Tables over four shards as their cost asks.
fn table_row_wise(path: &Path, writable: bool) -> Opened {
    opened(sharded(path, writable, options(4, 1, Scheme::TableRow, 0)))
}

/// Every table over three shards, the twenty hottest rows of each on every shard (a hot row
/// written is a write to every shard).
fn hot_replicated(path: &Path, writable: bool) -> Opened {
    opened(sharded(path, writable, options(3, 1, Scheme::Row, 20)))
}

/// The whole suite over each scheme: a case needing a capability a sharded store lacks ends
/// where it asks for it (`needs!`).
macro_rules! sharded_suite {
    ($name:ident, $open:path) => {
        mod $name {
            use super::*;

            store_api_suite!($open);
        }
    };
}

sharded_suite!(table, table_wise);
sharded_suite!(row, row_wise);
sharded_suite!(table_row, table_row_wise);
sharded_suite!(hot, hot_replicated);

/// A store cut into one shard of one replica.
fn one_shard(path: &Path, writable: bool) -> Opened {
    opened(sharded(path, writable, options(1, 1, Scheme::Table, 0)))
}

/// A sharded store writes, creates and drops tables, swaps its versions and runs the model its
/// shards keep (on the shard that holds every table whole, else on the router); it is no
/// replica (it drives its replicas with that).
#[test]
fn a_sharded_store_has_writes_schema_versions_and_its_model() {
    let (_dir, path) = suite::fixture();
    let s = row_wise(&path, true);
    assert_eq!(s.store.capabilities(), ["writes", "schema", "versions"]);
    suite::keep_model(&path, &[0.25; suite::DIM as usize], 0.0);
    let s = row_wise(&path, true);
    let all = ["writes", "schema", "versions", "inference"];
    assert_eq!(s.store.capabilities(), all);
    let s = one_shard(&path, true);
    let caps = s.store.capabilities();
    assert_eq!(caps, all);
}

/// An unknown key is named at its position in the caller's lookup, not in the share of the
/// shard that found it unknown.
#[test]
fn an_unknown_key_on_another_shard_is_named_at_the_callers_position() {
    let dir = tempfile::tempdir().unwrap();
    let keys = suite::suite_keys();
    let path = nearrec_testkit::write_keyed_store(
        dir.path().join("keyed"),
        "k",
        &keys,
        suite::DIM,
        nearrec::format::DType::Fp32,
        |_, i| i as f32,
    );
    let s = row_wise(&path, false);
    let on = |part: usize| {
        keys.iter()
            .filter(move |&&k| nearrec::plan::key_part(k, 2) == part)
    };
    let unknown = (1u64..)
        .find(|&k| nearrec::plan::key_part(k, 2) == 1 && !keys.contains(&k))
        .unwrap();
    let mut ids: Vec<i64> = on(0).take(3).map(|&k| k as i64).collect();
    ids.push(unknown as i64);
    ids.extend(on(1).take(2).map(|&k| k as i64));
    let lengths = [ids.len() as i64];
    let e = s
        .store
        .lookup(&Batch::new(vec![TableLookup::new(
            "k",
            Indices::I64(&ids),
            Bags::Lengths(Indices::I64(&lengths)),
        )]))
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.table(), e.position()),
        (ErrorKind::UnknownKey, Some("k"), Some(3)),
        "{e}"
    );
}

/// Writes by key where the keyed table is on one shard of one replica (one call, no
/// cross-shard transaction; the suite runs the case through one on every other scheme).
#[test]
fn keyed_tables_are_written_by_key_on_one_shard() {
    suite::keyed_tables_are_written_by_key(one_shard);
}

/// Issue 66: a keyed table with room for new keys, cut by key over two shards of two replicas
/// each, written through transactions (new keys, old keys, removals, in calls that span both
/// parts); then a replica that missed writes — new keys, a key rewritten, a key removed — is
/// caught up by key, each replica's keys holding rows of its own: after it, both replicas of
/// each shard hold the same keys with the same rows, and the caught-up one serves every
/// acknowledged write alone.
#[test]
fn keyed_tables_are_written_across_shards_and_replicas_and_caught_up_by_key() {
    use nearrec::format::{DType, StoreOptions, StoreWriter, TableSpec};
    use std::collections::HashMap;
    let dir = tempfile::tempdir().unwrap();
    let dim = suite::DIM as usize;
    let path = dir.path().join("keyed");
    let built: Vec<u64> = (0..200u64).map(|i| i * 7_919 + 13).collect();
    let mut w = StoreWriter::create(&path, StoreOptions::default()).unwrap();
    let spec = TableSpec::new("k", built.len() as u64, suite::DIM, DType::Fp32);
    let mut t = w.keyed_table(spec, 400).unwrap();
    t.write_f32(&vec![1.0; built.len() * dim]).unwrap();
    w.finish_table_keyed(t, &built).unwrap();
    w.commit().unwrap();
    let (store, mut cluster) = sharded(&path, true, options(2, 2, Scheme::Row, 0));
    let mut want: HashMap<i64, f32> = built.iter().map(|&k| (k as i64, 1.0)).collect();
    let write = |want: &mut HashMap<i64, f32>, keys: &[i64], value: Option<f32>| {
        let values = value.map(|v| vec![v; keys.len() * dim]);
        let w = RowWrite {
            table: "k",
            ids: keys,
            values: values.as_deref().map(RowValues::F32),
        };
        store.write_many(&[w], WriteOptions::default()).unwrap();
        for &k in keys {
            match value {
                Some(v) => want.insert(k, v),
                None => want.remove(&k),
            };
        }
    };
    let part = |k: i64| nearrec::plan::key_part(k as u64, 2);
    let new_keys: Vec<i64> = (0..40).map(|i| 1_000_000 + i * 31).collect();
    assert!((0..2).all(|p| new_keys.iter().any(|&k| part(k) == p)));
    // new keys and old ones in one call over both parts, then a removal over both
    write(&mut want, &new_keys[..20], Some(2.0));
    write(
        &mut want,
        &[built[0] as i64, built[1] as i64, new_keys[0]],
        Some(3.0),
    );
    write(&mut want, &[built[2] as i64, built[3] as i64], None);
    let check = |store: &ShardedStore, want: &HashMap<i64, f32>, what: &str| {
        let mut keys: Vec<i64> = want.keys().copied().collect();
        keys.sort_unstable();
        let got = store.lookup(&one_per_bag("k", &keys)).unwrap().0.values;
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(got[i * dim], want[k], "{what}: key {k}");
        }
    };
    check(&store, &want, "through transactions");
    let e = store
        .lookup(&one_per_bag("k", &[built[2] as i64]))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownKey, "{e}");
    // shard 0's second replica goes down; what it misses: new keys, a key rewritten, a key
    // removed, on shard 0's part
    let served = cluster._dir.path().join("copy-0-1");
    let mut down = cluster.nodes[0].remove(1);
    down.begin_drain();
    drop(down);
    let on0: Vec<i64> = new_keys.iter().copied().filter(|&k| part(k) == 0).collect();
    let old0: Vec<i64> = (built.iter().map(|&k| k as i64))
        .filter(|&k| part(k) == 0 && want.contains_key(&k))
        .take(2)
        .collect();
    write(&mut want, &new_keys[20..], Some(4.0));
    write(&mut want, &on0[..1], Some(5.0));
    write(&mut want, &old0[..1], None);
    write(&mut want, &old0[1..2], Some(6.0));
    let stats = store.stats().unwrap();
    assert_eq!(stats.get("cluster_stale_replicas"), Some(1.0), "{stats:?}");
    let shard0 = back_behind(&mut cluster, &served, &store);
    store.set_replicas(0, &shard0).unwrap();
    let caught = store.catch_up(Duration::from_secs(10));
    assert_eq!(caught.len(), 1, "{caught:?}");
    let done = caught[0].2.as_ref().unwrap();
    assert!(done.rows_before_fence > 0, "{done:?}");
    let clients = direct(&cluster);
    let digests = |c: &nearrec_client::Client| {
        use nearrec::Replica as _;
        c.key_digests("k", None, 1 << 16).unwrap()
    };
    for (k, replicas) in clients.iter().enumerate() {
        let (l, r) = (digests(&replicas[0]), digests(&replicas[1]));
        let held: Vec<i64> = l.iter().map(|&(key, _)| key as i64).collect();
        let mut of_part: Vec<i64> = want.keys().copied().filter(|&key| part(key) == k).collect();
        of_part.sort_unstable_by_key(|&key| key as u64);
        assert_eq!(held, of_part, "shard {k}: its keys");
        assert_eq!(l, r, "shard {k}: both replicas' keys and rows");
    }
    // paged: from after a key on, in order
    let all = digests(&clients[1][0]);
    let after = all[4].0;
    let page = {
        use nearrec::Replica as _;
        clients[1][0].key_digests("k", Some(after), 3).unwrap()
    };
    assert_eq!(page, all[5..8]);
    // the member goes: the caught-up replica serves every acknowledged write alone
    drop(cluster.nodes[0].remove(0));
    check(&store, &want, "the caught-up replica alone");
}
fn one_per_bag<'a>(table: &'a str, ids: &'a [i64]) -> Batch<'a> {
    Batch::new(vec![TableLookup::new(
        table,
        Indices::I64(ids),
        Bags::Fixed {
            batch: ids.len(),
            bag_size: 1,
        },
    )])
}

/// Each replica of every shard, through a client of its own (as a router that died would have
/// left them).
fn direct(cluster: &Cluster) -> Vec<Vec<nearrec_client::Client>> {
    (cluster.nodes.iter())
        .map(|nodes| {
            (nodes.iter())
                .map(|n| {
                    nearrec_client::Client::connect(&n.addr.to_string(), "s", Default::default())
                        .unwrap()
                })
                .collect()
        })
        .collect()
}

/// A future's output, on a runtime of its own.
fn wait<T>(f: impl std::future::Future<Output = T>) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(f)
}

#[test]
fn a_lookup_waits_for_writes_prepared_before_it_and_for_those_it_expects() {
    let (_d, path) = suite::fixture();
    let (store, cluster) = sharded(&path, true, options(2, 2, Scheme::Row, 0));
    let dim = suite::DIM as usize;
    let clients = direct(&cluster);
    let local = |id: i64| id - store.plan().tables[0].parts[1].first as i64;
    let (row, other) = (299i64, 298i64);
    let five = vec![5.0f32; dim];
    let write = RowWrite {
        table: "t0",
        ids: &[local(row)],
        values: Some(RowValues::F32(&five)),
    };
    // a write across shards 0 and 1 prepared on shard 1's replicas (as its router would)
    let note = "decider=1/0 shards=0,1";
    for c in &clients[1] {
        (c.prepare_write(5, &[write], WriteOptions::default(), note, None, None)).unwrap();
    }
    let reader = {
        let store = store.clone();
        std::thread::spawn(move || store.lookup(&one_per_bag("t0", &[row])))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !reader.is_finished(),
        "a lookup of a row held waits for its decision"
    );
    for c in &clients[1] {
        c.decide(5, nearrec::Decision::Commit, false).unwrap();
    }
    let (pooled, _) = reader.join().unwrap().unwrap();
    assert_eq!(
        pooled.values, five,
        "the write, decided while the lookup waited"
    );
    // each replica names the transaction as its row's last writer, with its note
    let both = [local(row), local(other)];
    let batch = one_per_bag("t0", &both);
    for c in &clients[1] {
        let answer = wait(c.start_lookup(&batch, None, None, &[]).unwrap());
        let writers: Vec<_> = (answer.unwrap().writers.iter())
            .map(|w| (w.tx, w.note.to_string()))
            .collect();
        assert_eq!(writers, vec![(5, note.to_owned())]);
    }
    // a lookup expecting a transaction waits for it though it holds no row it reads
    let six = vec![6.0f32; dim];
    let write = RowWrite {
        table: "t0",
        ids: &[local(row)],
        values: Some(RowValues::F32(&six)),
    };
    let c = &clients[1][0];
    (c.prepare_write(6, &[write], WriteOptions::default(), note, None, None)).unwrap();
    let just = [local(other)];
    let just_other = one_per_bag("t0", &just);
    let answer = wait(c.start_lookup(&just_other, None, None, &[]).unwrap());
    assert!(
        answer.unwrap().writers.is_empty(),
        "no writer of that row, none waited for"
    );
    let start = std::time::Instant::now();
    let e = wait(c.start_lookup(&just_other, None, None, &[6]).unwrap()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreLocked, "{e}");
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "it waited: {:?}",
        start.elapsed()
    );
    c.decide(6, nearrec::Decision::Abort, false).unwrap();
    let answer = wait(c.start_lookup(&just_other, None, None, &[6]).unwrap());
    assert!(answer.is_ok());
}

#[test]
fn a_write_across_shards_commits_on_every_replica_or_nowhere() {
    let (_d, path) = suite::fixture();
    let (store, cluster) = sharded(&path, true, options(2, 2, Scheme::Row, 0));
    let dim = suite::DIM as usize;
    let ids = [3i64, 299]; // one row on each shard
    let before = store.lookup(&one_per_bag("t0", &ids)).unwrap().0.values;
    // a bad value on one shard's row: refused before any shard prepares, at the caller's
    // position
    let mut values = vec![7.0f32; 2 * dim];
    values[dim + 2] = f32::NAN;
    let w = RowWrite {
        table: "t0",
        ids: &ids,
        values: Some(RowValues::F32(&values)),
    };
    let e = store.write_many(&[w], WriteOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert_eq!((e.table(), e.position()), (Some("t0"), Some(1)), "{e}");
    // one refused by a shard's node (a row a prepared transaction holds): nothing anywhere
    let clients = direct(&cluster);
    let held_row = 299 - store.plan().tables[0].parts[1].first as i64;
    let one = vec![1.0f32; dim];
    let hold = RowWrite {
        table: "t0",
        ids: &[held_row],
        values: Some(RowValues::F32(&one)),
    };
    for c in &clients[1] {
        // no note a router reads: left alone by settling, whatever its age
        c.prepare_write(99, &[hold], WriteOptions::default(), "", None, None)
            .unwrap();
    }
    values[dim + 2] = 7.0;
    let w = RowWrite {
        table: "t0",
        ids: &ids,
        values: Some(RowValues::F32(&values)),
    };
    let quick = ShardedStore::open(
        cluster._dir.path(),
        &endpoints(&store),
        ShardedOptions {
            client: nearrec_client::ClientOptions {
                timeout: Some(Duration::from_millis(300)),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    let e = quick.write_many(&[w], WriteOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreLocked, "{e}");
    for replicas in &clients {
        for c in replicas {
            let left: Vec<_> = c.transactions().unwrap().iter().map(|t| t.tx).collect();
            assert!(left.iter().all(|&t| t == 99), "{left:?}");
        }
    }
    // a read of the row held waits for its decision, and past a second fails naming it: its
    // value is in doubt (`docs/distributed.md`, "Reads while writes go on")
    let e = store.lookup(&one_per_bag("t0", &ids)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreLocked, "{e}");
    assert!(e.to_string().contains(&format!("{:032x}", 99)), "{e}");
    for c in &clients[1] {
        c.decide(99, nearrec::Decision::Abort, false).unwrap();
    }
    assert_eq!(
        store.lookup(&one_per_bag("t0", &ids)).unwrap().0.values,
        before
    );
    // now it goes through: every replica of both shards has it, at one more version each
    let v0 = store.version().unwrap();
    let v1 = store.write_many(&[w], WriteOptions::default()).unwrap();
    assert_eq!(
        v1,
        v0 + 2,
        "one version a shard (each shard's replicas agree)"
    );
    for (k, replicas) in clients.iter().enumerate() {
        let local = if k == 0 { 3 } else { held_row };
        for c in replicas {
            let mut out = vec![0f32; dim];
            c.read_rows("t0", &[local], &mut out).unwrap();
            assert_eq!(out, values[k * dim..][..dim], "shard {k}");
            // the decider forgets the outcome just after the call returns
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while !c.transactions().unwrap().is_empty() {
                assert!(std::time::Instant::now() < until, "an outcome left kept");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    let (pooled, read) = store.lookup(&one_per_bag("t0", &ids)).unwrap();
    assert_eq!(pooled.values, values);
    assert_eq!(read.version, v1);
    // written again at once, twice: each write answers once its decider committed, its other
    // replicas' commits on their way and holding the rows; the next write of them waits for
    // those, and a lookup after sees the last, at the version the write answered
    let twice = [values.clone(), values.iter().map(|v| v + 1.0).collect()];
    let mut version = v1;
    for values in &twice {
        let w = RowWrite {
            table: "t0",
            ids: &ids,
            values: Some(RowValues::F32(values)),
        };
        version = store.write_many(&[w], WriteOptions::default()).unwrap();
    }
    assert_eq!(version, v1 + 4);
    let (pooled, read) = store.lookup(&one_per_bag("t0", &ids)).unwrap();
    assert_eq!(pooled.values, twice[1]);
    assert_eq!(read.version, version);
}

/// The endpoints a sharded store's replicas are served at.
fn endpoints(store: &ShardedStore) -> Vec<Vec<Endpoint>> {
    (store.replicas().iter())
        .map(|r| {
            r.iter()
                .map(|a| Endpoint::parse(&format!("{a}/s")))
                .collect()
        })
        .collect()
}

#[test]
fn a_write_its_router_left_prepared_is_settled_as_its_decider_says() {
    let (_d, path) = suite::fixture();
    let (store, cluster) = sharded(&path, true, options(2, 1, Scheme::Row, 0));
    let dim = suite::DIM as usize;
    let clients = direct(&cluster);
    let second = store.plan().tables[0].parts[1].first as i64;
    let ids = [3i64, second + 3];
    let rows = |v: f32| vec![v; dim];
    let (a_rows, b_rows) = (rows(1.5), rows(2.5));
    let prepare = |tx: u128, values: &[f32]| {
        for c in [&clients[0][0], &clients[1][0]] {
            let w = RowWrite {
                table: "t0",
                ids: &[3],
                values: Some(RowValues::F32(values)),
            };
            c.prepare_write(
                tx,
                &[w],
                WriteOptions::default(),
                "decider=0/0 shards=0,1",
                None,
                None,
            )
            .unwrap();
        }
    };
    let before = store.lookup(&one_per_bag("t0", &ids)).unwrap().0.values;
    // a: the router died after phase one; nobody decided it: aborted everywhere
    prepare(0xa, &a_rows);
    let settled = store.settle(Duration::ZERO);
    assert_eq!((settled.aborted, settled.committed), (2, 0), "{settled:?}");
    assert_eq!(
        store.lookup(&one_per_bag("t0", &ids)).unwrap().0.values,
        before
    );
    // its decider keeps the abort (a commit on its way is refused) until a pass finds no
    // replica holding it
    let e = clients[0][0]
        .decide(0xa, nearrec::Decision::Commit, false)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    // b: the router died after the decider committed: committed everywhere
    prepare(0xb, &b_rows);
    clients[0][0]
        .decide(0xb, nearrec::Decision::Commit, true)
        .unwrap();
    let settled = store.settle(Duration::ZERO);
    assert_eq!((settled.aborted, settled.committed), (0, 1), "{settled:?}");
    let got = store.lookup(&one_per_bag("t0", &ids)).unwrap().0.values;
    assert_eq!(got, [b_rows.clone(), b_rows].concat());
    // a later pass forgets what the decider kept
    store.settle(Duration::ZERO);
    for c in [&clients[0][0], &clients[1][0]] {
        assert!(c.transactions().unwrap().is_empty());
    }
    // c: young transactions are left to their router
    prepare(0xc, &a_rows);
    let settled = store.settle(Duration::from_secs(60));
    assert_eq!(settled, nearrec_cluster::Settled::default());
    assert_eq!(clients[1][0].transactions().unwrap().len(), 1);
    store.settle(Duration::ZERO);
    // d: a write that meets a row held by a transaction older than its deadline settles it
    // (here prepared on shard 1 alone: its decider never heard of it) and goes through
    let w = RowWrite {
        table: "t0",
        ids: &[3],
        values: Some(RowValues::F32(&a_rows)),
    };
    clients[1][0]
        .prepare_write(
            0xd,
            &[w],
            WriteOptions::default(),
            "decider=0/0 shards=0,1",
            None,
            None,
        )
        .unwrap();
    let quick = ShardedStore::open(
        cluster._dir.path(),
        &endpoints(&store),
        ShardedOptions {
            client: nearrec_client::ClientOptions {
                timeout: Some(Duration::from_secs(1)),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(1050));
    let fresh = [rows(6.0), rows(7.0)].concat();
    let w = RowWrite {
        table: "t0",
        ids: &ids,
        values: Some(RowValues::F32(&fresh)),
    };
    quick.write_many(&[w], WriteOptions::default()).unwrap();
    assert_eq!(
        quick.lookup(&one_per_bag("t0", &ids)).unwrap().0.values,
        fresh
    );
}

#[test]
fn a_plan_that_does_not_fit_its_shards_and_a_shard_with_no_node_are_typed_errors() {
    let (_d, path) = suite::fixture();
    let (store, cluster) = sharded(&path, false, options(2, 1, Scheme::Row, 0));
    let dir = store.location().unwrap();
    let addr = |k: usize| Endpoint {
        addr: cluster.nodes[k][0].addr.to_string(),
        store: "s".into(),
    };
    // the shards given the other way round: shard 0's node holds shard 1's rows
    let swapped = [vec![addr(1)], vec![addr(0)]];
    let plan = store.plan().clone();
    if plan
        .tables
        .iter()
        .any(|t| t.parts[0].rows != t.parts[1].rows)
    {
        let e = ShardedStore::open(&dir, &swapped, ShardedOptions::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
        assert!(e.to_string().contains("does not fit plan"), "{e}");
    }
    // a plan for another cut: three shards
    let e = ShardedStore::open(&dir, &[vec![addr(0)]], ShardedOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    // a shard whose only node is gone
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let dead = [
        vec![addr(0)],
        vec![Endpoint {
            addr: gone,
            store: "s".into(),
        }],
    ];
    let e = ShardedStore::open(&dir, &dead, ShardedOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().starts_with("shard 1 of suite"), "{e}");
    // no plan at all
    let e = ShardedStore::open(&path, &dead, ShardedOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreNotFound, "{e}");
}

#[test]
fn a_replica_lost_under_load_leaves_every_answer_whole_and_no_replica_fails_the_call() {
    let (_d, path) = suite::fixture();
    let (store, mut cluster) = sharded(&path, false, options(2, 2, Scheme::Row, 0));
    let ids: Vec<i64> = (0..300).step_by(7).collect();
    let want = store.lookup(&one_per_bag("t1", &ids)).unwrap().0.values;
    let store = Arc::new(store);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, ids, want, stop) = (store.clone(), ids.clone(), want.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let got = store.lookup(&one_per_bag("t1", &ids)).unwrap().0.values;
                    assert_eq!(got, want);
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // one replica of each shard stops
    for shard in &mut cluster.nodes {
        drop(shard.remove(0));
    }
    std::thread::sleep(Duration::from_millis(400));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let stats = store.stats().unwrap();
    assert!(stats.get("cluster_retries").unwrap() >= 1.0, "{stats:?}");
    assert_eq!(stats.get("cluster_failures"), Some(0.0));
    // then the other replica of shard 1: a call that needs it fails, naming it
    drop(cluster.nodes[1].remove(0));
    let e = store.lookup(&one_per_bag("t1", &ids)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().starts_with("shard 1 of suite"), "{e}");
    // and one that needs only shard 0 is answered
    let first = store.plan().tables[1].parts[0];
    if first.shard == 0 {
        assert!(store.lookup(&one_per_bag("t1", &[0])).is_ok());
    }
}

#[test]
fn a_node_started_at_a_lost_replica_s_address_never_answers_as_it() {
    let (_d, path) = suite::fixture();
    let (store, mut cluster) = sharded(&path, false, options(2, 2, Scheme::Row, 0));
    let ids: Vec<i64> = (0..300).step_by(7).collect();
    let want = store.lookup(&one_per_bag("t1", &ids)).unwrap().0.values;
    // replica 0 of shard 0 stops, and a node serving shard 1 starts at its address
    let lost = cluster.nodes[0].remove(0);
    let addr = lost.addr;
    drop(lost);
    let shard1 = ShardPlan::shard_dir(&store.location().unwrap(), 1);
    let mut stores = Stores::new();
    let toml = "tier = \"ssd\"\ndram_budget = \"16KiB\"";
    stores.insert("s", common::open(&shard1, toml)).unwrap();
    let impostor = common::Node::start_at(addr, stores, NodeConfig::default());
    for _ in 0..40 {
        let got = store.lookup(&one_per_bag("t1", &ids)).unwrap().0.values;
        assert_eq!(got, want);
    }
    let refused = "nearrec_refused_total{reason=\"wrong_shard\"}";
    let scraped = impostor.scrape();
    let line = scraped.lines().find(|l| l.starts_with(refused)).unwrap();
    let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 1.0, "the router never reached it: {line}");
    // the other replica of shard 0 too: shard 0 is gone, and said so, not answered by shard 1
    drop(cluster.nodes[0].remove(0));
    let e = store.lookup(&one_per_bag("t1", &ids)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().starts_with("shard 0 of suite"), "{e}");
}

#[test]
fn hot_rows_on_every_shard_keep_a_bag_on_one_shard() {
    let (_d, path) = suite::fixture();
    // bags of a cold id from the second half and two of the hottest (0..20) from the first
    let ids: Vec<i64> = (0..64)
        .flat_map(|b| [150 + b, b % 20, (b + 7) % 20])
        .collect();
    let lengths = vec![3i64; 64];
    let batch = Batch::new(vec![TableLookup::new(
        "t0",
        Indices::I64(&ids),
        Bags::Lengths(Indices::I64(&lengths)),
    )]);
    let mut fanout = Vec::new();
    let mut answers = Vec::new();
    for hot in [0, 20] {
        let (store, _cluster) = sharded(&path, false, options(2, 1, Scheme::Row, hot));
        answers.push(store.lookup(&batch).unwrap().0.values);
        let stats = store.stats().unwrap();
        let split = stats.get("cluster_split_bags").unwrap();
        fanout.push(stats.get("cluster_bag_shards").unwrap() / split);
    }
    // the same answer, each bag on one shard instead of two
    for (a, b) in answers[0].iter().zip(&answers[1]) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
    }
    assert_eq!(fanout, [2.0, 1.0]);
}

#[test]
fn hedged_reads_are_counted_and_answer_the_same() {
    let (_d, path) = suite::fixture();
    let (plain, cluster) = sharded(&path, false, options(2, 2, Scheme::Row, 0));
    let endpoints: Vec<Vec<Endpoint>> = (cluster.nodes.iter())
        .map(|shard| {
            (shard.iter())
                .map(|n| Endpoint {
                    addr: n.addr.to_string(),
                    store: "s".into(),
                })
                .collect()
        })
        .collect();
    let hedging = ShardedOptions {
        hedge: Hedge::After(Duration::ZERO),
        ..ShardedOptions::default()
    };
    let dir = plain.location().unwrap();
    let hedged = ShardedStore::open(&dir, &endpoints, hedging).unwrap();
    let ids: Vec<i64> = (0..300).step_by(3).collect();
    for _ in 0..20 {
        let want = plain.lookup(&one_per_bag("t2", &ids)).unwrap().0.values;
        assert_eq!(
            hedged.lookup(&one_per_bag("t2", &ids)).unwrap().0.values,
            want
        );
    }
    // hedged at once: every read that was not answered before its timer fired went to both
    let stats = hedged.stats().unwrap();
    let (hedges, wins) = (
        stats.get("cluster_hedges").unwrap(),
        stats.get("cluster_hedge_wins").unwrap(),
    );
    assert!(
        (1.0..=40.0).contains(&hedges) && wins <= hedges,
        "{stats:?}"
    );
    assert_eq!(stats.get("cluster_reads"), Some(40.0));
}

#[test]
fn a_read_waits_within_its_deadline_for_a_shard_restarted_at_another_address() {
    let (_d, path) = suite::fixture();
    let (store, mut cluster) = sharded(&path, false, options(2, 1, Scheme::Row, 0));
    let dir = store.location().unwrap();
    let client = nearrec_client::ClientOptions {
        timeout: Some(Duration::from_secs(20)),
        ..Default::default()
    };
    let endpoints: Vec<Vec<Endpoint>> = (store.replicas().iter())
        .map(|s| {
            s.iter()
                .map(|a| Endpoint::parse(&format!("{a}/s")))
                .collect()
        })
        .collect();
    let options = ShardedOptions {
        client,
        ..ShardedOptions::default()
    };
    let store = Arc::new(ShardedStore::open(&dir, &endpoints, options).unwrap());
    let ids: Vec<i64> = (0..300).step_by(11).collect();
    let want = store.lookup(&one_per_bag("t0", &ids)).unwrap().0.values;
    // shard 1's only node stops; a read of it waits
    drop(cluster.nodes[1].remove(0));
    let reader = {
        let (store, ids) = (store.clone(), ids.clone());
        std::thread::spawn(move || store.lookup(&one_per_bag("t0", &ids)).map(|r| r.0.values))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(!reader.is_finished(), "the read did not wait for the shard");
    // the shard served again, elsewhere (as Ray restarts a node), and its address given
    let copy = ShardPlan::shard_dir(&dir, 1);
    let mut stores = Stores::new();
    let toml = "tier = \"ssd\"\ndram_budget = \"16KiB\"";
    stores.insert("s", common::open(&copy, toml)).unwrap();
    let node = common::Node::start(stores, NodeConfig::default());
    let moved = Endpoint {
        addr: node.addr.to_string(),
        store: "s".into(),
    };
    store.set_replicas(1, &[moved]).unwrap();
    assert_eq!(reader.join().unwrap().unwrap(), want);
    assert_eq!(store.replicas()[1], [node.addr.to_string()]);
    // a replica that is not the shard is refused, and the shard is served as it was
    let wrong = Endpoint {
        addr: cluster.nodes[0][0].addr.to_string(),
        store: "s".into(),
    };
    let e = store.set_replicas(1, &[wrong]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert_eq!(
        store.lookup(&one_per_bag("t0", &ids)).unwrap().0.values,
        want
    );
}

#[test]
fn a_replica_behind_its_shard_serves_no_reads_and_takes_no_writes() {
    let (_d, path) = suite::fixture();
    let (store, cluster) = sharded(&path, true, options(2, 2, Scheme::Row, 0));
    let dim = suite::DIM as usize;
    let clients = direct(&cluster);
    // replica 1 of shard 0 was away while row 3 was written
    let values = vec![4.25f32; dim];
    let w = RowWrite {
        table: "t0",
        ids: &[3],
        values: Some(RowValues::F32(&values)),
    };
    clients[0][0]
        .write_many(&[w], WriteOptions::default())
        .unwrap();
    let router = ShardedStore::open(
        cluster._dir.path(),
        &endpoints(&store),
        ShardedOptions::default(),
    )
    .unwrap();
    let stale = |s: &ShardedStore| {
        let stats = s.stats().unwrap();
        (stats.values.iter())
            .find(|(k, _)| k == "cluster_stale_replicas")
            .map(|v| v.1)
    };
    assert_eq!(stale(&router), Some(1.0));
    for _ in 0..40 {
        let got = router.lookup(&one_per_bag("t0", &[3])).unwrap().0.values;
        assert_eq!(got, values, "a read from the replica behind");
    }
    // a write reaches the replica that is current, not the one behind
    let newer = vec![5.5f32; dim];
    let w = RowWrite {
        table: "t0",
        ids: &[4],
        values: Some(RowValues::F32(&newer)),
    };
    router.write_many(&[w], WriteOptions::default()).unwrap();
    let mut out = vec![0f32; dim];
    clients[0][0].read_rows("t0", &[4], &mut out).unwrap();
    assert_eq!(out, newer);
    clients[0][1].read_rows("t0", &[4], &mut out).unwrap();
    assert_ne!(out, newer);
    // a replica given again at its address is kept as it is: still behind
    router.set_replicas(0, &endpoints(&store)[0]).unwrap();
    assert_eq!(stale(&router), Some(1.0));
}

#[test]
fn two_routers_writing_one_row_leave_its_replicas_alike() {
    let (_d, path) = suite::fixture();
    let (store, cluster) = sharded(&path, true, options(1, 2, Scheme::Table, 0));
    let dim = suite::DIM as usize;
    let routers: Vec<ShardedStore> = (0..2)
        .map(|_| {
            ShardedStore::open(
                cluster._dir.path(),
                &endpoints(&store),
                ShardedOptions::default(),
            )
            .unwrap()
        })
        .collect();
    std::thread::scope(|s| {
        for (k, router) in routers.iter().enumerate() {
            s.spawn(move || {
                for i in 0..40 {
                    let values = vec![(k * 1000 + i) as f32; dim];
                    let w = RowWrite {
                        table: "t0",
                        ids: &[3, 4],
                        values: Some(RowValues::F32(&[values.clone(), values].concat())),
                    };
                    router.write_many(&[w], WriteOptions::default()).unwrap();
                }
            });
        }
    });
    let clients = direct(&cluster);
    let read = |c: &nearrec_client::Client| {
        let mut out = vec![0f32; 2 * dim];
        c.read_rows("t0", &[3, 4], &mut out).unwrap();
        (out, c.version().unwrap())
    };
    let (a, b) = (read(&clients[0][0]), read(&clients[0][1]));
    assert_eq!(
        a, b,
        "the replicas took the two routers' writes in different orders"
    );
    assert_eq!(a.1, 80);
    assert!(a.0.iter().all(|&v| v == a.0[0]), "a torn pair of rows");
}

/// `bags` bags of table `t0`, each of one row from either end of the table: with rows cut in
/// two, every bag reads both shards.
fn spanning(ids: &[i64]) -> Batch<'_> {
    Batch::new(vec![TableLookup::new(
        "t0",
        Indices::I64(ids),
        Bags::Fixed {
            batch: ids.len() / 2,
            bag_size: 2,
        },
    )])
}

#[test]
fn a_swap_moves_every_shard_and_no_batch_of_any_router_reads_two_versions() {
    let (dir, path) = suite::fixture();
    let (a, cluster) = sharded(&path, false, options(2, 2, Scheme::Row, 0));
    let b = ShardedStore::open(
        cluster._dir.path(),
        &endpoints(&a),
        ShardedOptions::default(),
    )
    .unwrap();
    assert_eq!(a.info().unwrap().served_version, Some(1));
    // the next model: every row negated, published as version 2 of both shards, not served
    let next = suite::write_store(dir.path(), "next", &suite::TABLES, -1.0);
    assert_eq!(
        nearrec::shard::publish_cut(&next, cluster._dir.path()).unwrap(),
        2
    );
    let info = a.info().unwrap();
    assert_eq!((info.served_version, info.versions), (Some(1), vec![1, 2]));
    let ids: Vec<i64> = (0..64).flat_map(|i| [i, 299 - i]).collect();
    let first = a.lookup(&spanning(&ids)).unwrap().0.values;
    assert!(first.iter().any(|v| *v != 0.0));
    let negated: Vec<f32> = first.iter().map(|v| -v).collect();

    // two routers read throughout; every answer is one version's, whole
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|store| {
            let (stop, ids, first, negated) =
                (stop.clone(), ids.clone(), first.clone(), negated.clone());
            std::thread::spawn(move || {
                let (mut old, mut new) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let got = store.lookup(&spanning(&ids)).unwrap().0.values;
                    if got == first {
                        old += 1;
                    } else if got == negated {
                        new += 1;
                    } else {
                        panic!("a batch read at two versions: {:?}…", &got[..8]);
                    }
                }
                (old, new)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    a.swap(&nearrec::SwapTo::Version(2), true, false).unwrap();
    // the router that swapped reads the new version at once, the other from its next batch
    assert_eq!(a.lookup(&spanning(&ids)).unwrap().0.values, negated);
    assert_eq!(b.lookup(&spanning(&ids)).unwrap().0.values, negated);
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        let (old, new) = r.join().unwrap();
        assert!(old > 0 && new > 0, "{old} batches before, {new} after");
    }
    assert_eq!(b.info().unwrap().served_version, Some(2));
    // every node serves it, and a restart would too: each shard's pointer names it
    for k in 0..2 {
        let repo =
            nearrec::format::Repository::detect(&ShardPlan::shard_dir(cluster._dir.path(), k));
        assert_eq!(repo.unwrap().current().unwrap(), 2);
    }

    // back to the version served before, everywhere
    a.swap(&nearrec::SwapTo::Previous, false, false).unwrap();
    assert_eq!(b.lookup(&spanning(&ids)).unwrap().0.values, first);
    // what no shard holds, or a path: refused, typed, nothing switched
    let e = a
        .swap(&nearrec::SwapTo::Version(9), false, false)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreNotFound, "{e}");
    let e = a
        .swap(
            &nearrec::SwapTo::Path(next.to_string_lossy().into()),
            false,
            false,
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert_eq!(a.lookup(&spanning(&ids)).unwrap().0.values, first);
    // a version on one shard only (a publish cut short): refused at the stage, nothing switched
    let lone =
        nearrec::format::Repository::detect(&ShardPlan::shard_dir(cluster._dir.path(), 1)).unwrap();
    let copy = dir.path().join("lone");
    copy_dir(&lone.version_path(2), &copy);
    assert_eq!(
        lone.publish(&copy, nearrec::format::Publish::Move).unwrap(),
        3
    );
    assert_eq!(
        a.info().unwrap().versions,
        vec![1, 2],
        "every shard's versions, only"
    );
    let e = a
        .swap(&nearrec::SwapTo::Version(3), false, false)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreNotFound, "{e}");
    assert!(e.to_string().contains("shard 0"), "{e}");
    assert_eq!(b.lookup(&spanning(&ids)).unwrap().0.values, first);
    drop(cluster);
}

/// Shard 0's second replica started again (writable) from `served`, its files as it left them,
/// at a new address: the shard's replicas as `router` should be given them, its first kept.
fn back_behind(cluster: &mut Cluster, served: &Path, router: &ShardedStore) -> Vec<Endpoint> {
    let toml = "tier = \"ssd\"\ndram_budget = \"16KiB\"\nwritable = true";
    let mut stores = Stores::new();
    stores.insert("s", common::open(served, toml)).unwrap();
    cluster.nodes[0].push(common::Node::start(stores, NodeConfig::default()));
    let back = Endpoint {
        addr: cluster.nodes[0][1].addr.to_string(),
        store: "s".into(),
    };
    vec![endpoints(router)[0][0].clone(), back]
}

/// A replica down while two routers write, restarted behind at another address, is left out
/// of its shard (every router learns it at its next write), catches up from the member while
/// both routers go on writing, and is admitted again: afterwards its rows and count of writes
/// are its member's, it serves every router's reads, and with the member gone it serves
/// alone. No read of either router ever answers a row older than a write acknowledged before
/// the read began.
#[test]
fn a_replica_that_was_down_catches_up_under_writes_and_serves_again() {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (_d, path) = suite::fixture();
    let (a, mut cluster) = sharded(&path, true, options(2, 2, Scheme::Row, 0));
    let dim = suite::DIM as usize;
    let b = ShardedStore::open(cluster._dir.path(), &endpoints(&a), manual()).unwrap();
    let routers = [&a, &b];
    // every row's value is the number of the write that made it: acknowledged ones recorded
    let next = AtomicU64::new(1);
    let acked: Mutex<HashMap<i64, u64>> = Mutex::new(HashMap::new());
    let stop = AtomicBool::new(false);
    let write = |router: &ShardedStore, id: i64| {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let values = vec![n as f32; dim];
        let w = RowWrite {
            table: "t0",
            ids: &[id],
            values: Some(RowValues::F32(&values)),
        };
        router.write_many(&[w], WriteOptions::default()).unwrap();
        let mut acked = acked.lock().unwrap();
        let v = acked.entry(id).or_insert(0);
        *v = (*v).max(n);
    };
    // `during` while both routers write and read
    let under_load = |during: &mut dyn FnMut()| {
        std::thread::scope(|s| {
            for (k, router) in routers.into_iter().enumerate() {
                let (write, stop, acked) = (&write, &stop, &acked);
                s.spawn(move || {
                    let mut i = k as i64;
                    while !stop.load(Ordering::Relaxed) {
                        write(router, (i * 37) % 300);
                        i += 2;
                    }
                });
                s.spawn(move || {
                    let mut i = k as i64;
                    while !stop.load(Ordering::Relaxed) {
                        let id = (i * 53) % 300;
                        let floor = acked.lock().unwrap().get(&id).copied().unwrap_or(0);
                        let got = router.lookup(&one_per_bag("t0", &[id])).unwrap().0.values;
                        let at = if floor == 0 { 0.0 } else { got[0] };
                        assert!(at >= floor as f32, "row {id}: read {at}, {floor} was acked");
                        i += 1;
                    }
                });
            }
            during();
            stop.store(true, Ordering::Relaxed);
        });
        stop.store(false, Ordering::Relaxed);
    };
    let stale = |s: &ShardedStore| s.stats().unwrap().get("cluster_stale_replicas");
    // shard 0's second replica goes down under writes: the first write that misses it leaves
    // it out
    let served = cluster._dir.path().join("copy-0-1");
    let mut down = cluster.nodes[0].remove(1);
    under_load(&mut || {
        std::thread::sleep(Duration::from_millis(150));
        down.begin_drain();
        std::thread::sleep(Duration::from_millis(300));
    });
    drop(down);
    assert_eq!(stale(&a), Some(1.0));
    // writes it misses for certain, on each part of t0 (the write it was left out for may have
    // reached it before the draining node lost its answer): the catch-up has rows to copy
    write(&a, 1);
    write(&a, 299);
    // back, behind, at another address: given to both routers, stale in both
    let shard0 = back_behind(&mut cluster, &served, &a);
    for r in routers {
        r.set_replicas(0, &shard0).unwrap();
        assert_eq!(stale(r), Some(1.0));
    }
    // caught up under writes from both routers, then admitted
    let mut caught = Vec::new();
    under_load(&mut || {
        std::thread::sleep(Duration::from_millis(100));
        caught = a.catch_up(Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(200));
    });
    assert_eq!(caught.len(), 1, "{caught:?}");
    let (k, _, result) = &caught[0];
    let done = result.as_ref().unwrap();
    assert_eq!(*k, 0);
    assert!(done.rows_before_fence > 0, "{done:?}");
    // the members were fenced for the last pass, within its lease
    assert!(
        done.fenced > Duration::ZERO && done.fenced < Duration::from_secs(10),
        "{done:?}"
    );
    assert_eq!(stale(&a), Some(0.0));
    // the other router learns it at its next catch-up pass (or write)
    assert!(b.catch_up(Duration::from_secs(10)).is_empty());
    assert_eq!(stale(&b), Some(0.0));
    let clients = direct(&cluster);
    let (l, r) = (&clients[0][0], &clients[0][1]);
    assert_eq!(l.version().unwrap(), r.version().unwrap());
    for (t, _) in suite::TABLES {
        let rows = l.table(t).unwrap().rows;
        assert_eq!(
            l.row_digests(t, 0, rows).unwrap(),
            r.row_digests(t, 0, rows).unwrap(),
            "table {t}"
        );
    }
    // the member goes: the caught-up replica serves every acknowledged write alone
    drop(cluster.nodes[0].remove(0));
    let acked = acked.into_inner().unwrap();
    for router in routers {
        for (&id, &n) in &acked {
            let got = router.lookup(&one_per_bag("t0", &[id])).unwrap().0.values;
            assert_eq!(got[0], n as f32, "row {id}");
        }
    }
}

/// A replica's directory copied with its `MEMBERSHIP` is the same replica twice to a change of
/// membership: refused, naming both, and the shard is served as it was.
#[test]
fn a_copy_of_a_replica_with_its_membership_is_refused() {
    let (_d, path) = suite::fixture();
    let (store, mut cluster) = sharded(&path, true, options(1, 2, Scheme::Table, 0));
    let copied = cluster._dir.path().join("copy-of-0-0");
    copy_dir(&cluster._dir.path().join("copy-0-0"), &copied);
    std::fs::remove_file(copied.join("WRITER.lock")).ok();
    let toml = "tier = \"ssd\"\ndram_budget = \"16KiB\"\nwritable = true";
    let mut stores = Stores::new();
    stores.insert("s", common::open(&copied, toml)).unwrap();
    cluster.nodes[0].push(common::Node::start(stores, NodeConfig::default()));
    let mut given = endpoints(&store)[0].clone();
    given.push(Endpoint {
        addr: cluster.nodes[0][2].addr.to_string(),
        store: "s".into(),
    });
    let before = store.replicas();
    let e = store.set_replicas(0, &given).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert!(e.to_string().contains("MEMBERSHIP"), "{e}");
    assert_eq!(store.replicas(), before);
    // without the file, it is a replica of its own (behind nothing: no write was made)
    drop(cluster.nodes[0].pop());
    std::fs::remove_file(copied.join("MEMBERSHIP")).unwrap();
    let mut stores = Stores::new();
    stores.insert("s", common::open(&copied, toml)).unwrap();
    cluster.nodes[0].push(common::Node::start(stores, NodeConfig::default()));
    given[2].addr = cluster.nodes[0][2].addr.to_string();
    store.set_replicas(0, &given).unwrap();
    let stats = store.stats().unwrap();
    assert_eq!(stats.get("cluster_stale_replicas"), Some(0.0), "{stats:?}");
}

/// Issue 62, item 8: after router crashes the shards ran on one member each, and a router from
/// `connect` never caught the others up. Every router now catches up its stale replicas in the
/// background (`catch_up_every`), with no call to `catch_up`.
#[test]
fn a_router_catches_up_a_stale_replica_in_the_background() {
    let (_d, path) = suite::fixture();
    let (a, mut cluster) = sharded(&path, true, options(1, 2, Scheme::Row, 0));
    let background = ShardedOptions {
        catch_up_every: Some(Duration::from_millis(100)),
        ..ShardedOptions::default()
    };
    let c = ShardedStore::open(cluster._dir.path(), &endpoints(&a), background).unwrap();
    let stale = |s: &ShardedStore| s.stats().unwrap().get("cluster_stale_replicas");
    let values = vec![3.0f32; suite::DIM as usize];
    let write = |id: i64| {
        let w = RowWrite {
            table: "t0",
            ids: &[id],
            values: Some(RowValues::F32(&values)),
        };
        a.write_many(&[w], WriteOptions::default()).unwrap();
    };
    // the second replica goes down; the next write leaves it out
    let served = cluster._dir.path().join("copy-0-1");
    let mut down = cluster.nodes[0].remove(1);
    down.begin_drain();
    drop(down);
    write(5);
    assert_eq!(stale(&a), Some(1.0));
    // back at another address, behind: given to both routers; only `c` catches up on its own
    let shard0 = back_behind(&mut cluster, &served, &a);
    for r in [&a, &c] {
        r.set_replicas(0, &shard0).unwrap();
    }
    assert_eq!(stale(&a), Some(1.0));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while stale(&c) != Some(0.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "not caught up in 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let clients = direct(&cluster);
    assert_eq!(
        clients[0][0].version().unwrap(),
        clients[0][1].version().unwrap()
    );
    // the manual router learns it at its next write
    write(6);
    assert_eq!(stale(&a), Some(0.0));
}

/// Issue 62, item 22: a front node with one shard down refused every new client, since its
/// `Info` asked every shard. The info comes from the plan and the shards that answer: a client
/// connects, reads the other shards' tables, and a call that needs the missing shard fails,
/// typed, naming it; with no shard answering, `Info` fails too.
#[test]
fn a_shard_down_leaves_the_others_reachable_and_is_named() {
    let (_d, path) = suite::fixture();
    let (store, mut cluster) = sharded(&path, false, options(2, 1, Scheme::Table, 0));
    let plan = store.plan().clone();
    let on = |k: usize| {
        let t = plan.tables.iter().find(|t| t.parts[0].shard == k).unwrap();
        t.name.clone()
    };
    let (up, gone) = (on(0), on(1));
    let mut down = cluster.nodes[1].remove(0);
    down.begin_drain();
    drop(down);
    let info = store.info().unwrap();
    assert_eq!(
        info.tables.len(),
        plan.tables.len(),
        "every table, from the plan"
    );
    assert!(store.lookup(&one_per_bag(&up, &[1, 2])).is_ok());
    let e = store.lookup(&one_per_bag(&gone, &[1])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("shard 1"), "{e}");
    let mut last = cluster.nodes[0].remove(0);
    last.begin_drain();
    drop(last);
    assert_eq!(store.info().unwrap_err().kind(), ErrorKind::Unavailable);
}

/// Each replica's shard tag, asked directly.
fn tags(cluster: &Cluster) -> Vec<nearrec::shard::ShardTag> {
    (direct(cluster).iter().flatten())
        .map(|c| c.info().unwrap().shard.unwrap())
        .collect()
}

/// A table created through one router is a new plan every replica moves to while another
/// router reads on undisturbed; that router learns it at its first call naming the table; a
/// drop through it reaches the first; two changes from routers at the same plan both land
/// (the second learns the first's plan and tries again); a replica down is left out of a
/// change, brought to the plan when it is back, and caught up.
#[test]
fn tables_created_and_dropped_through_one_router_reach_every_shard_and_router() {
    let (_dir, path) = suite::fixture();
    let (a, mut cluster) = sharded(&path, true, options(2, 2, Scheme::Row, 0));
    let dir = cluster._dir.path().to_path_buf();
    let b = Arc::new(ShardedStore::open(&dir, &endpoints(&a), manual()).unwrap());
    let before = a.plan();
    let ids: Vec<i64> = (0..40).collect();
    let (want, _) = b.lookup(&spanning(&ids)).unwrap();
    // b reads throughout the changes below: every answer whole and as it was
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (b, ids, stop) = (b.clone(), ids.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (got, _) = b.lookup(&spanning(&ids)).unwrap();
                assert_eq!(got.values, want.values);
                reads += 1;
            }
            reads
        })
    };

    let fresh = |name| nearrec::NewTable {
        name,
        rows: 10,
        dim: 4,
        dtype: nearrec::format::DType::Fp32,
        init: nearrec::Init::Zeros,
    };
    let schema = a.schema().unwrap();
    schema.create_table(&fresh("fresh")).unwrap();
    let plan = a.plan();
    assert_eq!(plan.parents, vec![before.id.clone()]);
    let parts = &plan.tables.last().unwrap().parts;
    assert_eq!(parts.len(), 2, "row-wise: a part on each shard");
    // every replica at the new plan alone; shards.json says it
    assert!(
        tags(&cluster)
            .iter()
            .all(|t| t.plan == plan.id && t.previous.is_none())
    );
    assert_eq!(ShardPlan::read(&dir).unwrap(), plan);
    // written through a, across both shards; read through b, which learns the plan
    let values: Vec<f32> = (0..40).map(|v| v as f32).collect();
    let all: Vec<i64> = (0..10).collect();
    let w = RowWrite {
        table: "fresh",
        ids: &all,
        values: Some(RowValues::F32(&values)),
    };
    a.writes()
        .unwrap()
        .write_many(&[w], WriteOptions::default())
        .unwrap();
    let mut out = vec![0f32; 40];
    b.read_rows("fresh", &all, &mut out).unwrap();
    assert_eq!(out, values);
    assert_eq!(b.plan().id, plan.id);
    // a router opened now reads it from the plan in the directory
    let c = ShardedStore::open(&dir, &endpoints(&a), manual()).unwrap();
    c.read_rows("fresh", &all, &mut out).unwrap();
    assert_eq!(out, values);

    // dropped through b: gone from a and from every replica
    b.schema().unwrap().drop_table("fresh").unwrap();
    let e = a.read_rows("fresh", &all, &mut out).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownTable, "{e}");
    for client in direct(&cluster).iter().flatten() {
        assert!(client.table("fresh").is_err());
    }
    assert_eq!(a.plan().parents.len(), 2);

    // b and a both at the same plan; b creates y, then a, not knowing, creates x: a's stage is
    // refused at shard 0, it learns y's plan and tries again from it
    c.schema().unwrap().create_table(&fresh("y")).unwrap();
    schema.create_table(&fresh("x")).unwrap();
    let names: Vec<String> = a.plan().tables.iter().map(|t| t.name.clone()).collect();
    assert!(
        names.contains(&"x".into()) && names.contains(&"y".into()),
        "{names:?}"
    );
    b.read_rows("x", &all, &mut out).unwrap();
    b.read_rows("y", &all, &mut out).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);

    // a replica down: left out of the change (stale), which the others take; written meanwhile
    let served = cluster._dir.path().join("copy-1-1");
    drop(cluster.nodes[1].remove(1));
    schema.create_table(&fresh("z")).unwrap();
    let z = RowWrite {
        table: "z",
        ids: &all,
        values: Some(RowValues::F32(&values)),
    };
    a.writes()
        .unwrap()
        .write_many(&[z], WriteOptions::default())
        .unwrap();
    let stale = |s: &ShardedStore| s.stats().unwrap().get("cluster_stale_replicas");
    assert_eq!(stale(&a), Some(1.0));
    // back, behind the plan, at another address: brought to it, caught up, and then it holds
    // the new table's rows as its member does
    let toml = "tier = \"ssd\"\ndram_budget = \"16KiB\"\nwritable = true";
    let mut stores = Stores::new();
    stores.insert("s", common::open(&served, toml)).unwrap();
    cluster.nodes[1].push(common::Node::start(stores, NodeConfig::default()));
    let back = Endpoint {
        addr: cluster.nodes[1][1].addr.to_string(),
        store: "s".into(),
    };
    a.set_replicas(1, &[endpoints(&a)[1][0].clone(), back])
        .unwrap();
    let caught = a.catch_up(Duration::from_secs(10));
    assert!(caught.iter().all(|(_, _, r)| r.is_ok()), "{caught:?}");
    assert_eq!(stale(&a), Some(0.0));
    let clients = direct(&cluster);
    let tag = clients[1][1].info().unwrap().shard.unwrap();
    assert_eq!((tag.plan, tag.previous), (a.plan().id, None));
    let rows = a
        .plan()
        .tables
        .last()
        .unwrap()
        .parts
        .iter()
        .find(|p| p.shard == 1)
        .unwrap()
        .rows;
    let local: Vec<i64> = (0..rows as i64).collect();
    let (mut member, mut caught_up) = (vec![0f32; local.len() * 4], vec![1f32; local.len() * 4]);
    clients[1][0].read_rows("z", &local, &mut member).unwrap();
    clients[1][1]
        .read_rows("z", &local, &mut caught_up)
        .unwrap();
    assert_eq!(member, caught_up);
    assert!(
        member.iter().any(|&v| v != 0.0),
        "the part's rows were written"
    );
}

/// A router that held a replica stale learns that another router caught it up and admitted it
/// though a write is on its way to it — committed on the member, not yet on it, so its count
/// is a write behind — and holds it live: the epoch that names it again is a catch-up's, which
/// made the counts one under a fence. (Found by CI: two routers writing without pause each
/// held the replica the other had just admitted a write behind, left it out and caught it up
/// again, back and forth, for as long as the writes went on.)
#[test]
fn a_router_learns_another_s_catch_up_though_a_write_is_on_its_way() {
    let (_d, path) = suite::fixture();
    let (a, mut cluster) = sharded(&path, true, options(1, 2, Scheme::Row, 0));
    let b = ShardedStore::open(cluster._dir.path(), &endpoints(&a), manual()).unwrap();
    let stale = |s: &ShardedStore| s.stats().unwrap().get("cluster_stale_replicas");
    let values = vec![4.0f32; suite::DIM as usize];
    let row = |id: &'static [i64]| RowWrite {
        table: "t0",
        ids: id,
        values: Some(RowValues::F32(&values)),
    };
    // the second replica down: the next write leaves it out; back behind, stale in both routers
    let served = cluster._dir.path().join("copy-0-1");
    let mut down = cluster.nodes[0].remove(1);
    down.begin_drain();
    drop(down);
    a.write_many(&[row(&[5])], WriteOptions::default()).unwrap();
    let shard0 = back_behind(&mut cluster, &served, &a);
    for r in [&a, &b] {
        r.set_replicas(0, &shard0).unwrap();
        assert_eq!(stale(r), Some(1.0));
    }
    let caught = a.catch_up(Duration::from_secs(10));
    assert!(matches!(caught.as_slice(), [(0, _, Ok(_))]), "{caught:?}");
    // a write on its way: prepared on both at the epoch, committed on the member alone
    let clients = direct(&cluster);
    let (member, back) = (&clients[0][0], &clients[0][1]);
    let epoch = member.membership().unwrap().epoch;
    let at = Some(epoch);
    for c in [member, back] {
        (c.prepare_write(7, &[row(&[9])], WriteOptions::default(), "", at, None)).unwrap();
    }
    member.decide(7, nearrec::Decision::Commit, false).unwrap();
    assert!(back.version().unwrap() < member.version().unwrap());
    // the other router learns the admission: nothing to catch up, nothing left out
    let again = b.catch_up(Duration::from_secs(10));
    assert!(again.is_empty(), "{again:?}");
    assert_eq!(stale(&b), Some(0.0));
    assert_eq!(member.membership().unwrap().epoch, epoch);
    back.decide(7, nearrec::Decision::Commit, false).unwrap();
    assert_eq!(back.version().unwrap(), member.version().unwrap());
}
