//! Co-located copies: rows move in the file, row ids and values do not.

use std::os::unix::fs::FileExt;
use std::path::Path;

use nearrec_format::{
    DATA_OFFSET, DType, FormatError, RowOrder, StoreOptions, StoreReader, StoreWriter, TableSpec,
    copy_ordered,
};

/// Two tables: fp16 rows packed many to a block, and int8 rows larger than a 512-byte block.
fn build(path: &Path) {
    let mut w = StoreWriter::create(path, StoreOptions::default()).unwrap();
    for (name, rows, dim, dtype, block) in [
        ("small", 1000u64, 12u32, DType::Fp16, 4096u32),
        ("wide", 77, 600, DType::Int8, 512),
    ] {
        let mut t = w
            .table(TableSpec {
                block_bytes: block,
                ..TableSpec::new(name, rows, dim, dtype)
            })
            .unwrap();
        t.write_with(rows, |r, v| {
            for (j, x) in v.iter_mut().enumerate() {
                *x = (r as f32) * 0.5 - (j as f32) * 0.25;
            }
        })
        .unwrap();
        w.finish_table(t).unwrap();
    }
    w.commit().unwrap();
}

/// A seeded shuffle of `0..n`.
fn shuffled(n: u32, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n).collect();
    let mut s = seed;
    for i in (1..v.len()).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.swap(i, (s >> 33) as usize % (i + 1));
    }
    v
}

fn tables(r: &StoreReader) -> Vec<Vec<u8>> {
    (0..r.tables().len())
        .map(|i| r.read_table(i, true, None).unwrap().as_slice().to_vec())
        .collect()
}

#[test]
fn copies_move_rows_not_values() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    build(&a);
    let src = StoreReader::open(&a).unwrap();
    assert_eq!(src.manifest().format_version, 3);
    let order = RowOrder::from_slots(shuffled(1000, 7)).unwrap();
    copy_ordered(
        &src,
        &b,
        &[Some(order.clone()), None],
        StoreOptions::default(),
        None,
    )
    .unwrap();

    let moved = StoreReader::open(&b).unwrap();
    assert_eq!(moved.manifest().format_version, 3);
    assert_eq!(moved.order(0).map(|o| o.as_ref()), Some(&order));
    assert!(moved.order(1).is_none());
    // read whole, rows are back in row-id order ...
    assert_eq!(tables(&moved), tables(&src));
    // ... while in the file, row r's bytes sit at its slot
    let meta = &moved.tables()[0];
    let (layout, rb) = (meta.layout(), meta.row_bytes as usize);
    let whole = src.read_table(0, true, None).unwrap();
    for row in [0u64, 1, 499, 999] {
        let mut got = vec![0u8; rb];
        let at = DATA_OFFSET + layout.row_offset(order.slot(row));
        moved.file(0).read_exact_at(&mut got, at).unwrap();
        assert_eq!(
            got,
            whole.as_slice()[layout.row_offset(row) as usize..][..rb]
        );
    }
    assert!(moved.verify(None).iter().all(|c| c.error.is_none()));

    // a co-located store can be re-ordered again, and back to plain (version 1)
    let other = RowOrder::from_slots(shuffled(77, 9)).unwrap();
    copy_ordered(
        &moved,
        &c,
        &[None, Some(other)],
        StoreOptions::default(),
        None,
    )
    .unwrap();
    // a table given no order keeps its own; the identity puts rows back in row order
    let again = StoreReader::open(&c).unwrap();
    assert_eq!(again.order(0).map(|o| o.as_ref()), Some(&order));
    assert!(again.order(1).is_some());
    assert_eq!(tables(&again), tables(&src));
    let back = StoreOptions {
        overwrite: true,
        ..StoreOptions::default()
    };
    let identity = |n: u32| Some(RowOrder::from_slots((0..n).collect()).unwrap());
    copy_ordered(&again, &c, &[identity(1000), identity(77)], back, None).unwrap();
    let plain = StoreReader::open(&c).unwrap();
    assert_eq!(plain.manifest().format_version, 3);
    assert_eq!(tables(&plain), tables(&src));
}

#[test]
fn bad_orders_and_damaged_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    build(&a);
    let src = StoreReader::open(&a).unwrap();
    let short = RowOrder::from_slots(shuffled(999, 1)).unwrap();
    let err = copy_ordered(
        &src,
        &b,
        &[Some(short), None],
        StoreOptions::default(),
        None,
    );
    assert!(matches!(err, Err(FormatError::InvalidTable { ref table, .. }) if table == "small"));
    assert!(copy_ordered(&src, &b, &[None], StoreOptions::default(), None).is_err());
    assert!(!b.exists());

    let order = RowOrder::from_slots(shuffled(1000, 3)).unwrap();
    copy_ordered(
        &src,
        &b,
        &[Some(order), None],
        StoreOptions::default(),
        None,
    )
    .unwrap();
    let file = b.join("table-0000.order");
    let good = std::fs::read(&file).unwrap();
    // a flipped bit, a truncated file, a missing file: each is named corruption, not a wrong row
    let mut flipped = good.clone();
    flipped[40] ^= 4;
    for damaged in [Some(flipped), Some(good[..good.len() - 4].to_vec()), None] {
        match &damaged {
            Some(bytes) => std::fs::write(&file, bytes).unwrap(),
            None => std::fs::remove_file(&file).unwrap(),
        }
        let err = StoreReader::open(&b).unwrap_err().to_string();
        assert!(err.contains("\"small\" row order"), "{err}");
    }
    std::fs::write(&file, &good).unwrap();
    StoreReader::open(&b).unwrap();

    // a damaged source is not copied under fresh checksums
    let data = a.join("table-0001.nrt");
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[DATA_OFFSET as usize + 5] ^= 1;
    std::fs::write(&data, bytes).unwrap();
    let src = StoreReader::open(&a).unwrap();
    let c = dir.path().join("c");
    let err = copy_ordered(&src, &c, &[None, None], StoreOptions::default(), None);
    assert!(matches!(err, Err(FormatError::Corrupted { .. })), "{err:?}");
    assert!(!c.exists());
}
