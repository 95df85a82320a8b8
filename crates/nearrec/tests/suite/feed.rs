//! The suite's cases for delta feeds (`Writes::feed`): each file applied once with its cursor,
//! a file sent again taken as done, a gap and a bad file refused with nothing moved, the
//! cursors durable across a compaction and a reopen; a feed's share committed once; rows in a
//! table's encoding written as they are.

use nearrec::{ErrorKind, FeedCursor, RowValues, RowWrite, WriteOptions};

use super::{DIM, Open, fixture, rows_batch};

/// A feed's files applied in order, each once: the cursor moves with the rows, in one call.
pub fn a_feed_applies_each_file_once_with_its_cursor(open: Open) {
    let (_dir, path) = fixture();
    let s = open(&path, true);
    let store = &*s.store;
    let writes = needs!(store, writes);
    lacking!(s, "feeds");
    let d = DIM as usize;
    let file = |sequence: u64| FeedCursor {
        sequence,
        step: Some(100 * sequence),
        wall_time_ms: Some(1_700_000_000_000 + sequence),
        applied_ms: 0,
        rows: 2,
    };
    let opts = WriteOptions::default();
    let rows: Vec<f32> = (0..2 * d).map(|i| i as f32 * 0.5 - 1.0).collect();
    let w = RowWrite {
        table: "t0",
        ids: &[3, 8],
        values: Some(RowValues::F32(&rows)),
    };
    assert!(writes.feed_status().unwrap().is_empty());
    // a feed the store has not seen starts anywhere
    let fed = writes.feed("trainer", file(5), &[w], opts).unwrap();
    assert!(fed.applied);
    assert_eq!(fed.version, store.version().unwrap());
    assert_eq!(fed.cursor.sequence, 5);
    assert_eq!(fed.cursor.step, Some(500));
    assert!(
        fed.cursor.applied_ms >= 1_700_000_000_000,
        "{:?}",
        fed.cursor
    );
    let (pooled, read) = store.lookup(&rows_batch(&[3, 8])).unwrap();
    assert_eq!((pooled.values, read.version), (rows.clone(), fed.version));
    // sent again, or an older file: done already, nothing written
    for sequence in [5, 4] {
        let again = writes.feed("trainer", file(sequence), &[w], opts).unwrap();
        assert!(!again.applied, "file {sequence}");
        assert_eq!(again.version, fed.version, "file {sequence}");
        assert_eq!(again.cursor.sequence, 5, "file {sequence}");
    }
    // a gap is refused, and so is a bad file: neither moves anything
    let e = writes.feed("trainer", file(7), &[w], opts).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert!(e.to_string().contains("would skip file 6"), "{e}");
    let nan = [f32::NAN; 8];
    let bad = RowWrite {
        table: "t0",
        ids: &[1],
        values: Some(RowValues::F32(&nan)),
    };
    let e = writes.feed("trainer", file(6), &[bad], opts).unwrap_err();
    assert_eq!(
        (e.kind(), e.table()),
        (ErrorKind::InvalidRequest, Some("t0")),
        "{e}"
    );
    assert_eq!(store.version().unwrap(), fed.version);
    assert_eq!(writes.feed_status().unwrap()["trainer"].sequence, 5);
    // the next file, a remove; another feed beside it keeps its own cursor
    let remove = RowWrite {
        table: "t0",
        ids: &[3],
        values: None,
    };
    let next = writes.feed("trainer", file(6), &[remove], opts).unwrap();
    assert!(next.applied && next.version > fed.version);
    let (pooled, _) = store.lookup(&rows_batch(&[3])).unwrap();
    assert_eq!(pooled.values, vec![0.0; d]);
    let other = writes.feed("other", file(1), &[], opts).unwrap();
    assert!(other.applied, "a file of no rows moves its cursor");
    let status = writes.feed_status().unwrap();
    assert_eq!(
        status
            .iter()
            .map(|(k, c)| (k.as_str(), c.sequence))
            .collect::<Vec<_>>(),
        [("other", 1), ("trainer", 6)]
    );
    // durable: through a compaction and a reopen, read-only too
    lacking!(s, "its table files at the path");
    writes.compact().unwrap();
    let after = writes.feed("trainer", file(7), &[w], opts).unwrap();
    assert!(after.applied);
    drop(s);
    let s = open(&path, false);
    let status = s
        .store
        .writes()
        .expect("writes, as before")
        .feed_status()
        .unwrap();
    assert_eq!(status["trainer"].sequence, 7);
    assert_eq!(status["trainer"].step, Some(700));
    assert_eq!(status["other"].sequence, 1);
    let e = (s
        .store
        .writes()
        .unwrap()
        .feed("trainer", file(8), &[w], opts))
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::StoreReadOnly, "{e}");
}

