//! The store's conformance suite (`tests/suite/`) over the embedded store: on the DRAM tier,
//! and on the SSD tier behind DRAM tiers smaller than its tables.

#[macro_use]
mod suite;

use nearrec::prelude::*;
use std::path::Path;
use std::sync::Arc;

use nearrec::{RowValues, Store, StoreConfig};

use suite::Opened;

fn embedded(path: &Path, toml: &str, writable: bool) -> Opened {
    let mut config = StoreConfig::from_toml(toml).unwrap();
    config.writable = writable;
    Opened {
        store: Arc::new(Store::open(path, &config).unwrap()),
        keep: Box::new(()),
        lacks: Vec::new(),
    }
}

mod dram {
    use super::*;

    pub fn open(path: &Path, writable: bool) -> Opened {
        embedded(path, "tier = \"dram\"", writable)
    }

    store_api_suite!(open);
}

mod ssd {
    use super::*;

    /// A hot partition and a row cache in 16 KiB, the rest read with direct I/O.
    fn open(path: &Path, writable: bool) -> Opened {
        let toml = "tier = \"ssd\"\ndram_budget = \"16KiB\"\ncache_policy = \"lru\"";
        embedded(path, toml, writable)
    }

    store_api_suite!(open);
}

/// An embedded store has every capability, read-only or not (a read-only one refuses writes,
/// typed, when asked).
#[test]
fn an_embedded_store_has_every_capability() {
    let (_dir, path) = suite::fixture();
    for writable in [false, true] {
        let s = dram::open(&path, writable);
        assert_eq!(s.store.capabilities(), nearrec::CAPABILITIES);
    }
}

/// Closing a writable store lets go of its writer lock before `close` returns.
#[test]
fn a_closed_writer_lets_go_of_its_lock_at_once() {
    let (_dir, path) = suite::fixture();
    let config = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let store = Store::open(&path, &config).unwrap();
    let held = store.clone(); // another reference: closing must not wait for it
    let e = Store::open(&path, &config).unwrap_err();
    assert_eq!(e.kind(), nearrec::ErrorKind::StoreLocked);
    store.close().unwrap();
    let again = Store::open(&path, &config).unwrap();
    assert!(again.writable() && !held.writable());
    let e = held.remove("t0", &[1]).unwrap_err();
    assert_eq!(e.kind(), nearrec::ErrorKind::StoreReadOnly, "{e}");
}

