//! The delta targets: a trainer's delta file (`docs/format.md` §17), and one rank's
//! TorchEasyRec delta dump, read against the fuzz store's tables.

use nearrec::format::DType;
use nearrec::format::delta::Shape;

use crate::ROWS;

/// A delta file (`docs/format.md` §17), Arrow IPC (first byte even) or Parquet (odd), the rest
/// its bytes, read against the fuzz store's tables: refused, or every row within its table, and
/// written back it reads the same.
pub fn delta_file(data: &[u8]) {
    use nearrec::format::delta::{self, Encoding, Values};
    let_parquet_panics_be_caught();
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

/// One rank's TorchEasyRec delta dump (Parquet), listed as the step it names and read against
/// the fuzz store's tables: refused, or every row an upsert of a row within its table (any key
/// of a keyed one), its values of the table's dim and finite.
pub fn tzrec_dump(data: &[u8]) {
    use nearrec::format::delta::{Values, tzrec};
    let_parquet_panics_be_caught();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("delta_embedding_step_1.parquet");
    std::fs::write(&path, data).expect("the file written");
    let steps = tzrec::steps(dir.path(), tzrec::PREFIX).expect("the directory lists");
    assert_eq!(steps.len(), 1, "the file is step 1");
    let Ok(d) = tzrec::read_step(&steps[0], shapes) else {
        return;
    };
    assert_eq!((d.header.sequence, d.header.step), (1, Some(1)));
    for t in &d.tables {
        let shape = shapes(&t.table).expect("a table the dump was checked against");
        let Values::F32(v) = &t.values else {
            panic!("table {}: a dump's rows are float32", t.table)
        };
        assert!(t.deletes.is_empty(), "a dump holds upserts only");
        assert_eq!(v.len(), t.upserts.len() * shape.dim as usize);
        assert!(
            v.iter().all(|x| x.is_finite()),
            "table {}: a value not finite",
            t.table
        );
        assert!(
            shape.keyed || t.upserts.iter().all(|&i| (0..ROWS as i64).contains(&i)),
            "table {}: an id out of its rows read",
            t.table
        );
    }
}

/// The fuzz store's tables as a delta is checked against them.
fn shapes(t: &str) -> Option<Shape> {
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
}

/// The `parquet` crate panics on some malformed files; nearrec's reader catches such a panic as
/// the file's refusal (`delta::read`, `tzrec::read_step`). libFuzzer's panic hook aborts at
/// every panic, caught or not: this hook lets the ones raised inside the Arrow and Parquet
/// crates go on to their catch. One that nothing catches still ends the input as a crash
/// (libfuzzer-sys aborts on a panic that leaves the target).
fn let_parquet_panics_be_caught() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let inside = info.location().is_some_and(|l| {
                ["/parquet-", "/arrow-"]
                    .iter()
                    .any(|c| l.file().contains(c))
            });
            if !inside {
                previous(info);
            }
        }));
    });
}