/// A delta file's share prepared by two routers (a router's retry beside another's): the
/// first commit logs its rows with the cursor, the second finds the feed past it and logs
/// nothing; a feed's share at a gap is taken (a replica that caught up holds no cursor).
pub fn a_feeds_share_commits_once(open: Open) {
    use nearrec::Decision;
    let (_dir, path) = fixture();
    let s = open(&path, true);
    let store = &*s.store;
    let replica = needs!(store, replica);
    let writes = needs!(store, writes);
    let d = DIM as usize;
    let one = vec![1.0f32; d];
    let two = vec![2.0f32; d];
    let w = |ids: &'static [i64], v| RowWrite {
        table: "t0",
        ids,
        values: Some(RowValues::F32(v)),
    };
    let file = FeedCursor {
        sequence: 3,
        rows: 1,
        ..FeedCursor::default()
    };
    let opts = WriteOptions::default();
    let feed = Some(("trainer", file));
    replica
        .prepare_write(1, &[w(&[4], &one)], opts, "", None, feed)
        .unwrap();
    replica
        .prepare_write(2, &[w(&[5], &two)], opts, "", None, feed)
        .unwrap();
    let v1 = replica.decide(1, Decision::Commit, false).unwrap();
    let c = writes.feed_status().unwrap()["trainer"];
    assert_eq!((c.sequence, c.rows), (3, 1));
    assert!(c.applied_ms > 0, "stamped as the commit logged it: {c:?}");
    let v2 = replica.decide(2, Decision::Commit, false).unwrap();
    assert_eq!(
        v2, v1,
        "the second share logged no write (its decision alone)"
    );
    let (pooled, _) = store.lookup(&rows_batch(&[4, 5])).unwrap();
    assert_eq!(&pooled.values[..d], &one[..]);
    assert_ne!(
        &pooled.values[d..],
        &two[..],
        "the second share's row was not written"
    );
    assert!(replica.transactions().unwrap().is_empty());
    // the next file through the store's own feed goes on from the committed cursor
    let next = FeedCursor {
        sequence: 4,
        ..file
    };
    assert!(
        writes
            .feed("trainer", next, &[w(&[6], &two)], opts)
            .unwrap()
            .applied
    );
}

/// Rows already in a table's encoding (int8 row-wise, as a delta file carries them) written as
/// they are: read back as their own decoding, bit for bit; a wrong length or a row whose scale
/// is not finite refused naming the table and row.
pub fn encoded_rows_are_written_as_they_are(open: Open) {
    use nearrec::format::DType;
    let (_dir, path) = fixture();
    let s = open(&path, true);
    let store = &*s.store;
    let writes = needs!(store, writes);
    let rb = DType::Int8.row_bytes(DIM) as usize;
    let mut bytes = vec![0u8; 2 * rb];
    for (k, row) in bytes.chunks_exact_mut(rb).enumerate() {
        let v: Vec<f32> = (0..DIM)
            .map(|j| (k as f32 + 1.0) * (j as f32 * 0.37 - 1.1))
            .collect();
        DType::Int8.encode_row(&v, row);
    }
    let ids = [7i64, 250];
    let w = RowWrite {
        table: "t2",
        ids: &ids,
        values: Some(RowValues::Encoded(&bytes)),
    };
    writes.write_many(&[w], WriteOptions::default()).unwrap();
    let mut want = vec![0f32; 2 * DIM as usize];
    for (row, out) in bytes
        .chunks_exact(rb)
        .zip(want.chunks_exact_mut(DIM as usize))
    {
        DType::Int8.decode_row(row, out);
    }
    let mut got = vec![0f32; 2 * DIM as usize];
    store.read_rows("t2", &ids, &mut got).unwrap();
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let version = store.version().unwrap();
    let short = RowWrite {
        values: Some(RowValues::Encoded(&bytes[..rb + 1])),
        ..w
    };
    let e = writes
        .write_many(&[short], WriteOptions::default())
        .unwrap_err();
    assert_eq!(
        (e.kind(), e.table()),
        (ErrorKind::InvalidRequest, Some("t2")),
        "{e}"
    );
    let mut nan = bytes.clone();
    nan[rb + DIM as usize..rb + DIM as usize + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let bad = RowWrite {
        values: Some(RowValues::Encoded(&nan)),
        ..w
    };
    let e = writes
        .write_many(&[bad], WriteOptions::default())
        .unwrap_err();
    assert_eq!((e.table(), e.position()), (Some("t2"), Some(1)), "{e}");
    assert_eq!(store.version().unwrap(), version, "nothing written");
}