/// A read-only store that follows its writer runs the weights the writer's model update wrote.
#[test]
fn a_follower_runs_the_weights_its_writer_updated() {
    let (_dir, path) = suite::fixture();
    let dim = suite::DIM as usize;
    let old = vec![0.25f32; dim];
    suite::keep_model(&path, &old, 0.0);
    let writer = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let writer = Store::open(&path, &writer).unwrap();
    let follower = StoreConfig {
        follow_ms: Some(20),
        ..StoreConfig::default()
    };
    let follower = Store::open(&path, &follower).unwrap();
    let batch = nearrec::OwnedBatch::new(vec![nearrec::OwnedLookup::with_lengths(
        "t0",
        vec![3i64, 8],
        vec![1i64, 1],
    )]);
    let infer = |s: &Store| s.infer(&[], &nearrec::AsBatch::as_batch(&batch)).unwrap();
    let before = infer(&follower).outputs;
    let new = vec![-0.5f32; dim];
    let weights = [
        nearrec::model::Tensor {
            name: "top.weight",
            shape: &[1, dim],
            values: &new,
        },
        nearrec::model::Tensor {
            name: "top.bias",
            shape: &[1],
            values: &[1.0],
        },
    ];
    writer.update_model(&weights).unwrap();
    let want = infer(&writer).outputs;
    assert_ne!(want, before);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while infer(&follower).outputs != want {
        assert!(std::time::Instant::now() < deadline, "not followed in 10 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A prepared transaction outlives its writer: reopened, it is still prepared (and still holds
/// its rows), across a compaction that folds its record away too; a decision kept is kept; a
/// forget holds once the store closes; a `committed` file an older build left (decided, its
/// rows not logged) is logged on open, once.
#[test]
fn prepared_and_decided_transactions_survive_a_reopen() {
    use nearrec::format::wal::{Op, TxState, write_tx};
    use nearrec::{Decision, ErrorKind, RowWrite, WriteOptions};
    let (_dir, path) = suite::fixture();
    let config = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let d = suite::DIM as usize;
    let values: Vec<f32> = (0..d).map(|i| i as f32 * 0.5).collect();
    let w = |id: &'static [i64]| RowWrite {
        table: "t0",
        ids: id,
        values: Some(RowValues::F32(&values)),
    };
    let held = |store: &Store| {
        let mut listed: Vec<_> = (store.transactions().unwrap().into_iter())
            .map(|t| (t.tx, t.state, t.note))
            .collect();
        listed.sort_by_key(|t| t.0);
        listed
    };
    let (a, b, c) = (0xa_u128, 0xb_u128, 0xc_u128);
    let store = Store::open(&path, &config).unwrap();
    let v0 = store.version().unwrap();
    for (tx, id, note) in [
        (a, &[1i64][..], "decider=0/0"),
        (b, &[2][..], "decider=1/0"),
    ] {
        let row = RowWrite {
            table: "t0",
            ids: id,
            values: Some(RowValues::F32(&values)),
        };
        (store.prepare_write(tx, &[row], WriteOptions::default(), note, None, None)).unwrap();
    }
    // a prepare is no write: the count of writes stays
    assert_eq!(store.version().unwrap(), v0);
    // the writer dies (no close): both come back prepared from the log alone
    drop(store);
    let store = Store::open(&path, &config).unwrap();
    assert_eq!(
        held(&store),
        [
            (a, TxState::Prepared, "decider=0/0".to_owned()),
            (b, TxState::Prepared, "decider=1/0".to_owned()),
        ]
    );
    store.decide(b, Decision::Commit, true).unwrap();
    assert_eq!(store.version().unwrap(), v0 + 1);
    // a compaction folds the records away: the checkpoint holds them
    store.compact().unwrap();
    drop(store);
    let store = Store::open(&path, &config).unwrap();
    let mut out = vec![0f32; d];
    store.read_rows("t0", &[2], &mut out).unwrap();
    assert_eq!(out, values, "a committed transaction's rows");
    assert_eq!(
        held(&store),
        [
            (a, TxState::Prepared, "decider=0/0".to_owned()),
            (b, TxState::Applied, "decider=1/0".to_owned()),
        ]
    );
    // `a` still holds row 1
    let e = store
        .prepare_write(7, &[w(&[1])], WriteOptions::default(), "", None, None)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreLocked, "{e}");
    store.read_rows("t0", &[1], &mut out).unwrap();
    assert_ne!(out, values);
    store.close().unwrap();
    drop(store);
    // an older build's store: `c` decided, its rows not yet logged
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let ops = [Op::Write {
        table: "t0".into(),
        ids: vec![3],
        row_bytes: bytes.len() as u32,
        rows: bytes,
    }];
    write_tx(&path, c, TxState::Committed, "decider=2/0", &ops).unwrap();
    let store = Store::open(&path, &config).unwrap();
    store.read_rows("t0", &[3], &mut out).unwrap();
    assert_eq!(out, values, "a decided transaction is logged on open");
    assert_eq!(store.version().unwrap(), v0 + 2);
    assert_eq!(
        held(&store)[2],
        (c, TxState::Applied, "decider=2/0".to_owned())
    );
    store.decide(a, Decision::Commit, false).unwrap();
    store.read_rows("t0", &[1], &mut out).unwrap();
    assert_eq!(out, values);
    store.forget(b).unwrap();
    store.forget(c).unwrap();
    assert!(store.transactions().unwrap().is_empty());
    // and nothing is redone, nor brought back, on the next open
    store.close().unwrap();
    drop(store);
    let store = Store::open(&path, &config).unwrap();
    assert_eq!(store.version().unwrap(), v0 + 3);
    assert!(store.transactions().unwrap().is_empty());
}

/// The deciding replica's share is held, not logged: it holds its rows as a prepare does, and
/// its commit logs it with the rows in one record (one write counted, the note back with the
/// kept outcome after the writer dies); a share the writer dies holding is forgotten, and its
/// commit refused.
#[test]
fn a_held_share_is_logged_by_its_commit_and_forgotten_by_a_crash() {
    use nearrec::format::wal::TxState;
    use nearrec::{Decision, ErrorKind, RowWrite, WriteOptions};
    let (_dir, path) = suite::fixture();
    let config = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let d = suite::DIM as usize;
    let values: Vec<f32> = (0..d).map(|i| i as f32 * 0.25 + 1.0).collect();
    let w = |id: &'static [i64]| RowWrite {
        table: "t0",
        ids: id,
        values: Some(RowValues::F32(&values)),
    };
    let note = "decider=0/0 shards=0,1";
    let (a, b) = (0xa_u128, 0xb_u128);
    let store = Store::open(&path, &config).unwrap();
    let v0 = store.version().unwrap();
    let opts = WriteOptions::default();
    store
        .hold_write(a, &[w(&[1])], opts, note, None, None)
        .unwrap();
    store
        .hold_write(b, &[w(&[2])], opts, note, None, None)
        .unwrap();
    let e = store
        .prepare_write(7, &[w(&[1])], opts, "", None, None)
        .unwrap_err();
    assert_eq!(
        e.kind(),
        ErrorKind::StoreLocked,
        "a held share holds its rows: {e}"
    );
    let states: Vec<_> = store
        .transactions()
        .unwrap()
        .iter()
        .map(|t| t.state)
        .collect();
    assert_eq!(states, [TxState::Prepared, TxState::Prepared]);
    assert_eq!(store.decide(a, Decision::Commit, true).unwrap(), v0 + 1);
    // the writer dies (no close, no checkpoint)
    drop(store);
    let store = Store::open(&path, &config).unwrap();
    let listed: Vec<_> = (store.transactions().unwrap().into_iter())
        .map(|t| (t.tx, t.state, t.note))
        .collect();
    assert_eq!(listed, [(a, TxState::Applied, note.to_owned())]);
    assert_eq!(store.version().unwrap(), v0 + 1);
    let mut out = vec![0f32; d];
    store.read_rows("t0", &[1], &mut out).unwrap();
    assert_eq!(out, values, "the commit's record holds the rows");
    store.read_rows("t0", &[2], &mut out).unwrap();
    assert_ne!(out, values);
    // `b` was never logged: forgotten, its commit refused, its row free
    let e = store.decide(b, Decision::Commit, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    store
        .prepare_write(7, &[w(&[2])], opts, "", None, None)
        .unwrap();
    store.decide(7, Decision::Abort, false).unwrap();
    store.forget(a).unwrap();
    assert!(store.transactions().unwrap().is_empty());
}

/// A replica's membership and the count of writes it adopted survive a reopen: the membership
/// in its `MEMBERSHIP` file, the count in the empty records of its log.
#[test]
fn membership_and_an_adopted_count_survive_a_reopen() {
    use nearrec::{RowWrite, WriteOptions};
    let (_dir, path) = suite::fixture();
    let config = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let row = [0.5f32; suite::DIM as usize];
    let w = RowWrite {
        table: "t0",
        ids: &[7],
        values: Some(RowValues::F32(&row)),
    };
    let v = {
        let store = Store::open(&path, &config).unwrap();
        store.set_membership(0, 3, &[42]).unwrap();
        let v = store.adopt(&[w], WriteOptions::default(), 1000).unwrap();
        store.close().unwrap();
        v
    };
    assert_eq!(v, 1000);
    let store = Store::open(&path, &config).unwrap();
    let m = store.membership().unwrap();
    assert_eq!(
        (m.epoch, m.members.as_slice(), m.is_member()),
        (3, &[42][..], false)
    );
    assert_eq!(store.version().unwrap(), 1000);
    let mut got = row;
    got.fill(0.0);
    store.read_rows("t0", &[7], &mut got).unwrap();
    assert_eq!(got, row);
    // and after a compaction folds the log away
    store.compact().unwrap();
    store.close().unwrap();
    let store = Store::open(&path, &config).unwrap();
    assert_eq!(store.version().unwrap(), 1000);
}

/// Issue 62, item 7: a prepare reusing the id of a transaction already committed was accepted
/// (its outcome was not kept, so the store had forgotten it). A transaction decided here is
/// remembered, kept or not, and a prepare of its id is refused, typed; other ids prepare.
#[test]
fn a_prepare_of_a_finished_transactions_id_is_refused() {
    use nearrec::{Decision, ErrorKind, RowWrite, WriteOptions};
    let (_dir, path) = suite::fixture();
    let config = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    let values = vec![1.5f32; suite::DIM as usize];
    let store = Store::open(&path, &config).unwrap();
    let prepare = |tx: u128, ids: &[i64]| {
        let w = RowWrite {
            table: "t0",
            ids,
            values: Some(RowValues::F32(&values)),
        };
        store.prepare_write(tx, &[w], WriteOptions::default(), "", None, None)
    };
    // committed without its outcome kept (a participant), aborted, and kept then forgotten
    prepare(1, &[1]).unwrap();
    store.decide(1, Decision::Commit, false).unwrap();
    prepare(2, &[2]).unwrap();
    store.decide(2, Decision::Abort, false).unwrap();
    prepare(3, &[3]).unwrap();
    store.decide(3, Decision::Commit, true).unwrap();
    store.forget(3).unwrap();
    let version = store.version().unwrap();
    for (tx, id) in [(1u128, 4i64), (2, 2), (3, 3)] {
        let e = prepare(tx, &[id]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{tx}: {e}");
        assert!(e.to_string().contains("replayed"), "{e}");
    }
    assert!(store.transactions().unwrap().is_empty(), "nothing prepared");
    assert_eq!(store.version().unwrap(), version);
    prepare(4, &[4]).unwrap();
}
