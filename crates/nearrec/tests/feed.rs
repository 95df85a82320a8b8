//! The feeder (`nearrec::feed`): a directory of delta files applied to a store in order, each
//! once — again after a feeder "dies" between files, from a given sequence, through a gap
//! (stopped before it), int8 rows and deletes of a keyed table's keys.

use std::path::Path;
use std::time::Duration;

use nearrec::feed::{Applied, DirSource, FeedOptions, Feeder};
use nearrec::format::DType;
use nearrec::format::delta::{self, Changes, Encoding, Header, Values};
use nearrec::prelude::*;
use nearrec::{
    Bags, Batch, Indices, RowValues, RowWrite, Store, StoreConfig, TableLookup, WriteOptions,
};

const DIM: usize = 4;

fn writable(path: &Path) -> Store {
    let config = StoreConfig {
        writable: true,
        ..StoreConfig::default()
    };
    Store::open(path, &config).unwrap()
}

/// Delta file `sequence` of `dir`: rows `ids` of table `t` at `sequence + id / 100`.
fn publish(dir: &Path, sequence: u64, table: &str, ids: &[i64], deletes: &[i64]) {
    let values = ids
        .iter()
        .flat_map(|&id| (0..DIM).map(move |j| sequence as f32 + id as f32 / 100.0 + j as f32))
        .collect();
    let changes = Changes {
        table: table.into(),
        upserts: ids.to_vec(),
        values: Values::F32(values),
        deletes: deletes.to_vec(),
        deleted: None,
    };
    let header = Header {
        sequence,
        step: Some(sequence * 10),
        wall_time_ms: Some(nearrec_wall_ms()),
    };
    let path = dir.join(delta::file_name(sequence, Encoding::Arrow));
    delta::write(&path, &header, &[changes], None).unwrap();
}

fn nearrec_wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn row(store: &Store, table: &str, id: i64) -> Vec<f32> {
    let ids = [id];
    store.lookup(&one(table, &ids)).unwrap().0.values
}

fn one<'a>(table: &'a str, ids: &'a [i64]) -> Batch<'a> {
    let bags = Bags::Fixed {
        batch: 1,
        bag_size: 1,
    };
    Batch::new(vec![TableLookup::new(table, Indices::I64(ids), bags)])
}

fn feeder<'a>(store: &'a Store, dir: &Path, from: Option<u64>) -> Feeder<'a> {
    let options = FeedOptions {
        from,
        ..FeedOptions::default()
    };
    let source = Box::new(DirSource::new(dir));
    Feeder::new(store, source, options).unwrap()
}

/// A store of one fp32 table `t` of `rows` rows (the test kit's pattern) in `dir`.
fn table_t(dir: &tempfile::TempDir, rows: u64) -> std::path::PathBuf {
    nearrec_testkit::write_store(
        dir.path().join("store"),
        &[("t", rows, DIM as u32, DType::Fp32)],
        nearrec_testkit::pattern,
    )
}

/// A temporary directory with an empty `deltas/` in it.
fn deltas_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let deltas = dir.path().join("deltas");
    std::fs::create_dir(&deltas).unwrap();
    (dir, deltas)
}

fn sequences(done: &[Applied]) -> Vec<u64> {
    done.iter().map(|a| a.sequence).collect()
}

#[test]
fn files_are_applied_in_order_once_across_restarts() {
    let (dir, deltas) = deltas_dir();
    let path = table_t(&dir, 100);
    let store = writable(&path);
    publish(&deltas, 1, "t", &[1, 2], &[]);
    publish(&deltas, 2, "t", &[2, 3], &[1]);
    let done = feeder(&store, &deltas, None)
        .apply_pending(&mut |_| {})
        .unwrap();
    assert_eq!(sequences(&done), [1, 2]);
    assert!(done.iter().all(|a| a.applied && a.rows > 0));
    assert!(
        done[1].lag.unwrap() < Duration::from_secs(60),
        "{:?}",
        done[1].lag
    );
    assert_eq!(row(&store, "t", 1), vec![0.0; DIM], "removed by file 2");
    assert_eq!(row(&store, "t", 2)[0], 2.02, "file 2's");
    // a new feeder (the last one died) starts after the store's cursor: nothing twice
    publish(&deltas, 3, "t", &[4], &[]);
    let version = store.version().unwrap();
    let done = feeder(&store, &deltas, None)
        .apply_pending(&mut |_| {})
        .unwrap();
    assert_eq!(sequences(&done), [3]);
    assert_eq!(
        store.version().unwrap(),
        version + 1,
        "one record for file 3"
    );
    let done = feeder(&store, &deltas, None)
        .apply_pending(&mut |_| {})
        .unwrap();
    assert!(done.is_empty());
    // a gap stops it before the file after it, naming that file
    publish(&deltas, 5, "t", &[5], &[]);
    let e = feeder(&store, &deltas, None)
        .apply_pending(&mut |_| {})
        .unwrap_err();
    assert!(e.to_string().contains("needs sequence 4 next"), "{e}");
    assert_eq!(store.feed_status().unwrap()["default"].sequence, 3);
    publish(&deltas, 4, "t", &[6], &[]);
    let done = feeder(&store, &deltas, None)
        .apply_pending(&mut |_| {})
        .unwrap();
    assert_eq!(sequences(&done), [4, 5]);
    // the cursor survives a reopen
    drop(store);
    let store = writable(&path);
    assert_eq!(store.feed_status().unwrap()["default"].sequence, 5);
    assert_eq!(row(&store, "t", 6)[0], 4.06);
}

