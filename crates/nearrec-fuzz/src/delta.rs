//! The delta-file target: a trainer's delta file (`docs/format.md` §17) read against the fuzz
//! store's tables.

use nearrec::format::DType;

use crate::ROWS;

/// A delta file (`docs/format.md` §17), Arrow IPC (first byte even) or Parquet (odd), the rest
/// its bytes, read against the fuzz store's tables: refused, or every row within its table, and
/// written back it reads the same.
pub fn delta_file(data: &[u8]) {
    use nearrec::format::delta::{self, Encoding, Shape, Values};
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    let encoding = if kind % 2 == 0 {
        Encoding::Arrow
    } else {
        Encoding::Parquet
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(delta::file_name(1, encoding));
    std::fs::write(&path, bytes).expect("the file written");
    let shapes = |t: &str| -> Option<Shape> {
        let (dim, dtype, keyed) = match t {
            "a" => (4, DType::Fp32, false),
            "b" => (8, DType::Int8, false),
            "q" => (8, DType::Int4, false),
            "k" => (4, DType::Fp16, true),
            _ => return None,
        };
        Some(Shape {
            rows: ROWS,
            dim,
            dtype,
            keyed,
        })
    };
    let Ok(d) = delta::read(&path, shapes) else {
        return;
    };
    let mut encoded = None;
    for t in &d.tables {
        let shape = shapes(&t.table).expect("a table the file was checked against");
        let width = match &t.values {
            Values::F32(_) => shape.dim as usize,
            Values::Encoded(_) => {
                encoded = Some(shape.dtype);
                shape.row_bytes()
            }
        };
        let len = match &t.values {
            Values::F32(v) => v.len(),
            Values::Encoded(b) => b.len(),
        };
        assert_eq!(
            len,
            t.upserts.len() * width,
            "table {}: rows of its width",
            t.table
        );
        assert!(
            shape.keyed
                || t.upserts
                    .iter()
                    .chain(&t.deletes)
                    .all(|&i| (0..ROWS as i64).contains(&i)),
            "table {}: an id out of its rows read",
            t.table
        );
    }
    let back = dir.path().join(delta::file_name(1, Encoding::Arrow));
    let back = if back == path {
        dir.path().join(delta::file_name(1, Encoding::Parquet))
    } else {
        back
    };
    std::fs::remove_file(&path).expect("the file removed");
    delta::write(&back, &d.header, &d.tables, encoded).expect("a delta read is written back");
    let again = delta::read(&back, shapes).expect("a delta written back reads");
    assert_eq!((again.header, &again.tables), (d.header, &d.tables));
}
