//! Keyed tables in the format: the zero row, the keys file, and what is refused.

use nearrec_format::{DType, StoreOptions, StoreReader, StoreWriter, TableSpec};

fn write(dir: &std::path::Path, keys: &[u64]) -> nearrec_format::Result<()> {
    let mut w = StoreWriter::create(dir, StoreOptions::default())?;
    let mut t = w.keyed_table(TableSpec::new("ids", keys.len() as u64, 2, DType::Fp32), 2)?;
    let rows: Vec<f32> = (0..keys.len() * 2).map(|v| v as f32 + 1.0).collect();
    t.write_f32(&rows)?;
    w.finish_table_keyed(t, keys)?;
    w.commit().map(drop)
}

#[test]
fn a_keyed_table_keeps_a_zero_row_then_its_keys_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let keys = [u64::MAX, 7, 1 << 40];
    write(&dir, &keys).unwrap();
    let r = StoreReader::open(&dir).unwrap();
    assert_eq!(r.manifest().format_version, 5);
    let meta = &r.tables()[0];
    // the zero row, a row a key, two spare rows
    assert_eq!((meta.rows, meta.entries(), meta.is_keyed()), (6, 3, true));
    assert_eq!(
        r.keys(0).unwrap().unwrap(),
        [(u64::MAX, 1), (7, 2), (1 << 40, 3)]
    );
    let data = r.read_table(0, true, None).unwrap();
    let data = data.as_slice();
    let row = |i: usize| -> Vec<f32> {
        data[i * 8..i * 8 + 8]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    assert_eq!(row(0), [0.0, 0.0]);
    assert_eq!(row(1), [1.0, 2.0]);
    assert_eq!(row(3), [5.0, 6.0]);
    assert_eq!(row(5), [0.0, 0.0]);
    assert!(r.verify(None).iter().all(|c| c.error.is_none()));
}

#[test]
fn damaged_or_short_keys_are_a_corrupted_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    write(&dir, &[1, 2, 3]).unwrap();
    let file = dir.join(
        StoreReader::open(&dir).unwrap().tables()[0]
            .keys
            .clone()
            .unwrap()
            .file,
    );
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[3] ^= 1;
    std::fs::write(&file, &bytes).unwrap();
    let e = StoreReader::open(&dir)
        .unwrap()
        .keys(0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("checksum") && e.contains("\"ids\""), "{e}");
    std::fs::write(&file, &bytes[..16]).unwrap();
    let e = StoreReader::open(&dir)
        .unwrap()
        .keys(0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("16 bytes"), "{e}");
    std::fs::remove_file(&file).unwrap();
    let e = StoreReader::open(&dir)
        .unwrap()
        .keys(0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing"), "{e}");
}

#[test]
fn keys_that_do_not_match_the_rows_are_refused_and_nothing_is_published() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let mut w = StoreWriter::create(&dir, StoreOptions::default()).unwrap();
    let mut t = w
        .keyed_table(TableSpec::new("ids", 2, 1, DType::Fp32), 0)
        .unwrap();
    t.write_f32(&[1.0, 2.0]).unwrap();
    let e = w.finish_table_keyed(t, &[1]).unwrap_err().to_string();
    assert!(
        e.contains("1 keys were given for 2 rows") && e.contains("\"ids\""),
        "{e}"
    );
    drop(w);
    assert!(!dir.exists());
    let mut w = StoreWriter::create(&dir, StoreOptions::default()).unwrap();
    let mut t = w
        .keyed_table(TableSpec::new("ids", 1, 1, DType::Fp32), 0)
        .unwrap();
    t.write_f32(&[1.0]).unwrap();
    let e = w.finish_table(t).unwrap_err().to_string();
    assert!(e.contains("finish_table_keyed"), "{e}");
}

#[test]
fn a_key_given_twice_is_refused_naming_both_positions() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let e = write(&dir, &[5, 9, 11, 9]).unwrap_err().to_string();
    assert!(
        e.contains("key 9 is given twice, at positions 1 and 3"),
        "{e}"
    );
    assert!(!dir.exists());
}