#[test]
fn a_file_larger_than_a_call_is_applied_in_parts_and_again_whole_after_a_kill() {
    let (dir, deltas) = deltas_dir();
    let path = table_t(&dir, 1000);
    let store = writable(&path);
    let ids: Vec<i64> = (0..600).collect();
    let deletes: Vec<i64> = (900..950).collect();
    publish(&deltas, 1, "t", &ids, &deletes);
    // a feeder killed inside file 1 had applied its first call's rows (the deletes, and some
    // upserts at the values the file gives them) and not moved the cursor
    let first: Vec<f32> = ids[..100]
        .iter()
        .flat_map(|&id| (0..DIM).map(move |j| 1.0 + id as f32 / 100.0 + j as f32))
        .collect();
    let partial = [
        RowWrite {
            table: "t",
            ids: &deletes,
            values: None,
        },
        RowWrite {
            table: "t",
            ids: &ids[..100],
            values: Some(RowValues::F32(&first)),
        },
    ];
    store.write_many(&partial, WriteOptions::default()).unwrap();
    assert!(store.feed_status().unwrap().is_empty());
    // 24 bytes a row: 4,096-byte calls take 170 rows, the file's 650 in 4
    let options = FeedOptions {
        part_bytes: 4096,
        ..FeedOptions::default()
    };
    let mut feeder = Feeder::new(&store, Box::new(DirSource::new(&deltas)), options).unwrap();
    let done = feeder.apply_pending(&mut |_| {}).unwrap();
    assert_eq!(sequences(&done), [1]);
    assert_eq!((done[0].calls, done[0].rows), (4, 650));
    assert_eq!(store.feed_status().unwrap()["default"].sequence, 1);
    for id in [0, 99, 100, 599] {
        assert_eq!(row(&store, "t", id)[0], 1.0 + id as f32 / 100.0, "row {id}");
    }
    assert_eq!(row(&store, "t", 920), vec![0.0; DIM], "deleted");
    assert_eq!(
        row(&store, "t", 700)[0],
        nearrec_testkit::pattern(0, 700 * DIM as u64),
        "untouched"
    );
}

#[test]
fn a_feed_starts_from_a_given_sequence_and_refuses_a_file_that_misfits() {
    let (dir, deltas) = deltas_dir();
    let path = table_t(&dir, 100);
    let store = writable(&path);
    for s in 1..=3 {
        publish(&deltas, s, "t", &[s as i64], &[]);
    }
    let done = feeder(&store, &deltas, Some(2))
        .apply_pending(&mut |_| {})
        .unwrap();
    assert_eq!(sequences(&done), [2, 3]);
    assert_eq!(row(&store, "t", 1), {
        let mut want = vec![0f32; DIM];
        for (j, w) in want.iter_mut().enumerate() {
            *w = nearrec_testkit::pattern(0, (DIM + j) as u64);
        }
        want
    });
    // a file naming a table the store does not have: refused whole, cursor unmoved
    let values = Values::F32(vec![1.0; DIM]);
    let header = Header {
        sequence: 4,
        ..Header::default()
    };
    let bad = [
        Changes {
            table: "t".into(),
            upserts: vec![9],
            values: values.clone(),
            deletes: vec![],
            deleted: None,
        },
        Changes {
            table: "nope".into(),
            upserts: vec![0],
            values,
            deletes: vec![],
            deleted: None,
        },
    ];
    delta::write(
        &deltas.join(delta::file_name(4, Encoding::Arrow)),
        &header,
        &bad,
        None,
    )
    .unwrap();
    let e = feeder(&store, &deltas, None)
        .apply_pending(&mut |_| {})
        .unwrap_err();
    assert!(e.to_string().contains("row 1, column \"table\""), "{e}");
    assert_eq!(store.feed_status().unwrap()["default"].sequence, 3);
    assert_eq!(
        row(&store, "t", 9)[0],
        nearrec_testkit::pattern(0, 9 * DIM as u64)
    );
}

#[test]
fn int8_rows_and_keyed_deletes_are_fed() {
    let (dir, deltas) = deltas_dir();
    let keys = [10u64, 20, 30];
    let path = nearrec_testkit::write_keyed_store(
        dir.path().join("store"),
        "k",
        &keys,
        DIM as u32,
        DType::Int8,
        nearrec_testkit::pattern,
    );
    let store = writable(&path);
    let rb = DType::Int8.row_bytes(DIM as u32) as usize;
    let want: Vec<f32> = vec![-1.0, 0.0, 0.5, 1.0];
    let mut encoded = vec![0u8; rb];
    DType::Int8.encode_row(&want, &mut encoded);
    let changes = Changes {
        table: "k".into(),
        upserts: vec![u64::MAX as i64],
        values: Values::Encoded(encoded.clone()),
        deletes: vec![20],
        deleted: None,
    };
    let header = Header {
        sequence: 1,
        ..Header::default()
    };
    let file = deltas.join(delta::file_name(1, Encoding::Parquet));
    delta::write(&file, &header, &[changes], Some(DType::Int8)).unwrap();
    let done = feeder(&store, &deltas, None)
        .apply_pending(&mut |_| {})
        .unwrap();
    assert_eq!(sequences(&done), [1]);
    assert!(done[0].lag.is_none(), "the file gave no wall time");
    let mut decoded = vec![0f32; DIM];
    DType::Int8.decode_row(&encoded, &mut decoded);
    assert_eq!(row(&store, "k", -1), decoded, "key 2^64 - 1");
    let e = store.lookup(&one("k", &[20])).unwrap_err();
    assert_eq!(e.kind(), nearrec::ErrorKind::UnknownKey, "{e}");
}
